"""A load's largest round goes out at once with the default ``max_concurrency``.

The worst first load of a State packed as loads go (``auto_pack=16``, 15 final entries since
the last pack) sends in its second round the segment, the listing after it and the 15 entries:
17 requests here, 18 with two segments. With a limit of 16 the last ones waited for an answer,
a round trip more (~20 ms of ~80 through the bench's proxy). Each test holds every request of
that round at ``before-send`` until all of them are there: they must all be in flight at once.
On moto's server, sync and async.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config

from alpineagents import State
from alpineagents_s3 import S3Store
from tests.s3.helpers import InFlight, Stores, run

ROUND_1 = 3  # the snapshot, the listing of the segments, the first page of entries
ROUND_2 = 17  # the segment, the listing after it, the 15 entries since the pack


def worst_case(stores: Stores, state_id: str) -> State:
    """A State of 121 entries packed as loads go (more than the first listing's 100), then
    15 more saved and counted."""
    state = State("worst case", id=state_id)
    run(state, 60)  # 121 entries
    writer = stores.new(auto_pack=16)
    writer.save(state)
    assert writer.load(state.id).history == state.history  # fetched one by one: packs them
    run(state, 7, first=60)
    state.add_user_message("one more")  # 15 entries since, all final once saved
    writer.save(state)
    return state


class AllAtOnce:
    """A ``before-send`` hook: requests ``ROUND_1 + 1`` to ``ROUND_1 + ROUND_2`` wait there
    until all of them have come (a sync barrier, or an async one for aiobotocore)."""

    def __init__(self) -> None:
        self.seen = 0
        self.lock = threading.Lock()
        self.barrier = threading.Barrier(ROUND_2, timeout=10)
        self.arrived = 0
        self.all_here: asyncio.Event | None = None

    def _in_round_2(self) -> bool:
        with self.lock:
            self.seen += 1
            return ROUND_1 < self.seen <= ROUND_1 + ROUND_2

    def sync(self, **kwargs: Any) -> None:
        if self._in_round_2():
            self.barrier.wait()  # BrokenBarrierError: fewer were sent at once

    async def async_(self, **kwargs: Any) -> None:
        if not self._in_round_2():
            return
        if self.all_here is None:
            self.all_here = asyncio.Event()
        self.arrived += 1
        if self.arrived == ROUND_2:
            self.all_here.set()
        await asyncio.wait_for(self.all_here.wait(), 10)


def test_the_second_round_goes_out_at_once_sync(stores: Stores) -> None:
    state = worst_case(stores, "at-once")
    hook = AllAtOnce()
    reader = stores.new(auto_pack=16, event_hooks={"before-send.s3": hook.sync})
    assert reader.load(state.id).history == state.history
    assert hook.seen == ROUND_1 + ROUND_2


async def test_the_second_round_goes_out_at_once_async(stores: Stores) -> None:
    state = worst_case(stores, "at-once-async")
    hook = AllAtOnce()
    reader = stores.new(auto_pack=16, event_hooks={"before-send.s3": hook.async_})
    assert (await reader.aload(state.id)).history == state.history
    assert hook.seen == ROUND_1 + ROUND_2


def test_the_default_is_what_the_docs_say() -> None:
    store = S3Store("bucket")
    assert store.max_concurrency == 32
    docs = (Path(__file__).resolve().parents[2] / "docs" / "s3.md").read_text()
    assert f"| `max_concurrency={store.max_concurrency}` |" in docs


@pytest.mark.parametrize("limit", [16])
def test_a_lower_limit_is_kept(stores: Stores, limit: int) -> None:
    """The limit given holds: at most that many in flight (the same round, 17 requests)."""
    state = worst_case(stores, "limited")
    hook = AllAtOnce()
    hook.barrier = threading.Barrier(limit + 1, timeout=1)  # one more than the limit allows
    reader = stores.new(
        auto_pack=16, max_concurrency=limit, event_hooks={"before-send.s3": hook.sync}
    )
    with pytest.raises(Exception, match="BrokenBarrierError"):
        reader.load(state.id)


def test_no_more_at_once_than_the_connection_pool_holds(stores: Stores) -> None:
    """A ``config`` with a smaller pool, or a ``client=`` (botocore's pool: 10), lowers the
    limit to the pool: more at once would open connections that urllib3 drops again."""
    state = State("many", id="pool")
    for n in range(40):
        state.add_user_message(f"message {n}")  # a load GETs 41 entries
    stores.new().save(state)

    flight = InFlight()
    small = stores.new(config=Config(max_pool_connections=4), event_hooks=flight.hooks)
    assert small.load(state.id).history == state.history
    assert flight.most <= 4, flight.most

    own = boto3.Session().client("s3", endpoint_url=stores.url)
    flight = InFlight()
    for event, hook in flight.hooks.items():
        own.meta.events.register(event, hook)
    given = S3Store(stores.bucket, "runs", client=own)
    try:
        assert given.load(state.id).history == state.history
    finally:
        given.close()
    assert flight.most <= 10, flight.most

    flight = InFlight()
    default = stores.new(event_hooks=flight.hooks)
    assert default.load(state.id).history == state.history
    assert flight.most > 10, flight.most  # the default pool holds 32


async def test_no_more_at_once_than_the_pool_holds_async(stores: Stores) -> None:
    state = State("many", id="pool-async")
    for n in range(40):
        state.add_user_message(f"message {n}")
    await stores.new().asave(state)
    flight = InFlight()
    small = stores.new(config=Config(max_pool_connections=4), event_hooks=flight.hooks)
    assert (await small.aload(state.id)).history == state.history
    assert 1 <= flight.most <= 4, flight.most
