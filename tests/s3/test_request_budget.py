"""The request budget of every store operation, pinned: a change that costs more fails here.

Counted by botocore event hooks on the store's own client (``RequestLog``), every request the
store sends, retries included, on moto's server. The figures are the protocol's and hold on
any S3; docs/s3.md ("What it costs") and docs/performance.md quote them.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

from alpineagents import State, _saving
from alpineagents_s3 import S3Store
from alpineagents_s3._layout import BASE_META, PENDING, PENDING_META, WRITER_META
from alpineagents_s3._reading import FIRST_PAGE
from alpineagents_s3.testing import RequestLog
from tests.helpers import Mode, bucket_maker, entry_dicts, tool_turn
from tests.s3.helpers import Stores, body, entry_key, raw_client

if TYPE_CHECKING:
    import boto3
    from types_boto3_s3 import S3Client


def with_history(state_id: str, turns: int) -> State:
    state = State("budget", id=state_id)
    for n in range(turns):
        tool_turn(state, n)
    return state


async def counted(log: RequestLog, operation: Awaitable[Any]) -> Counter[str]:
    log.clear()
    await operation
    return log.counts()


async def test_the_steady_state_write_path_sends_no_get_list_or_head(
    mode: Mode, stores: Stores
) -> None:
    log = RequestLog()
    io = stores.io(mode, event_hooks=log.hooks)
    state = State("budget", id="steady")
    assert await counted(log, io.save(state)) == {"PUT": 2}  # create: entry 0, snapshot
    tool_turn(state, 1)
    assert await counted(log, io.save(state)) == {"PUT": 3}  # two entries, the snapshot
    assert await counted(log, io.save(state)) == {}  # nothing changed
    state.data["step"] = 1
    assert await counted(log, io.save(state)) == {"PUT": 1}  # the snapshot alone
    tool_turn(state, 2)
    result = state.history.pop()  # a model response, then its tool result saved alone
    state.data["step"] = 2
    assert await counted(log, io.save(state)) == {"PUT": 1}  # committed alone, data with it
    state.history.append(result)
    if mode == "async":
        alone = _saving.asave(io.store, state, entries_only=True)
    else:
        alone = asyncio.to_thread(_saving.save, io.store, state, entries_only=True)
    assert await counted(log, alone) == {"PUT": 1}  # the entry: no check
    assert await counted(log, io.save(state)) == {}  # the snapshot only counted the result
    state._stop("reply", "done")
    assert await counted(log, io.save(state)) == {"PUT": 1}  # the stop: the snapshot
    loaded = await stores.io(mode).load("steady")
    assert loaded.history == state.history and loaded.data == {"step": 2}
    assert loaded.stopped_by == "reply"


async def test_a_snapshot_is_written_at_least_every_16_entries_committed_alone(
    mode: Mode, stores: Stores
) -> None:
    log = RequestLog()
    io = stores.io(mode, event_hooks=log.hooks)
    state = State("budget", id="checkpoints")
    await io.save(state)
    puts = []
    for n in range(20):
        tool_turn(state, n)
        result = state.history.pop()
        response = (await counted(log, io.save(state)))["PUT"]
        state.history.append(result)
        if mode == "async":
            saving = _saving.asave(io.store, state, entries_only=True)
        else:
            saving = asyncio.to_thread(_saving.save, io.store, state, entries_only=True)
        puts.append((response, (await counted(log, saving))["PUT"]))
    # 1 PUT a save while fewer than 16 entries were committed alone since the snapshot; the
    # result that makes them 16 is followed by the snapshot (the same JSON, counting them).
    assert puts == [(1, 1)] * 7 + [(1, 2)] + [(1, 1)] * 7 + [(1, 2)] + [(1, 1)] * 4
    loaded = await stores.io(mode).load("checkpoints")
    assert loaded.history == state.history


@pytest.fixture(scope="module")
def saved_once(
    moto: S3Client, moto_url: str, boto_session: boto3.Session
) -> Iterator[tuple[str, Callable[[int], State]]]:
    """A bucket of this module, and ``save(turns)``: a State of that many tool turns, saved
    there at its first use. The sync and the async load read the same objects (a load writes
    nothing), so each State's PUTs are sent once, not once per mode."""
    bucket = bucket_maker(moto)()
    saved: dict[int, State] = {}
    with S3Store(bucket, "runs", endpoint_url=moto_url, session=boto_session) as store:

        def save(turns: int) -> State:
            if turns not in saved:
                saved[turns] = with_history(f"load-{turns}", turns)
                store.save(saved[turns])
            return saved[turns]

        yield bucket, save


