"""Which snapshot version a store object's next save replaces (its If-Match baseline), when the
same store object also serves loads: a monitor, a resume, a serverless handler on warm
instances."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import pytest

from alpineagents import _saving
from alpineagents.errors import ConcurrentWriteError
from alpineagents.state import State
from alpineagents.store import dumps
from alpineagents.testing import StoreIO
from alpineagents.testing._store_suite import make_entries
from alpineagents_s3 import S3Store
from tests.s3.conftest import MakeBucket
from tests.s3.faults import play
from tests.s3.test_orphans import entry_key
from tests.s3.test_protocol import tool_turn

if TYPE_CHECKING:
    from types_boto3_s3 import S3Client

both_modes = pytest.mark.parametrize("mode", ["sync", "async"])


def new_store(url: str, bucket: str, **options: Any) -> S3Store:
    return S3Store(bucket, "runs", endpoint_url=url, **options)


@both_modes
def test_a_monitors_load_does_not_let_the_run_overwrite_another_writer(
    mode: str, moto_url: str, moto_bucket: MakeBucket
) -> None:
    bucket = moto_bucket()
    store = new_store(moto_url, bucket)  # the run's store, also used by a monitor

    async def scenario(io: StoreIO) -> None:
        run = State("watched", id="w")
        await io.save(run)
        tool_turn(run, 1)
        await io.save(run)
        other = StoreIO(new_store(moto_url, bucket), io.mode)  # a second process
        try:
            theirs = await other.load("w")
            theirs.add_user_message("from the other process")
            theirs.data = {"by": "other"}
            await other.save(theirs)
        finally:
            await other.close()

        seen = await io.load("w")  # the monitor, on the run's store object
        assert [e.text for e in seen.history][-1] == "from the other process"
        # The run's older copy saves a new entry. (A save of `data` alone carries no seq:
        # the snapshot is opaque to the plugin, so such a save from an older copy through the
        # monitor's store object is not told apart from the loaded copy's; see docs/s3.md.)
        run.add_user_message("from the run")
        with pytest.raises(ConcurrentWriteError, match=r"'w'.*since this copy.*entry 3") as e:
            await io.save(run)
        assert "store.load('w')" in str(e.value)
        with pytest.raises(ConcurrentWriteError):
            await io.save(run)  # and again: never a silent overwrite

        # The other process's save is whole; a fresh load continues from it.
        fresh = await io.load("w")
        assert fresh.data == {"by": "other"} and fresh.history == seen.history
        fresh.add_user_message("continued")
        assert await io.save(fresh) is True

    play(store, mode, scenario)
    with new_store(moto_url, bucket) as reader:
        assert [e.text for e in reader.load("w").history][-2:] == [
            "from the other process",
            "continued",
        ]


@both_modes
def test_a_monitors_load_does_not_disturb_the_run(
    mode: str, moto_url: str, moto_bucket: MakeBucket
) -> None:
    store = new_store(moto_url, moto_bucket())

    async def scenario(io: StoreIO) -> None:
        run = State("watched", id="w")
        await io.save(run)
        for n in range(3):
            seen = await io.load("w")
            assert seen.history == run.history
            tool_turn(run, n)
            run.data = {"turn": n}
            assert await io.save(run) is True
        assert (await io.load("w")).data == {"turn": 2}

    play(store, mode, scenario)


@both_modes
def test_warm_instances_taking_turns_each_load_and_continue(
    mode: str, moto_url: str, moto_bucket: MakeBucket
) -> None:
    """A serverless handler with a module-level store, on two warm instances: each event
    loads the State and saves it, whichever instance saved last."""
    bucket = moto_bucket()
    first, second = new_store(moto_url, bucket), new_store(moto_url, bucket)

    async def scenario(io: StoreIO) -> None:
        other = StoreIO(second, io.mode)
        try:
            await io.save(State("handed around", id="h"))
            for n, instance in enumerate([other, io, other, io, io, other]):
                state = await instance.load("h")
                if n == 4:
                    state.data = {"only": "data"}  # a save that adds no entry
                else:
                    state.add_user_message(f"event {n}")
                assert await instance.save(state) is True
        finally:
            await other.close()
        final = await io.load("h")
        assert [e.text for e in final.history][1:] == [f"event {n}" for n in (0, 1, 2, 3, 5)]
        assert final.data == {"only": "data"}

    play(first, mode, scenario)


@both_modes
def test_a_reload_on_the_same_store_object_sees_orphans_left_since(
    mode: str, moto_url: str, moto_bucket: MakeBucket, moto: S3Client
) -> None:
    """Another instance loaded the State and was killed during its next save's entry PUTs: the
    snapshot is the one this store object wrote, and orphans lie beyond its history."""
    bucket = moto_bucket()
    store = new_store(moto_url, bucket)

    async def scenario(io: StoreIO) -> None:
        state = State("handed around", id="h")
        await io.save(state)
        killed = make_entries(0, 3, "from the killed instance")[2]
        moto.put_object(Bucket=bucket, Key=entry_key(moto, bucket, "h", 2), Body=dumps(killed))
        again = await io.load("h")  # the same snapshot as this store object's own save
        assert again.history == state.history
        tool_turn(again, 1)  # seqs 1 and 2
        assert await io.save(again) is True
        assert (await io.load("h")).history == again.history

    play(store, mode, scenario)


def test_a_load_racing_the_runs_own_save_does_not_roll_its_baseline_back(
    moto_url: str, moto_bucket: MakeBucket
) -> None:
    """A monitor thread's load fetches the snapshot, then the run saves, then the load ends:
    the load must not make the version it fetched (older than the run's save) the baseline."""
    bucket = moto_bucket()
    fetched, saved = threading.Event(), threading.Event()
    armed: list[bool] = []

    def hold_snapshot_get(parsed: dict[str, Any], **kwargs: Any) -> None:
        if armed and "alpineagents-generation" in parsed.get("Metadata", {}):
            armed.clear()
            fetched.set()
            assert saved.wait(10)

    store = new_store(moto_url, bucket, event_hooks={"after-call.s3.GetObject": hold_snapshot_get})
    run = State("raced", id="r")
    _saving.save(store, run)
    run.data = {"n": 1}
    _saving.save(store, run)

    armed.append(True)
    monitor = threading.Thread(target=store.load, args=("r",))
    monitor.start()
    assert fetched.wait(10)
    run.data = {"n": 2}
    _saving.save(store, run)  # while the load holds the version before it
    saved.set()
    monitor.join(10)

    run.data = {"n": 3}
    assert _saving.save(store, run) is True  # not ConcurrentWriteError
    assert store.load("r").data == {"n": 3}
    store.close()
