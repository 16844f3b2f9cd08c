"""FileStore's check for a second writer follows the copy of the State being saved.

Two FileStore objects for one folder are the same store: a copy that is current saves through
either, whatever each object read or wrote before. A stale copy (another writer saved since
this copy was loaded or saved, even a save that changed only the snapshot) is refused with
``ConcurrentWriteError`` through any of them, and nothing of it is written.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from alpineagents import Agent, ConcurrentWriteError, FileStore, State, _saving
from alpineagents import filestore as filestore_module
from alpineagents._filestore import writing as filestore_writing
from alpineagents._serialize import entry_to_dict
from tests.helpers import Mode, run, script


def files(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` and its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def texts(store: FileStore, state_id: str = "s") -> list[str]:
    return [e.text for e in store.load(state_id).history]


def save(store: FileStore, state: State, mode: Mode, *, entries_only: bool = False) -> bool:
    """A save of ``state`` (``entries_only``: a tool result's, the new entries alone)."""
    if mode == "async":
        return asyncio.run(_saving.asave(store, state, entries_only=entries_only))
    return _saving.save(store, state, entries_only=entries_only)


@pytest.fixture
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder ``runs`` (the working directory's) holding State ``s``."""
    monkeypatch.chdir(tmp_path)
    FileStore("runs").save(State("task", id="s", data={"n": 0}))
    return tmp_path / "runs"


async def test_a_current_copy_runs_with_an_agent_on_another_object_for_the_folder(
    runs: Path, mode: Mode
) -> None:
    absolute = FileStore(runs)  # tmp_path is absolute; the States are loaded as "runs"
    absolute.load("s")  # this object read the State earlier ...
    other = FileStore(runs)
    elsewhere = other.load("s")
    elsewhere.add_user_message("saved by another object since")
    other.save(elsewhere)  # ... and another object saved since

    state = FileStore("runs").load("s")  # current: it has that save
    agent = Agent(script("a reply"), store=absolute)
    assert await run(mode, agent, state) == "a reply"
    assert texts(FileStore("runs")) == ["task", "saved by another object since", "a reply"]
    state.add_user_message("and one more")
    assert await (
        absolute.asave(state) if mode == "async" else asyncio.to_thread(absolute.save, state)
    )
    assert texts(absolute)[-1] == "and one more"


@pytest.mark.parametrize("through", ["same object", "other object", "object that read since"])
@pytest.mark.parametrize("change", ["data", "message", "tool result alone"])
def test_a_stale_copy_is_refused_through_any_object_and_writes_nothing(
    runs: Path, mode: Mode, through: str, change: str
) -> None:
    loader = FileStore("runs")
    stale = loader.load("s")
    winner = FileStore(runs).load("s")
    winner.data["n"] = 1  # a save of the snapshot alone
    assert FileStore(runs).save(winner) is True

    store = {
        "same object": loader,
        "other object": FileStore(runs),
        "object that read since": FileStore(runs),
    }[through]
    if through == "object that read since":
        store.load("s")  # the object's own view is current; the copy's is not
    before = files(runs)
    if change == "data":
        stale.data["n"] = 2
    else:
        stale.add_user_message("from the stale copy")
    with pytest.raises(ConcurrentWriteError, match=r"State 's' in FileStore.*store\.load\('s'\)"):
        save(store, stale, mode, entries_only=change == "tool result alone")
    assert files(runs) == before
    assert FileStore(runs).load("s").data == {"n": 1}


def test_two_copies_held_by_one_store_object_are_told_apart(runs: Path, mode: Mode) -> None:
    store = FileStore("runs")
    first, second = store.load("s"), store.load("s")
    first.data["n"] = 1
    assert save(store, first, mode) is True
    second.data["n"] = 2  # no history entry: only the snapshot tells the copies apart
    with pytest.raises(ConcurrentWriteError, match="was replaced"):
        save(store, second, mode)
    assert store.load("s").data == {"n": 1}


def test_a_copy_whose_failed_write_landed_saves_again_through_another_object(
    runs: Path, mode: Mode, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The snapshot was replaced, then the write failed (flushing the folder): the copy does
    # not know its write landed. The snapshot on disk is its own, not another writer's.
    writer = FileStore("runs", fsync=True)
    state = writer.load("s")
    state.data["n"] = 1

    def failing_fsync(path: Path) -> None:
        raise OSError(5, "Input/output error (injected)")

    with monkeypatch.context() as patch:
        patch.setattr(filestore_writing, "_fsync_dir", failing_fsync)
        with pytest.raises(OSError, match="injected"):
            save(writer, state, mode)
    assert FileStore(runs).load("s").data == {"n": 1}  # it did land
    state.add_user_message("after the failed write")
    assert save(FileStore(runs), state, mode) is True
    assert texts(FileStore(runs)) == ["task", "after the failed write"]


def test_a_snapshot_in_other_bytes_than_this_version_writes_is_compared_as_json(
    runs: Path, mode: Mode
) -> None:
    # A snapshot another version wrote with other spacing: the same JSON, so the same version.
    path = runs / "s" / filestore_module.SNAPSHOT
    path.write_text(json.dumps(json.loads(path.read_bytes()), indent=2))
    state = FileStore("runs").load("s")
    state.data["n"] = 5
    assert save(FileStore(runs), state, mode) is True
    assert FileStore(runs).load("s").data == {"n": 5}
    assert os.stat(path).st_mode & 0o777 == 0o600


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
