"""FileStore with more than one process: a second writer is refused, never lost; parent folders
are 0700; and leftovers of killed creates, deletes and snapshot writes are swept, but never
while their writer lives. Every process here is real (tests/scripts/fs_writer.py)."""

from __future__ import annotations

import json
import os
import random
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from alpineagents import FileStore, State
from alpineagents import filestore as filestore_module
from alpineagents.errors import ConcurrentWriteError
from tests.scripts.harness import REPO, child, child_env, ended, sigkill

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


# Leftovers of killed processes -------------------------------------------------------------------


@contextmanager
def _paused(root: Path, state_id: str, where: str) -> Iterator[subprocess.Popen[str]]:
    with child(WRITER, "pause", root, state_id, where) as proc:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == "paused", (line, proc.stderr.read() if proc.stderr else "")
        yield proc


def _leftovers(root: Path) -> list[str]:
    found = [p.name for p in root.iterdir() if p.name.startswith(".")]
    found += [f"{p.name}/{q.name}" for p in root.iterdir() for q in p.iterdir() if q.name[0] == "."]
    return sorted(found)


@pytest.mark.crash
@pytest.mark.parametrize("where", ["create", "delete", "snapshot"])
def test_leftovers_of_a_killed_writer_are_swept_only_once_it_is_dead(
    tmp_path: Path, where: str
) -> None:
    store = FileStore(tmp_path)
    if where != "create":
        store.save(State("to be cut short", id="s"))
    store.save(State("a bystander", id="other"))
    with _paused(tmp_path, "s", where) as proc:
        (left,) = _leftovers(tmp_path)
        suffix = {"create": ".new", "delete": ".deleted", "snapshot": ".tmp"}[where]
        assert left.endswith(suffix)
        if where == "delete":  # the deleted conversation is still on disk
            assert (tmp_path / left / "entries.jsonl").exists()
        # Its writer is alive: the sweep leaves it.
        assert FileStore(tmp_path).sweep() == []
        assert _leftovers(tmp_path) == [left]
        sigkill(proc)
    assert FileStore(tmp_path).sweep() == [tmp_path / left]
    assert _leftovers(tmp_path) == []
    if where == "snapshot":  # the entry saved before the snapshot is kept
        texts = [e.text for e in store.load("s").history]
        assert texts == ["to be cut short", "saved before the snapshot"]
    else:
        assert [s.id for s in store.list()] == ["other"]
    assert store.load("other").task == "a bystander"


def _everything(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.crash
@pytest.mark.parametrize("then", ["purge again", "sweep"])
def test_a_purge_killed_halfway_leaves_nothing_of_the_state_after_a_purge_or_a_sweep(
    tmp_path: Path, then: str
) -> None:
    store = FileStore(tmp_path)
    state = State("to be erased", id="s")
    state.add_user_message("a secret")
    store.save(state)
    store.save(State("a bystander", id="other"))
    with _paused(tmp_path, "s", "delete") as proc:  # a delete killed before: its leftover
        sigkill(proc)
    store.save(State("t", id="s"))  # the id again (this object swept at its first write only)
    with _paused(tmp_path, "s", "purge") as proc:
        sigkill(proc)  # one file removed, the rest still there
    left = [name for name in _everything(tmp_path) if name.startswith(".s.")]
    assert any(name.endswith((".jsonl", ".json")) for name in left), left  # still readable
    assert not (tmp_path / "s").exists()

    if then == "purge again":
        report = FileStore(tmp_path).delete("s", purge=True)
        assert report.leftovers == 2 and report.files >= 1, report
        assert str(report).startswith("purged State 's': ")
    else:
        removed = FileStore(tmp_path).sweep()
        assert len(removed) == 2 and all(p.name.startswith(".s.") for p in removed), removed
    assert _everything(tmp_path) == ["other", "other/entries.jsonl", "other/snapshot.json"]
    with pytest.raises(KeyError, match="'s'"):
        FileStore(tmp_path).delete("s", purge=True)
    assert FileStore(tmp_path).load("other").task == "a bystander"


@pytest.mark.crash
def test_a_purge_waits_for_a_create_under_way_then_removes_its_leftover(tmp_path: Path) -> None:
    # A create of the id, stopped (alive) before its rename: its folder is in use, and a sweep
    # leaves it; a purge waits for its writer, which is killed here meanwhile.
    FileStore(tmp_path).save(State("a bystander", id="other"))
    with _paused(tmp_path, "s", "create") as proc:
        assert len(_leftovers(tmp_path)) == 1
        assert FileStore(tmp_path).sweep() == []
        with ThreadPoolExecutor(1) as pool:
            purge = pool.submit(FileStore(tmp_path).delete, "s", purge=True)
            time.sleep(0.3)
            assert not purge.done()  # waiting for the writer's lock
            sigkill(proc)
            report = purge.result(timeout=30)
    assert (report.leftovers, report.files) == (1, 2), report
    assert _everything(tmp_path) == ["other", "other/entries.jsonl", "other/snapshot.json"]


@pytest.mark.crash
def test_a_store_sweeps_killed_creates_and_deletes_at_its_first_write_and_at_delete(
    tmp_path: Path,
) -> None:
    FileStore(tmp_path).save(State("t", id="gone"))
    with _paused(tmp_path, "half", "create") as proc:
        sigkill(proc)
    with _paused(tmp_path, "gone", "delete") as proc:  # it would sweep after its own delete
        sigkill(proc)
    assert len(_leftovers(tmp_path)) == 2
    store = FileStore(tmp_path)
    store.list()  # a read removes nothing
    assert len(_leftovers(tmp_path)) == 2
    store.save(State("t", id="next"))  # the first write of this store object sweeps
    assert _leftovers(tmp_path) == []

    store.save(State("t", id="again"))
    with _paused(tmp_path, "again", "delete") as proc:
        sigkill(proc)
    assert len(_leftovers(tmp_path)) == 1
    store.save(State("t", id="later"))  # only the first write of a store object sweeps
    assert len(_leftovers(tmp_path)) == 1
    store.delete("next")  # a delete sweeps
    assert _leftovers(tmp_path) == []


def test_without_locks_only_old_leftovers_are_swept(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    store._unlockable = True  # as where flock is refused
    young = tmp_path / ".young.0123456789ab.deleted"
    old = tmp_path / ".old.0123456789ab.new"
    for folder in (young, old):
        folder.mkdir()
        (folder / "entries.jsonl").write_text("{}\n")
    past = time.time() - filestore_module.UNLOCKED_LEFTOVER_AGE - 5
    os.utime(old, (past, past))
    assert store.sweep() == [old]
    assert young.exists() and not old.exists()


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


@pytest.mark.crash
def test_random_kills_of_a_churning_writer_leave_nothing_a_sweep_does_not_remove(
    tmp_path: Path,
) -> None:
    rng = random.Random(9)
    store = FileStore(tmp_path)
    for _ in range(20):
        with child(WRITER, "churn", tmp_path) as proc:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
            time.sleep(rng.uniform(0, 0.2))
            sigkill(proc)
        store.sweep()
        assert _leftovers(tmp_path) == []
        for saved in store.list():  # every State left is whole
            assert store.load(saved.id).task.startswith("churned")
    assert len(store.list()) > 20
