"""A load holds the garbage collector's pause from its segment GETs to its end (``_gc.hold``).

What could break, and is tried here: a collection between the segments' parse and the core's
rebuild, or during the rebuild, all the same (the hold not begun, or ended early by a parse's
own pause); the collector left off after a load, after a load the core refuses, after a read
outside a load (no scope: the hold must not begin), after two loads in two threads that end
in either order; a load that reads no segment holding it anyway; a program's own choice to
turn it off undone; a child forked in the middle of a hold left with it off, or its scope's
end counting below zero.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import threading
from typing import Any

import pytest

from alpineagents import CorruptStateError, State
from alpineagents.store import Store
from alpineagents_s3 import _gc
from tests.helpers import Mode
from tests.s3.helpers import Stores, load, pack, run, save


@pytest.fixture(autouse=True)
def _collector_as_found() -> Any:
    was_on = gc.isenabled()
    yield
    (gc.enable if was_on else gc.disable)()
    assert _gc._PAUSE.depth == 0


# The hold alone ---------------------------------------------------------------------------


def test_a_hold_lasts_until_its_scope_ends() -> None:
    assert gc.isenabled()
    with _gc.holding():
        assert gc.isenabled(), "no hold before a segment is fetched"
        _gc.hold()
        assert not gc.isenabled()
        _gc.hold()  # once a load
        assert _gc._PAUSE.depth == 1
        with _gc.paused():  # a segment's parse within it
            pass
        assert not gc.isenabled(), "a parse's pause ends inside the hold"
    assert gc.isenabled()
    assert _gc._PAUSE.depth == 0


def test_no_hold_outside_a_load() -> None:
    _gc.hold()
    assert gc.isenabled()
    assert _gc._PAUSE.depth == 0


def held_then_raises() -> None:
    with _gc.holding():
        _gc.hold()
        raise ValueError("boom")


def test_a_scope_that_raises_ends_its_hold() -> None:
    with pytest.raises(ValueError, match="boom"):
        held_then_raises()
    assert gc.isenabled()
    assert _gc._PAUSE.depth == 0


def test_nested_scopes_end_their_own_holds() -> None:
    with _gc.holding():
        _gc.hold()
        with _gc.holding():
            _gc.hold()
            assert _gc._PAUSE.depth == 2
        assert not gc.isenabled()
        assert _gc._PAUSE.depth == 1
        with _gc.holding():  # begins none
            pass
        assert _gc._PAUSE.depth == 1
    assert gc.isenabled()


def test_a_collector_turned_off_stays_off_after_a_hold() -> None:
    gc.disable()
    with _gc.holding():
        _gc.hold()
    assert not gc.isenabled()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="a platform that does not fork")
def test_a_child_forked_in_a_hold_runs_the_collector_and_ends_none() -> None:
    code = 0
    with _gc.holding():
        _gc.hold()
        pid = os.fork()
        if pid == 0:  # the child: the scope ends here too, but began no pause of this process
            code |= 0 if gc.isenabled() and _gc._PAUSE.depth == 0 else 1
            with _gc.holding():
                _gc.hold()
                code |= 0 if not gc.isenabled() else 2
            code |= 0 if gc.isenabled() and _gc._PAUSE.depth == 0 else 4
        else:
            _, status = os.waitpid(pid, 0)
            assert not gc.isenabled(), "the parent's hold is still under way"
    if pid == 0:
        os._exit(code | (0 if gc.isenabled() and _gc._PAUSE.depth == 0 else 8))
    assert os.WIFEXITED(status)
    assert os.WEXITSTATUS(status) == 0
    assert gc.isenabled()


# Loads through moto's server ------------------------------------------------------------------


class Rebuilds:
    """The core's rebuild of each load: whether the collector ran at its start and end, and
    the collections during it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, collections: list[int]) -> None:
        self.seen: list[tuple[bool, bool, int]] = []
        rebuild = Store._loaded

        def spied(store: Store, state_id: str, record: Any) -> State:
            before, on = len(collections), gc.isenabled()
            try:
                return rebuild(store, state_id, record)
            finally:
                self.seen.append((on, gc.isenabled(), len(collections) - before))

        monkeypatch.setattr(Store, "_loaded", spied)


