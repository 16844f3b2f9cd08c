"""The steps of ``S3Store.pack``: a State's final entries in a few large objects.

Only the entries the stored snapshot counts are packed: those are final (every later save,
claim or orphan replacement touches seqs from the count on), so a packed segment never
contradicts the entry objects it covers, even while the State is being run. A segment is
written once, with ``If-None-Match: *``; its key names the range it holds.

Sizes stay few and large. The entries not yet packed become new segments of about
:data:`SEGMENT_MAX` each (a quarter of them each when they are more than four times that, see
:func:`cut`). These take in the segments at the end of the chain that are smaller than
``SEGMENT_MAX`` and no larger than the new entries (or any, while those are under
:data:`SEGMENT_MIN`): like carries in a binary counter, a State packed again and again keeps a
few segments under ``SEGMENT_MAX`` besides its full ones, each of at least 128 KiB but the one
segment of a small State. A pack as loads go (``auto_pack``) never takes in a full segment
(``SEGMENT_MAX`` or more, as one entry that large makes): it would send it again for a few
new entries at every pack, so what follows one may be a segment under 128 KiB until later
packs grow it; a pack on request takes it in (once, for archiving). The segments taken in
are removed once the new ones are stored; a reader that listed one of them meets a 404 and
lists the segments again.

With ``remove_entries``, the entry objects a segment covers are removed too, for archiving:
the State is then its snapshot, its segments and the entries saved after the pack. Every
guarantee of the entry objects holds: writers only list, read, claim or replace entries from the
snapshot's count on, above every segment.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from alpineagents_s3._codec import (
    begins_as_segment,
    dumps_as_read,
    dumps_segment,
    loads_segment,
    validate_id,
)
from alpineagents_s3._contract import Record
from alpineagents_s3._deleting import delete_keys
from alpineagents_s3._layout import GENERATION_META, Layout
from alpineagents_s3._reading import Gathered, gather, list_all, read_gathered
from alpineagents_s3._segments import Known, Segment, chain, segments_in
from alpineagents_s3._steps import Steps, error_code
from alpineagents_s3._translate import NOT_FOUND_CODES, PRECONDITION_CODES
from alpineagents_s3._versions import Ledger
from alpineagents_s3.errors import CorruptStateError

logger = logging.getLogger("alpineagents_s3")

# S3 lifecycle rules by default do not transition objects smaller than this.
SEGMENT_MIN: Final = 128 * 1024
# A segment is cut once it holds this much (or more, below): a load then fetches several at
# once, and holds the bytes of one while it parses it; a pack as loads go never rewrites a
# segment this large.
SEGMENT_MAX: Final = 1024 * 1024
# A pack that writes more than this many times SEGMENT_MAX at once cuts it into this many
# segments, each up to SEGMENT_LARGEST: every GET costs the client ~2 ms of CPU (botocore) and
# makes objects that start the garbage collector while the entries parsed before are young,
# so a load of 10,000 packed entries (14 MB) took ~98 ms in 15 GETs and ~83 ms in 4, through
# the bench's proxy; four still arrive at once, and none is larger than S3 suggests for one
# ranged GET of a large object.
SEGMENTS_AT_ONCE: Final = 4
SEGMENT_LARGEST: Final = 8 * 1024 * 1024
# How often a pack reads a damaged segment it writes again, if another pack replaces it first.
SEGMENT_TRIES: Final = 3


@dataclass(frozen=True)
class Packed:
    """What ``S3Store.pack`` did to one State.

    Attributes:
        state_id: The State.
        covered: How many entries from seq 0 on are held by packed segments now.
        written: The keys of the segments written.
        removed: The keys removed: segments taken into a larger one, and, with
            ``remove_entries``, the entry objects the segments cover.
    """

    state_id: str
    covered: int
    written: tuple[str, ...]
    removed: tuple[str, ...]


def pack(
    layout: Layout, state_id: str, remove_entries: bool, ledger: Ledger | None = None
) -> Steps[Packed]:
    """Pack the entries the stored snapshot counts; see the module docstring.

    With ``ledger`` (the store object's), the next read knows the chain of segments written.
    """
    validate_id(state_id)
    found = yield from gather(layout, state_id)
    if found is None:
        raise layout.not_found(state_id)
    packed = yield from pack_gathered(layout, state_id, found, remove_entries, full_too=True)
    if ledger is not None:
        ledger.know_chain(state_id, chain_after(layout, state_id, found, packed))
    return packed


def read_and_pack(
    layout: Layout, ledger: Ledger, state_id: str, at_least: int
) -> Steps[Record | None]:
    """``read``, then a pack of what it read if it fetched ``at_least`` final entries one by one.

    The load returns what it read whatever the pack does: a pack that fails (no permission to
    write, the State deleted meanwhile, a network error) is logged as a warning, and leaves
    the State as it was (a pack stopped at any point does; see ``tests/s3/test_pack_crash.py``).
    """
    record, found = yield from read_gathered(layout, ledger, state_id)
    fetched = 0 if found is None else unpacked(found)
    if found is None or fetched < at_least:
        return record
    try:
        packed = yield from pack_gathered(layout, state_id, found, False, full_too=False)
    except Exception as e:  # noqa: BLE001 - the load has what it read; the pack can wait
        logger.warning(
            "loaded %s, but could not pack its %d entries read one by one (auto_pack=%d): %s",
            layout.url(layout.state_prefix(state_id)),
            fetched,
            at_least,
            e,
        )
    else:
        logger.info(
            "packed %s while loading it: %d entries in segments",
            layout.url(layout.state_prefix(state_id)),
            packed.covered,
        )
        ledger.know_chain(state_id, chain_after(layout, state_id, found, packed))
    return record


def chain_after(layout: Layout, state_id: str, found: Gathered, packed: Packed) -> Known | None:
    """The chain of segments after a pack of ``found``, for the next read of the State."""
    generation = found.stored.meta.generation
    kept = [s for s in found.segments if s.key not in packed.removed]
    kept += segments_in(layout, state_id, generation, [{"Key": key} for key in packed.written])
    return Known.of(generation, kept, found.stored.meta.count or 0, packed.covered)


def unpacked(found: Gathered) -> int:
    """How many of the entries the snapshot counts a read of ``found`` fetched one by one."""
    readable, _ = _segments_read(found)
    return (found.stored.meta.count or 0) - _covered(readable)


def _segments_read(found: Gathered) -> tuple[list[Segment], frozenset[str]]:
    """The chain of segments a read of ``found`` read from seq 0 on, and the keys of the others.

    A damaged segment ends what was read; it and those after it are among the others.
    """
    readable: list[Segment] = []
    unread: set[str] = set()
    for segment in chain(found.segments, found.stored.meta.count):
        if segment.end <= found.packed:
            readable.append(segment)
        else:
            unread.add(segment.key)
    return readable, frozenset(unread)


def _takes_in(last: Segment, size: int, full_too: bool) -> bool:
    """Whether new segments of ``size`` bytes take in the ``last`` segment of the chain."""
    if last.size <= min(size, SEGMENT_MAX - 1):  # a carry of the binary counter
        return True
    return size < SEGMENT_MIN and (full_too or last.size < SEGMENT_MAX)


def _covered(segments: Sequence[Segment]) -> int:
    return segments[-1].end if segments else 0


def pack_gathered(
    layout: Layout, state_id: str, found: Gathered, remove_entries: bool, *, full_too: bool
) -> Steps[Packed]:
    """Pack what ``found`` (a read of the State just made) holds of the final entries.

    A load that read the State packs from what it read (``S3Store(auto_pack=...)``): the
    writes of a pack, no GET more. ``full_too``: a full last segment may be taken in, so that
    every segment reaches ``SEGMENT_MIN`` (``pack``; a pack as loads go leaves it).
    """
    generation = found.stored.meta.generation
    count = found.stored.meta.count or 0  # no count recorded: nothing is known to be final
    segments, damaged = _segments_read(found)  # a damaged segment is written again
    covered = _covered(segments)
    written: list[str] = []
    # A pack on request also grows a last segment an earlier pack as loads go left small.
    small_tail = full_too and len(segments) > 1 and segments[-1].size < SEGMENT_MIN
    if covered < count or small_tail:

        def entry_body(seq: int) -> bytes:
            entry = found.entries[seq].entry
            return dumps_as_read(entry, f"history entry {seq} of State {state_id!r}")

        bodies = {seq: entry_body(seq) for seq in range(covered, count)}
        size = sum(map(len, bodies.values()))
        largest = 0  # of the segments taken in: none is cut smaller again
        while segments and _takes_in(segments[-1], size, full_too):
            merged = segments.pop()
            size += merged.size
            largest = max(largest, merged.size)
            bodies.update((seq, entry_body(seq)) for seq in range(merged.start, merged.end))
        first = min(bodies)
        new = []
        sizes = [len(bodies[seq]) for seq in range(first, count)]
        for start, end in cut(first, sizes, at_least=largest):
            key = layout.segment_key(state_id, generation, start, end)
            new.append(
                (key, start, end, dumps_segment(start, [bodies[s] for s in range(start, end)]))
            )
        del bodies
        yield from _put_segments(layout, new, damaged)
        for key, start, end, body in new:
            written.append(key)
            segments.append(Segment(key, start, end, len(body)))
        del new

    # A State deleted (or deleted and created again) meanwhile must not keep the new segment.
    snap_key = layout.snapshot_key(state_id)
    (head,) = yield from layout.send([layout.head(snap_key)])
    if isinstance(head, Exception) and error_code(head) not in NOT_FOUND_CODES:
        layout.fail(head, snap_key, "HeadObject (after a pack)")
    if isinstance(head, Exception) or head.get("Metadata", {}).get(GENERATION_META) != generation:
        yield from delete_keys(layout, written, required=False)
        raise layout.not_found(state_id, ": it was deleted while it was being packed")

    reach = segments[-1].end if segments else 0
    kept = {segment.key for segment in segments}
    doomed = [s.key for s in found.segments if s.key not in kept and s.end <= reach]
    if remove_entries and reach:
        mine = f"{layout.entries_prefix(state_id)}{generation}/"
        for item in (yield from list_all(layout, mine)):
            parsed = layout.parse_entry_key(state_id, item["Key"])
            if parsed is not None and parsed[0] == generation and parsed[1] < reach:
                doomed.append(item["Key"])
    yield from delete_keys(layout, doomed, required=True)
    logger.debug(
        "packed %s: %d entries in %d segment(s); wrote %d, removed %d objects",
        layout.url(layout.state_prefix(state_id)),
        reach,
        len(segments),
        len(written),
        len(doomed),
    )
    return Packed(state_id, reach, tuple(written), tuple(doomed))


def cut(first: int, sizes: Sequence[int], at_least: int = 0) -> list[tuple[int, int]]:
    """Ranges ``(start, end)`` of entries ``first`` on, of about :data:`SEGMENT_MAX` bytes each.

    ``sizes`` are the entries' sizes in bytes. A range ends once it holds ``SEGMENT_MAX`` bytes
    or more; a last range under :data:`SEGMENT_MIN` joins the one before it. When the entries
    hold more than :data:`SEGMENTS_AT_ONCE` times that, a range ends once it holds a
    ``SEGMENTS_AT_ONCE``-th of them instead, and when ``at_least`` is more (the largest segment
    a pack takes in: a small pack on request that takes in a large segment writes it again
    as large, not cut up), once it holds that; never later than at :data:`SEGMENT_LARGEST`.
    So at most that many ranges of entries no larger than a quarter, fewer of larger ones,
    and more only beyond ``SEGMENTS_AT_ONCE`` times ``SEGMENT_LARGEST``; a range holds up to
    its target and one entry.
    """
    total = sum(sizes)
    target = min(max(SEGMENT_MAX, -(-total // SEGMENTS_AT_ONCE), at_least), SEGMENT_LARGEST)
    ranges: list[tuple[int, int]] = []
    start, held = first, 0
    for seq, size in enumerate(sizes, first):
        held += size
        if held >= target:
            ranges.append((start, seq + 1))
            start, held = seq + 1, 0
    end = first + len(sizes)
    if start < end:
        if ranges and held < SEGMENT_MIN:
            ranges[-1] = (ranges[-1][0], end)
        else:
            ranges.append((start, end))
    return ranges


def _put_segments(
    layout: Layout, new: Sequence[tuple[str, int, int, bytes]], damaged: frozenset[str]
) -> Steps[None]:
    """PUT segments with ``If-None-Match: *``; one already there must hold the same entries.

    Two packs of one State write the same segments (the same final entries). A segment of
    S3Store's that the read found damaged (its key in ``damaged``, its body beginning as a
    segment does) is written again over the object there, with ``If-Match`` on that object's
    ETag. Anything else under a segment's key is not S3Store's segment, and nothing is
    removed on its strength.
    """
    puts = [layout.put(key, body, IfNoneMatch="*") for key, _, _, body in new]
    outcomes = yield from layout.send(puts)
    for (key, start, end, body), outcome in zip(new, outcomes, strict=True):
        if not isinstance(outcome, Exception):
            continue
        if error_code(outcome) not in PRECONDITION_CODES:
            layout.fail(outcome, key, "PutObject", "If-None-Match: *")
        yield from _meet_segment(layout, key, (start, end), body, key in damaged)


def _meet_segment(
    layout: Layout, key: str, span: tuple[int, int], body: bytes, damaged: bool
) -> Steps[None]:
    """The object under a segment's key that a pack meets: the same entries, or damaged."""
    where = layout.url(key)
    start, end = span
    for _ in range(SEGMENT_TRIES):
        (there,) = yield from layout.send([layout.get(key)])
        if isinstance(there, Exception):
            layout.fail(there, key, "GetObject (a segment another pack wrote)")
        try:
            if loads_segment(there["Body"], where, start, end) == loads_segment(
                body, where, start, end
            ):
                return
        except CorruptStateError as e:
            if not (damaged and begins_as_segment(there["Body"])):
                raise _in_the_way(where, span, str(e).removeprefix(f"{where} ")) from None
        else:
            raise _in_the_way(where, span, "it holds other entries")
        etag = there["ETag"]
        (put,) = yield from layout.send([layout.put(key, body, IfMatch=etag)])
        if not isinstance(put, Exception):
            logger.warning("%s was damaged: packed again from the entry objects", where)
            return
        if error_code(put) not in PRECONDITION_CODES:
            layout.fail(put, key, "PutObject", f"If-Match: {etag}")
        # Replaced since we read it (another pack repairing it too): read it again.
    raise CorruptStateError(
        f"{where} was replaced {SEGMENT_TRIES} times while this pack wrote it again: pack again"
    )


def _in_the_way(where: str, span: tuple[int, int], why: str) -> CorruptStateError:
    start, end = span
    return CorruptStateError(
        f"{where} is in the way of packing entries {start} to {end - 1} of the State: "
        f"{why}. S3Store did not write it: delete it and pack again"
    )
