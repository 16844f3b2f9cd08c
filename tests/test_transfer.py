"""alpineagents.transfer: copy, move, export and import States between FileStore and S3Store.

S3Store runs against moto's real HTTP server in this process (the ``bucket`` fixture); the
crash tests copy in a real subprocess that is killed with SIGKILL halfway, then run the copy
again to completion.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from alpineagents import Agent, FileStore, State, Store, open_store
from alpineagents.errors import (
    CorruptStateError,
    SchemaVersionError,
    StateExistsError,
    StateNotFoundError,
)
from alpineagents.testing import TestModel
from alpineagents.transfer import (
    EXPORT_FORMAT,
    TransferConflictError,
    Transferred,
    acopy_states,
    aexport_state,
    aimport_state,
    amove_states,
    copy_states,
    export_state,
    import_state,
    move_states,
)
from tests.corrupt_cases import CASES, ID, Case, case_id, damage, saved_state
from tests.helpers import make_states

REPO = Path(__file__).resolve().parents[1]


StoreFactory = Callable[[str], Store]


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.server)])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    """Makes stores of one kind: ``make_store("a")`` is a folder or a prefix named ``a``."""
    opened: list[Store] = []

    def make(name: str) -> Store:
        if request.param == "file":
            store = open_store(str(tmp_path / name))
        else:
            store = open_store(f"s3://{request.getfixturevalue('bucket')}/{name}")
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


def same_state(a: Store, b: Store, state_id: str) -> None:
    one, two = a.load(state_id), b.load(state_id)
    assert (one.task, one.data, one.stopped_by, one.answer) == (
        two.task,
        two.data,
        two.stopped_by,
        two.answer,
    )
    assert [(e.seq, e.kind, e.text, e.data) for e in one.history] == [
        (e.seq, e.kind, e.text, e.data) for e in two.history
    ]


# Copy -------------------------------------------------------------------------------------


def test_copy_all_then_again_is_identical(make_store: StoreFactory, tmp_path: Path) -> None:
    src, dst = make_store("src"), FileStore(tmp_path / "dst")
    ids = make_states(src, 3)
    seen: list[tuple[str, int, int]] = []
    done = copy_states(src, dst, progress=lambda t, n, total: seen.append((t.id, n, total)))
    assert sorted(t.id for t in done) == ids
    assert {t.action for t in done} == {"copied"}
    assert all(t.entries == 5 and not t.removed for t in done)
    assert [(n, total) for _, n, total in seen] == [(1, 3), (2, 3), (3, 3)]
    for state_id in ids:
        same_state(src, dst, state_id)
    again = copy_states(src, dst)
    assert {t.action for t in again} == {"identical"}


def test_copy_into_s3_and_back(make_store: StoreFactory, bucket: str) -> None:
    src = make_store("src")
    ids = make_states(src, 2)
    s3 = open_store(f"s3://{bucket}/archive")
    try:
        copy_states(src, s3, [ids[1]])
        assert [s.id for s in s3.list()] == [ids[1]]
        same_state(src, s3, ids[1])
        back = make_store("back")
        assert copy_states(s3, back)[0].action == "copied"
        same_state(src, back, ids[1])
    finally:
        s3.close()


def test_a_copied_state_continues_in_its_new_store(make_store: StoreFactory) -> None:
    src, dst = make_store("src"), make_store("dst")
    Agent(TestModel(answer="first"), store=src).run(State("ask me", id="asking"))
    copy_states(src, dst, ["asking"])
    loaded = dst.load("asking")
    loaded.add_user_message("and one more thing")
    Agent(TestModel(answer="done"), store=dst).run(loaded)
    assert dst.load("asking").answer == "done"
    assert src.load("asking").answer != "done"  # the source is untouched


def test_a_different_state_under_the_same_id_is_refused(make_store: StoreFactory) -> None:
    src, dst = make_store("src"), make_store("dst")
    make_states(src, 2)
    other = State("something else", id="run-1")
    Agent(TestModel(answer="other"), store=dst).run(other)
    with pytest.raises(TransferConflictError) as refused:
        copy_states(src, dst)
    message = str(refused.value)
    assert "'run-1'" in message and repr(src) in message and repr(dst) in message
    assert isinstance(refused.value, StateExistsError) and isinstance(refused.value, ValueError)
    assert dst.load("run-1").answer == "other"

    kept = copy_states(src, dst, on_exists="skip")
    # list() is newest first: run-1 was refused before run-0 was copied.
    assert {t.id: t.action for t in kept} == {"run-0": "copied", "run-1": "kept"}
    assert dst.load("run-1").answer == "other"

    replaced = copy_states(src, dst, on_exists="overwrite")
    assert {t.id: t.action for t in replaced} == {"run-0": "identical", "run-1": "replaced"}
    same_state(src, dst, "run-1")


def test_unknown_ids_same_store_and_bad_options(make_store: StoreFactory) -> None:
    src, dst = make_store("src"), make_store("dst")
    make_states(src, 1)
    with pytest.raises(StateNotFoundError, match="'nope'"):
        copy_states(src, dst, ["run-0", "nope"])
    assert [s.id for s in dst.list()] == ["run-0"]  # what was copied before stays
    with pytest.raises(ValueError, match="onto itself"):
        copy_states(src, make_store("src"))
    with pytest.raises(ValueError, match="on_exists"):
        copy_states(src, dst, on_exists="replace")  # type: ignore[arg-type]


# Move -------------------------------------------------------------------------------------


def test_move_deletes_the_source_only_after_the_copy(make_store: StoreFactory) -> None:
    src, dst = make_store("src"), make_store("dst")
    make_states(src, 3)
    Agent(TestModel(answer="other"), store=dst).run(State("else", id="run-2"))
    moved = move_states(src, dst, on_exists="skip")
    assert {(t.id, t.action, t.removed) for t in moved} == {
        ("run-0", "copied", True),
        ("run-1", "copied", True),
        ("run-2", "kept", False),
    }
    assert [s.id for s in src.list()] == ["run-2"]  # kept in dst, so kept in src too
    assert {s.id for s in dst.list()} == {"run-0", "run-1", "run-2"}


def test_move_after_a_copy_removes_what_the_destination_has(make_store: StoreFactory) -> None:
    src, dst = make_store("src"), make_store("dst")
    make_states(src, 2)
    copy_states(src, dst)  # as if a move was killed before its deletes
    moved = move_states(src, dst)
    assert {(t.action, t.removed) for t in moved} == {("identical", True)}
    assert src.list() == []


def test_move_refuses_to_delete_when_the_destination_does_not_read_back(tmp_path: Path) -> None:
    class Lossy(FileStore):
        def read(self, state_id: str) -> Any:
            record = super().read(state_id)
            if record is not None and len(record.entries) > 1:
                return type(record)(list(record.entries)[:-1], record.snapshot)
            return record

    src = FileStore(tmp_path / "src")
    make_states(src, 1)
    dst = Lossy(tmp_path / "dst")
    with pytest.raises(CorruptStateError, match="not removed from"):
        move_states(src, dst)
    assert [s.id for s in src.list()] == ["run-0"]


# Async twins ------------------------------------------------------------------------------


async def test_async_copy_and_move(make_store: StoreFactory) -> None:
    src, dst, archive = make_store("src"), make_store("dst"), make_store("archive")
    ids = await asyncio.to_thread(make_states, src, 2)
    copied = await acopy_states(src, dst)
    assert sorted((t.id, t.action) for t in copied) == [(i, "copied") for i in ids]
    assert {t.action for t in await acopy_states(src, dst)} == {"identical"}
    moved = await amove_states(dst, archive, [ids[0]])
    assert [(t.id, t.removed) for t in moved] == [(ids[0], True)]
    assert [s.id for s in await dst.alist()] == [ids[1]]
    await asyncio.to_thread(same_state, src, archive, ids[0])
    for store in (src, dst, archive):
        await store.aclose()


# Export and import ------------------------------------------------------------------------


def test_export_import_round_trip(make_store: StoreFactory) -> None:
    src, dst = make_store("src"), make_store("dst")
    make_states(src, 1)
    document = export_state(src, "run-0")
    assert document["format"] == EXPORT_FORMAT and document["version"] == 1
    assert document["id"] == "run-0"
    assert [e["seq"] for e in document["entries"]] == [0, 1, 2, 3, 4]
    text = json.dumps(document)
    assert import_state(dst, text) == Transferred("run-0", "copied", 5)
    same_state(src, dst, "run-0")
    assert import_state(dst, document).action == "identical"

    changed = json.loads(text)
    changed["snapshot"]["data"] = {"i": 99}
    with pytest.raises(TransferConflictError, match=r"'run-0'.*backup\.json"):
        import_state(dst, changed, where="backup.json")
    assert import_state(dst, changed, on_exists="skip").action == "kept"
    assert import_state(dst, changed, on_exists="overwrite").action == "replaced"
    assert dst.load("run-0").data == {"i": 99}
    with pytest.raises(StateNotFoundError):
        export_state(src, "nope")


async def test_async_export_import(make_store: StoreFactory) -> None:
    src, dst = make_store("src"), make_store("dst")
    await asyncio.to_thread(make_states, src, 1)
    document = await aexport_state(src, "run-0")
    assert (await aimport_state(dst, document)).action == "copied"
    await asyncio.to_thread(same_state, src, dst, "run-0")
    await src.aclose()
    await dst.aclose()


@pytest.mark.parametrize(
    ("document", "error", "match"),
    [
        ("not json", CorruptStateError, "is not JSON"),
        ('{"format": "other"}', CorruptStateError, "not an exported alpineagents State"),
        (
            '{"format": "alpineagents.state", "version": 2}',
            SchemaVersionError,
            "version 2, newer",
        ),
        ('{"format": "alpineagents.state", "version": 1}', CorruptStateError, "no State id"),
        (
            '{"format": "alpineagents.state", "version": 1, "id": "x", "entries": [{}]}',
            CorruptStateError,
            r"State 'x' in in\.json, the history entry read at position 0: seq must be an int",
        ),
        (
            '{"format": "alpineagents.state", "version": 1, "id": "x", "entries": [{"seq": 0}]}',
            CorruptStateError,
            "no snapshot",
        ),
    ],
)
def test_import_refuses_what_is_not_an_export(
    tmp_path: Path, document: str, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        import_state(FileStore(tmp_path), document, where="in.json")
    assert not tmp_path.joinpath("x").exists()


def damaged_export(case: Case, folder: Path) -> dict[str, Any]:
    """The export of ``tests.corrupt_cases.saved_state()`` with one field damaged."""
    source = FileStore(folder)
    source.save(saved_state())
    document = export_state(source, ID)
    what, path, value, _ = case
    if what == "snapshot":
        document["snapshot"] = damage(document["snapshot"], path, value)
    else:
        assert isinstance(what, int)
        document["entries"][what] = damage(document["entries"][what], path, value)
    return document


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_import_refuses_a_damaged_state_and_writes_nothing(tmp_path: Path, case: Case) -> None:
    document = damaged_export(case, tmp_path / "source")
    store = FileStore(tmp_path / "target")
    with pytest.raises(CorruptStateError) as raised:
        import_state(store, json.dumps(document), where="backup.json")
    message = str(raised.value)
    assert message.startswith(f"State {ID!r} in backup.json, "), message
    assert re.search(case[3], message), message
    assert store.read(ID) is None and not store.path.exists()


async def test_a_damaged_import_leaves_the_state_it_would_overwrite(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    store = make_store("dst")
    kept = saved_state()
    await asyncio.to_thread(store.save, kept)
    document = damaged_export((3, ("data", "call_id"), 7, ""), tmp_path / "one")
    with pytest.raises(
        CorruptStateError, match=r"history entry 3 \(tool_result\): data\['call_id'\]"
    ):
        await aimport_state(store, document, on_exists="overwrite")
    with pytest.raises(CorruptStateError, match="snapshot: created_at must be"):
        import_state(store, damaged_export(CASES[0], tmp_path / "two"), on_exists="overwrite")
    assert (await store.aload(ID)).history == kept.history
    await store.aclose()


# Killed halfway ---------------------------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from alpineagents import open_store
    from alpineagents.transfer import copy_states

    src_url, dst_url, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
    puts = 0

    def hook(**kwargs):
        global puts
        puts += 1
        if puts == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    options = {"event_hooks": {"before-send.s3.PutObject": hook}} if kill_at else {}
    copy_states(open_store(src_url), open_store(dst_url, **options))
    print("finished")
    """
)