# 550 turns: 1,101 entries, the first page of 100, a page of 1,000 and one of 1. Loaded by
# the async API only (the sync one crosses full pages on LocalStack, tests/s3/test_conformance.py):
# the listing is walked by the same steps in both, and the 1,101 GETs cost moto ~9 s of CPU.
@pytest.mark.parametrize(
    ("mode", "turns"),
    [("sync", 0), ("sync", 12), ("async", 0), ("async", 12), ("async", 550)],
)
async def test_a_load_is_one_listing_per_1000_entries_and_one_get_per_object(
    mode: Mode, stores: Stores, turns: int, saved_once: tuple[str, Callable[[int], State]]
) -> None:
    bucket, save = saved_once
    state = save(turns)
    log = RequestLog()
    io = stores.io(mode, bucket=bucket, event_hooks=log.hooks)
    entries = 1 + 2 * turns
    # The segments, a first page of 100 entries, then pages of 1,000.
    pages = 1 + -(-max(0, entries - FIRST_PAGE) // 1000)
    expected = {"GET": entries + 1, "LIST": 1 + pages}
    loading = asyncio.ensure_future(io.load(state.id))
    assert await counted(log, loading) == expected
    # Whole and in order across full pages of 1,000 keys (the conformance suite on moto
    # crosses pages of 100).
    assert loading.result().history == state.history


async def test_list_delete_and_a_first_write_cost_what_the_docs_say(
    mode: Mode, stores: Stores
) -> None:
    for n in range(3):
        stores.new().save(with_history(f"listed-{n}", 1))
    log = RequestLog()
    io = stores.io(mode, event_hooks=log.hooks)
    # The State folders, their snapshots; for each running State, the entries after its
    # snapshot's count (none here), whose changes a save committed alone would carry.
    assert await counted(log, io.list()) == {"LIST": 4, "GET": 3}
    other = stores.io(mode)
    for n in range(3):
        stopped = await other.load(f"listed-{n}")
        stopped._stop("reply", "done")
        await other.save(stopped)
    assert await counted(log, io.list()) == {"LIST": 1, "GET": 3}  # none running
    assert await counted(log, io.delete("listed-0")) == {"HEAD": 1, "DELETE": 2, "LIST": 1}
    # A store object that never read the State: the snapshot and the listing, in one round.
    state = stores.new().load("listed-1")
    state._restart()
    tool_turn(state, 9)
    assert await counted(log, io.save(state)) == {"GET": 1, "LIST": 1, "PUT": 3}


async def test_resuming_after_a_killed_save_costs_one_claim(mode: Mode, stores: Stores) -> None:
    """The pending entries of a save killed before its snapshot: one claim, then replaced."""
    stores.new().save(with_history("killed", 1))
    client = raw_client(stores.url)
    base = client.head_object(Bucket=stores.bucket, Key="runs/killed/snapshot.json")["ETag"]
    for seq, entry in enumerate(entry_dicts(3, 5, "killed"), start=3):
        client.put_object(  # as a save killed before its snapshot PUT leaves them
            Bucket=stores.bucket,
            Key=entry_key(client, stores.bucket, "killed", seq),
            Body=body(entry),
            Metadata={BASE_META: base, WRITER_META: "dead", PENDING_META: PENDING},
        )
    client.close()
    log = RequestLog()
    io = stores.io(mode, event_hooks=log.hooks)
    state = await io.load("killed")
    tool_turn(state, 1)  # seqs 3, 4: both taken by the killed save
    # The load took seq 4 for an orphan (beyond seq 3, which it does not read). The claim
    # (GET of the snapshot, HEAD of seq 3, PUT of the snapshot); the orphan replaced (PUT,
    # If-Match); seq 3 (PUT: taken, GET, HEAD of the snapshot, PUT, If-Match); the snapshot.
    assert await counted(log, io.save(state)) == {"GET": 2, "PUT": 5, "HEAD": 2}
    assert [e.text for e in (await stores.io(mode).load("killed")).history[3:]] == ["", "result 1"]
