"""FileStore's list: the saved States, newest first, without the States being created or
deleted, a snapshot it cannot read (named in a warning) or a folder whose name is no id; and
``list(limit=...)``, the start of the whole list, reading only the newest snapshots whole."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from alpineagents import FileStore, State, StoreError
from alpineagents._filestore import reading as filestore_reading


def test_list_skips_states_being_created_or_deleted(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    store.save(State("t", id="real"))
    (tmp_path / ".half.abc.new").mkdir()
    (tmp_path / "stray-file").write_text("not a state")
    assert [s.id for s in store.list()] == ["real"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"v": 1}, "not an alpineagents snapshot"),
        ({"v": 9, "task": "t", "updated_at": "2026-01-01T00:00:00+00:00"}, "schema version 9"),
        ({"v": 1, "task": "t", "updated_at": "2026-01-01T00:00:00"}, "not an alpineagents"),
    ],
)
def test_list_leaves_out_a_snapshot_it_cannot_read_and_names_it(
    tmp_path: Path, content: dict[str, Any], message: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = FileStore(tmp_path)
    store.save(State("t", id="bad"))
    store.save(State("t", id="good"))
    (tmp_path / "bad" / "snapshot.json").write_text(json.dumps(content))
    with caplog.at_level(logging.WARNING, logger="alpineagents.filestore"):
        assert [s.id for s in store.list()] == ["good"]
    (record,) = caplog.records
    assert "'bad'" in record.getMessage() and "snapshot.json" in record.getMessage()
    assert re.search(message, record.getMessage())
    with pytest.raises(StoreError, match=message):  # its load says why
        store.load("bad")


def test_list_leaves_out_a_folder_whose_name_is_not_an_id(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    store.save(State("t", id="good"))
    shutil.copytree(tmp_path / "good", tmp_path / "not an id!")
    assert [s.id for s in store.list()] == ["good"]


# list(limit=...) ----------------------------------------------------------------------------


def _many(store: FileStore, tmp_path: Path) -> None:
    """States whose snapshots end in every way the limit must cope with."""
    base = "2026-03-01T10:00:00+00:00"
    for n in range(12):
        state = State(f"task {n}", id=f"s{n:02}", data={"pad": "x" * (n * 50)})
        store.save(state)
        path = tmp_path / state.id / "snapshot.json"
        value = json.loads(path.read_bytes())
        value["updated_at"] = f"2026-03-01T10:{(n * 7) % 12:02}:00+00:00"
        if n in (3, 4):
            value["updated_at"] = base  # a tie
        if n == 5:  # written by other means: its end does not say when (key order, spacing)
            path.write_text(json.dumps(dict(reversed(value.items())), indent=2))
        elif n == 6:
            path.write_text(json.dumps(value).replace("+00:00", "+02:00"))  # another zone
        else:
            path.write_text(json.dumps(value, separators=(",", ":")))
    (tmp_path / "s07" / "snapshot.json").write_text("{damaged")
    (tmp_path / "s08" / "snapshot.json").write_text(
        (tmp_path / "s08" / "snapshot.json").read_text().replace('"v":1', '"v":9')
    )
    (tmp_path / "notes").write_text("a file of my own")


@pytest.mark.parametrize("limit", [0, 1, 2, 3, 5, 8, 9, 10, 12, 40])
def test_list_with_a_limit_is_the_start_of_the_whole_list(tmp_path: Path, limit: int) -> None:
    store = FileStore(tmp_path)
    _many(store, tmp_path)
    everything = store.list()
    assert len(everything) == 10  # the damaged and the newer one are left out
    assert store.list(limit=limit) == everything[:limit]
    assert asyncio.run(store.alist(limit=limit)) == everything[:limit]


def test_list_with_a_limit_reads_only_the_newest_snapshots_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStore(tmp_path)
    for n in range(40):
        store.save(State(f"task {n}", id=f"s{n}", data={"pad": "x" * 10_000}))
    read: list[str] = []
    real = filestore_reading.loads  # type: ignore[attr-defined]

    def counting(raw: bytes | str, where: str) -> Any:
        read.append(where)
        return real(raw, where)

    monkeypatch.setattr(filestore_reading, "loads", counting)
    newest = store.list(limit=3)
    assert [s.id for s in newest] == ["s39", "s38", "s37"]
    assert len(read) == 3
    read.clear()
    store.list()
    assert len(read) == 40


@pytest.mark.parametrize("limit", [-1, 1.5, "3", True])
def test_a_bad_limit_is_a_value_error(tmp_path: Path, limit: Any) -> None:
    with pytest.raises(ValueError, match="limit must be an int"):
        FileStore(tmp_path).list(limit=limit)
