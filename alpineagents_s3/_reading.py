"""The steps of ``S3Store.read``, ``list`` and ``objects``, and the listing they share.

A read GETs the snapshot and lists the packed segments and the entries at once, then GETs the
segments (``_segments``) with the entries the snapshot counts after them (by key: they are
final), then the other entries after them, each page while it lists the next. It
returns the unbroken run of entries from seq 0 only; entries beyond a gap (orphans of a save that
was stopped halfway) are remembered with their ETags, not returned. The snapshot's metadata says
how many entries were stored when it was written: a run shorter than that (a writer added entries
between our listing and our snapshot GET, or a pack removed entries it had packed) is listed
again, segments included, and one that stays shorter means entry objects were deleted.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, NamedTuple

from alpineagents_s3 import _contract, _patches, _refs
from alpineagents_s3._codec import loads_entry, validate_id
from alpineagents_s3._contract import Record, Summary
from alpineagents_s3._layout import (
    ALONE_META,
    BASE_META,
    ENTRIES_META,
    GENERATION_META,
    OPEN_META,
    PENDING,
    PENDING_META,
    REFUSED_BASE,
    WRITER_META,
    Layout,
    StoredSnapshot,
)
from alpineagents_s3._segments import (
    Known,
    Segment,
    chain,
    read_chain,
    segment_gets,
    segments_in,
    take_segments,
)
from alpineagents_s3._steps import Call, Outcome, Response, Steps, error_code
from alpineagents_s3._timestamps import as_datetime
from alpineagents_s3._translate import NOT_FOUND_CODES
from alpineagents_s3._versions import Effective, Ledger, Version
from alpineagents_s3.errors import CorruptStateError, SchemaVersionError

logger = logging.getLogger("alpineagents_s3")

# How often a read lists again when the snapshot accounts for more entries than it found.
RELISTS = 3
# Keys of the first listing of entries, made before the read knows which are packed: a small
# page is quick to answer, and the pages after it are full ones.
FIRST_PAGE = 100
# At most this many entries the snapshot counts after the segments are fetched with them, by
# key (more are fetched as the listing names them).
PREFETCH = 100
# At most this many final entries after the known segments are fetched with the snapshot by a
# store object that read the State before: fetched for nothing if another process packed them
# since (the listing of segments in the same round tells), so fewer than ``PREFETCH``.
WARM_PREFETCH = 32


class Fetched(NamedTuple):
    """An entry as read (from its object or a segment), and what its metadata says of its writer.

    A named tuple, not a frozen dataclass: a load of 10,000 packed entries makes one for
    each, and a tuple is made in a quarter of the time.

    Attributes:
        entry: The history entry.
        base: The snapshot ETag its writer saved it on top of (``None``: not recorded).
        writer: The token of its writer (``None``: not recorded).
        pending: Whether it belongs to a save that ends with a snapshot PUT.
        change: For an entry committed alone (layout 3), the change of the snapshot it
            carries (``_patches``); ``None`` for the others.
    """

    entry: dict[str, Any]
    base: str | None
    writer: str | None = None
    pending: bool = False
    change: str | None = None


class Entries(Mapping[int, Fetched]):
    """The entries a read found, by seq: the run from seq 0 read from packed segments, then others.

    The run from segments is kept as the segments' parse gave it, a list, and an entry of it
    is a :class:`Fetched` (with no base or writer: it is final) only when asked for by seq: a
    load of 10,000 packed entries makes no object for each, nor a dict of them, which the
    garbage collector would then walk. The others are entries read from their own objects,
    and from segments read after the run was listed again.
    """

    __slots__ = ("others", "packed")

    def __init__(self, packed: list[dict[str, Any]]) -> None:
        self.packed = packed
        self.others: dict[int, Fetched] = {}

    def __getitem__(self, seq: int) -> Fetched:
        if 0 <= seq < len(self.packed):
            return Fetched(self.packed[seq], None)
        return self.others[seq]

    def __contains__(self, seq: object) -> bool:
        if isinstance(seq, int) and 0 <= seq < len(self.packed):
            return True
        return seq in self.others

    def __iter__(self) -> Iterator[int]:
        yield from range(len(self.packed))
        yield from self._beyond()

    def __len__(self) -> int:
        return len(self.packed) + sum(1 for _ in self._beyond())

    def _beyond(self) -> Iterator[int]:
        """The seqs of ``others`` outside the packed run."""
        return (seq for seq in self.others if not 0 <= seq < len(self.packed))

    def __setitem__(self, seq: int, fetched: Fetched) -> None:
        """Keep ``fetched`` at ``seq``, which must not be one of the packed run's.

        A read fetches an entry object only for a seq it has no entry for (``scan``): one
        that the run holds is a mistake of the read, not an entry to keep beside it.
        """
        if 0 <= seq < len(self.packed):
            raise ValueError(f"history entry {seq} was read from a packed segment already")
        self.others[seq] = fetched

    def setdefault(self, seq: int, fetched: Fetched) -> Fetched:
        """The entry at ``seq``, after keeping ``fetched`` there if there was none."""
        if seq in self:
            return self[seq]
        self.others[seq] = fetched
        return fetched

    def run(self) -> int:
        """How many entries from seq 0 on were found without a hole."""
        seq = len(self.packed)
        while seq in self.others:
            seq += 1
        return seq

    def run_of(self, end: int) -> list[dict[str, Any]]:
        """The entries of seqs 0 to ``end - 1`` (found: ``end`` is at most :meth:`run`)."""
        if end <= len(self.packed):
            return self.packed[:end]
        return [*self.packed, *(self.others[seq].entry for seq in range(len(self.packed), end))]


@dataclass(frozen=True)
class StoredObject:
    """One object of a saved State, as :meth:`S3Store.objects` lists it.

    Attributes:
        key: The object's key in the bucket.
        size: Its size in bytes.
        kind: ``"snapshot"``, ``"entry"`` (a history entry of the State), ``"segment"`` (a
            packed segment of the State's entries, see ``S3Store.pack``), ``"abandoned"`` (an
            entry or segment of a create that did not finish or lost a race: never read,
            removed with the State) or ``"other"`` (not written by S3Store).
        seq: The history entry's seq, for entries; the first seq it holds, for segments.
        last_modified: When S3 stored it.
    """

    key: str
    size: int
    kind: str
    seq: int | None
    last_modified: datetime


def get_snapshot(layout: Layout, state_id: str, action: str) -> Steps[StoredSnapshot | None]:
    """The State's snapshot object, or ``None`` when there is none."""
    key = layout.snapshot_key(state_id)
    (outcome,) = yield from layout.send([layout.get(key)])
    if isinstance(outcome, Exception):
        if error_code(outcome) in NOT_FOUND_CODES:
            return None
        layout.fail(outcome, key, action)
    return layout.stored_snapshot(state_id, outcome)


