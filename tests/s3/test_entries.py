"""What a read keeps of the entries it found: ``_reading.Entries`` and ``_segments.take_segments``.

A read keeps the run of entries from seq 0 that packed segments held as one list (a load of
10,000 packed entries makes no object for each of them), and the entries read from their own
objects by seq. These tests hold it to the dict of ``Fetched`` by seq it replaced: the same
items, the same precedence (an entry of the packed run is the one kept at its seq), the same
unbroken run; and they hold ``take_segments`` to a chain's overlaps, holes and failures.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from botocore.exceptions import ClientError

from alpineagents_s3._layout import Layout
from alpineagents_s3._reading import Entries, Fetched
from alpineagents_s3._segments import Segment, take_segments
from alpineagents_s3._versions import unbroken_run
from alpineagents_s3.errors import CorruptStateError

LAYOUT = Layout("bucket", "root/", "http://127.0.0.1:1")


def entry(seq: int, source: str = "segment") -> dict[str, Any]:
    return {"seq": seq, "source": source}


def the_old_way(
    packed: list[dict[str, Any]], others: list[tuple[int, Fetched]]
) -> dict[int, Fetched]:
    """The dict of Fetched by seq that ``gather`` built before ``Entries``."""
    found = {seq: Fetched(e, None) for seq, e in enumerate(packed)}
    for seq, fetched in others:
        found.setdefault(seq, fetched)
    return found


@pytest.mark.parametrize("seed", range(40))
def test_entries_hold_what_the_dict_they_replace_held(seed: int) -> None:
    rng = random.Random(seed)
    packed = [entry(seq) for seq in range(rng.choice([0, 1, 5, 30]))]
    others = []
    for _ in range(rng.randrange(12)):
        # Seqs inside the packed run (a prefetched entry a segment also held), right after
        # it, beyond a hole, and the odd negative one.
        seq = rng.choice([rng.randrange(-2, len(packed) + 8), len(packed), len(packed) + 1])
        others.append((seq, Fetched(entry(seq, "object"), f"etag-{seq}", "writer")))
    found = Entries(packed)
    for seq, fetched in others:
        found.setdefault(seq, fetched)
    reference = the_old_way(packed, others)

    assert dict(found.items()) == reference
    assert len(found) == len(reference)
    assert sorted(found) == sorted(reference)
    for seq in range(-3, len(packed) + 12):
        assert (seq in found) == (seq in reference), seq
        assert found.get(seq) == reference.get(seq), seq
    assert found.run() == unbroken_run(reference)
    for end in range(found.run() + 1):
        assert found.run_of(end) == [reference[seq].entry for seq in range(end)]


def test_the_packed_run_keeps_its_entry_at_its_seq() -> None:
    found = Entries([entry(0), entry(1)])
    late = Fetched(entry(1, "object"), "etag", "writer")

    assert found.setdefault(1, late) == Fetched(entry(1), None)
    with pytest.raises(ValueError, match="history entry 1 was read from a packed segment"):
        found[1] = late  # a read GETs only the entries it has none for
    assert found[1] == Fetched(entry(1), None)
    found[3] = late  # beyond a hole: kept, not part of the run
    assert found[3] is late and found.run() == 2
    assert found.setdefault(2, late) is late and found.run() == 4  # 2 joins the run to 3
    not_seqs: list[object] = ["1", None]
    assert not any(seq in found for seq in not_seqs)


def test_run_of_is_a_list_of_its_own() -> None:
    packed = [entry(0), entry(1)]
    history = Entries(packed).run_of(2)
    history.append(entry(2))
    assert len(packed) == 2


def segment(start: int, end: int) -> Segment:
    return Segment(f"root/s/packed/g/{start}-{end}.json", start, end, 1)


def parsed(start: int, end: int) -> dict[str, Any]:
    """A segment GET's outcome once the driver parsed its body."""
    return {"Body": [entry(seq, f"segment {start}-{end}") for seq in range(start, end)]}


def test_take_segments_joins_a_chain_whose_segments_overlap() -> None:
    picked = [segment(0, 10), segment(5, 20), segment(20, 22)]
    into: list[dict[str, Any]] = []
    reach = take_segments(LAYOUT, picked, [parsed(0, 10), parsed(5, 20), parsed(20, 22)], into, 0)

    assert (reach.end, reach.gone, reach.damaged) == (22, False, None)
    assert [e["seq"] for e in into] == list(range(22))
    assert into[7]["source"] == "segment 0-10" and into[12]["source"] == "segment 5-20"


def test_take_segments_adds_to_what_is_there_from_a_base() -> None:
    into = [entry(4), entry(5)]  # seqs 4 and 5, read before
    reach = take_segments(LAYOUT, [segment(3, 9)], [parsed(3, 9)], into, 4)

    assert reach.end == 9
    assert [e["seq"] for e in into] == [4, 5, 6, 7, 8]
    assert into[1]["source"] == "segment"  # kept: not replaced by the segment's copy


def test_take_segments_stops_at_a_hole_a_gone_segment_and_a_damaged_one() -> None:
    into: list[dict[str, Any]] = []
    reach = take_segments(
        LAYOUT, [segment(0, 4), segment(6, 9)], [parsed(0, 4), parsed(6, 9)], into, 0
    )
    assert (reach.end, len(into)) == (4, 4)

    missing = ClientError({"Error": {"Code": "NoSuchKey"}}, "GetObject")  # merged away
    into = []
    reach = take_segments(LAYOUT, [segment(0, 4), segment(4, 8)], [parsed(0, 4), missing], into, 0)
    assert (reach.end, reach.gone, len(into)) == (4, True, 4)

    into = []
    damage = CorruptStateError("s3://bucket/root/s/packed/g/4-8.json is damaged")
    reach = take_segments(
        LAYOUT, [segment(0, 4), segment(4, 8)], [parsed(0, 4), {"Body": damage}], into, 0
    )
    assert (reach.end, len(into)) == (4, 4) and reach.damaged and "4-8.json" in reach.damaged
