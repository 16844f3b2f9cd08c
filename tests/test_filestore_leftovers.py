"""FileStore's leftovers of killed processes: a killed create, delete or snapshot write leaves
a hidden folder or file that a sweep removes, but never while its writer lives; a purge waits
for a writer under way; without locks only old leftovers go. Every process here is real
(tests/scripts/fs_writer.py), killed with SIGKILL."""

from __future__ import annotations

import os
import random
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest

from alpineagents import FileStore, State
from alpineagents import filestore as filestore_module
from tests.scripts.harness import child, sigkill

pytestmark = pytest.mark.slow

WRITER = "fs_writer.py"

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