@dataclass
class Gathered:
    """What a read found of a State, before deciding which entries are its own.

    Attributes:
        stored: The snapshot object.
        entries: The unbroken run of entries from seq 0 (from segments and entry objects), and
            entries beyond it that extend no run.
        listed: The entry objects of the snapshot's generation listed (seq: key, ETag); seqs
            read from segments may be missing.
        segments: The packed segments of the generation last listed.
        run: How many entries from seq 0 on were read without a hole.
        packed: How many entries from seq 0 on were read from segments (a damaged segment is
            listed in ``segments`` but ends this).
    """

    stored: StoredSnapshot
    entries: Entries
    listed: dict[int, tuple[str, str]]
    segments: list[Segment]
    run: int
    packed: int


def read(layout: Layout, ledger: Ledger, state_id: str) -> Steps[Record | None]:
    """The State's Record: the snapshot and the unbroken run of entries from seq 0."""
    record, _ = yield from read_gathered(layout, ledger, state_id)
    return record


def read_gathered(
    layout: Layout, ledger: Ledger, state_id: str
) -> Steps[tuple[Record, Gathered] | tuple[None, None]]:
    """``read``, and what it gathered (for a pack of what it read)."""
    validate_id(state_id)
    held = ledger.versions.get(state_id)
    known = ledger.chains.pop(state_id, None)  # kept again if the read succeeds
    if known is not None and held is not None:
        if held.generation != known.generation:
            known = None  # this store object created the State again since
        else:
            # Its own saves since: the entries below the count of its last snapshot are final.
            known = replace(known, count=max(known.count, held.landed))
    found = yield from gather(layout, state_id, known=known)
    ledger.know_chain(state_id, None if found is None else known_chain(found))
    if found is None:
        return None, None
    stored, entries, listed = found.stored, found.entries, found.listed
    if stored.meta.layout >= 3:
        gap = committed(entries, stored.meta.count or 0, found.run)
    else:
        # Beyond the count, only entries saved on top of this very snapshot are the State's.
        also = (stored.meta.claimed_from, stored.meta.claimer)
        gap = _vouched(entries, stored.meta.count or 0, stored.etag, found.run, also)
    orphans = {seq: etag for seq, (_, etag) in listed.items() if seq > gap}
    if orphans:
        logger.info(
            "%s: %d entry object(s) beyond seq %d, where a save was stopped halfway, are left "
            "out; the next save replaces or removes them",
            layout.url(layout.entries_prefix(state_id)),
            len(orphans),
            gap,
        )
    count = stored.meta.count
    tail_writer = entries[count or 0].writer if gap > (count or 0) else None
    version = Version(
        stored.etag,
        stored.meta.generation,
        count=count,
        landed=count or 0,
        layout=stored.meta.layout,
        open=stored.meta.open,
        tail_writer=tail_writer,
    )
    if (
        held is not None
        and ledger.versions.get(state_id) is held
        and held.wrote(stored.meta.generation, stored.meta.token)
    ):
        # A snapshot PUT of this store object whose answer was lost landed: the State is still
        # this store object's own, as its next save would find (``_settle``).
        held = held.landed_as(stored.etag, count)
        ledger.versions[state_id] = held
    ledger.remember(state_id, held, version, gap, orphans)
    logger.debug("read %s: %d entries", layout.url(layout.snapshot_key(state_id)), gap)
    history = entries.run_of(gap)
    snapshot = stored.snapshot
    where = layout.url(layout.snapshot_key(state_id))
    if snapshot is not None and _refs.has_context(snapshot):
        # What the next save may refer to: the texts this snapshot refers to, and those it
        # keeps whole that the newest entries hold.
        texts = _refs.texts_of(stored.meta.generation, stored.refs, gap)
        texts.add(history[count or 0 :])  # saved alone beyond the count: no snapshot has them
        whole = _refs.whole_texts(snapshot)
        if whole:
            depth = 2 * len(snapshot[_refs.CONTEXT]) + 64
            _refs.find_texts(texts, history, whole, depth)
        if stored.refs:
            snapshot = _refs.resolve(snapshot, stored.refs, history, where)
        ledger.know_texts(state_id, texts)
    elif snapshot is not None:
        if stored.refs:  # a long answer kept in the reply it copies (``_refs.encode``)
            snapshot = _refs.resolve(snapshot, stored.refs, history, where)
        ledger.know_texts(state_id, _refs.Texts(stored.meta.generation, context=False))
    else:
        ledger.texts.pop(state_id, None)
    snapshot = changed_snapshot(layout, state_id, stored, entries, gap, snapshot)
    if (
        stored.meta.layout >= 3
        and snapshot is not None
        and not _refs.has_context(snapshot)
        and (now := ledger.versions.get(state_id)) is not None
        and not now.own
        and (now.etag, now.count) == (stored.etag, gap)
    ):
        # What a save of this store object diffs against, once it replaced the snapshot.
        effective = Effective(stored.etag, stored.meta.generation, gap, snapshot)
        ledger.know_effective(state_id, effective)
    record = _contract.make_record(history, snapshot)
    return record, found


