"""Review of session 10 (issue 10): what the faster load and save changed that they should not.

Each test pins a behaviour of the version before (a4fcc24) that the change lost:

* FileStore's chunked load parses many lines in one ``json.loads`` and takes the result when it
  gives one value per line. A value that goes on over two lines, beside a line of two values,
  gives that count too: a file the line-by-line load refused is taken.
* A save whose snapshot is the one on disk is no longer written, and so no longer forgets the
  digests of snapshot writes that never finished (``_Seen.tried``); one of those found on
  disk later, written by another writer, is then taken for this store object's own.
* A model entry without ``text`` gets the text of its blocks: right for a compact entry
  (schema version 2), but a version-1 entry without it is damaged and was refused.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from alpineagents import ConcurrentWriteError, CorruptStateError, FileStore, State
from alpineagents import filestore as filestore_module
from alpineagents._serialize import entry_from_dict, entry_to_dict


def _saved(tmp_path: Path, state_id: str = "s1", replies: int = 2) -> tuple[FileStore, Path]:
    """A FileStore holding a State of a task and ``replies`` model replies."""
    store = FileStore(tmp_path / "store")
    state = State("the task", id=state_id)
    for n in range(replies):
        state.append("model", f"reply {n}", {"content": [{"type": "text", "text": f"reply {n}"}]})
    store.save(state)
    return store, tmp_path / "store" / state_id / filestore_module.ENTRIES


@pytest.mark.parametrize("chunk", [1 << 18, 7])
def test_value_over_two_lines_beside_a_line_of_two_values_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    """Every line must hold exactly one value, as the line-by-line load of a4fcc24 required.

    Entry 0 is cut after its ``data`` field and its last key goes on the next line; entries 1
    and 2 share the third line. Three lines, three values: the joined parse takes the file, the
    State loads, though no line but the third is JSON on its own and that one holds two values.
    """
    monkeypatch.setattr(filestore_module, "_READ_CHUNK", chunk, raising=False)  # not in a4fcc24
    store, path = _saved(tmp_path)
    lines = path.read_bytes().split(b"\n")[:-1]
    assert len(lines) == 3
    first = json.loads(lines[0])
    head = json.dumps(first, separators=(",", ":")).encode()
    assert head.endswith(b"}")
    # {"v":1,...,"data":{}   +  newline  +  "x":1}   : one object once the newline is a comma
    damaged = head[:-1] + b'\n"x":1}\n' + lines[1] + b"," + lines[2] + b"\n"
    path.write_bytes(damaged)

    with pytest.raises(CorruptStateError, match=r"line 1 of .*entries\.jsonl"):
        store.read("s1")
    with pytest.raises(CorruptStateError, match=r"line 1 of .*entries\.jsonl"):
        FileStore(tmp_path / "store").load("s1")


def _snapshot(n: int) -> dict[str, Any]:
    """A snapshot body the FileStore keeps as it is (it never reads its fields)."""
    return {"v": 1, "n": n}


def test_unchanged_snapshot_save_forgets_unfinished_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A save that leaves the snapshot as it is ends this object's doubt about earlier writes.

    A's write of snapshot X fails before its rename (X is "tried"). A's next save sends the
    snapshot on disk, S0, and completes: A's view is S0, so X found on disk later is another
    writer's. Before, that save rewrote S0 and forgot X; now it skips the write and keeps X
    in ``tried``, so after B writes X, A replaces B's snapshot instead of being refused.
    """
    a = FileStore(tmp_path / "store")
    state = State("the task", id="s1")
    entry = entry_to_dict(state.history[0])
    a.write("s1", [entry], _snapshot(0), create=True)

    def failing_replace(src: Any, dst: Any) -> None:
        raise OSError(5, "Input/output error (injected)")

    with monkeypatch.context() as patch:
        patch.setattr(os, "replace", failing_replace)
        with pytest.raises(OSError, match="injected"):
            a.write("s1", [], _snapshot(1))  # X: never on disk
    a.write("s1", [], _snapshot(0))  # S0 again: A saw the write through, its view is S0

    b = FileStore(tmp_path / "store")
    b.write("s1", [], _snapshot(1))  # another writer saves X

    with pytest.raises(ConcurrentWriteError, match="was replaced"):
        a.write("s1", [], _snapshot(2))
    assert json.loads((tmp_path / "store" / "s1" / "snapshot.json").read_bytes()) == _snapshot(1)


def test_version_1_model_entry_without_text_is_refused() -> None:
    """Only a compact entry (schema version 2) may leave its text out.

    Every version-1 entry has its text: one without it is damaged, and a4fcc24 said so. The
    rewritten check derives the text of any model entry without one, whatever its version.
    """
    state = State("the task", id="s1")
    state.append("model", "hi", {"content": [{"type": "text", "text": "hi"}]})
    raw = entry_to_dict(state.history[1])
    assert raw["v"] == 1
    del raw["text"]
    with pytest.raises(CorruptStateError, match=r"history entry 1 \(model\): text must be a str"):
        entry_from_dict(raw, "State 's1'", 1)
