"""Stored objects damaged by hand are refused at load, naming the State, the entry and the field.

Each case of ``CASES`` (tests/corrupt_cases.py) damages one field of a saved State (a
FileStore's files here; S3 objects in tests/s3/test_damaged_objects.py, an export in
test_transfer.py, with the same table) and expects ``CorruptStateError``
from ``load`` whose message names the State, the entry's seq (or the snapshot) and the field's
path, instead of a ``ValueError``/``TypeError``/``KeyError`` later (on the next run, when a
request is formatted, in ``show``) or a State that loads as if nothing were wrong.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

from alpineagents import CorruptStateError, FileStore, HistoryEntry
from alpineagents.history import COMPACTION

# The table, named here too for tests/s3/test_damaged_objects.py (``import
# tests.test_corrupt_load as table``) until it imports tests.corrupt_cases itself.
from tests.corrupt_cases import CASES as CASES
from tests.corrupt_cases import ID as ID
from tests.corrupt_cases import Case as Case
from tests.corrupt_cases import case_id as case_id
from tests.corrupt_cases import damage as damage
from tests.corrupt_cases import saved_state as saved_state


def expect_refused(load: Callable[[], Any], words: str, store: str) -> None:
    """``load()`` raises CorruptStateError naming the State in ``store`` and ``words``."""
    with pytest.raises(CorruptStateError) as raised:
        load()
    message = str(raised.value)
    assert message.startswith(f"State {ID!r} in {store}"), message
    assert re.search(words, message), message


def rewrite(path: Path, change: Callable[[dict[str, Any]], dict[str, Any]], line: int) -> None:
    """Change one JSON line of a file (or the whole file for ``line=-1``)."""
    if line < 0:
        path.write_text(json.dumps(change(json.loads(path.read_text()))))
        return
    lines = path.read_text().splitlines()
    lines[line] = json.dumps(change(json.loads(lines[line])))
    path.write_text("\n".join(lines) + "\n")


def test_the_state_of_the_table_loads_undamaged(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    state = saved_state()
    store.save(state)
    loaded = store.load(ID)
    assert [e.kind for e in loaded.history] == [e.kind for e in state.history]
    assert loaded.history == state.history
    assert (loaded.stopped_by, loaded.answer, loaded.data) == ("reply", "done", {"k": [1, 2]})


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_a_damaged_file_is_refused_at_load_naming_the_field(tmp_path: Path, case: Case) -> None:
    what, path, value, words = case
    store = FileStore(tmp_path)
    store.save(saved_state())
    folder = tmp_path / ID
    if what == "snapshot":
        rewrite(folder / "snapshot.json", lambda s: damage(s, path, value), -1)
    else:
        assert isinstance(what, int)
        rewrite(folder / "entries.jsonl", lambda e: damage(e, path, value), what)

    expect_refused(lambda: store.load(ID), words, repr(store))
    with pytest.raises(CorruptStateError):
        store.get(ID)  # not taken for an unknown id either


def test_what_a_newer_version_or_a_hand_made_state_may_hold_still_loads(tmp_path: Path) -> None:
    # An entry kind this version does not know (a newer one's) is kept, out of the context;
    # a compaction appended without ``covers`` covers every entry before it.
    store = FileStore(tmp_path)
    state = saved_state()
    state.append(COMPACTION, "a summary")  # 6
    state.history.append(HistoryEntry(7, cast(Any, "future_kind"), "later", {"k": 1}))
    store.save(state)
    loaded = store.load(ID)
    assert loaded.history == state.history
    assert loaded.history[6].as_compaction().covers == 5