def gather(
    layout: Layout, state_id: str, again: int = RELISTS, known: Known | None = None
) -> Steps[Gathered | None]:
    """The snapshot, and the entries from seq 0 on: from packed segments, then entry objects.

    Round 1 GETs the snapshot and lists the segments and the first page of entries; round 2
    GETs the segments and up to ``PREFETCH`` entries the snapshot counts after them (and
    lists the entries after them); then the other entries after the segments are fetched,
    page by page. An entry fetched by key is wasted when a pack took it into a segment
    between the rounds, or made again when it could not be read. ``None`` when there is no
    snapshot.

    With ``known``, the chain the last read of this store object read, round 1 also GETs its
    segments and the final entries after them, and lists the entries from its end: a State
    packed since that read needs no round 2 (see :func:`warm_round`).
    """
    prefix = layout.entries_prefix(state_id)
    snap_key = layout.snapshot_key(state_id)
    packed: list[dict[str, Any]] = []  # entries from seq 0 on, from segments
    early: dict[int, Fetched] = {}
    asked = False
    damaged: str | None = None
    start = 0  # entries below it were read from segments
    listed_from = 0  # the seq ``page`` lists from
    if known is None:
        snap_out, packed_page, page = yield from layout.send(
            [
                layout.get(snap_key),
                layout.list_page(layout.packed_prefix(state_id)),
                layout.list_page(prefix, MaxKeys=FIRST_PAGE),
            ]
        )
        warm = None
    else:
        warm = yield from warm_round(layout, state_id, known)
        snap_out, packed_page, page = warm.snapshot, warm.packed_page, warm.page
    if isinstance(snap_out, Exception):
        if error_code(snap_out) in NOT_FOUND_CODES:
            return None
        layout.fail(snap_out, snap_key, "GetObject")
    stored = layout.stored_snapshot(state_id, snap_out)
    generation = stored.meta.generation
    mine = f"{prefix}{generation}/"
    covered = stored.meta.count
    if warm is not None:
        if generation != warm.known.generation or (covered or 0) < warm.known.count:
            # Deleted and created again since: what the chain holds is another State's.
            return (yield from gather(layout, state_id, again))
        reach = take_segments(layout, warm.known.segments, warm.segments, packed, 0)
        _prefetched(layout, state_id, generation, warm.tail, warm.tail_outcomes, early)
        asked = True
        start = reach.end
        damaged = reach.damaged
        listed_from = warm.known.end
    segments = yield from _listed_segments(layout, state_id, generation, packed_page)

    # The segments first, with the listing of the entries after them in the same round, and
    # the GETs of the entries the snapshot counts after them: those are final, so their keys
    # are known without a listing.
    for _ in range(RELISTS):
        picked = [s for s in chain(segments, covered) if s.end > start]
        if not picked:
            break
        extra = []
        # The page lists all entries (a first load), or those after the known segments, which
        # new segments may cover by more than a page: list from the segments' end instead.
        onward = start == 0 or (warm is not None and picked[-1].end > listed_from)
        if onward and (isinstance(page, Exception) or page.get("IsTruncated")):
            listed_from = picked[-1].end
            last = layout.entry_key(state_id, generation, listed_from - 1)
            extra = [layout.list_page(mine, StartAfter=last)]
        listing = len(extra)
        tail = range(0)
        if not asked:  # once, with the first segments
            asked = True
            tail = range(picked[-1].end, min(covered or 0, picked[-1].end + PREFETCH))
            extra += [layout.get(layout.entry_key(state_id, generation, seq)) for seq in tail]
        reach, others = yield from read_chain(layout, picked, packed, 0, extra)
        if listing:
            page = others[0]
        _prefetched(layout, state_id, generation, tail, others[listing:], early)
        start = max(start, reach.end)
        damaged = damaged or reach.damaged
        if not reach.gone:
            break
        # A later pack merged a segment into a bigger one (and removed it): list them again.
        (packed_page,) = yield from layout.send([layout.list_page(layout.packed_prefix(state_id))])
        segments = yield from _listed_segments(layout, state_id, generation, packed_page)
    entries = Entries(packed)
    del packed
    for seq, found_early in early.items():
        entries.setdefault(seq, found_early)
    if start < listed_from or (warm is not None and isinstance(page, Exception)):
        # A segment was damaged or gone: list the entries it covered (or, after a first round
        # with the known segments, the entries after them, whose listing failed).
        skip = {"StartAfter": layout.entry_key(state_id, generation, start - 1)} if start else {}
        (page,) = yield from layout.send([layout.list_page(mine, **skip)])
    listed: dict[int, tuple[str, str]] = {}
    jump = layout.entry_key(state_id, generation, start - 1) if start else None
    yield from scan(layout, state_id, generation, page, listed, entries, after=jump, start=start)

    # A writer may have added entries between our listing and our snapshot GET, and a pack
    # may have removed entry objects it packed since we listed segments.
    for _ in range(RELISTS):
        gap = entries.run()
        if covered is None or gap >= covered:
            break
        skip = {"StartAfter": layout.entry_key(state_id, generation, gap - 1)} if gap else {}
        page, packed_page = yield from layout.send(
            [layout.list_page(mine, **skip), layout.list_page(layout.packed_prefix(state_id))]
        )
        segments = yield from _listed_segments(layout, state_id, generation, packed_page)
        picked = [s for s in chain(segments, covered) if s.end > gap]
        if picked:
            more: list[dict[str, Any]] = []
            reach, _ = yield from read_chain(layout, picked, more, picked[0].start)
            damaged = damaged or reach.damaged
            if picked[0].start <= start:
                start = max(start, reach.end)
            for seq, entry in enumerate(more, picked[0].start):
                entries.setdefault(seq, Fetched(entry, None))
        yield from scan(layout, state_id, generation, page, listed, entries, start=entries.run())
    gap = entries.run()
    if covered is not None and gap < covered and again:
        # A save and a pack (remove_entries) since our snapshot GET: the segment reaches
        # beyond the count we read, and the entries we listed are gone. Read the State again.
        (head,) = yield from layout.send([layout.head(snap_key)])
        if isinstance(head, Exception):
            if error_code(head) in NOT_FOUND_CODES:
                return None
            layout.fail(head, snap_key, "HeadObject")
        if head.get("ETag") != stored.etag:
            return (yield from gather(layout, state_id, again - 1))
    if covered is not None and gap < covered:
        why = f" (a packed segment is damaged: {damaged})" if damaged else ""
        raise CorruptStateError(
            f"{layout.url(snap_key)} accounts for {covered} history entries, but "
            f"{layout.url(mine)} holds {gap} in a row from seq 0{why}: entry objects were "
            "deleted or moved. Restore them from a bucket version, or delete the State"
        )
    return Gathered(stored, entries, listed, segments, gap, start)


