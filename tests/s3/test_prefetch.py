"""A packed State's load GETs the entries its snapshot counts after the segments by key, with
the segments, before a listing names them (``_reading.gather``, round 2).

On moto's server, sync and async. What could break, and is tried here: an entry fetched twice
(by key, then as the listing names it); an entry saved alone after the snapshot taken as final,
or missed; a prefetch that fails (refused, once or always), reads a damaged object or finds no
object, hiding the error or changing it; more entries since the pack than are fetched by key;
a damaged segment next to the prefetched entries; a first listing of entries that is
truncated, so that the listing after the segments shares the round; a pack that merges or
removes what the load listed, between its first round and its second; a concurrency of 1.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest

from alpineagents import State
from alpineagents._serialize import entry_to_dict
from alpineagents.history import TOOL_RESULT
from alpineagents_s3 import CorruptStateError, S3Store, S3StoreError, _reading
from alpineagents_s3.testing import RequestLog
from tests.helpers import Mode
from tests.s3.helpers import Refuse, Stores, entry_key, load, pack, raw_client, run
from tests.s3.test_packed import Rounds, same

SINCE = 10  # entries saved after the pack


async def packed_with_tail(
    stores: Stores,
    mode: Mode,
    state_id: str,
    *,
    remove: bool,
    since: int = SINCE,
    turns: int = 20,
) -> State:
    """A State of ``2 * turns + 1`` entries (41), packed, then ``since`` more saved (the
    snapshot counts them)."""
    state = State("prefetch", id=state_id)
    run(state, turns)
    writer = stores.new()
    writer.save(state)
    await pack(stores.new(), mode, state_id, remove_entries=remove)
    for n in range(since):
        state.append(TOOL_RESULT, f"since {n}", {"call_id": f"s{n}", "name": "lookup"})
    writer.save(state)
    return state


def gets_by_key(log: RequestLog) -> Counter[str]:
    """How often each entry object was fetched."""
    return Counter(r.path for r in log.requests if r.kind == "GET" and "/entries/" in r.path)


@pytest.mark.parametrize("remove", [False, True], ids=["kept", "removed"])
async def test_the_entries_since_the_pack_come_with_the_segments(
    mode: Mode, stores: Stores, remove: bool
) -> None:
    state = await packed_with_tail(stores, mode, f"tail-{remove:d}", remove=remove)
    log = RequestLog()
    reader = stores.new(event_hooks=log.hooks)
    rounds = Rounds(reader)
    same(await load(reader, mode, state.id), state)
    assert len(rounds.batches) == 2, rounds.batches
    fetched = gets_by_key(log)
    assert len(fetched) == SINCE and set(fetched.values()) == {1}, fetched


async def test_entries_saved_alone_after_the_snapshot_are_read_as_the_listing_names_them(
    mode: Mode, stores: Stores
) -> None:
    state = await packed_with_tail(stores, mode, "alone", remove=False)
    store = stores.new()
    for n in range(3):  # tool results saved alone: beyond the snapshot's count
        state.append(TOOL_RESULT, f"alone {n}", {"call_id": f"a{n}", "name": "lookup"})
        store.write(state.id, [entry_to_dict(state.history[-1])], None)
    log = RequestLog()
    reader = stores.new(event_hooks=log.hooks)
    rounds = Rounds(reader)
    same(await load(reader, mode, state.id), state)
    assert len(rounds.batches) == 3, rounds.batches  # the 3 entries once listed
    fetched = gets_by_key(log)
    assert len(fetched) == SINCE + 3 and set(fetched.values()) == {1}, fetched


async def test_more_entries_since_the_pack_than_are_fetched_by_key(
    mode: Mode, stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_reading, "PREFETCH", 4)
    state = await packed_with_tail(stores, mode, "many", remove=True)
    log = RequestLog()
    reader = stores.new(event_hooks=log.hooks)
    rounds = Rounds(reader)
    same(await load(reader, mode, state.id), state)
    assert len(rounds.batches) == 3, rounds.batches
    assert rounds.batches[1] == 1 + 4, rounds.batches  # the segment and 4 entries by key
    fetched = gets_by_key(log)
    assert len(fetched) == SINCE and set(fetched.values()) == {1}, fetched


@pytest.mark.parametrize("times", [1, None], ids=["once", "always"])
async def test_a_refused_prefetch_is_asked_again_and_its_error_is_the_load_s(
    mode: Mode, stores: Stores, times: int | None
) -> None:
    state = await packed_with_tail(stores, mode, f"refused-{times}", remove=True)
    client = raw_client(stores.url)
    key = entry_key(client, stores.bucket, state.id, 41 + 3)
    refuse = Refuse(403, "AccessDenied", times=times, when=lambda url, headers: key in url)
    reader = stores.new(event_hooks={"before-call.s3.GetObject": refuse})
    if times is None:
        with pytest.raises(S3StoreError) as raised:
            await load(reader, mode, state.id)
        assert key in str(raised.value) and "AccessDenied" in str(raised.value)
        assert refuse.refused == 2  # by key, then as the listing named it
    else:
        same(await load(reader, mode, state.id), state)
        assert refuse.refused == 1


@pytest.mark.parametrize("damage", ["garbage", "missing"])
async def test_a_damaged_or_missing_entry_since_the_pack_fails_as_before(
    mode: Mode, stores: Stores, damage: str
) -> None:
    state = await packed_with_tail(stores, mode, f"damaged-{damage}", remove=True)
    client = raw_client(stores.url)
    key = entry_key(client, stores.bucket, state.id, 41 + 5)
    if damage == "garbage":
        client.put_object(Bucket=stores.bucket, Key=key, Body=b"{not json")
    else:
        client.delete_object(Bucket=stores.bucket, Key=key)
    with pytest.raises(CorruptStateError) as raised:
        await load(stores.new(), mode, state.id)
    message = str(raised.value)
    if damage == "garbage":
        assert key in message, message
    else:
        assert f"accounts for {41 + SINCE} history entries" in message, message
        assert f"holds {41 + 5} in a row" in message, message


async def test_a_truncated_first_listing_and_entries_since_the_pack(
    mode: Mode, stores: Stores
) -> None:
    """121 entry objects kept: the first listing (100 keys) is truncated, so the listing of
    the entries after the segment goes with the segment and the entries fetched by key."""
    state = await packed_with_tail(stores, mode, "truncated", remove=False, turns=60)
    log = RequestLog()
    reader = stores.new(event_hooks=log.hooks)
    rounds = Rounds(reader)
    same(await load(reader, mode, state.id), state)
    assert len(rounds.batches) == 2, rounds.batches
    assert log.counts() == {"GET": 1 + 1 + SINCE, "LIST": 3}, log.counts()
    fetched = gets_by_key(log)
    assert len(fetched) == SINCE and set(fetched.values()) == {1}, fetched


async def test_one_request_at_a_time(mode: Mode, stores: Stores) -> None:
    state = await packed_with_tail(stores, mode, "one-at-a-time", remove=False, turns=60)
    reader = stores.new(max_concurrency=1)
    rounds = Rounds(reader)
    same(await load(reader, mode, state.id), state)
    assert len(rounds.batches) == 2, rounds.batches


class Between(Rounds):
    """Runs ``action`` once, when the outcomes of a store's first batch of requests arrive and
    before its steps see them: between a load's first round and its second."""

    def __init__(self, store: S3Store, action: Callable[[], object]):
        super().__init__(store)
        self.action = action

    def answered(self, batch: int) -> None:
        if batch == 1:
            self.action()


