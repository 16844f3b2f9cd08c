"""Two processes, one State: a second writer is refused and nothing saved is lost; and which
snapshot version a store object's next save replaces (its If-Match baseline) when the same
store object also serves loads: a monitor, a resume, a serverless handler on warm instances."""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Any

import pytest

from alpineagents import State
from alpineagents.errors import ConcurrentWriteError, StateExistsError
from alpineagents_s3 import S3Store
from alpineagents_s3.testing import RequestLog
from tests.helpers import MakeBucket, Mode, entry_dicts, snapshot_dict, tool_turn
from tests.s3.helpers import Stores, objects

if TYPE_CHECKING:
    pass


def new_store(url: str, bucket: str, **options: Any) -> S3Store:
    return S3Store(bucket, "runs", endpoint_url=url, **options)


# A second writer ---------------------------------------------------------------------------


async def test_a_second_writer_is_refused_and_what_is_saved_is_kept(
    mode: Mode, stores: Stores
) -> None:
    # Three store objects share nothing but the bucket: three processes.
    io, second_io, third_io = (stores.io(mode) for _ in range(3))
    state = State("shared", id="shared")
    await io.save(state)
    theirs = await second_io.load("shared")  # another process resumes it
    stale = await third_io.load("shared")  # and a third one
    theirs.add_user_message("from the second process")
    await second_io.save(theirs)

    # Same seq, different entry: refused while writing the entries.
    state.add_user_message("from the first process")
    with pytest.raises(ConcurrentWriteError, match=r"State 'shared' in s3://.*another writer"):
        await io.save(state)
    # A snapshot-only change from a stale copy: refused by If-Match.
    # (Rebound, not mutated: after load, state.data is the same dict as the core's
    # record of the saved snapshot, so a mutation looks like no change at all.)
    stale.data = {"stale": True}
    with pytest.raises(ConcurrentWriteError, match="'shared'") as refused:
        await third_io.save(stale)
    assert "store.load('shared')" in str(refused.value)
    with pytest.raises(ConcurrentWriteError):
        await third_io.save(stale)  # and again: never a silent overwrite

    saved = await io.load("shared")
    assert [e.text for e in saved.history] == ["shared", "from the second process"]
    assert saved.data == {}
    # Loading again is how to continue: the new copy saves.
    saved.add_user_message("continued")
    assert await io.save(saved) is True


async def test_a_state_deleted_by_another_process_is_key_error_on_write(
    mode: Mode, stores: Stores
) -> None:
    ours, theirs = stores.io(mode), stores.new()
    state = State("gone", id="gone")
    await ours.save(state)
    await asyncio.to_thread(theirs.delete, "gone")
    state.data["x"] = 1
    with pytest.raises(KeyError, match="gone"):
        await ours.save(state)


def test_a_create_by_another_store_object_with_the_same_content_is_refused(
    moto_url: str, moto_bucket: MakeBucket
) -> None:
    """Only this store object's own PUTs count as "ours": another one is a second writer."""
    bucket = moto_bucket()
    entries, snapshot = entry_dicts(0, 3), snapshot_dict("twice", 3)
    with new_store(moto_url, bucket) as first, new_store(moto_url, bucket) as second:
        first.write("twice", entries, snapshot, create=True)
        with pytest.raises(StateExistsError):
            second.write("twice", entries, snapshot, create=True)


async def test_a_refused_create_leaves_nothing_behind(mode: Mode, stores: Stores) -> None:
    io = stores.io(mode)
    await io.write("taken", entry_dicts(0, 2, "first"), snapshot_dict("taken", 2), create=True)
    before = await objects(io, "taken")
    with pytest.raises(StateExistsError, match=r"'taken'.*store\.load"):
        await io.write("taken", entry_dicts(0, 5, "second"), snapshot_dict("taken", 5), create=True)
    assert await objects(io, "taken") == before


# One store object serving loads and saves --------------------------------------------------


async def test_a_monitors_load_does_not_let_the_run_overwrite_another_writer(
    mode: Mode, stores: Stores
) -> None:
    io = stores.io(mode)  # the run's store, also used by a monitor
    run = State("watched", id="w")
    await io.save(run)
    tool_turn(run, 1)
    await io.save(run)
    other = stores.io(mode)  # a second process
    theirs = await other.load("w")
    theirs.add_user_message("from the other process")
    theirs.data = {"by": "other"}
    await other.save(theirs)

    seen = await io.load("w")  # the monitor, on the run's store object
    assert [e.text for e in seen.history][-1] == "from the other process"
    # The run's older copy saves a new entry. (A save of `data` alone carries no seq:
    # the snapshot is opaque to the plugin, so such a save from an older copy through the
    # monitor's store object is not told apart from the loaded copy's; see docs/s3.md.)
    run.add_user_message("from the run")
    with pytest.raises(ConcurrentWriteError, match=r"'w'.*since this process.*entry 3") as e:
        await io.save(run)
    assert "store.load('w')" in str(e.value)
    with pytest.raises(ConcurrentWriteError):
        await io.save(run)  # and again: never a silent overwrite

    # The other process's save is whole; a fresh load continues from it.
    fresh = await io.load("w")
    assert fresh.data == {"by": "other"} and fresh.history == seen.history
    fresh.add_user_message("continued")
    assert await io.save(fresh) is True

    reader = stores.io(mode)
    assert [e.text for e in (await reader.load("w")).history][-2:] == [
        "from the other process",
        "continued",
    ]