@dataclass
class WarmRound:
    """What the first round of a read that knew the State's chain of segments found.

    Attributes:
        known: The chain it was made for.
        segments: The outcomes of the known segments' GETs (``take_segments`` reads them).
        snapshot: The snapshot GET's outcome.
        packed_page: The first page of the listing of the State's segments.
        page: The first page of the listing of the known generation's entries after the chain.
        tail: The seqs of the final entries after the chain GET by key.
        tail_outcomes: Their GETs' outcomes.
    """

    known: Known
    segments: list[Outcome]
    snapshot: Outcome
    packed_page: Outcome
    page: Outcome
    tail: range
    tail_outcomes: list[Outcome]


def warm_round(layout: Layout, state_id: str, known: Known) -> Steps[WarmRound]:
    """Round 1 of a read that knows a chain of segments of the State (``Ledger.chains``).

    The snapshot GET and the listing of the segments, as any read's, and with them the GETs of
    the known segments and of up to ``WARM_PREFETCH`` final entries after them, and the listing of
    the entries from the chain's end. Segments are immutable and hold final entries, so what
    they give is the State's if the snapshot is of the same generation (``gather`` checks
    before it reads their outcomes); a segment a later pack merged away is not found, and the
    chain listed replaces it.
    """
    generation = known.generation
    after = layout.entry_key(state_id, generation, known.end - 1)
    mine = f"{layout.entries_prefix(state_id)}{generation}/"
    tail = range(known.end, min(known.count, known.end + WARM_PREFETCH))
    calls = [
        layout.get(layout.snapshot_key(state_id)),
        layout.list_page(layout.packed_prefix(state_id)),
        layout.list_page(mine, StartAfter=after),
        *(layout.get(layout.entry_key(state_id, generation, seq)) for seq in tail),
    ]
    outcomes = yield from layout.send([*segment_gets(layout, known.segments), *calls])
    first = len(known.segments)
    snapshot, packed_page, page, *tail_outcomes = outcomes[first:]
    return WarmRound(known, outcomes[:first], snapshot, packed_page, page, tail, tail_outcomes)