@pytest.mark.parametrize("remove", [False, True], ids=["merged", "merged-and-removed"])
async def test_a_pack_between_the_first_round_and_the_second(
    mode: Mode, stores: Stores, remove: bool
) -> None:
    """The segment the load listed is taken into a larger one (and the entries it covers
    removed) before the load fetches it: it lists the segments again and reads the new one.
    The entries it had fetched by key are wasted, but none is fetched twice."""
    state = await packed_with_tail(stores, mode, f"race-{remove:d}", remove=False)
    log = RequestLog()
    reader = stores.new(event_hooks=log.hooks)
    packer = stores.new()
    Between(reader, lambda: packer.pack(state.id, remove_entries=remove))
    same(await load(reader, mode, state.id), state)
    fetched = gets_by_key(log)
    assert len(fetched) <= SINCE and set(fetched.values()) <= {1}, fetched


@pytest.mark.parametrize("turns", [20, 60], ids=["one-listing", "truncated-listing"])
async def test_a_damaged_segment_next_to_the_prefetched_entries(
    mode: Mode, stores: Stores, caplog: pytest.LogCaptureFixture, turns: int
) -> None:
    """The segment's entries are read from their objects, the prefetched ones not again, with
    a first listing of entries that holds them all (41) or is truncated (121)."""
    state = await packed_with_tail(stores, mode, f"damaged-{turns}", remove=False, turns=turns)
    client = raw_client(stores.url)
    listed = client.list_objects_v2(Bucket=stores.bucket, Prefix=f"runs/{state.id}/packed/")
    (segment,) = [item["Key"] for item in listed["Contents"]]
    client.put_object(Bucket=stores.bucket, Key=segment, Body=b"[damaged")
    log = RequestLog()
    same(await load(stores.new(event_hooks=log.hooks), mode, state.id), state)
    assert "reading its entries from their own objects" in caplog.text
    fetched = gets_by_key(log)
    assert len(fetched) == 2 * turns + 1 + SINCE and set(fetched.values()) == {1}, fetched