def run_copy(src_url: str, dst_url: str, kill_at: int = 0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CHILD, src_url, dst_url, str(kill_at)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
@pytest.mark.crash
@pytest.mark.parametrize("kill_at", [3, 14])
def test_a_copy_into_s3_killed_halfway_finishes_when_run_again(
    tmp_path: Path, bucket: str, kill_at: int
) -> None:
    """SIGKILL at the kill_at-th PUT: inside a State's entries, before its snapshot."""
    src = FileStore(tmp_path / "src")
    ids = make_states(src, 5)
    dst_url = f"s3://{bucket}/copy"
    killed = run_copy(str(src.path), dst_url, kill_at)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    dst = open_store(dst_url)
    try:
        partial = {s.id for s in dst.list()}
        assert partial < set(ids)
        done = run_copy(str(src.path), dst_url)
        assert done.returncode == 0, done.stderr
        assert "finished" in done.stdout
        assert {s.id for s in dst.list()} == set(ids)
        for state_id in ids:
            same_state(src, dst, state_id)
        assert {t.action for t in copy_states(src, dst)} == {"identical"}
    finally:
        dst.close()


@pytest.mark.slow
@pytest.mark.crash
def test_a_copy_between_folders_killed_at_a_random_point_finishes(tmp_path: Path) -> None:
    src, dst = FileStore(tmp_path / "src"), FileStore(tmp_path / "dst")
    ids = make_states(src, 120)  # enough that the copy is still running at the 10th
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(src.path), str(dst.path), "0"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while len(dst.list()) < 10 and time.monotonic() < deadline and child.poll() is None:
        time.sleep(0.005)
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert len(dst.list()) < len(ids), "the copy finished before it could be killed"
    done = run_copy(str(src.path), str(dst.path))
    assert done.returncode == 0, done.stderr
    assert sorted(s.id for s in dst.list()) == sorted(ids)
    for state_id in ids:
        same_state(src, dst, state_id)