def known_chain(found: Gathered) -> Known | None:
    """The chain of segments ``found`` read whole, for the next read of the State."""
    count = found.stored.meta.count or 0
    return Known.of(found.stored.meta.generation, found.segments, count, found.packed)


def _prefetched(
    layout: Layout,
    state_id: str,
    generation: str,
    seqs: range,
    outcomes: Sequence[Outcome],
    into: dict[int, Fetched],
) -> None:
    """Keep the entries GET by key before any listing named them (``gather``, round 2).

    An entry that could not be read is left out: the listing finds it, and the GET made then
    fails (or reads it) as any other; a key that is not there is for the listing to explain.
    """
    for seq, outcome in zip(seqs, outcomes, strict=True):
        if isinstance(outcome, Exception):
            continue
        key = layout.entry_key(state_id, generation, seq)
        try:
            into[seq] = fetched(outcome, layout.url(key), seq)
        except (CorruptStateError, SchemaVersionError):
            continue


def committed(entries: Mapping[int, Fetched], count: int, run: int) -> int:
    """How many entries from seq 0 on are the State's, under a layout 3 snapshot.

    The ``count`` the snapshot accounts for, then the entries committed alone after it (each
    save's PUT of its one entry, or of a tool result), by the writer of the first of them,
    whatever snapshot they were saved on: a snapshot replaced since by a save that added no
    entry does not undo them. An entry of another writer ends the run (two writers committing
    alone race, and the first has it), and so do a pending entry (its save ends with a snapshot
    PUT), an entry of a refused save, and one saved without the layout 3 mark (an older
    alpineagents-s3, which checks its entries against the snapshot instead). ``run`` is the
    unbroken run found.
    """
    seq = min(count, run)
    writer = entries[seq].writer if seq < run else None
    while seq < run:
        fetched = entries[seq]
        if (
            fetched.change is None
            or fetched.pending
            or fetched.base == REFUSED_BASE
            or writer is None
            or fetched.writer != writer
        ):
            break
        seq += 1
    return seq


