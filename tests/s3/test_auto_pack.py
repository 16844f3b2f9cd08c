"""``S3Store(auto_pack=N)``: a load that fetched N or more final entries one by one packs them.

On moto's server, sync and async. What could break, and is tried here: a load under the
threshold writes something; the pack re-reads what the load just read; a pack that fails
fails the load (or leaves a half-written segment a later load trusts); the run that saves
the State meanwhile is refused or loses entries; packing again as the State grows stops
merging; entries saved alone beyond the snapshot's count get packed; bad values of the
option are taken.
"""

from __future__ import annotations

import logging
import re
from itertools import pairwise
from typing import Any

import pytest

from alpineagents import State
from alpineagents._serialize import entry_to_dict
from alpineagents.history import TOOL_RESULT
from alpineagents_s3 import S3Store
from alpineagents_s3.testing import RequestLog
from tests.helpers import Mode
from tests.s3.helpers import Refuse, Stores, load, objects, run, save
from tests.s3.test_packed import Rounds, same

pytestmark = pytest.mark.slow


async def segments_of(stores: Stores, mode: Mode, state_id: str) -> list[tuple[int, int]]:
    """The ranges ``(start, end)`` of the State's segments, in key order."""
    found = [o.key for o in await objects(stores.io(mode), state_id) if o.kind == "segment"]
    ranges = [re.fullmatch(r".*/(\d+)-(\d+)\.json", key) for key in found]
    return [(int(m[1]), int(m[2])) for m in ranges if m]


def entry(state: State, seq: int) -> dict[str, Any]:
    return entry_to_dict(state.history[seq])


async def test_a_load_that_fetched_enough_entries_packs_them_without_reading_again(
    mode: Mode, stores: Stores
) -> None:
    await packs_as_it_loads(stores, mode)


@pytest.mark.integration
async def test_a_load_packs_as_it_loads_on_localstack(mode: Mode, localstack: Stores) -> None:
    await packs_as_it_loads(localstack, mode)


async def packs_as_it_loads(stores: Stores, mode: Mode) -> None:
    """61 entries saved, loaded through ``auto_pack=50``: packed; the next load reads that."""
    state = State("auto", id="auto")
    state.data["k"] = ["\u00e9", None, 1.5]
    run(state, 30)  # 61 entries, ~120 KB
    stores.new().save(state)

    log = RequestLog()
    reader = stores.new(auto_pack=50, event_hooks=log.hooks)
    same(await load(reader, mode, state.id), state)
    # The load's own requests (the snapshot, 61 entries, the listings), then the pack's
    # writes: one segment, and one HEAD that the State was not deleted meanwhile.
    assert log.counts() == {"GET": 62, "LIST": 2, "PUT": 1, "HEAD": 1}, log.counts()
    assert await segments_of(stores, mode, state.id) == [(0, 61)]

    # The next load, by a store object of another process, reads one segment.
    log = RequestLog()
    fresh = stores.new(auto_pack=50, event_hooks=log.hooks)
    rounds = Rounds(fresh)
    same(await load(fresh, mode, state.id), state)
    assert log.counts() == {"GET": 2, "LIST": 2}, log.counts()
    assert len(rounds.batches) <= 3, rounds.batches


async def test_a_load_under_the_threshold_writes_nothing(mode: Mode, stores: Stores) -> None:
    state = State("few", id="few")
    run(state, 10)  # 21 entries
    stores.new().save(state)
    log = RequestLog()
    same(await load(stores.new(auto_pack=22, event_hooks=log.hooks), mode, state.id), state)
    assert log.counts() == {"GET": 22, "LIST": 2}, log.counts()
    assert await segments_of(stores, mode, state.id) == []


async def test_entries_saved_alone_beyond_the_count_are_not_packed(
    mode: Mode, stores: Stores
) -> None:
    state = State("alone", id="alone")
    run(state, 5)  # 11 entries, counted
    store = stores.new()
    store.save(state)
    for n in range(6):  # tool results saved alone: beyond the snapshot's count
        state.append(TOOL_RESULT, f"r{n}", {"call_id": f"c{n}", "name": "lookup"})
        store.write(state.id, [entry(state, len(state.history) - 1)], None)
    log = RequestLog()
    # 17 entries fetched, 11 of them final: a threshold of 12 packs nothing.
    loaded = await load(stores.new(auto_pack=12, event_hooks=log.hooks), mode, state.id)
    assert len(loaded.history) == 17
    assert "PUT" not in log.counts(), log.counts()
    # At 11 it packs the 11 the snapshot counts, and the 6 stay entry objects that loads read.
    loaded = await load(stores.new(auto_pack=11), mode, state.id)
    assert await segments_of(stores, mode, state.id) == [(0, 11)]
    log = RequestLog()
    again = await load(stores.new(event_hooks=log.hooks), mode, state.id)
    assert again.history == loaded.history and len(again.history) == 17
    assert log.counts()["GET"] == 1 + 1 + 6, log.counts()  # snapshot, segment, 6 entries


async def test_a_pack_that_fails_leaves_the_load_and_the_state_as_they_were(
    mode: Mode, stores: Stores, caplog: pytest.LogCaptureFixture
) -> None:
    state = State("denied", id="denied")
    run(state, 30)
    stores.new().save(state)
    # Credentials that may read but not write: every PUT is refused with 403.
    denied = Refuse(403, "AccessDenied", when=lambda url, headers: "/packed/" in url)
    reader = stores.new(auto_pack=10, event_hooks={"before-call.s3.PutObject": denied})
    with caplog.at_level(logging.WARNING, logger="alpineagents_s3"):
        same(await load(reader, mode, state.id), state)
    assert denied.refused >= 1
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("could not pack" in m and "AccessDenied" in m for m in warned), warned
    assert await segments_of(stores, mode, state.id) == []
    # The reader's own saves go on: its store object holds the State it loaded.
    loaded = await load(reader, mode, state.id)
    run(loaded, 1, first=30)
    await save(reader, mode, loaded)
    same(await load(stores.new(), mode, state.id), loaded)


async def test_the_run_saving_the_state_goes_on_while_loads_pack_it(
    mode: Mode, stores: Stores
) -> None:
    state = State("running", id="running")
    writer = stores.new()
    writer.save(state)
    for step in range(4):
        run(state, 20, first=20 * step)  # 40 entries a step, ~80 KB
        await save(writer, mode, state)  # never refused: a pack does not touch the snapshot
        monitor = stores.new(auto_pack=30)
        same(await load(monitor, mode, state.id), state)
        segments = await segments_of(stores, mode, state.id)
        # Each load packed what was saved since the last, merging small segments: few stay,
        # in one chain from seq 0 to the end.
        assert 1 <= len(segments) <= 3, segments
        assert segments[0][0] == 0 and segments[-1][1] == len(state.history), segments
        assert all(a[1] == b[0] for a, b in pairwise(segments))
    log = RequestLog()
    same(await load(stores.new(event_hooks=log.hooks), mode, state.id), state)
    assert log.counts()["GET"] <= 1 + 3, log.counts()


@pytest.mark.parametrize("value", [0, -1, True, 2.5, "10"])
def test_auto_pack_takes_a_positive_number_of_entries(value: Any) -> None:
    with pytest.raises(ValueError, match=r"auto_pack must be None or a number of entries"):
        S3Store("bucket", auto_pack=value)
