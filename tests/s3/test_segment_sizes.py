"""How a pack cuts the entries it writes (``_packing.cut``), and what a load of the result costs.

Up to four times ``SEGMENT_MAX`` of entries, segments of about ``SEGMENT_MAX`` each (as
before); more than that, at most four segments of about a quarter each (fewer of coarse
entries), a range ending at ``SEGMENT_LARGEST`` at the latest, and a segment a pack takes in is
not cut smaller again. On moto's server, sync and async: a State of ~5 MB packed in one pack
is four segments that load the same in five GETs; what is saved after it is packed on its own
(the four full segments are not sent again); a pack of less than 128 KiB takes in the last
segment and writes it again as one.
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


def test_an_entry_larger_than_segment_largest_ends_its_segment() -> None:
    sizes = [1_000, 9 * MIB, 1_000, 3 * MIB, 2 * MIB]
    ranges = cut(0, sizes)
    assert covers(ranges, 0, len(sizes))
    # The target is a quarter (3.75 MiB): the large entry ends the first range (none is split),
    # the next two entries the second.
    assert ranges == [(0, 2), (2, 5)]


def test_coarse_entries_make_fewer_segments_each_up_to_a_quarter_and_one_entry() -> None:
    sizes = [int(1.9 * MIB)] * 5
    held = sizes_of(cut(0, sizes), 0, sizes)
    quarter = -(-sum(sizes) // SEGMENTS_AT_ONCE)
    assert len(held) == 3 and all(size < quarter + max(sizes) for size in held), held


def test_a_segment_taken_in_is_not_cut_smaller() -> None:
    """A pack on request of a few entries takes in the large last segment: written again as
    one, not cut at SEGMENT_MAX (the chain keeps its few segments)."""
    sizes = [20_000] * (int(3.4 * MIB) // 20_000) + [300] * 5  # a 3.4 MiB segment and 1.5 KB
    assert len(cut(0, sizes)) == 4  # cut as new entries: at about SEGMENT_MAX
    assert cut(0, sizes, at_least=int(3.4 * MIB) - 1000) == [(0, len(sizes))]
    assert len(cut(0, [9 * MIB // 10] * 40, at_least=20 * MIB)) == 5  # never over SEGMENT_LARGEST


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_state_of_5_mb_packed_at_once_is_four_segments_that_load_the_same(
    stores: Stores, mode: Mode
) -> None:
    state = State("a long run", id=f"large-{mode}")
    large = "row,value\n" + "alpha,1\nbeta,2\ngamma,3\n" * 2_200  # ~50 KB a tool result
    run(state, 110, result=large)  # ~5.6 MB: four segments of ~1.4 MB
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

    # Less than 128 KiB since: a pack on request takes in the last segment (no segment under
    # 128 KiB is left) and writes it again as one, not cut into segments of 1 MiB.
    run(state, 1, first=110)
    await save(stores.new(), mode, state)
    small = await pack(stores.new(), mode, state.id)
    assert len(small.written) == 1 and len(small.removed) == 1, small
    segments = [o for o in await objects(stores.io(mode), state.id) if o.kind == "segment"]
    assert len(segments) == SEGMENTS_AT_ONCE and min(o.size for o in segments) >= SEGMENT_MAX
    assert (await load(stores.new(), mode, state.id)).history == state.history

    # More since: packed into a segment of its own, no full segment sent again.
    run(state, 4, first=111, result=large)  # ~200 KB
    await save(stores.new(), mode, state)
    again = await pack(stores.new(), mode, state.id)
    assert len(again.written) == 1 and not again.removed, again
    assert (await load(stores.new(), mode, state.id)).history == state.history