def changed_snapshot(
    layout: Layout,
    state_id: str,
    stored: StoredSnapshot,
    entries: Mapping[int, Fetched],
    gap: int,
    snapshot: dict[str, Any] | None,
) -> dict[str, Any] | None:
    """``snapshot`` (the stored one) with the changes of the entries committed alone after it."""
    for seq in range(stored.meta.count or 0, gap):
        change = entries[seq].change
        if change is None or change == _patches.NO_CHANGE:
            continue
        where = layout.url(layout.entry_key(state_id, stored.meta.generation, seq))
        if snapshot is None:
            raise CorruptStateError(
                f"{where} changes the snapshot of a State that has none "
                f"({layout.url(layout.snapshot_key(state_id))} holds null)"
            )
        snapshot = _patches.apply(snapshot, change, where)
    return snapshot


def _listed_segments(
    layout: Layout, state_id: str, generation: str, page: Outcome
) -> Steps[list[Segment]]:
    """The segments of ``generation`` in a listing of the State's packed prefix, every page."""
    prefix = layout.packed_prefix(state_id)
    if isinstance(page, Exception):
        layout.fail(page, prefix, "ListObjectsV2")
    items = yield from list_all(layout, prefix, first=page)
    return segments_in(layout, state_id, generation, items)


def _vouched(
    entries: Mapping[int, Fetched],
    count: int,
    etag: str,
    run: int,
    also: tuple[str | None, str | None] = (None, None),
) -> int:
    """How many entries from seq 0 on are the State's.

    The ``count`` the snapshot accounts for, then the entries saved alone on top of it (based
    on ``etag``, not pending), by the writer of the first of them. ``run`` is the unbroken run
    found. An entry of another writer ends the run: two writers saving alone on one snapshot
    race, and the one whose entry comes first has it. A pending entry ends it too: its save is
    either under way (its snapshot PUT will count it) or was stopped, and then did not happen.
    ``also`` is, for a claim, the snapshot it replaced and the claiming writer: that writer's
    entries saved alone on the replaced snapshot count as saved on the claim. An entry
    without a base or writer (written before they were recorded) is taken as before.
    """
    claimed_from, claimer = also
    seq = min(count, run)
    writer = entries[seq].writer if seq < run else None
    while seq < run:
        fetched = entries[seq]
        based = fetched.base in (None, etag) or (
            claimed_from is not None and fetched.base == claimed_from and fetched.writer == claimer
        )
        if not based or fetched.pending or fetched.writer != writer:
            break
        seq += 1
    return seq


def fetched(response: Response, where: str, seq: int) -> Fetched:
    """An entry object's GetObject response, read."""
    metadata = response.get("Metadata", {})
    return Fetched(
        loads_entry(response["Body"], where, seq),
        metadata.get(BASE_META),
        metadata.get(WRITER_META),
        metadata.get(PENDING_META) == PENDING,
        metadata.get(ALONE_META),
    )


def scan(
    layout: Layout,
    state_id: str,
    generation: str,
    page: Outcome,
    listed: dict[int, tuple[str, str]],
    into: Entries | None = None,
    *,
    after: str | None = None,
    start: int = 0,
) -> Steps[None]:
    """List the entries of ``generation`` from ``page`` on into ``listed`` (seq: key, ETag).

    With ``into``, also GET the entries that extend the unbroken run from seq 0, each round
    fetching the entries of one page while it lists the next, from seq ``start`` on (the seqs
    before it are in ``into`` already). Seqs up to the key ``after`` are not needed: a
    truncated listing of all generations skips to it.
    """
    prefix = layout.entries_prefix(state_id)
    mine = f"{prefix}{generation}/"
    while True:
        if isinstance(page, Exception):
            layout.fail(page, prefix, "ListObjectsV2")
        last = ""
        for item in page.get("Contents", ()):
            last = item["Key"]
            parsed = layout.parse_entry_key(state_id, last)
            if parsed is None:
                logger.debug("ignoring %s: not an entry object", layout.url(last))
            elif parsed[0] == generation:
                listed[parsed[1]] = (last, item.get("ETag", ""))
        calls: list[Call] = []
        if page.get("IsTruncated"):
            jump = max(after or "", mine)
            if page.get("Prefix") != mine and last < jump:
                calls = [layout.list_page(mine, StartAfter=jump)]
            else:
                calls = [
                    layout.list_page(page.get("Prefix", prefix), page["NextContinuationToken"])
                ]
        wanted: list[int] = []
        if into is not None:
            seq = start
            while seq in listed:
                if seq not in into:
                    wanted.append(seq)
                seq += 1
        outcomes = yield from layout.send(calls + [layout.get(listed[s][0]) for s in wanted])
        if calls:
            page = outcomes.pop(0)
        for seq, outcome in zip(wanted, outcomes, strict=True):
            key = listed[seq][0]
            if isinstance(outcome, Exception):
                if error_code(outcome) in NOT_FOUND_CODES:
                    # Deleted since it was listed (an orphan a writer cleared): the run ends
                    # below it; listing again tells what follows.
                    del listed[seq]
                    continue
                layout.fail(outcome, key, "GetObject")
            if into is not None:
                into[seq] = fetched(outcome, layout.url(key), seq)
        if not calls:
            return