async def test_a_monitors_load_does_not_disturb_the_run(mode: Mode, stores: Stores) -> None:
    io = stores.io(mode)
    run = State("watched", id="w")
    await io.save(run)
    for n in range(3):
        seen = await io.load("w")
        assert seen.history == run.history
        tool_turn(run, n)
        run.data = {"turn": n}
        assert await io.save(run) is True
    assert (await io.load("w")).data == {"turn": 2}


async def test_warm_instances_taking_turns_each_load_and_continue(
    mode: Mode, stores: Stores
) -> None:
    """A serverless handler with a module-level store, on two warm instances: each event
    loads the State and saves it, whichever instance saved last."""
    io, other = stores.io(mode), stores.io(mode)
    await io.save(State("handed around", id="h"))
    for n, instance in enumerate([other, io, other, io, io, other]):
        state = await instance.load("h")
        if n == 4:
            state.data = {"only": "data"}  # a save that adds no entry
        else:
            state.add_user_message(f"event {n}")
        assert await instance.save(state) is True
    final = await io.load("h")
    assert [e.text for e in final.history][1:] == [f"event {n}" for n in (0, 1, 2, 3, 5)]
    assert final.data == {"only": "data"}


def test_a_load_racing_the_runs_own_save_does_not_roll_its_baseline_back(
    moto_url: str, moto_bucket: MakeBucket
) -> None:
    """A monitor thread's load fetches the snapshot, then the run saves, then the load ends:
    the load must not make the version it fetched (older than the run's save) the baseline."""
    bucket = moto_bucket()
    fetched, saved = threading.Event(), threading.Event()
    armed: list[bool] = []

    heads = threading.local()

    def note_head_get(request: Any, **kwargs: Any) -> None:
        heads.head = "/heads/" in request.url

    def hold_head_get(**kwargs: Any) -> None:  # answered (200, or 304 for a head held)
        if armed and getattr(heads, "head", False):
            armed.clear()
            fetched.set()
            assert saved.wait(10)

    hooks = {"before-send.s3.GetObject": note_head_get, "after-call.s3.GetObject": hold_head_get}
    store = new_store(moto_url, bucket, event_hooks=hooks)
    run = State("raced", id="r")
    store.save(run)
    run.data = {"n": 1}
    store.save(run)

    armed.append(True)
    monitor = threading.Thread(target=store.load, args=("r",))
    monitor.start()
    assert fetched.wait(10)
    run.data = {"n": 2}
    store.save(run)  # while the load holds the version before it
    saved.set()
    monitor.join(10)

    run.data = {"n": 3}
    assert store.save(run) is True  # not ConcurrentWriteError
    assert store.load("r").data == {"n": 3}
    store.close()


