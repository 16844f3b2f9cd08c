"""Storing a save's entries: conflicts at a seq, leftovers of refused writers, orphans.

An entry is PUT with ``If-None-Match: *``. A 412 means the seq is stored:

* by this store object before (an answer lost): the same entry, skipped;
* by a writer that lost a race or held a stale copy (an entry based on an older snapshot, beyond
  what the stored snapshot counts): replaced;
* by another writer's save that is under way or was stopped (a *pending* entry based on the
  stored snapshot, beyond its count): :class:`Contested` — the caller claims the snapshot
  (``_writing``), after which that entry is based on an older one, and tries again;
* by a second writer otherwise (counted, or saved alone on the stored snapshot): refused, and
  this save's other entries are disowned.

Orphans, entries beyond a gap left by a save killed halfway, are replaced or deleted before a
save fills the gap (after a claim, too).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from alpineagents_s3._codec import loads_entry
from alpineagents_s3._deleting import check_deletes, delete_keys
from alpineagents_s3._layout import (
    ALONE_META,
    BASE_META,
    CLAIMED_META,
    CLAIMER_META,
    ENTRIES_META,
    GENERATION_META,
    PENDING,
    PENDING_META,
    REFUSED_BASE,
    WRITER_META,
    Layout,
    Mark,
)
from alpineagents_s3._steps import Call, Response, Steps, error_code
from alpineagents_s3._translate import NOT_FOUND_CODES, PRECONDITION_CODES
from alpineagents_s3._versions import Ledger, Version
from alpineagents_s3.errors import ConcurrentWriteError

logger = logging.getLogger("alpineagents_s3")

# How often an entry to replace may change under us (its writer disowning it) before giving up.
REPLACE_ATTEMPTS = 3


class Contested(Exception):  # noqa: N818 - a signal between two modules, never raised to users
    """A seq this save needs holds another writer's pending entry on the stored snapshot.

    Whose save lands is decided by the snapshot: the caller claims it, then writes again.
    """


def clear_orphans(
    layout: Layout,
    ledger: Ledger,
    state_id: str,
    version: Version,
    bodies: Mapping[int, bytes],
    mark: Mark,
) -> Steps[tuple[Version, set[int]]]:
    """Replace or delete the orphans, before a write fills the gap below them (lock held).

    Each orphan the write has an entry for is replaced (``If-Match`` on the orphan's ETag), the
    others are deleted, so that no entry of the save that was stopped ever joins the history.
    Returns the Version now, and the seqs stored here. Never touches a seq of the unbroken run:
    orphans all lie beyond ``version.gap``. The deletes are unconditional (S3-compatible servers
    such as LocalStack refuse a conditional DeleteObject), hence the lock, and a HEAD
    (``If-Match``) of each first: an orphan that changed since the read is another writer's
    doing, and the write is refused.
    """
    cleared = replace(version, orphans={})
    current = ledger.versions.get(state_id)
    if current is None or current.generation != version.generation or not current.orphans:
        return cleared, set()  # cleared by a write that held the lock before us
    orphans = dict(current.orphans)
    deleted = sorted(seq for seq in orphans if seq not in bodies)
    stale = [layout.entry_key(state_id, version.generation, seq) for seq in deleted]
    # The count never reaches past what is stored: a save of ours that failed counted its
    # entries, now orphans, and this write removes those it has no entry for.
    count = current.count
    if deleted and count is not None:
        count = min(count, deleted[0])
        cleared = replace(
            cleared, count=count if cleared.count is None else min(cleared.count, count)
        )
    if deleted:
        # The deletes are unconditional: first make sure each orphan is still the object the
        # read listed. Another writer may have cleared it since and committed an entry alone
        # at its seq (in layout 3 nothing else tells), which a delete would take from loads.
        heads = yield from layout.send(
            [
                layout.head(key, IfMatch=orphans[seq])
                for seq, key in zip(deleted, stale, strict=True)
            ]
        )
        for seq, key, outcome in zip(deleted, stale, heads, strict=True):
            if isinstance(outcome, Exception):
                if error_code(outcome) in PRECONDITION_CODES | NOT_FOUND_CODES:
                    raise second_writer(layout, state_id, key, seq)
                layout.fail(outcome, key, "HeadObject (an orphan to remove)")
    puts = {
        seq: layout.entry_key(state_id, version.generation, seq) for seq in orphans if seq in bodies
    }
    calls = [
        layout.entry_put(
            state_id,
            version.generation,
            seq,
            bodies[seq],
            version.etag,
            mark,
            IfMatch=orphans[seq],
        )
        for seq in puts
    ]
    outcomes = yield from layout.send(calls + layout.delete_many(stale))
    stored: set[int] = set()
    changed: list[int] = []
    for (seq, key), outcome in zip(puts.items(), outcomes, strict=False):
        if not isinstance(outcome, Exception):
            stored.add(seq)
        elif error_code(outcome) in PRECONDITION_CODES:
            changed.append(seq)  # replaced since we listed it: by whom?
        elif error_code(outcome) not in NOT_FOUND_CODES:  # gone: it is PUT anew later
            layout.fail(outcome, key, "PutObject", f"If-Match: {orphans[seq]}")
    check_deletes(layout, stale, outcomes[len(calls) :], required=True)
    if changed:
        found = yield from layout.send([layout.get(puts[seq]) for seq in changed])
        for seq, outcome in zip(changed, found, strict=True):
            key = puts[seq]
            if isinstance(outcome, Exception):
                if error_code(outcome) in NOT_FOUND_CODES:
                    continue
                layout.fail(outcome, key, "GetObject (a replaced orphan)")
            if loads_entry(outcome["Body"], layout.url(key), seq) != json.loads(bodies[seq]):
                raise second_writer(layout, state_id, key, seq)
            stored.add(seq)  # our own replacement, whose answer was lost
    if ledger.versions.get(state_id) is current:
        ledger.versions[state_id] = replace(current, orphans={}, count=count)
    logger.debug(
        "cleared %d orphan entries of %s: %d replaced, %d deleted",
        len(orphans),
        state_id,
        len(stored),
        len(stale),
    )
    return cleared, stored


def second_writer(layout: Layout, state_id: str, key: str, seq: int) -> ConcurrentWriteError:
    return ConcurrentWriteError(
        f"{layout.url(key)} already holds a different history entry {seq} of State "
        f"{state_id!r}: another process is running this State, or ran it since this one loaded "
        f"it. Load it again with store.load({state_id!r}) and continue from what is saved"
    )


def put_entries(
    layout: Layout,
    state_id: str,
    version: Version,
    entries: Sequence[dict[str, Any]],
    bodies: Mapping[int, bytes],
    mark: Mark,
    claimed: bool = False,
) -> Steps[list[str]]:
    """PUT entries with If-None-Match, based on ``version``; return the keys written.

    A seq already stored is skipped when it holds the same entry from a writer with the same
    base (our own PUT whose answer was lost). One a writer stored on top of an older snapshot
    (a writer that lost, or a stale copy) beyond what the stored snapshot counts is replaced:
    that writer's snapshot PUT can never land, so its entry is no one's. Another writer's
    pending entry on the stored snapshot raises :class:`Contested`. Anything else is a second
    writer: then the entries this call did write are disowned, so no reader replays them.
    ``claimed``: the save has just claimed the snapshot, so an entry another writer committed
    alone that loads do not read (not the first of one writer's run) never will: it is
    replaced.
    """
    generation, base = version.generation, version.etag
    seqs = [entry["seq"] for entry in entries]
    keys = [layout.entry_key(state_id, generation, seq) for seq in seqs]
    outcomes = yield from layout.send(
        [
            layout.entry_put(state_id, generation, seq, bodies[seq], base, mark, IfNoneMatch="*")
            for seq in seqs
        ]
    )
    mine: dict[int, str] = {}  # index -> ETag, of the entries this call stored
    taken: list[int] = []
    for i, outcome in enumerate(outcomes):
        if not isinstance(outcome, Exception):
            mine[i] = outcome.get("ETag", "")
        elif error_code(outcome) in PRECONDITION_CODES:
            taken.append(i)
        else:
            layout.fail(outcome, keys[i], "PutObject", "If-None-Match: *")
    if taken:
        try:
            replaced = yield from _settle_taken(
                layout, state_id, version, seqs, keys, bodies, taken, mark, claimed
            )
        except ConcurrentWriteError:
            yield from _disown(layout, state_id, version, seqs, bodies, mine, mark)
            raise
        except KeyError:  # the State was deleted: no one else writes under its generation
            yield from delete_keys(layout, [keys[i] for i in mine], required=False)
            raise
        mine.update(replaced)
    return [keys[i] for i in sorted(mine)]


def _settle_taken(
    layout: Layout,
    state_id: str,
    version: Version,
    seqs: Sequence[int],
    keys: Sequence[str],
    bodies: Mapping[int, bytes],
    taken: Sequence[int],
    mark: Mark,
    claimed: bool = False,
) -> Steps[dict[int, str]]:
    """Decide about entries whose If-None-Match PUT found the seq stored; return those replaced."""
    found = yield from layout.send([layout.get(keys[i]) for i in taken])
    other_base: dict[int, tuple[str, bool]] = {}  # index -> (ETag, same entry as ours)
    contested: list[int] = []
    alone: dict[int, str] = {}  # index -> writer, of entries saved alone by another writer
    etags: dict[int, str] = {}  # index -> ETag, of the entries found
    for i, outcome in zip(taken, found, strict=True):
        if isinstance(outcome, Exception):
            if error_code(outcome) in NOT_FOUND_CODES:
                # Gone since its PUT met it: the State deleted (StateNotFoundError), or a
                # writer cleared it as an orphan (another writer is saving).
                yield from check_base(layout, state_id, version, "an entry that vanished")
                raise second_writer(layout, state_id, keys[i], seqs[i])
            layout.fail(outcome, keys[i], "GetObject (an entry already stored)")
        metadata = outcome.get("Metadata", {})
        etags[i] = outcome["ETag"]
        same = _same(layout, outcome["Body"], bodies, seqs[i], keys[i])
        writer = metadata.get(WRITER_META)
        if committed_alone(metadata) and writer not in (None, mark.writer):
            # Committed alone by another writer (layout 3): the State's if loads read it,
            # whatever snapshot it was saved on.
            alone[i] = writer
        elif same and writer == mark.writer and mark.change is not None:
            if metadata.get(PENDING_META) == PENDING or ALONE_META not in metadata:
                # Ours, from a save that was to end with a snapshot PUT (which failed): this
                # save commits it alone, so it is marked so.
                other_base[i] = (outcome["ETag"], True)
            else:
                logger.debug("entry %s of %s is stored already: skipped", keys[i], state_id)
        elif metadata.get(BASE_META) not in (None, version.etag):
            other_base[i] = (outcome["ETag"], same)
        elif same and (mark.change is None or writer in (None, mark.writer)):
            # (Another writer's entry, the same, pending: a save committing alone does not
            # take it for stored, since loads do not read it.)
            logger.debug("entry %s of %s is stored already: skipped", keys[i], state_id)
        elif metadata.get(PENDING_META) == PENDING:
            contested.append(i)
        elif metadata.get(WRITER_META) not in (None, mark.writer):
            alone[i] = metadata[WRITER_META]
        else:
            raise second_writer(layout, state_id, keys[i], seqs[i])
    if not other_base and not contested and not alone:
        return {}
    # Entries the stored snapshot counts are the State's, whoever based them where; one beyond
    # its count was saved on top of an older snapshot by a writer whose snapshot PUT can never
    # land: it is no one's, and is replaced. A pending one on this snapshot is contested.
    try:
        count = yield from check_base(
            layout, state_id, version, "an entry of another writer", mark.writer
        )
    except ConcurrentWriteError:
        met = [*contested, *alone]
        if met:  # its writer's snapshot landed: name the entry that says so
            raise second_writer(layout, state_id, keys[met[0]], seqs[met[0]]) from None
        raise
    for i in contested:  # counted: the State's
        if count is None or seqs[i] < count:
            raise second_writer(layout, state_id, keys[i], seqs[i])
    for i in alone:  # counted, or the first saved alone on top of it: the State's
        if count is None or seqs[i] <= count:
            raise second_writer(layout, state_id, keys[i], seqs[i])
    if alone:
        # Saved alone on this snapshot: a reader replays it if its writer also saved the first
        # entry beyond the count (readers replay one writer's run). Else it is a leftover of a
        # writer refused at an earlier seq, and contested.
        assert count is not None
        first_beyond = layout.entry_key(state_id, version.generation, count)
        (outcome,) = yield from layout.send([layout.head(first_beyond)])
        if isinstance(outcome, Exception):
            layout.fail(outcome, first_beyond, "HeadObject (the first entry saved alone)")
        run_writer = outcome.get("Metadata", {}).get(WRITER_META)
        for i, writer in alone.items():
            if writer == run_writer:
                raise second_writer(layout, state_id, keys[i], seqs[i])
            if claimed and i not in other_base:
                # Read by no load, and after our claim no snapshot of its writer can count it.
                other_base[i] = (etags[i], False)
            else:
                contested.append(i)
    if contested:
        raise Contested(keys[contested[0]])
    stale: dict[int, str] = {}
    for i, (etag, same) in other_base.items():
        if count is not None and seqs[i] >= count:
            stale[i] = etag
        elif not same:
            raise second_writer(layout, state_id, keys[i], seqs[i])
        # (The same entry, counted: the State's as it is.)
    if mark.change is None or not stale:
        return (yield from _replace(layout, state_id, version, seqs, keys, bodies, stale, mark))
    # A save committing alone replaces them as pending first: no load reads them until the
    # stored snapshot is found still ours (a claim since would let its writer remove or replace
    # what it takes for orphans), then marks them committed alone.
    pending = replace(mark, pending=True, change=None)
    replaced = yield from _replace(layout, state_id, version, seqs, keys, bodies, stale, pending)
    try:
        yield from check_base(layout, state_id, version, "before committing a replaced entry")
    except ConcurrentWriteError:
        i = next(iter(replaced))
        raise second_writer(layout, state_id, keys[i], seqs[i]) from None
    outcomes = yield from layout.send(
        _replacements(layout, state_id, version, seqs, bodies, replaced, mark)
    )
    for i, outcome in zip(replaced, outcomes, strict=True):
        if isinstance(outcome, Exception):
            if error_code(outcome) in PRECONDITION_CODES | NOT_FOUND_CODES:
                raise second_writer(layout, state_id, keys[i], seqs[i])
            layout.fail(outcome, keys[i], "PutObject", f"If-Match: {replaced[i]}")
        replaced[i] = outcome.get("ETag", "")
    return replaced


def _replacements(
    layout: Layout,
    state_id: str,
    version: Version,
    seqs: Sequence[int],
    bodies: Mapping[int, bytes],
    etags: Mapping[int, str],
    mark: Mark,
    base: str | None = None,
) -> list[Call]:
    """PUTs of our entries over those of ``etags`` (index -> ETag), ``If-Match`` on each."""
    return [
        layout.entry_put(
            state_id,
            version.generation,
            seqs[i],
            bodies[seqs[i]],
            version.etag if base is None else base,
            mark,
            IfMatch=etag,
        )
        for i, etag in etags.items()
    ]


def _replace(
    layout: Layout,
    state_id: str,
    version: Version,
    seqs: Sequence[int],
    keys: Sequence[str],
    bodies: Mapping[int, bytes],
    stale: dict[int, str],
    mark: Mark,
) -> Steps[dict[int, str]]:
    """Replace the ``stale`` entries (index -> ETag) with ours, ``If-Match`` on each ETag.

    An entry that changed before it could be replaced is read again (``_still_stale``), and
    replaced in turn only while the stored snapshot is still the one ``version`` names.
    """
    replaced: dict[int, str] = {}
    for _ in range(REPLACE_ATTEMPTS):
        outcomes = yield from layout.send(
            _replacements(layout, state_id, version, seqs, bodies, stale, mark)
        )
        changed: list[int] = []
        for i, outcome in zip(stale, outcomes, strict=True):
            if not isinstance(outcome, Exception):
                replaced[i] = outcome.get("ETag", "")
                logger.info("replaced %s, left by a refused writer", layout.url(keys[i]))
            elif error_code(outcome) in PRECONDITION_CODES | NOT_FOUND_CODES:
                changed.append(i)  # its writer disowned it meanwhile, or someone replaced it
            else:
                layout.fail(outcome, keys[i], "PutObject", f"If-Match: {stale[i]}")
        if not changed:
            return replaced
        stale = yield from _still_stale(
            layout, state_id, version, seqs, keys, bodies, changed, mark.writer
        )
        if not stale:
            return replaced
        # Replaced meanwhile by a writer based elsewhere: replace it in turn only while the
        # stored snapshot is still ours (that writer's snapshot PUT can then never land). A
        # claim of another writer since makes its entry the State's to be, and this save
        # the second writer.
        try:
            yield from check_base(layout, state_id, version, "an entry replaced meanwhile")
        except ConcurrentWriteError:
            i = next(iter(stale))
            raise second_writer(layout, state_id, keys[i], seqs[i]) from None
    raise second_writer(layout, state_id, keys[next(iter(stale))], seqs[next(iter(stale))])


def _same(layout: Layout, body: bytes, bodies: Mapping[int, bytes], seq: int, key: str) -> bool:
    """Whether a stored entry's ``body`` is the entry this save has for ``seq``."""
    return body == bodies[seq] or loads_entry(body, layout.url(key), seq) == json.loads(bodies[seq])


def _still_stale(
    layout: Layout,
    state_id: str,
    version: Version,
    seqs: Sequence[int],
    keys: Sequence[str],
    bodies: Mapping[int, bytes],
    changed: Sequence[int],
    writer: str,
) -> Steps[dict[int, str]]:
    """Read again entries that changed before they could be replaced: which to replace now.

    A disowned entry (its writer was refused) is replaced on its new ETag; our own (an answer
    lost) is kept; anything else (gone included: only a delete removes entries) is a second
    writer.
    """
    found = yield from layout.send([layout.get(keys[i]) for i in changed])
    stale: dict[int, str] = {}
    for i, outcome in zip(changed, found, strict=True):
        if isinstance(outcome, Exception):
            if error_code(outcome) in NOT_FOUND_CODES:
                raise second_writer(layout, state_id, keys[i], seqs[i])
            layout.fail(outcome, keys[i], "GetObject (an entry to replace)")
        metadata = outcome.get("Metadata", {})
        base = metadata.get(BASE_META)
        ours = base == version.etag or (
            committed_alone(metadata) and metadata.get(WRITER_META) == writer
        )
        if ours and _same(layout, outcome["Body"], bodies, seqs[i], keys[i]):
            continue  # ours, whose answer was lost
        if base in (None, version.etag):
            raise second_writer(layout, state_id, keys[i], seqs[i])
        stale[i] = outcome["ETag"]
    return stale


def _disown(
    layout: Layout,
    state_id: str,
    version: Version,
    seqs: Sequence[int],
    bodies: Mapping[int, bytes],
    mine: Mapping[int, str],
    mark: Mark,
) -> Steps[None]:
    """Mark the entries of a refused save as based on nothing, so no reader replays them.

    They were stored on top of the stored snapshot, like a tool result saved alone. Each is PUT
    again with ``If-Match`` on the ETag this save got for it: one a winner has replaced since
    is left alone. (A conditional delete would do, but S3-compatible servers refuse it.)
    """
    calls = _replacements(layout, state_id, version, seqs, bodies, mine, mark, REFUSED_BASE)
    for outcome in (yield from layout.send(calls)):
        if isinstance(outcome, Exception) and error_code(outcome) not in PRECONDITION_CODES:
            logger.warning(
                "could not mark an entry of a refused save of %s as not part of it: %s",
                state_id,
                outcome,
            )


def check_base(
    layout: Layout, state_id: str, version: Version, why: str, writer: str | None = None
) -> Steps[int | None]:
    """Confirm that the stored snapshot is still the one ``version`` names (HEAD, If-Match).

    Returns how many entries it counts (``None`` if its metadata does not say). A claim that
    ``writer`` (this store object) made on top of that snapshot counts as it: its entries saved
    alone on the claimed snapshot are read as saved on the claim. Raises
    ``StateNotFoundError`` if the State was deleted, ``ConcurrentWriteError`` if another writer
    saved it since.
    """
    key = layout.snapshot_key(state_id)
    (outcome,) = yield from layout.send([layout.head(key, IfMatch=version.etag)])
    if not isinstance(outcome, Exception):
        return _count(outcome)
    code = error_code(outcome)
    if code in NOT_FOUND_CODES:
        raise layout.not_found(state_id, f": {layout.url(key)} was deleted ({why})")
    if code not in PRECONDITION_CODES:
        layout.fail(outcome, key, f"HeadObject ({why})", f"If-Match: {version.etag}")
    if writer is not None:
        (current,) = yield from layout.send([layout.head(key)])
        if not isinstance(current, Exception):
            metadata = current.get("Metadata", {})
            if (
                metadata.get(CLAIMED_META) == version.etag
                and metadata.get(CLAIMER_META) == writer
                and metadata.get(GENERATION_META) == version.generation
            ):
                return _count(current)
    raise refused(layout, state_id, version)


def committed_alone(metadata: Mapping[str, str]) -> bool:
    """Whether an entry's metadata marks it committed alone (layout 3), by a save not refused."""
    return (
        ALONE_META in metadata
        and PENDING_META not in metadata
        and metadata.get(BASE_META) != REFUSED_BASE
    )


def _count(head: Response) -> int | None:
    raw = head.get("Metadata", {}).get(ENTRIES_META, "")
    return int(raw) if raw.isdigit() else None


def refused(layout: Layout, state_id: str, version: Version) -> ConcurrentWriteError:
    return ConcurrentWriteError(
        f"State {state_id!r} was saved by another writer since this process last read or wrote "
        f"it ({layout.url(layout.snapshot_key(state_id))} no longer has ETag {version.etag}): "
        "two processes are running this State. What that writer saved is kept, and nothing of "
        f"this save will be read; load it again with store.load({state_id!r}) to continue from "
        "what is saved"
    )