def list_states(layout: Layout) -> Steps[list[Summary]]:
    """One ListObjectsV2 per 1,000 States (by ``/``), snapshot GETs in parallel.

    Each State is summarised by the installed core's own summary class. A State created without
    a snapshot (alpineagents 0.2-0.4, in the middle of a turn) is listed once its first snapshot
    is saved. A snapshot that is damaged or of a newer layout or schema is left out with a
    warning on the ``alpineagents_s3`` logger; ``load`` of that id raises the error.
    """
    saved: list[Summary] = []
    running: list[tuple[str, StoredSnapshot]] = []  # open layout 3 snapshots: read changes
    (page,) = yield from layout.send([layout.list_page(layout.root, Delimiter="/")])
    while True:
        if isinstance(page, Exception):
            layout.fail(page, layout.root, "ListObjectsV2")
        ids = []
        for common in page.get("CommonPrefixes", ()):
            name = common["Prefix"][len(layout.root) :].rstrip("/")
            try:
                ids.append(validate_id(name))
            except ValueError:
                logger.debug("ignoring %s: not a State id", layout.url(common["Prefix"]))
        token = page.get("NextContinuationToken") if page.get("IsTruncated") else None
        calls = [layout.list_page(layout.root, token, Delimiter="/")] if token else []
        outcomes = yield from layout.send(calls + [layout.get(layout.snapshot_key(i)) for i in ids])
        if token:
            page = outcomes.pop(0)
        for state_id, outcome in zip(ids, outcomes, strict=True):
            key = layout.snapshot_key(state_id)
            if isinstance(outcome, Exception):
                if error_code(outcome) in NOT_FOUND_CODES:
                    continue  # a create that did not finish, or a State being deleted
                layout.fail(outcome, key, "GetObject")
            try:
                metadata = outcome.get("Metadata", {})
                layout.check_layout(metadata, key)
                if metadata.get(OPEN_META) == "1" and metadata.get(ENTRIES_META, "").isdigit():
                    running.append((state_id, layout.stored_snapshot(state_id, outcome)))
                    continue
                snapshot, _ = layout.snapshot_of(metadata, outcome["Body"], key)
                if snapshot is None:
                    logger.debug("not listing %s: created without a snapshot", layout.url(key))
                    continue
                saved.append(_summary(layout, state_id, snapshot, key))
            except (CorruptStateError, SchemaVersionError) as e:
                # One State that cannot be read does not hide the others; its load says why.
                logger.warning("not listing State %r: %s: %s", state_id, type(e).__name__, e)
        if not token:
            break
    changed = yield from changes_after(layout, running)
    for state_id, _ in running:
        key = layout.snapshot_key(state_id)
        try:
            _, snapshot = changed[state_id]
            if isinstance(snapshot, CorruptStateError):
                raise snapshot
            if snapshot is not None:
                saved.append(_summary(layout, state_id, snapshot, key))
        except (CorruptStateError, SchemaVersionError) as e:
            logger.warning("not listing State %r: %s: %s", state_id, type(e).__name__, e)
    return _contract.newest_first(saved)


def changes_after(
    layout: Layout, found: list[tuple[str, StoredSnapshot]]
) -> Steps[dict[str, tuple[int, Any]]]:
    """For layout 3 snapshots: the entries committed alone after each, and their changes.

    Each State maps to how many entries from seq 0 on are its own (the count, then those
    committed alone after it) and the snapshot with their changes applied (or the
    ``CorruptStateError`` that applying them raised).

    The entries after each snapshot's count are listed (one request per State, all at once),
    then HEADed (their metadata carries the changes), all at once: two rounds for every
    running State together. A State whose changes cannot be read maps to the error. (A save
    replaces the snapshot every ``CHECKPOINT_EVERY`` entries committed alone, so there are
    few; one page of the listing, 1,000 entries, is read.)
    """
    pages = yield from layout.send(
        [_after_count(layout, state_id, stored) for state_id, stored in found]
    )
    wanted: list[tuple[str, int, str]] = []  # (state id, seq, key), seqs in a row from count
    for (state_id, stored), page in zip(found, pages, strict=True):
        if isinstance(page, Exception):
            layout.fail(page, layout.entries_prefix(state_id), "ListObjectsV2")
        seq = stored.meta.count or 0
        for item in page.get("Contents", ()):
            parsed = layout.parse_entry_key(state_id, item["Key"])
            if parsed is None:
                continue  # not an entry object (a load skips it too)
            if parsed != (stored.meta.generation, seq):
                break
            wanted.append((state_id, seq, item["Key"]))
            seq += 1
    heads = yield from layout.send([layout.head(key) for _, _, key in wanted])
    seen: dict[str, dict[int, Fetched]] = {state_id: {} for state_id, _ in found}
    for (state_id, seq, key), head in zip(wanted, heads, strict=True):
        if isinstance(head, Exception):
            if error_code(head) in NOT_FOUND_CODES:
                continue  # removed since it was listed (an orphan cleared): the run ends there
            layout.fail(head, key, "HeadObject")
        metadata = head.get("Metadata", {})
        seen[state_id][seq] = Fetched(
            {},
            metadata.get(BASE_META),
            metadata.get(WRITER_META),
            metadata.get(PENDING_META) == PENDING,
            metadata.get(ALONE_META),
        )
    changed: dict[str, tuple[int, Any]] = {}
    for state_id, stored in found:
        count = stored.meta.count or 0
        entries = seen[state_id]
        run = count
        while run in entries:
            run += 1
        gap = committed(entries, count, run)
        try:
            snapshot = stored.snapshot
            after = changed_snapshot(layout, state_id, stored, entries, gap, snapshot)
            changed[state_id] = (gap, after)
        except CorruptStateError as e:
            changed[state_id] = (gap, e)
    return changed