def test_a_concurrent_create_of_one_id_by_one_store_object_loses_as_any_creator(
    stores: Stores,
) -> None:
    """Two threads create one id through one store object at once: the saves of one State
    take turns in a process, so the second meets the first's head and loses as any other
    creator does (``StateExistsError``); the first's State is whole."""
    store = stores.new()
    outcomes: dict[int, BaseException | None] = {}
    start = threading.Barrier(2)

    def create(n: int) -> None:
        start.wait(10)
        try:
            store.write(
                "one-id",
                entry_dicts(0, 1, text=f"writer {n}"),
                snapshot_dict("one-id", 1),
                create=True,
            )
            outcomes[n] = None
        except BaseException as e:  # noqa: BLE001 - the outcome is the test's
            outcomes[n] = e

    threads = [threading.Thread(target=create, args=(n,)) for n in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    won = [n for n, outcome in outcomes.items() if outcome is None]
    lost = [outcome for outcome in outcomes.values() if outcome is not None]
    assert len(won) == 1 and len(lost) == 1, outcomes
    assert isinstance(lost[0], StateExistsError), outcomes
    record = stores.new().read("one-id")
    assert record is not None and record.entries == entry_dicts(0, 1, text=f"writer {won[0]}")


# A delete that saves overtake ---------------------------------------------------------------


@pytest.mark.parametrize("overtaken", [5, 6])
async def test_a_delete_overtaken_by_saves(mode: Mode, stores: Stores, overtaken: int) -> None:
    """Another process saves just before each of the delete's tombstone PUTs: the delete GETs
    the head again and puts its tombstone over the newer one, 6 tries in all. After 5 saves
    it wins and removes what they made too; after 6 it stops with ConcurrentWriteError and
    the State, with every save, is as its writer left it."""
    writer = stores.new()
    state = State("busy", id="busy")
    writer.save(state)
    saves = 0

    def save_first(params: dict[str, Any], **kwargs: Any) -> None:
        nonlocal saves
        tombstone = params["headers"].get("x-amz-meta-alpineagents-s3") == "tombstone"
        if tombstone and saves < overtaken:
            saves += 1
            tool_turn(state, saves)
            writer.save(state)  # another process: its own memory and client

    deleter = stores.io(mode, event_hooks={"before-call.s3.PutObject": save_first})
    if overtaken == 6:
        with pytest.raises(ConcurrentWriteError, match=r"'busy' in s3://.* saved 6 times"):
            await deleter.delete_with("busy")
        loaded = await stores.io(mode).load("busy")
        assert loaded.history == state.history and len(state.history) == 13
    else:
        assert await deleter.delete_with("busy") is not None
        assert saves == 5
        assert await stores.io(mode).get("busy") is None
        assert [o.role for o in await objects(deleter, "busy")] == ["tombstone"]
        tool_turn(state, 9)
        with pytest.raises(KeyError, match="busy"):
            writer.save(state)


async def test_a_refused_update_deletes_the_entry_objects_it_wrote(
    mode: Mode, stores: Stores
) -> None:
    io, other = stores.io(mode), stores.io(mode)
    state = State("shared", id="refused")
    await io.save(state)
    theirs = await other.load("refused")
    theirs.add_user_message("theirs")
    await other.save(theirs)
    before = await objects(io, "refused")
    for n in range(3):
        tool_turn(state, n)  # 6 entries this save would add
    with pytest.raises(ConcurrentWriteError, match=r"nothing of this save was kept"):
        await io.save(state)
    after = await objects(io, "refused")
    assert [o.role for o in after if o.role == "unnamed"] == []
    assert [o.key for o in after] == [o.key for o in before]


async def test_a_copy_from_elsewhere_must_send_its_last_stored_entry_again(
    mode: Mode, stores: Stores
) -> None:
    """A process that never read the State: its save must show that its copy is the stored
    one (docs/s3.md, "Two processes, one State")."""
    await stores.io(mode).write(
        "handed", entry_dicts(0, 3), snapshot_dict("handed", 3), create=True
    )
    before = await stores.keys()
    elsewhere = stores.io(mode)  # never read it
    with pytest.raises(ConcurrentWriteError, match=r"Load it \(store\.load\('handed'\)\)"):
        await elsewhere.write("handed", entry_dicts(3, 4), snapshot_dict("handed", 4))
    assert await stores.keys() == before  # nothing was written
    # Different content at the last stored seq is a second writer's.
    with pytest.raises(ConcurrentWriteError, match=r"its entry 2 is not the one"):
        await stores.io(mode).write(
            "handed", entry_dicts(2, 4, "other"), snapshot_dict("handed", 4)
        )
    assert await stores.keys() == before
    # The last stored entry sent again, identical: skipped, and the save goes on from it.
    await stores.io(mode).write("handed", entry_dicts(2, 4), snapshot_dict("handed", 4))
    record = await stores.io(mode).read("handed")
    assert record is not None and [e["seq"] for e in record.entries] == [0, 1, 2, 3]


async def test_an_old_copy_of_a_state_deleted_and_made_again_is_refused(
    mode: Mode, stores: Stores
) -> None:
    """The id deleted and made again, shorter, while an old copy still runs: the old copy's
    save would continue past the new State's entries (invariant 6). It is refused, and the new
    State is kept as it is."""
    first, old = stores.io(mode), stores.io(mode)
    await first.write("again", entry_dicts(0, 10), snapshot_dict("again", 10), create=True)
    await old.read("again")  # the old copy's process
    await first.delete("again")
    await first.write("again", entry_dicts(0, 2, "new"), snapshot_dict("again", 2), create=True)
    made_again = await stores.io(mode).read("again")
    with pytest.raises(ConcurrentWriteError):
        await old.write("again", entry_dicts(9, 11), snapshot_dict("again", 11))
    assert await stores.io(mode).read("again") == made_again
    roles = [o.role for o in await objects(first, "again")]
    assert "unnamed" not in roles


async def test_a_load_that_finds_a_part_packed_away_reads_the_head_again(
    mode: Mode, stores: Stores
) -> None:
    """Another process's save packs the parts a load is fetching (invariant 8): the load reads
    the head again and returns what that head names, whole."""
    writer = stores.new()
    writer.write("packing", entry_dicts(0, 15), snapshot_dict("packing", 15), create=True)
    lock, done = threading.Lock(), list[bool]()

    def pack_meanwhile(params: dict[str, Any], **kwargs: Any) -> None:
        if "/states/" not in params["url"]:
            return
        with lock:
            if not done:  # the 16th entry: the save packs 16 entry objects into a segment
                writer.write("packing", entry_dicts(15, 16), snapshot_dict("packing", 16))
                done.append(True)

    log = RequestLog()
    reader = stores.io(mode, event_hooks={"before-call.s3.GetObject": pack_meanwhile, **log.hooks})
    record = await reader.read("packing")
    assert done and record is not None
    assert [e["seq"] for e in record.entries] == list(range(16))
    heads = [r for r in log.requests if r.path.endswith("/heads/packing.json")]
    assert len(heads) == 2  # read again after a part was gone
