"""Packed segments: finding them in a listing, choosing which to read, reading them.

A packed segment holds a contiguous range of a State's entries in one object (written by
``S3Store.pack``). It only ever covers entries below the count of a snapshot that had landed:
those entries are final (a save, a claim or an orphan replacement only touches seqs from the
count on), so a segment never contradicts the entry objects it covers, and a reader may take
either. A reader uses a *chain*: segments from seq 0 on, each starting at or before the seq
where the one before ended, the longest reach first. A segment that is gone (a later pack
merged it into a bigger one) is listed again; a damaged one ends the chain there, and the
entries it covers are read from their own objects.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from alpineagents_s3._codec import loads_segment
from alpineagents_s3._layout import Layout
from alpineagents_s3._steps import Call, Outcome, Steps, error_code
from alpineagents_s3._translate import NOT_FOUND_CODES
from alpineagents_s3.errors import CorruptStateError, SchemaVersionError

logger = logging.getLogger("alpineagents_s3")


@dataclass(frozen=True)
class Segment:
    """A packed segment as listed: its key, the entries ``start`` to ``end - 1``, its size."""

    key: str
    start: int
    end: int
    size: int


@dataclass(frozen=True)
class Known:
    """A chain of segments a read of a State read whole, for this store object's next read.

    Segments are immutable and cover final entries, so the next read may GET them with the
    snapshot instead of after listing them; one that a later pack merged away is not found
    and listed again, and a State deleted and created again has another generation.

    Attributes:
        generation: The generation of the snapshot that read found.
        segments: The chain from seq 0, in order (not empty).
        count: That snapshot's count: the entries below it are final.
    """

    generation: str
    segments: tuple[Segment, ...]
    count: int

    @property
    def end(self) -> int:
        """The seq after the chain's last entry."""
        return self.segments[-1].end

    @classmethod
    def of(
        cls, generation: str, segments: Sequence[Segment], count: int, reach: int
    ) -> Known | None:
        """The chain of ``segments`` under ``count`` that ends by ``reach`` (``None``: empty)."""
        picked = tuple(s for s in chain(segments, count) if s.end <= reach)
        return cls(generation, picked, count) if picked else None


@dataclass
class Reach:
    """What reading a chain of segments gave.

    Attributes:
        end: Entries from seq 0 up to ``end`` were read from segments.
        gone: A segment of the chain was not found (replaced by a later pack): list again.
        damaged: What was wrong with a damaged segment, if one was met.
    """

    end: int = 0
    gone: bool = False
    damaged: str | None = None


def segments_in(
    layout: Layout, state_id: str, generation: str, items: Sequence[Mapping[str, Any]]
) -> list[Segment]:
    """The segments of ``generation`` among listed objects (ListObjectsV2 ``Contents``)."""
    found = []
    for item in items:
        parsed = layout.parse_segment_key(state_id, item["Key"])
        if parsed is not None and parsed[0] == generation:
            found.append(Segment(item["Key"], parsed[1], parsed[2], int(item.get("Size", 0))))
    return found


def chain(segments: Sequence[Segment], limit: int | None) -> list[Segment]:
    """Segments that cover seqs 0 on without a hole, none beyond ``limit``.

    At each seq, the segment that starts at or before it and reaches furthest: two packs at
    once may have cut the entries differently, and segments that overlap hold the same final
    entries. ``limit`` is the count of the snapshot read: a segment never covers more (one that
    does is not S3Store's, and is ignored), and without a count no segment is used.
    """
    if not limit:
        return []
    usable = sorted((s for s in segments if s.end <= limit), key=lambda s: s.start)
    picked: list[Segment] = []
    at = i = 0
    while True:
        best: Segment | None = None
        while i < len(usable) and usable[i].start <= at:
            if usable[i].end > at and (best is None or usable[i].end > best.end):
                best = usable[i]
            i += 1
        if best is None:
            return picked
        picked.append(best)
        at = best.end


def read_chain(
    layout: Layout,
    picked: Sequence[Segment],
    into: list[dict[str, Any]],
    base: int,
    extra: Sequence[Call] = (),
) -> Steps[tuple[Reach, list[Outcome]]]:
    """GET the segments ``picked`` (then the calls ``extra``, in the same round) into ``into``.

    ``into`` holds the entries from seq ``base`` on, in a row; those of the segments are added
    after them (see :func:`take_segments`). Returns how far the entries were read, and the
    outcomes of ``extra``. A segment not found or damaged ends the reach there; any other
    failure raises.
    """
    outcomes = yield from layout.send([*segment_gets(layout, picked), *extra])
    reach = take_segments(layout, picked, outcomes, into, base)
    return reach, outcomes[len(picked) :]


def segment_gets(layout: Layout, picked: Sequence[Segment]) -> list[Call]:
    """The GETs of the segments ``picked``, each parsed as its body arrives."""
    return [
        replace(layout.get(s.key), then=partial(_parse, layout.url(s.key), s.start, s.end))
        for s in picked
    ]


def take_segments(
    layout: Layout,
    picked: Sequence[Segment],
    outcomes: list[Outcome],
    into: list[dict[str, Any]],
    base: int,
) -> Reach:
    """The entries of the segment GETs' ``outcomes`` (the first ``len(picked)``) into ``into``.

    ``into`` holds the entries from seq ``base`` on, in a row, and each segment's entries
    after those are added to it (segments of a chain may overlap). A list, not a dict by seq:
    a load of 10,000 packed entries adds them with a few slices. Returns how far the entries
    were read: a segment not found or damaged ends the reach there, and so does one that would
    leave a hole (``picked`` is not a chain from there); any other failure raises.
    """
    reach = Reach(base + len(into))
    for i, segment in enumerate(picked):
        if segment.start > reach.end:
            break
        outcome, outcomes[i] = outcomes[i], {}  # the entries are not kept twice
        if isinstance(outcome, Exception):
            if error_code(outcome) in NOT_FOUND_CODES:
                reach.gone = True
                break
            layout.fail(outcome, segment.key, "GetObject")
        entries = outcome.pop("Body")
        if isinstance(entries, bytes):  # a driver that does not apply ``then``
            entries = _parse(layout.url(segment.key), segment.start, segment.end, entries)
        if isinstance(entries, SchemaVersionError):
            raise entries
        if isinstance(entries, CorruptStateError):
            logger.warning("%s; reading its entries from their own objects instead", entries)
            reach.damaged = str(entries)
            break
        if segment.end > reach.end:
            into += entries[reach.end - segment.start :]
            reach.end = segment.end
    return reach


def _parse(
    where: str, start: int, end: int, body: bytes
) -> list[dict[str, Any]] | CorruptStateError | SchemaVersionError:
    """A segment's entries, or what is wrong with it (the drivers apply it as bodies arrive)."""
    try:
        return loads_segment(body, where, start, end)
    except (CorruptStateError, SchemaVersionError) as e:
        return e