def _after_count(layout: Layout, state_id: str, stored: StoredSnapshot) -> Call:
    """A listing of the entries of the snapshot's generation from its count on."""
    mine = f"{layout.entries_prefix(state_id)}{stored.meta.generation}/"
    count = stored.meta.count or 0
    if not count:
        return layout.list_page(mine)
    last = layout.entry_key(state_id, stored.meta.generation, count - 1)
    return layout.list_page(mine, StartAfter=last)


def _summary(layout: Layout, state_id: str, snapshot: dict[str, Any], key: str) -> Summary:
    """The core's summary of a snapshot; a snapshot it cannot read names the object."""
    try:
        return _contract.summarize(state_id, snapshot)
    except Exception as e:
        newer = any(c.__name__ == "SchemaVersionError" for c in type(e).__mro__)
        error = SchemaVersionError if newer else CorruptStateError
        raise error(
            f"{layout.url(key)} is not a snapshot alpineagents {_contract.CORE_VERSION} can "
            f"summarise: {type(e).__name__}: {e}"
        ) from e


def list_all(layout: Layout, prefix: str, first: Response | None = None) -> Steps[list[Response]]:
    """Every object under ``prefix``, as ListObjectsV2 describes them, page after page.

    ``first`` is a first page of that listing already fetched: the listing goes on after it.
    """
    items: list[Response] = []
    token = None
    if first is not None:
        items.extend(first.get("Contents", ()))
        token = first.get("NextContinuationToken") if first.get("IsTruncated") else None
        if not token:
            return items
    while True:
        (page,) = yield from layout.send([layout.list_page(prefix, token)])
        if isinstance(page, Exception):
            layout.fail(page, prefix, "ListObjectsV2")
        items.extend(page.get("Contents", ()))
        token = page.get("NextContinuationToken") if page.get("IsTruncated") else None
        if not token:
            return items


def objects(layout: Layout, state_id: str) -> Steps[list[StoredObject]]:
    """Every object of a State with its size and role, in key order."""
    validate_id(state_id)
    prefix = layout.state_prefix(state_id)
    snap_key = layout.snapshot_key(state_id)
    head, listing = yield from layout.send([layout.head(snap_key), layout.list_page(prefix)])
    generation = None
    if isinstance(head, Exception):
        if error_code(head) not in NOT_FOUND_CODES:
            layout.fail(head, snap_key, "HeadObject")
    else:
        generation = head.get("Metadata", {}).get(GENERATION_META)
    if isinstance(listing, Exception):
        layout.fail(listing, prefix, "ListObjectsV2")
    items = list(listing.get("Contents", ()))
    if listing.get("IsTruncated"):
        items = yield from list_all(layout, prefix)
    found = []
    for item in items:
        key = item["Key"]
        parsed = layout.parse_entry_key(state_id, key)
        segment = layout.parse_segment_key(state_id, key)
        seq = parsed[1] if parsed else segment[1] if segment else None
        owner = parsed[0] if parsed else segment[0] if segment else None
        if key == snap_key:
            kind = "snapshot"
        elif owner is None:
            kind = "other"
        elif owner != generation:
            kind = "abandoned"
        else:
            kind = "entry" if parsed else "segment"
        found.append(
            StoredObject(key, int(item["Size"]), kind, seq, as_datetime(item["LastModified"]))
        )
    return found