async def packed_state(stores: Stores, mode: Mode, name: str, *, remove: bool = False) -> State:
    state = State("gc hold", id=f"{name}-{mode}")
    run(state, 70)  # over 128 KiB: packed, with an entry after its segment
    store = stores.new()
    await save(store, mode, state)
    await pack(store, mode, state.id, remove_entries=remove)
    return state


async def test_a_packed_load_rebuilds_with_no_collection(
    stores: Stores, mode: Mode, monkeypatch: pytest.MonkeyPatch, collections: list[int]
) -> None:
    state = await packed_state(stores, mode, "packed")
    rebuilds = Rebuilds(monkeypatch, collections)
    collections.clear()
    [{} for _ in range(200)]  # the thresholds set make collections at once, without a hold
    assert collections, "the control: the collector runs"
    loaded = await load(stores.new(), mode, state.id)
    assert [e.seq for e in loaded.history] == [e.seq for e in state.history]
    assert rebuilds.seen == [(False, False, 0)]
    assert gc.isenabled()
    assert _gc._PAUSE.depth == 0
    collections.clear()
    [{} for _ in range(200)]
    assert collections, "the collector runs again after the load"


async def test_a_load_that_reads_no_segment_holds_nothing(
    stores: Stores, mode: Mode, monkeypatch: pytest.MonkeyPatch, collections: list[int]
) -> None:
    state = State("gc hold", id=f"unpacked-{mode}")
    run(state, 5)
    await save(stores.new(), mode, state)
    rebuilds = Rebuilds(monkeypatch, collections)
    await load(stores.new(), mode, state.id)
    assert [(on, after) for on, after, _ in rebuilds.seen] == [(True, True)]


async def test_a_read_outside_a_load_does_not_hold(stores: Stores, mode: Mode) -> None:
    state = await packed_state(stores, mode, "read")
    store = stores.new()
    if mode == "async":
        record = await store.aread(state.id)
    else:
        record = await asyncio.to_thread(store.read, state.id)
    assert record is not None and len(record.entries) == len(state.history)
    assert gc.isenabled()
    assert _gc._PAUSE.depth == 0


async def test_a_load_the_core_refuses_ends_its_hold(stores: Stores, mode: Mode, moto: Any) -> None:
    state = await packed_state(stores, mode, "refused", remove=True)
    store = stores.new()
    segments = [o for o in store.objects(state.id) if o.kind == "segment"]
    assert segments
    key = segments[-1].key
    got = moto.get_object(Bucket=stores.bucket, Key=key)
    segment = json.loads(got["Body"].read())
    segment["entries"][-1]["kind"] = 5  # the segment's own checks pass; the core's do not
    moto.put_object(
        Bucket=stores.bucket, Key=key, Body=json.dumps(segment).encode(), Metadata=got["Metadata"]
    )
    with pytest.raises(CorruptStateError, match="kind"):
        await load(stores.new(), mode, state.id)
    assert gc.isenabled()
    assert _gc._PAUSE.depth == 0


@pytest.mark.parametrize("first_to_end", ["held", "other"])
async def test_two_loads_in_two_threads_resume_the_collector_once_both_ended(
    stores: Stores, monkeypatch: pytest.MonkeyPatch, first_to_end: str
) -> None:
    state = await packed_state(stores, "sync", f"threads-{first_to_end}")
    rebuild = Store._loaded
    inside, leave = threading.Event(), threading.Event()

    def blocking(store: Store, state_id: str, record: Any) -> State:
        if threading.current_thread().name == "held":
            inside.set()
            assert leave.wait(10)
        return rebuild(store, state_id, record)

    monkeypatch.setattr(Store, "_loaded", blocking)
    loaded: list[State] = []
    held = threading.Thread(target=lambda: loaded.append(stores.new().load(state.id)), name="held")
    held.start()
    try:
        assert inside.wait(10)
        assert not gc.isenabled(), "the held load is between its segments and its end"
        if first_to_end == "held":
            leave.set()
            held.join(10)
            assert gc.isenabled()
        other = await asyncio.to_thread(stores.new().load, state.id)
        assert len(other.history) == len(state.history)
        if first_to_end == "other":
            assert not gc.isenabled(), "the held load is still under way"
    finally:
        leave.set()
        held.join(10)
    assert len(loaded) == 1 and len(loaded[0].history) == len(state.history)
    assert gc.isenabled()
    assert _gc._PAUSE.depth == 0
