"""FileStore with more than one process: a second writer is refused, never lost; parent folders
are 0700. Every process here is real (tests/scripts/fs_writer.py). The leftovers of killed
writers and their sweep are in test_filestore_leftovers.py."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from alpineagents import FileStore, State
from alpineagents.errors import ConcurrentWriteError
from tests.scripts.harness import REPO, child, child_env, ended

pytestmark = pytest.mark.slow

WRITER = "fs_writer.py"


# A concurrent-append stress ------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_writers_racing_on_one_state_lose_no_acknowledged_save(tmp_path: Path, mode: str) -> None:
    FileStore(tmp_path).save(State("shared", id="shared"))
    names, count = ["w0", "w1", "w2"], 90
    start = time.time() + 1.5
    with contextmanager_all(
        [child(WRITER, "stress", tmp_path, "shared", n, count, mode, start) for n in names]
    ) as procs:
        results = []
        for proc in procs:
            code, out, err = ended(proc)
            assert code == 0, err
            results.append(json.loads(out.strip().splitlines()[-1]))

    state = FileStore(tmp_path).load("shared")
    texts = [entry.text for entry in state.history]
    assert texts[0] == "shared"
    assert len(texts) == len(set(texts))  # no entry twice
    for name, result in zip(names, results, strict=True):
        # Every acknowledged message is on disk, once, in order; nothing else of this writer.
        mine = [int(t.split()[1]) for t in texts if t.startswith(f"{name} ")]
        assert mine == result["messages"]
        # Every acknowledged change of data survived every later save of the other writers.
        assert state.data.get(name, []) == result["data"]
        assert len(result["messages"]) + len(result["data"]) == count
    assert [e.seq for e in state.history] == list(range(len(texts)))
    # The writers did race: some saves were refused (and then made again on a fresh load).
    assert sum(r["refused"] for r in results) > 0


@contextmanager
def contextmanager_all(
    managers: list[Any],
) -> Iterator[list[subprocess.Popen[str]]]:
    """Enter every child context manager; leave them all (kill what still runs) on exit."""
    entered: list[Any] = []
    try:
        for manager in managers:
            entered.append(manager.__enter__())
        yield entered
    finally:
        for manager in reversed(managers[: len(entered)]):
            manager.__exit__(None, None, None)


# Two processes step by step --------------------------------------------------------------------


class Repl:
    """A child process holding one FileStore object and one State, driven a command at a time."""

    def __init__(self, proc: subprocess.Popen[str]):
        self.proc = proc

    def __call__(self, op: str, **args: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the child ended: {self.proc.stderr.read() if self.proc.stderr else ''}"
        answer: dict[str, Any] = json.loads(line)
        return answer

    def ok(self, op: str, **args: Any) -> Any:
        answer = self(op, **args)
        assert "ok" in answer, answer
        return answer["ok"]


@contextmanager
def two_writers(root: Path) -> Iterator[tuple[Repl, Repl]]:
    with (
        child(WRITER, "repl", root, stdin=subprocess.PIPE) as a,
        child(WRITER, "repl", root, stdin=subprocess.PIPE) as b,
    ):
        yield Repl(a), Repl(b)


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    state = State("task", id="s")
    state.data["who"] = "nobody"
    FileStore(tmp_path).save(state)
    return tmp_path


@pytest.mark.parametrize("use_async", [False, True])
@pytest.mark.parametrize("entries_only", [False, True])
def test_a_stale_copy_is_refused_and_the_winner_carries_on(
    saved: Path, use_async: bool, entries_only: bool
) -> None:
    with two_writers(saved) as (a, b):
        a.ok("load", id="s", **{"async": use_async})
        b.ok("load", id="s", **{"async": use_async})
        a.ok("say", text="from a")
        assert a.ok("save", entries_only=entries_only, **{"async": use_async}) is True
        b.ok("say", text="from b")
        refused = b("save", entries_only=entries_only, **{"async": use_async})
        assert refused["error"] == "ConcurrentWriteError", refused
        assert "'s'" in refused["message"] and "store.load('s')" in refused["message"]
        a.ok("say", text="a again")
        assert a.ok("save", **{"async": use_async}) is True
        # The refused writer recovers by loading again.
        assert b.ok("load", id="s") == ["task", "from a", "a again"]
        b.ok("say", text="b after reload")
        assert b.ok("save") is True
    texts = [e.text for e in FileStore(saved).load("s").history]
    assert texts == ["task", "from a", "a again", "b after reload"]


@pytest.mark.parametrize("use_async", [False, True])
def test_a_stale_data_only_save_is_refused(saved: Path, use_async: bool) -> None:
    with two_writers(saved) as (a, b):
        a.ok("load", id="s")
        b.ok("load", id="s")
        a.ok("data", key="who", value="a")
        assert a.ok("save", **{"async": use_async}) is True
        b.ok("data", key="who", value="b")
        assert b("save", **{"async": use_async})["error"] == "ConcurrentWriteError"
        a.ok("data", key="who", value="a twice")
        assert a.ok("save", **{"async": use_async}) is True
    assert FileStore(saved).load("s").data == {"who": "a twice"}


def test_entries_saved_alone_by_another_writer_refuse_a_data_only_save(saved: Path) -> None:
    # The snapshot is unchanged; only the entries tell that another writer saved.
    with two_writers(saved) as (a, b):
        a.ok("load", id="s")
        b.ok("load", id="s")
        a.ok("say", text="tool result, saved alone")
        assert a.ok("save", entries_only=True) is True
        b.ok("data", key="who", value="b")
        assert b("save")["error"] == "ConcurrentWriteError"
    loaded = FileStore(saved).load("s")
    assert [e.text for e in loaded.history] == ["task", "tool result, saved alone"]
    assert loaded.data == {"who": "nobody"}


def test_a_save_after_a_delete_is_refused_and_leaves_nothing(saved: Path) -> None:
    with child(WRITER, "repl", saved, stdin=subprocess.PIPE) as proc:
        a = Repl(proc)
        a.ok("load", id="s")
        FileStore(saved).delete("s")
        a.ok("say", text="after the delete")
        answer = a("save", entries_only=True)
        assert answer["error"] == "StateNotFoundError", answer
        assert a("save")["error"] == "StateNotFoundError"
    assert os.listdir(saved) == []


def test_a_save_into_a_state_deleted_and_created_again_is_refused(saved: Path) -> None:
    with child(WRITER, "repl", saved, stdin=subprocess.PIPE) as proc:
        a = Repl(proc)
        a.ok("load", id="s")
        store = FileStore(saved)
        store.delete("s")
        store.save(State("a new State, same id", id="s"))
        a.ok("say", text="into the old one")
        assert a("save")["error"] == "ConcurrentWriteError"
    assert [e.text for e in FileStore(saved).load("s").history] == ["a new State, same id"]


def test_one_store_object_recognises_its_own_retried_save(
    saved: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The entries were appended, then the snapshot write failed: the Agent sends them again.
    store = FileStore(saved)
    state = store.load("s")
    state.add_user_message("sent twice")

    def full_disk(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(os, "replace", full_disk)
        with pytest.raises(OSError, match="No space"):
            store.save(state)
    assert store.save(state) is True
    other = FileStore(saved)  # equal, but a store object of its own: it meets the State now
    assert [e.text for e in other.load("s").history] == ["task", "sent twice"]
    assert store.save(state) is False


def test_a_monitor_loading_through_the_run_store_does_not_disturb_it(saved: Path) -> None:
    store = FileStore(saved)
    run = store.load("s")
    run.add_user_message("one")
    store.save(run)
    monitor = store.load("s")  # same snapshot: nothing moves
    assert [e.text for e in monitor.history] == ["task", "one"]
    run.add_user_message("two")
    assert store.save(run) is True


def test_two_store_objects_saving_one_state_the_second_is_refused(saved: Path) -> None:
    # The plain case of the stress test (before the fix: "b" was skipped as a seq on disk).
    a, b = FileStore(saved), FileStore(saved)
    copy_a, copy_b = a.load("s"), b.load("s")
    copy_a.add_user_message("a")
    a.save(copy_a)
    copy_b.add_user_message("b")
    with pytest.raises(ConcurrentWriteError, match=r"State 's' in FileStore"):
        b.save(copy_b)
    assert [e.text for e in FileStore(saved).load("s").history] == ["task", "a"]


# Parent folders ----------------------------------------------------------------------------------

UMASK_CHILD = """
import os, sys
from alpineagents import FileStore, State
os.umask(0)
FileStore(sys.argv[1]).save(State("t", id="s"))
"""


def test_parent_folders_it_makes_are_0700_under_umask_000(tmp_path: Path) -> None:
    root = tmp_path / "a" / "b" / "runs"
    subprocess.run(
        [sys.executable, "-c", UMASK_CHILD, str(root)],
        check=True,
        env=child_env(),
        cwd=REPO,
        timeout=30,
    )
    for folder in (tmp_path / "a", tmp_path / "a" / "b", root, root / "s"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder


def test_saves_of_one_turn_finishing_out_of_order_are_not_refused(saved: Path) -> None:
    # Two tool results of one turn, saved alone: the later save (both entries) lands first.
    store = FileStore(saved)
    record = store.read("s")
    assert record is not None
    n = len(record.entries)
    first = {**record.entries[0], "seq": n, "text": "result one"}
    second = {**record.entries[0], "seq": n + 1, "text": "result two"}
    store.write("s", [first, second], None)
    store.write("s", [first], None)
    assert [e.text for e in store.load("s").history][n:] == ["result one", "result two"]
