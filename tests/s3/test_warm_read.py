"""A read by a store object that read the State before: the segments it knows GET with the
snapshot (``_reading.warm_round``, ``Ledger.chains``).

What could break, and is tried here: the known segments of a State deleted and created again
under the same id read into the new one (longer or shorter than the old); a known segment that
a later pack merged away, or damaged since, or a new segment whose pack removed the entries the
listing from the known end would have found; a State deleted since; the listing of the first
round failing; an ``auto_pack`` load leaving a chain of segments it just merged away; the
ledger keeping chains without bound. Each load is compared with the State it must give, and
with what a store object that never read the State gives.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from alpineagents import State
from alpineagents_s3 import CorruptStateError, S3Store, S3StoreError
from alpineagents_s3._reading import WARM_PREFETCH
from alpineagents_s3._segments import Known, Segment
from alpineagents_s3._versions import CHAIN_STATES, Ledger
from alpineagents_s3.testing import RequestLog
from tests.helpers import Mode
from tests.s3.helpers import RESULT, Refuse, Stores, load, pack, raw_client, run, save
from tests.s3.test_packed import Rounds, same
from tests.s3.test_packed_edges import Listings

pytestmark = pytest.mark.slow

BIG = RESULT * 4  # ~8 KB a tool result: 18 tool-using turns are over 128 KiB


async def packed_state(
    stores: Stores, mode: Mode, state_id: str, turns: int, result: str = RESULT, **options: Any
) -> State:
    state = State("warm", id=state_id)
    run(state, turns, result=result)
    stores.new().save(state)
    await pack(stores.new(), mode, state_id, **options)
    return state


async def warm_reader(stores: Stores, mode: Mode, state: State) -> tuple[S3Store, RequestLog]:
    """A store object that has read ``state`` (its packed chain is known)."""
    log = RequestLog()
    reader = stores.new(event_hooks=log.hooks)
    same(await load(reader, mode, state.id), state)
    assert state.id in reader._ledger.chains
    log.clear()
    return reader, log


@pytest.mark.parametrize("turns", [10, 30], ids=["shorter", "longer"])
async def test_a_state_deleted_and_created_again_is_read_anew(
    mode: Mode, stores: Stores, turns: int
) -> None:
    old = await packed_state(stores, mode, "again", 20)
    reader, _ = await warm_reader(stores, mode, old)
    client = raw_client(stores.url)
    known = reader._ledger.chains[old.id].segments
    left = {s.key: client.get_object(Bucket=stores.bucket, Key=s.key)["Body"].read() for s in known}
    other = stores.new()
    other.delete(old.id)
    new = State("another", id=old.id)
    run(new, turns, result="other result\n" * 50)
    other.save(new)
    await pack(other, mode, new.id)
    for key, body in left.items():  # as a delete stopped halfway leaves them (for sweep)
        client.put_object(Bucket=stores.bucket, Key=key, Body=body)
    rounds = Rounds(reader)
    got = await load(reader, mode, new.id)
    same(got, new)
    assert got.task == "another"
    same(await load(stores.new(), mode, new.id), new)
    assert len(rounds.batches) == 3, rounds.batches  # the wasted round, then a cold read


@pytest.mark.parametrize("remove_entries", [False, True], ids=["kept", "removed"])
async def test_a_known_segment_merged_away_is_listed_again(
    mode: Mode, stores: Stores, remove_entries: bool
) -> None:
    state = await packed_state(stores, mode, "merged", 10, remove_entries=remove_entries)
    reader, _ = await warm_reader(stores, mode, state)
    (known,) = reader._ledger.chains[state.id].segments
    writer = stores.new()
    grown = await load(writer, mode, state.id)
    run(grown, 10, first=10)
    await save(writer, mode, grown)
    packed = await pack(writer, mode, state.id, remove_entries=remove_entries)
    assert known.key in packed.removed  # taken into a bigger segment
    same(await load(reader, mode, state.id), grown)
    same(await load(stores.new(), mode, state.id), grown)
    # It knows the new chain now: one round.
    rounds = Rounds(reader)
    same(await load(reader, mode, state.id), grown)
    assert len(rounds.batches) == 1, rounds.batches


async def test_a_known_segment_damaged_since_falls_back_as_a_cold_read_does(
    mode: Mode, stores: Stores, caplog: pytest.LogCaptureFixture
) -> None:
    state = await packed_state(stores, mode, "damaged-warm", 12)
    reader, _ = await warm_reader(stores, mode, state)
    (segment,) = reader._ledger.chains[state.id].segments
    raw_client(stores.url).put_object(Bucket=stores.bucket, Key=segment.key, Body=b"[]")
    with caplog.at_level(logging.WARNING, "alpineagents_s3"):
        same(await load(reader, mode, state.id), state)  # from the entry objects
    assert segment.key in caplog.text and "own objects instead" in caplog.text
    same(await load(reader, mode, state.id), state)
    same(await load(stores.new(), mode, state.id), state)


async def test_a_known_segment_damaged_whose_entries_were_removed_is_named(
    mode: Mode, stores: Stores
) -> None:
    state = await packed_state(stores, mode, "damaged-archived", 10, remove_entries=True)
    reader, _ = await warm_reader(stores, mode, state)
    (segment,) = reader._ledger.chains[state.id].segments
    client = raw_client(stores.url)
    whole = client.get_object(Bucket=stores.bucket, Key=segment.key)["Body"].read()
    client.put_object(Bucket=stores.bucket, Key=segment.key, Body=whole[:-40])
    for store in (reader, stores.new()):
        with pytest.raises(CorruptStateError, match="packed segment is damaged") as caught:
            await load(store, mode, state.id)
        assert segment.key in str(caught.value)


async def test_a_new_segment_that_removed_the_entries_after_the_known_ones_is_read(
    mode: Mode, stores: Stores
) -> None:
    # Over SEGMENT_MIN each, the second smaller: the pack keeps the first, adds the second.
    state = await packed_state(stores, mode, "extended", 18, BIG, remove_entries=True)
    reader, _ = await warm_reader(stores, mode, state)
    (known,) = reader._ledger.chains[state.id].segments
    writer = stores.new()
    grown = await load(writer, mode, state.id)
    run(grown, 17, first=18, result=BIG)
    await save(writer, mode, grown)
    packed = await pack(writer, mode, state.id, remove_entries=True)
    assert len(packed.written) == 1 and known.key not in packed.removed
    same(await load(reader, mode, state.id), grown)
    same(await load(stores.new(), mode, state.id), grown)


async def test_a_state_deleted_since_is_not_found(mode: Mode, stores: Stores) -> None:
    state = await packed_state(stores, mode, "gone", 10)
    reader, _ = await warm_reader(stores, mode, state)
    stores.new().delete(state.id)
    for store in (reader, stores.new()):
        with pytest.raises(LookupError):
            await load(store, mode, state.id)
    assert reader.get(state.id) is None


async def test_a_failed_listing_of_the_first_round_is_made_again(
    mode: Mode, stores: Stores
) -> None:
    state = await packed_state(stores, mode, "listing", 30)
    refuse = Refuse(500, "InternalError", when=lambda url, headers: "start-after=" in url)
    log = RequestLog()
    reader = stores.new(event_hooks={**log.hooks, "before-call.s3.ListObjectsV2": refuse})
    same(await load(reader, mode, state.id), state)  # cold: lists from seq 0
    refuse.left = 1  # the warm round's listing, from the end of the segments, fails once
    same(await load(reader, mode, state.id), state)
    assert refuse.refused >= 1


async def test_an_auto_pack_load_knows_the_chain_it_wrote(mode: Mode, stores: Stores) -> None:
    state = State("auto", id="auto")
    run(state, 10)
    stores.new().save(state)
    log = RequestLog()
    reader = stores.new(auto_pack=4, event_hooks=log.hooks)
    same(await load(reader, mode, state.id), state)  # fetched 20 one by one: packs them
    (written,) = reader._ledger.chains[state.id].segments
    run(state, 3, first=10)
    await save(stores.new(), mode, state)
    same(await load(reader, mode, state.id), state)  # 6 more: packs again, merging
    assert reader._ledger.chains[state.id].segments != (written,)
    log.clear()
    rounds = Rounds(reader)
    same(await load(reader, mode, state.id), state)
    assert len(rounds.batches) == 1, rounds.batches
    assert log.counts() == {"GET": 2, "LIST": 2}, log.counts()  # the snapshot, one segment
    same(await load(stores.new(), mode, state.id), state)


async def test_a_load_after_the_store_object_s_own_saves_takes_one_round(
    mode: Mode, stores: Stores
) -> None:
    """A serverless function's steady state: load, run (its saves), and at the next event load
    again: its saves landed snapshots, so the entries they counted are final, and are fetched
    with the snapshot and the segments."""
    state = await packed_state(stores, mode, "steady", 20)
    store, log = await warm_reader(stores, mode, state)
    for turn in range(3):
        loaded = await load(store, mode, state.id)
        run(loaded, 2, first=20 + 2 * turn)
        await save(store, mode, loaded)
        rounds = Rounds(store)
        log.clear()
        same(await load(store, mode, state.id), loaded)
        assert len(rounds.batches) == 1, (turn, rounds.batches)
        # The snapshot and the segment, and the entries saved since, one GET each.
        assert log.counts() == {"GET": 2 + 4 * (turn + 1), "LIST": 2}, log.counts()
        same(await load(stores.new(), mode, state.id), loaded)


async def test_a_read_that_fails_forgets_the_chain(mode: Mode, stores: Stores) -> None:
    state = await packed_state(stores, mode, "fails", 10)
    refuse = Refuse(500, "InternalError", times=0, when=lambda url, h: "snapshot" in url)
    reader = stores.new(event_hooks={"before-call.s3.GetObject": refuse})
    same(await load(reader, mode, state.id), state)
    refuse.left = 1
    with pytest.raises(S3StoreError):
        await load(reader, mode, state.id)
    assert state.id not in reader._ledger.chains
    same(await load(reader, mode, state.id), state)


async def test_an_old_segment_left_behind_that_cannot_be_read_does_not_fail_a_new_state(
    mode: Mode, stores: Stores
) -> None:
    """The State deleted (the delete stopped before its old segment went) and created again:
    the old segment's GET, answered 403, is the old State's, not the new one's."""
    old = await packed_state(stores, mode, "left-behind", 10)
    stale: list[str] = []
    refuse = Refuse(403, "AccessDenied", when=lambda url, h: any(k in url for k in stale))
    reader = stores.new(event_hooks={"before-call.s3.GetObject": refuse})
    same(await load(reader, mode, old.id), old)
    (segment,) = reader._ledger.chains[old.id].segments
    client = raw_client(stores.url)
    left = client.get_object(Bucket=stores.bucket, Key=segment.key)["Body"].read()
    other = stores.new()
    other.delete(old.id)
    new = State("new", id=old.id)
    run(new, 3, result="other")
    other.save(new)
    client.put_object(Bucket=stores.bucket, Key=segment.key, Body=left)
    stale.append(segment.key.split("/", 1)[1])
    same(await load(reader, mode, new.id), new)
    assert refuse.refused == 1


