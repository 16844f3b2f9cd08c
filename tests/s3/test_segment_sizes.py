"""How a pack cuts the entries it writes (``_packing.cut``), and what a load of the result costs.

Up to four times ``SEGMENT_MAX`` of entries, segments of about ``SEGMENT_MAX`` each (as
before); more than that, four segments of about a quarter each, none over ``SEGMENT_LARGEST``
but an entry larger than that on its own. On moto's server, sync and async: a State of ~5 MB
packed in one pack is four segments that load the same in five GETs, and what is saved after
it is packed on its own (the four full segments are not sent again).
"""

from __future__ import annotations

import random

import pytest

from alpineagents import State
from alpineagents_s3._packing import (
    SEGMENT_LARGEST,
    SEGMENT_MAX,
    SEGMENT_MIN,
    SEGMENTS_AT_ONCE,
    cut,
)
from alpineagents_s3.testing import RequestLog
from tests.helpers import Mode
from tests.s3.helpers import Stores, load, objects, pack, run, save

MIB = 1024 * 1024


def covers(ranges: list[tuple[int, int]], first: int, count: int) -> bool:
    """Whether ``ranges`` are in a row from ``first``, none empty, up to ``first + count``."""
    at = first
    for start, end in ranges:
        if start != at or end <= start:
            return False
        at = end
    return at == first + count


def sizes_of(ranges: list[tuple[int, int]], first: int, sizes: list[int]) -> list[int]:
    return [sum(sizes[start - first : end - first]) for start, end in ranges]


@pytest.mark.parametrize("total_mib", [0.05, 0.9, 1.6, 3.9])
def test_up_to_four_times_segment_max_segments_are_of_about_segment_max(total_mib: float) -> None:
    sizes = [20_000] * int(total_mib * MIB / 20_000)
    ranges = cut(7, sizes)
    assert covers(ranges, 7, len(sizes))
    held = sizes_of(ranges, 7, sizes)
    assert all(size < SEGMENT_MAX + 20_000 for size in held), held
    assert all(size >= SEGMENT_MAX for size in held[:-1]), held
    assert len(held) == 1 or held[-1] >= SEGMENT_MIN, held


@pytest.mark.parametrize("seed", range(12))
def test_more_than_that_makes_four_segments_of_about_a_quarter(seed: int) -> None:
    rng = random.Random(seed)
    sizes: list[int] = []
    while sum(sizes) <= rng.choice([4.2, 7, 13.9, 31]) * MIB:
        sizes.append(rng.choice([300, 2_000, 20_000, 150_000]))
    total = sum(sizes)
    ranges = cut(0, sizes)
    assert covers(ranges, 0, len(sizes))
    held = sizes_of(ranges, 0, sizes)
    assert len(held) == SEGMENTS_AT_ONCE, held
    quarter = -(-total // SEGMENTS_AT_ONCE)
    assert all(quarter <= size < quarter + 150_000 for size in held[:-1]), (held, quarter)
    assert max(held) <= SEGMENT_LARGEST + 150_000


def test_beyond_four_times_segment_largest_segments_stay_at_segment_largest() -> None:
    sizes = [100_000] * (45 * MIB // 100_000)
    held = sizes_of(cut(0, sizes), 0, sizes)
    assert len(held) == 6 and all(
        SEGMENT_LARGEST <= size < SEGMENT_LARGEST + 100_000 for size in held[:-1]
    )


def test_an_entry_larger_than_segment_largest_is_a_segment_of_its_own() -> None:
    sizes = [1_000, 9 * MIB, 1_000, 3 * MIB, 2 * MIB]
    ranges = cut(0, sizes)
    assert covers(ranges, 0, len(sizes))
    assert ranges[0] == (0, 2)  # the entry before it joins it; none is split


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_state_of_5_mb_packed_at_once_is_four_segments_that_load_the_same(
    stores: Stores, mode: Mode
) -> None:
    state = State("a long run", id=f"large-{mode}")
    large = "row,value\n" + "alpha,1\nbeta,2\ngamma,3\n" * 9_000  # ~200 KB a tool result
    run(state, 26, result=large)  # ~5.3 MB
    await save(stores.new(), mode, state)

    packed = await pack(stores.new(), mode, state.id)
    segments = [o for o in await objects(stores.io(mode), state.id) if o.kind == "segment"]
    assert len(packed.written) == len(segments) == SEGMENTS_AT_ONCE, segments
    assert all(o.size >= SEGMENT_MAX for o in segments), segments
    assert packed.covered == len(state.history)

    log = RequestLog()
    loaded = await load(stores.new(event_hooks=log.hooks), mode, state.id)
    assert loaded.history == state.history and loaded.data == state.data
    assert log.counts()["GET"] == 1 + SEGMENTS_AT_ONCE, log.counts()

    # What is saved since is packed into a segment of its own: no full segment is sent again.
    run(state, 2, first=26, result=large)
    await save(stores.new(), mode, state)
    again = await pack(stores.new(), mode, state.id)
    assert len(again.written) == 1 and not again.removed, again
    reloaded = await load(stores.new(), mode, state.id)
    assert reloaded.history == state.history