async def test_a_delete_forgets_the_chain_and_a_create_of_its_own_is_read_as_new(
    mode: Mode, stores: Stores
) -> None:
    old = await packed_state(stores, mode, "own-again", 10)
    store, _ = await warm_reader(stores, mode, old)
    store.delete(old.id)
    assert old.id not in store._ledger.chains
    new = State("new", id=old.id)
    run(new, 3)
    await save(store, mode, new)
    rounds = Rounds(store)
    same(await load(store, mode, new.id), new)
    assert len(rounds.batches) == 2, rounds.batches  # a first load's: no round wasted


async def test_new_segments_beyond_a_page_of_entries_are_not_listed_through(
    mode: Mode, stores: Stores
) -> None:
    """Another process packed more entries than a listing page after the known segment (the
    pages are made 5 keys long): the entries after the new segment are listed from its end,
    with its GET, not page after page through what it covers."""
    state = await packed_state(stores, mode, "pages", 18, BIG)
    listings = Listings(entries=5)
    log = RequestLog()
    reader = stores.new(event_hooks={**log.hooks, **listings.hooks})
    same(await load(reader, mode, state.id), state)
    writer = stores.new()
    grown = await load(writer, mode, state.id)
    run(grown, 17, first=18, result=BIG)
    await save(writer, mode, grown)
    packed = await pack(writer, mode, state.id)
    assert len(packed.written) == 1
    log.clear()
    rounds = Rounds(reader)
    same(await load(reader, mode, state.id), grown)
    assert len(rounds.batches) == 2, rounds.batches
    assert log.counts() == {"GET": 3, "LIST": 3}, log.counts()


async def test_entries_another_process_packed_since_cost_few_gets(
    mode: Mode, stores: Stores
) -> None:
    """The store object's own saves made 40 entries final; another process packed them since:
    the first round GETs at most ``WARM_PREFETCH`` of them for nothing."""
    state = await packed_state(stores, mode, "packed-since", 10)
    store, log = await warm_reader(stores, mode, state)
    loaded = await load(store, mode, state.id)
    run(loaded, 20, first=10)
    await save(store, mode, loaded)
    await pack(stores.new(), mode, state.id)
    log.clear()
    same(await load(store, mode, state.id), loaded)
    assert log.counts()["GET"] <= 3 + WARM_PREFETCH, log.counts()


def test_the_ledger_keeps_a_bounded_number_of_chains() -> None:
    ledger = Ledger()
    chain = (Segment("k", 0, 1, 1),)
    for n in range(CHAIN_STATES + 10):
        ledger.know_chain(f"s{n}", Known("g", chain, 1))
    assert len(ledger.chains) == CHAIN_STATES
    assert "s0" not in ledger.chains and f"s{CHAIN_STATES + 9}" in ledger.chains
    ledger.know_chain("s20", None)
    assert "s20" not in ledger.chains
