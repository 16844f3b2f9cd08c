"""The steps of ``S3Store.write``: the order of a save, and its conditional snapshot PUT.

* The entries go first (``_entries``: conflicts, refused writers' leftovers, orphans), then the
  snapshot, so a snapshot never counts an entry that is not stored.
* A new State's snapshot is PUT with ``If-None-Match: *``: a 412 means the id is taken, unless the
  snapshot found carries the token of one of this create's own attempts (an answer lost).
* A later snapshot is PUT with ``If-Match`` on the ETag this store object last wrote or read: a
  412 means another process wrote the State since, unless the snapshot found carries the token of
  one of our own PUTs whose answer was lost.
* Entries saved without a snapshot (a tool result saved alone) are checked with a HEAD
  ``If-Match`` on that ETag: they count only if saved on top of the stored snapshot.
* Before a save replaces entries a snapshot may yet count (another writer's pending entries, or
  orphans), it *claims* the stored snapshot: the same snapshot PUT again with other trailing
  whitespace, ``If-Match`` on its ETag. A snapshot PUT of the other writer can no longer land,
  so whichever of the two wins, the history is one writer's. The claim counts only the entries
  this save's copy holds (those below its first new seq).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from alpineagents_s3 import _contract, _refs
from alpineagents_s3._codec import dumps, validate_id
from alpineagents_s3._deleting import delete_keys
from alpineagents_s3._entries import (
    Contested,
    check_base,
    clear_orphans,
    committed_alone,
    put_entries,
    refused,
    second_writer,
)
from alpineagents_s3._layout import (
    BASE_META,
    CREATE_BASE,
    ENTRIES_META,
    GENERATION_META,
    PENDING_META,
    WRITER_META,
    Layout,
    Mark,
    StoredSnapshot,
    claim_body,
    new_generation,
    new_token,
)
from alpineagents_s3._patches import NO_CHANGE, diff
from alpineagents_s3._reading import changes_after, gather, get_snapshot, read, scan
from alpineagents_s3._refs import Texts, encode
from alpineagents_s3._steps import Hold, Release, Response, Steps, error_code
from alpineagents_s3._translate import NOT_FOUND_CODES, PRECONDITION_CODES
from alpineagents_s3._versions import Effective, Ledger, PendingCreate, Version, first_seq
from alpineagents_s3.errors import ConcurrentWriteError, StateExistsError

logger = logging.getLogger("alpineagents_s3")

# How often a 412 on the snapshot may turn out to be our own lost answer before giving up.
OWN_WRITE_CHECKS = 3


def write(
    layout: Layout,
    ledger: Ledger,
    state_id: str,
    entries: Sequence[dict[str, Any]],
    snapshot: dict[str, Any] | None,
    create: bool,
) -> Steps[None]:
    """Entries the bucket lacks (in parallel), then the snapshot (unless ``None``).

    ``snapshot`` is the core's snapshot or info dict, opaque here. ``None`` (the snapshot
    contract of alpineagents 0.2-0.4) keeps the stored one; a State created with ``None`` gets a
    snapshot object whose body is ``null``, so its id is taken all the same.
    """
    validate_id(state_id)
    if snapshot is not None and not isinstance(snapshot, Mapping):
        raise TypeError(
            f"the snapshot of State {state_id!r} is a {type(snapshot).__name__}, not a dict"
        )
    # Every body first: a value JSON cannot hold fails before any request.
    bodies: dict[int, bytes] = {}
    for entry in entries:
        seq = entry.get("seq")
        if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
            raise ValueError(f"a history entry of State {state_id!r} has the seq {seq!r}")
        if seq in bodies:
            raise ValueError(
                f"the history entries given for State {state_id!r} hold seq {seq} twice"
            )
        bodies[seq] = dumps(entry, f"history entry {seq} of State {state_id!r}")
    if bodies and max(bodies) - min(bodies) + 1 != len(bodies):
        hole = next(seq for seq in range(min(bodies), max(bodies)) if seq not in bodies)
        raise ValueError(
            f"the history entries given for State {state_id!r} skip seq {hole} (seqs "
            f"{min(bodies)} to {max(bodies)}): a write sends every entry from the first the "
            "store lacks, one seq after another"
        )
    texting = yield from _texts_for(layout, ledger, state_id, entries, snapshot, create)
    used: set[str] = set()
    what = f"the snapshot of {state_id!r}"
    body = None if snapshot is None else encode(snapshot, texting.texts, what, used, entries)
    try:
        yield from _write(layout, ledger, state_id, entries, bodies, body, create, snapshot)
    except BaseException:
        _keep_final_texts(ledger, state_id)
        # What the stored snapshot is after a failed save is unsure: the next save replaces it.
        ledger.know_effective(state_id, None)
        raise
    _remember_texts(ledger, state_id, texting, snapshot, body is not None or create, used)


@dataclass(frozen=True)
class _Texting:
    """The long texts a save's snapshot may refer to (``_refs``), and where they come from.

    Attributes:
        known: What this store object knew of the State's texts before the save.
        texts: ``known`` and the texts of the save's entries; ``None``: nothing to refer to.
        own: The texts of the save's entries.
    """

    known: Texts | None = None
    texts: Texts | None = None
    own: Texts | None = None


def _texts_for(
    layout: Layout,
    ledger: Ledger,
    state_id: str,
    entries: Sequence[dict[str, Any]],
    snapshot: dict[str, Any] | None,
    create: bool,
) -> Steps[_Texting]:
    """The texts a save may refer to: those of the history this store object knows, and its own.

    Only a State whose snapshot holds a model context (alpineagents 0.2-0.4) has any; entries
    saved alone count as such until a snapshot says otherwise. A store object that forgot a
    State's texts (``Ledger.know_texts`` keeps the last States') GETs the snapshot it holds
    first: its references are what the State's history holds.
    """
    found = ledger.texts.get(state_id)
    held = ledger.versions.get(state_id)
    known = None
    if not create and found is not None and held is not None:
        if found.generation == held.generation:
            if not found.context:
                return _Texting()  # this State's snapshots hold no context
            known = found
    if snapshot is not None and not _refs.has_context(snapshot):
        return _Texting()
    if known is None and held is not None and not create and snapshot is not None:
        dumps(snapshot, f"the snapshot of {state_id!r}")  # a bad value fails before any request
        stored = yield from get_snapshot(layout, state_id, "GetObject (the texts it refers to)")
        if stored is not None and (stored.etag, stored.meta.generation) == (
            held.etag,
            held.generation,
        ):
            known = _referred(stored)
    own = Texts("").with_entries(entries)
    texts = own
    if known is not None:  # what it knew first (as ``Texts.add`` keeps the first holder)
        texts = Texts(known.generation, own.where | known.where, known.final)
    return _Texting(known, texts, own)


def _referred(stored: StoredSnapshot) -> Texts:
    """The texts a stored snapshot refers to, final below its count."""
    count = stored.meta.count
    final = count if count is not None else max((ref.seq + 1 for ref in stored.refs), default=0)
    return _refs.texts_of(stored.meta.generation, stored.refs, final)


def _remember_texts(
    ledger: Ledger,
    state_id: str,
    texting: _Texting,
    snapshot: dict[str, Any] | None,
    counted: bool,
    used: set[str],
) -> None:
    """After a save that succeeded, what its store object keeps of the State's texts.

    After a snapshot, only the texts it refers to, this save's, and those a first GET of the
    snapshot during this save found referred to: the context holds no other (a compaction
    drops the rest). ``counted``: the save's snapshot (or create) landed, so the entries it
    counts are final.
    """
    now = ledger.versions.get(state_id)
    if now is None:
        return
    if snapshot is not None and not _refs.has_context(snapshot):
        ledger.know_texts(state_id, Texts(now.generation, context=False))
        return
    if texting.texts is None or texting.own is None:
        return
    final = (now.count or 0) if counted else texting.texts.final
    found = ledger.texts.get(state_id)
    seeded: dict[str, tuple[int, _refs.Path]] = {}
    if found is not None and found is not texting.known and found.generation == now.generation:
        seeded, final = found.where, max(final, found.final)
    where = texting.texts.where
    if snapshot is not None:
        where = {d: where[d] for d in used} | texting.own.where
    ledger.know_texts(state_id, Texts(now.generation, seeded | where, final))


def _keep_final_texts(ledger: Ledger, state_id: str) -> None:
    """After a failed save, keep only the texts of entries that were final before it.

    A failed save may leave another writer's entries at its seqs, never below the count of a
    snapshot this store object wrote or read.
    """
    held = ledger.versions.get(state_id)
    texts = ledger.texts.get(state_id)
    if held is None or texts is None or texts.generation != held.generation:
        ledger.texts.pop(state_id, None)
    else:
        ledger.texts[state_id] = texts.finals()


def _write(
    layout: Layout,
    ledger: Ledger,
    state_id: str,
    entries: Sequence[dict[str, Any]],
    bodies: dict[int, bytes],
    body: bytes | None,
    create: bool,
    snapshot: Mapping[str, Any] | None,
) -> Steps[None]:
    """``write`` once each body is made.

    In layout 3 a save commits by its entries' PUTs alone, with no snapshot PUT and no check
    after them, when it sends no snapshot (a tool result) or when it adds one entry to a
    running State whose snapshot this store object wrote and the installed core's summary of
    the State does not change but for ``updated_at`` (``_change_alone``). Any other save
    (several entries, a change that stops or restarts the run, data alone, the first save
    after a load) ends with a snapshot PUT, as does every ``CHECKPOINT_EVERY``-th entry.
    """
    if create:
        yield from _create(layout, ledger, state_id, entries, bodies, body or b"null", snapshot)
        return
    # The first seq this copy of the State has not saved yet.
    first = first_seq(entries) if entries else None
    version = ledger.versions.get(state_id)
    appends = ledger.appends.get(state_id)
    locked = bool(entries) and version is not None and version.layout >= 3
    if locked:
        # What one store object commits alone of a State, it commits one save at a time, so
        # its entries are stored in seq order (no one meets a hole among them). A save that
        # ends with a snapshot PUT lets go of the lock once it knows it does.
        yield Hold(appends)
        version = ledger.versions.get(state_id)  # a save of ours may have ended meanwhile
    if version is None:
        version = yield from _first_write(layout, ledger, state_id, entries)
        if first is not None and first < version.floor:
            # A copy behind the stored snapshot, met first in a write: nothing tells this
            # store object its later saves apart from it, so they are refused too.
            ledger.versions[state_id] = replace(version, refused=True)
    if version.refused:
        raise refused(layout, state_id, version)
    if first is not None and first < version.floor:
        raise ConcurrentWriteError(
            f"State {state_id!r} was saved by another writer since this copy of it was "
            f"loaded: this store object has read it since with {version.floor} history "
            f"entries ({layout.url(layout.snapshot_key(state_id))}), and this save continues "
            f"from entry {first}. Load it again with store.load({state_id!r}) and continue "
            "from what is saved"
        )
    if version.unsure:
        version = yield from _settle(layout, ledger, state_id, version)
    if first is not None and version.count is not None and first > version.count:
        version = yield from _check_follows(layout, ledger, state_id, version, first)
    if first is not None and first < version.landed:
        entries = yield from _already_final(layout, state_id, version.landed, entries, bodies)
        first = first_seq(entries) if entries else None
    change = None
    if version.layout >= 3 and entries:
        if not locked:  # met for the first time in this write: layout 3, as it turns out
            yield Hold(appends)
            locked = True
        # Entries this store object committed alone since the snapshot are stored already.
        entries = [e for e in entries if version.tail.get(e["seq"]) != _digest(bodies[e["seq"]])]
        first = first_seq(entries) if entries else None
        if not entries and body is None:
            yield Release(appends)
            return
        if entries and body is None:
            change = NO_CHANGE
            if not _continues_run(ledger, version, first):
                version = yield from _adopt(layout, ledger, state_id, version)
        elif entries:
            change = _change_alone(ledger, state_id, version, entries, snapshot)
    if locked and change is None:
        yield Release(appends)
    rest = entries
    written: list[str] = []
    mark = Mark(ledger.writer, pending=body is not None and change is None)
    if change is not None:
        mark = replace(mark, change=NO_CHANGE)
    if first is not None and version.orphans and first == version.gap:
        lock = ledger.lock(state_id)
        yield Hold(lock)
        # A write that held the lock first may have claimed the snapshot and cleared them.
        version = ledger.versions.get(state_id, version)
        if version.orphans:
            version = yield from _claim(layout, ledger, state_id, first, written)
        # A save committing alone deletes every orphan and then stores its entries in seq
        # order: an orphan it replaced beyond its first entry would be read after the count
        # of a later snapshot, were it killed before that first entry.
        replace_with = {} if change is not None else bodies
        version, stored = yield from clear_orphans(
            layout, ledger, state_id, version, replace_with, mark
        )
        yield Release(lock)
        rest = [entry for entry in entries if entry["seq"] not in stored]
        written += [layout.entry_key(state_id, version.generation, seq) for seq in stored]
    if change is not None:
        effective = ledger.effective_of(state_id, ledger.versions[state_id])
        fresh = yield from _commit_alone(layout, ledger, state_id, rest, bodies, written, change)
        if body is None and effective is not None:  # entries that change nothing of it
            now = ledger.versions[state_id]
            effective = replace(effective, etag=now.etag, count=now.count)
            ledger.know_effective(state_id, effective)
            if now.own and len(now.tail) >= CHECKPOINT_EVERY:
                # Tool results of a long turn: the snapshot is replaced (the same JSON), so
                # that it counts them, as every CHECKPOINT_EVERY entries committed alone.
                again = claim_body(dumps(effective.snapshot, f"the snapshot of {state_id!r}"))
                tail = _tail_keys(layout, state_id, now)
                yield from _replace_snapshot(layout, ledger, state_id, again, tail, opens=now.open)
                _know_effective(ledger, state_id, again)
        if body is not None and not fresh:
            # Its entry was stored already, by an attempt of ours whose answer was lost: the
            # change that carries may be another. The snapshot PUT says what holds.
            ledger.know_effective(state_id, None)
            tail = _tail_keys(layout, state_id, ledger.versions[state_id])
            opens = _opens(state_id, snapshot)
            yield from _replace_snapshot(layout, ledger, state_id, body, tail, opens=opens)
            _know_effective(ledger, state_id, body)
        elif body is not None:
            now = ledger.versions[state_id]
            # A copy of it as stored (the core may change its dicts in place after the save).
            copy = json.loads(dumps(snapshot, f"the snapshot of {state_id!r}"))
            ledger.know_effective(state_id, Effective(now.etag, now.generation, now.count, copy))
        yield Release(appends)
        logger.debug("committed %d entries of %s alone", len(entries), state_id)
        return
    try:
        written += yield from put_entries(layout, state_id, version, rest, bodies, mark)
    except Contested as contest:
        logger.info("%s holds a pending entry of another writer: claiming", contest)
        assert first is not None  # a write without entries meets no entry
        version = yield from _claim(layout, ledger, state_id, first, written)
        try:
            written += yield from put_entries(
                layout, state_id, version, rest, bodies, mark, claimed=True
            )
        except Contested:  # a writer on the snapshot we claimed: one is a second writer
            raise refused(layout, state_id, version) from None
    ledger.stored(state_id, {entry["seq"] for entry in entries})
    if body is not None:
        written += _tail_keys(layout, state_id, ledger.versions[state_id])
        opens = _opens(state_id, snapshot)
        yield from _replace_snapshot(layout, ledger, state_id, body, written, opens=opens)
        _know_effective(ledger, state_id, body)
    elif entries:
        last = max(entry["seq"] for entry in entries)
        yield from _confirm(layout, ledger, state_id, version, written, last)
    logger.debug(
        "saved %d entries of %s in %s (snapshot: %s)",
        len(entries),
        state_id,
        layout.url(layout.root),
        body is not None,
    )


# A State's snapshot is replaced at least once every this many entries committed alone, so a
# load applies few changes and ``pack`` (which packs what the snapshot counts) reaches them.
CHECKPOINT_EVERY = 16


def _digest(body: bytes) -> str:
    return hashlib.blake2b(body, digest_size=16).hexdigest()


def _tail_keys(layout: Layout, state_id: str, version: Version) -> list[str]:
    """The keys of the entries this store object committed alone since its last snapshot."""
    return [layout.entry_key(state_id, version.generation, seq) for seq in sorted(version.tail)]


def _opens(state_id: str, snapshot: Mapping[str, Any] | None) -> bool:
    """Whether a snapshot PUT of ``snapshot`` opens it to changes committed alone after it.

    Only a running State's, whose snapshot holds no model context (alpineagents 0.2-0.4 keep
    theirs there, and always replace it): ``list()`` reads the changes of open snapshots only.
    """
    if not isinstance(snapshot, dict) or _refs.has_context(snapshot):
        return False
    key = _contract.run_summary(state_id, snapshot)
    return key is not None and _contract.running(key)


def _know_effective(ledger: Ledger, state_id: str, body: bytes) -> None:
    """After a snapshot PUT of ``body`` landed: it is the State's effective snapshot."""
    version = ledger.versions.get(state_id)
    snapshot = None
    if version is not None and version.open and not _refs.compressed(body):
        snapshot = json.loads(body)
    if not isinstance(snapshot, dict) or version is None:
        ledger.know_effective(state_id, None)
        return
    ledger.know_effective(
        state_id, Effective(version.etag, version.generation, version.count, snapshot)
    )


def _change_alone(
    ledger: Ledger,
    state_id: str,
    version: Version,
    entries: Sequence[dict[str, Any]],
    snapshot: Mapping[str, Any] | None,
) -> str | None:
    """The change of the snapshot a save commits alone with, or ``None``: it replaces it.

    One new entry, right after those stored; the stored snapshot this store object's own and
    open, with no one else's entries after it and fewer than ``CHECKPOINT_EVERY`` of its own;
    nothing unsure or orphaned; a change that leaves the core's summary of the State as it
    was but for ``updated_at`` (a run that stops or restarts replaces the snapshot, so that
    ``list()`` reads it there), small enough for the entry's metadata.
    """
    if len(entries) != 1 or not isinstance(snapshot, dict) or version.count is None:
        return None
    if not (version.own and version.open) or version.unsure or version.orphans:
        return None
    if entries[0]["seq"] != version.count or len(version.tail) >= CHECKPOINT_EVERY:
        return None
    if version.tail_writer not in (None, ledger.writer) or _refs.has_context(snapshot):
        return None
    effective = ledger.effective_of(state_id, version)
    if effective is None:
        return None
    before = _contract.run_summary(state_id, effective.snapshot)
    if before is None or before != _contract.run_summary(state_id, snapshot):
        return None
    return diff(effective.snapshot, snapshot)


def _continues_run(ledger: Ledger, version: Version, first: int | None) -> bool:
    """Whether entries committed alone from seq ``first`` on continue the run loads read.

    Loads read, after the snapshot's count, one writer's entries committed alone in a row.
    """
    if first is None or first == version.landed:
        return True
    return version.tail_writer == ledger.writer


def _commit_alone(
    layout: Layout,
    ledger: Ledger,
    state_id: str,
    entries: Sequence[dict[str, Any]],
    bodies: Mapping[int, bytes],
    written: list[str],
    change: str,
) -> Steps[bool]:
    """PUT each entry with ``If-None-Match: *``, one after another: the save is then done.

    No snapshot PUT and no check follow: an entry committed alone is the State's as soon as
    it is stored (``_reading.committed``); a second writer is refused at the seq it contends
    for, or when it next replaces the snapshot. The last entry carries ``change``, the others
    no change. Returns whether this save stored every entry (``False``: one was there
    already, ours). ``written`` gets the keys stored.
    """
    fresh = True
    ordered = sorted(entries, key=lambda entry: int(entry["seq"]))
    for n, entry in enumerate(ordered):
        seq = int(entry["seq"])
        mark = Mark(ledger.writer, pending=False, change=NO_CHANGE)
        if n == len(ordered) - 1:
            mark = replace(mark, change=change)
        version = ledger.versions[state_id]
        try:
            keys = yield from put_entries(layout, state_id, version, [entry], bodies, mark)
        except Contested as contest:
            logger.info("%s holds an entry of another writer: claiming", contest)
            mine = written + _tail_keys(layout, state_id, version)
            version = yield from _claim(layout, ledger, state_id, seq, mine)
            try:
                keys = yield from put_entries(
                    layout, state_id, version, [entry], bodies, mark, claimed=True
                )
            except Contested:
                raise refused(layout, state_id, version) from None
        fresh = fresh and bool(keys)
        written += keys
        ledger.stored(state_id, {seq})
        now = ledger.versions[state_id]
        ledger.versions[state_id] = replace(
            now, tail={**now.tail, seq: _digest(bodies[seq])}, tail_writer=ledger.writer
        )
    return fresh


def _adopt(layout: Layout, ledger: Ledger, state_id: str, version: Version) -> Steps[Version]:
    """Make the stored snapshot count the entries another writer committed alone after it.

    Before this store object commits entries alone after them (loads read one writer's in a
    row after the count): a snapshot PUT with ``If-Match``, of the snapshot with their changes
    (the same JSON when they carry none), counting every entry this store object's copy holds.
    Refused if another writer saved since. The State is read first if this store object does
    not know those changes.
    """
    effective = ledger.effective_of(state_id, version)
    got = yield from get_snapshot(layout, state_id, "GetObject (before committing alone)")
    if got is None:
        ledger.versions.pop(state_id, None)
        raise layout.not_found(state_id, ": it was deleted since this store object read it")
    if (got.etag, got.meta.generation) != (version.etag, version.generation):
        raise refused(layout, state_id, version)
    if got.snapshot is None or _refs.has_context(got.snapshot) or got.meta.layout < 3:
        body = claim_body(got.body)  # no entry after it carries a change
    else:
        if effective is None:
            yield from read(layout, ledger, state_id)
            now = ledger.versions.get(state_id)
            if now is None or (now.etag, now.count) != (version.etag, version.count):
                raise refused(layout, state_id, version)
            effective = ledger.effective_of(state_id, now)
        if effective is None:
            raise refused(layout, state_id, version)
        body = claim_body(dumps(effective.snapshot, f"the snapshot of {state_id!r}"))
    tail = _tail_keys(layout, state_id, version)
    yield from _replace_snapshot(layout, ledger, state_id, body, tail, opens=got.meta.open)
    _know_effective(ledger, state_id, body)
    logger.info(
        "%s counts the entries committed alone after it now",
        layout.url(layout.snapshot_key(state_id)),
    )
    return ledger.versions[state_id]


def _already_final(
    layout: Layout,
    state_id: str,
    landed: int,
    entries: Sequence[dict[str, Any]],
    bodies: Mapping[int, bytes],
) -> Steps[list[dict[str, Any]]]:
    """``entries`` without those below ``landed``, which must be the ones stored.

    Entries below the count of a snapshot this store object wrote or read are final; a pack
    may have removed their objects, so a PUT of one would not meet a 412. A save that sends
    them again (a retried save) leaves them as they are; one that sends other entries there
    comes from a copy of the State older than that snapshot, and is refused. Reads the State
    once: only a retried save or a copy behind gets here.
    """
    found = yield from gather(layout, state_id)
    if found is None:
        raise layout.not_found(state_id)
    for entry in entries:
        seq = entry["seq"]
        if seq >= landed:
            continue
        stored = found.entries.get(seq)
        if stored is None or stored.entry != json.loads(bodies[seq]):
            raise ConcurrentWriteError(
                f"State {state_id!r} was saved since this copy of it was loaded: "
                f"{layout.url(layout.snapshot_key(state_id))} counts {landed} history entries, "
                f"and this save holds another entry {seq}. Load it again with "
                f"store.load({state_id!r}) and continue from what is saved"
            )
    return [entry for entry in entries if entry["seq"] >= landed]


def _check_follows(
    layout: Layout, ledger: Ledger, state_id: str, version: Version, first: int
) -> Steps[Version]:
    """Refuse a save that would leave a hole: entries below ``first`` that are not stored.

    Run when this store object knows fewer stored entries than the save's copy of the State
    claims (``first`` past its count): the copy saved them through another store object, or
    it skips some, against the Store contract. A hole would end the history for every load,
    and a later save would clear what follows it as orphans. A LIST of the seqs between (``scan``, a
    page per 1,000); those not listed may be final entries a pack removed, which the stored
    snapshot counts (a HEAD says). Once they are all stored, this store object counts them,
    and the snapshot it writes next counts them too.
    """
    count = version.count or 0
    mine = f"{layout.entries_prefix(state_id)}{version.generation}/"
    after = layout.entry_key(state_id, version.generation, count - 1) if count else None
    start = {"StartAfter": after} if after else {}
    (page,) = yield from layout.send([layout.list_page(mine, **start)])
    listed: dict[int, tuple[str, str]] = {}
    yield from scan(layout, state_id, version.generation, page, listed, after=after)
    missing = [seq for seq in range(count, first) if seq not in listed]
    if missing:
        key = layout.snapshot_key(state_id)
        (head,) = yield from layout.send([layout.head(key)])
        if isinstance(head, Exception):
            if error_code(head) in NOT_FOUND_CODES:
                raise layout.not_found(state_id, f": {layout.url(key)} was deleted")
            layout.fail(head, key, "HeadObject (the entries before a save's first)")
        metadata = head.get("Metadata", {})
        if metadata.get(GENERATION_META) != version.generation:
            raise ConcurrentWriteError(
                f"State {state_id!r} is not the one this copy was saved to: {layout.url(key)} "
                "is of another generation (was the State deleted and created again?). Load it "
                f"again with store.load({state_id!r}) and continue from what is saved"
            )
        stored = metadata.get(ENTRIES_META, "")
        final = int(stored) if stored.isdigit() else 0  # packed, their objects maybe removed
        hole = next((seq for seq in missing if seq >= final), None)
        if hole is not None:
            where = layout.url(layout.entry_key(state_id, version.generation, hole))
            raise ValueError(
                f"this save of State {state_id!r} begins at history entry {first}, but entry "
                f"{hole} is not stored ({where}): a write sends every entry from the first "
                "the store lacks. Nothing was written"
            )
    ledger.stored(state_id, set(range(count, first)))
    # They are another store object's: what they change of the snapshot is not known here, so
    # this one's next entries do not commit alone after them before a snapshot PUT counts them
    # (loads read one writer's entries committed alone in a row).
    version = replace(ledger.versions[state_id], own=False)
    ledger.versions[state_id] = version
    ledger.know_effective(state_id, None)
    return version


def _first_write(
    layout: Layout, ledger: Ledger, state_id: str, entries: Sequence[dict[str, Any]]
) -> Steps[Version]:
    """The Version of a State this store object has neither read nor written.

    The snapshot, and for a write with entries the orphans it could meet, listed in the same
    round.
    """
    key = layout.snapshot_key(state_id)
    calls = [layout.get(key)]
    if entries:
        calls.append(layout.list_page(layout.entries_prefix(state_id)))
    outcome, *page = yield from layout.send(calls)
    if isinstance(outcome, Exception):
        if error_code(outcome) in NOT_FOUND_CODES:
            raise layout.not_found(state_id, ": create it with create=True first")
        layout.fail(outcome, key, "GetObject (before a write)")
    stored = layout.stored_snapshot(state_id, outcome)
    if stored.refs:  # this save's snapshot was made without them; the next may refer to them
        ledger.know_texts(state_id, _referred(stored))
    version = Version(
        stored.etag,
        stored.meta.generation,
        count=stored.meta.count,
        landed=stored.meta.count or 0,
        layout=stored.meta.layout,
        open=stored.meta.open,
    )
    if not entries and stored.meta.layout >= 3 and stored.meta.count is not None:
        # A save without entries, by a store object that did not read the State: its snapshot
        # must count the entries committed alone after the stored one, whose changes would
        # otherwise be applied again on top of it.
        ((gap, _),) = (yield from changes_after(layout, [(state_id, stored)])).values()
        version = replace(version, count=gap, gap=gap)
    if entries:
        # The State was loaded through another store object: its copy has every seq below its
        # first unsaved one. A gap right there means orphans may follow.
        first = first_seq(entries)
        listed: dict[int, tuple[str, str]] = {}
        count = stored.meta.count
        # Seqs from the snapshot's count to ``first`` are entries saved alone, which the copy
        # holds: they must be stored (not so in a State deleted and created again since).
        start = count if count is not None and count < first else first
        after = layout.entry_key(state_id, version.generation, start - 1) if start else None
        yield from scan(layout, state_id, version.generation, page[0], listed, after=after)
        missing = [seq for seq in range(start, first) if seq not in listed]
        if missing:
            raise ConcurrentWriteError(
                f"State {state_id!r} is not the one this copy was loaded from: {layout.url(key)} "
                f"counts {count} history entries, and this save continues from entry {first}, "
                f"but entry {missing[0]} is not stored (was the State deleted and created "
                f"again?). Load it again with store.load({state_id!r}) and continue from what "
                "is saved"
            )
        gap = first
        while gap in listed:  # seqs below ``first`` are stored: the copy saved them
            gap += 1
        orphans = {seq: etag for seq, (_, etag) in listed.items() if seq > gap}
        # What the State holds is what the copy holds; entries from ``first`` on are someone
        # else's (a save under way, or stopped), never counted by our snapshot.
        version = replace(version, gap=gap, orphans=orphans, count=first)
        if stored.meta.count is not None and first < stored.meta.count:
            # The stored snapshot counts entries this copy does not have: it is behind.
            version = replace(version, floor=stored.meta.count)
    return ledger.versions.setdefault(state_id, version)


def _confirm(
    layout: Layout,
    ledger: Ledger,
    state_id: str,
    version: Version,
    written: list[str],
    last: int,
) -> Steps[None]:
    """Check that entries saved without a snapshot were saved on top of the stored snapshot.

    They are part of the State only if so. If the State was deleted meanwhile, they are removed
    (no one else writes under its generation) and ``StateNotFoundError`` is raised; if another
    writer saved it since, ``ConcurrentWriteError`` (no reader will replay them) — unless that
    writer's snapshot counts them (:func:`_adopted`). ``last`` is the highest seq saved.
    """
    try:
        why = "confirming a save of entries alone"
        yield from check_base(layout, state_id, version, why, ledger.writer)
    except KeyError:
        ledger.versions.pop(state_id, None)
        yield from delete_keys(layout, written, required=False)
        raise
    except ConcurrentWriteError:
        if (yield from _adopted(layout, ledger, state_id, version, written, last)):
            return
        raise


def _adopted(
    layout: Layout,
    ledger: Ledger,
    state_id: str,
    version: Version,
    written: list[str],
    last: int,
) -> Steps[bool]:
    """Whether the snapshot another writer saved since counts these entries, still ours.

    A reader loaded them (saved alone on the stored snapshot, they are replayed) and saved on
    top: they are part of the State, so the save did happen. This store object's copy is stale
    all the same; its next save is refused.
    """
    current = yield from get_snapshot(layout, state_id, "GetObject (a changed snapshot)")
    if current is None or current.meta.generation != version.generation:
        return False
    if current.meta.count is None or current.meta.count <= last:
        return False
    heads = yield from layout.send([layout.head(key) for key in written])
    for outcome in heads:
        if isinstance(outcome, Exception):
            return False
        metadata = outcome.get("Metadata", {})
        if metadata.get(WRITER_META) != ledger.writer or metadata.get(BASE_META) != version.etag:
            return False
    logger.info(
        "%d entries of %s saved alone were loaded and saved on by another writer: they are "
        "part of the State",
        len(written),
        state_id,
    )
    return True


def _claim(
    layout: Layout, ledger: Ledger, state_id: str, first: int, written: list[str]
) -> Steps[Version]:
    """Make the stored snapshot this store object's own write, before replacing entries.

    The snapshot this store object holds is PUT again (other trailing whitespace: a new ETag),
    with ``If-Match``, counting the ``first`` entries its copy holds. Refused if another writer
    saved since; then nothing was touched.
    """
    version = ledger.versions[state_id]
    snap_key = layout.snapshot_key(state_id)
    there = layout.entry_key(state_id, version.generation, first)
    got, head = yield from layout.send([layout.get(snap_key), layout.head(there)])
    current = None
    if isinstance(got, Exception):
        if error_code(got) not in NOT_FOUND_CODES:
            layout.fail(got, snap_key, "GetObject (before a claim)")
    else:
        current = layout.stored_snapshot(state_id, got)
    if current is None:
        ledger.versions.pop(state_id, None)
        yield from delete_keys(layout, written, required=False)
        raise layout.not_found(state_id, ": it was deleted since this store object read it")
    if current.meta.generation != version.generation:  # deleted and created again
        ledger.versions[state_id] = replace(version, refused=True)
        mine = written + _tail_keys(layout, state_id, version)
        yield from delete_keys(layout, mine, required=False)
        raise refused(layout, state_id, version)
    if current.etag != version.etag:
        raise refused(layout, state_id, version)
    if isinstance(head, Exception):
        if error_code(head) not in NOT_FOUND_CODES:
            layout.fail(head, there, "HeadObject (before a claim)")
    elif (yield from _read_there(layout, ledger, state_id, current, head, first)):
        # At our first seq, an entry saved alone on this snapshot by another writer (a tool
        # result, since our load) that loads read: this copy is behind.
        raise second_writer(layout, state_id, there, first)
    # In layout 3 the claim counts what the snapshot counted: the entries committed alone
    # after it carry changes of it, which a load applies only after its count.
    three = current.meta.layout >= 3
    claimed = replace(version, count=current.meta.count if three else first)
    effective = ledger.effective_of(state_id, version)
    ledger.versions[state_id] = claimed
    try:
        body = claim_body(current.body)
        claim = (version.etag, ledger.writer)
        opens = current.meta.open
        yield from _replace_snapshot(layout, ledger, state_id, body, written, claim, opens=opens)
    finally:
        after = ledger.versions.get(state_id)
        if after is not None:
            ledger.versions[state_id] = replace(after, count=max(version.count or 0, first))
    now = ledger.versions[state_id]
    if effective is not None and now.count == version.count:  # the same JSON, a new ETag
        ledger.know_effective(state_id, replace(effective, etag=now.etag))
    logger.info("claimed %s to replace entries of another writer", layout.snapshot_key(state_id))
    return now


def _read_there(
    layout: Layout,
    ledger: Ledger,
    state_id: str,
    current: StoredSnapshot,
    head: Response,
    seq: int,
) -> Steps[bool]:
    """Whether loads read the entry at ``seq`` (``head`` of it), another writer's.

    Beyond the snapshot's count, loads read entries saved alone on it, one writer's in a row:
    the entry is read if it is such an entry and the first beyond the count is its writer's.
    """
    metadata = head.get("Metadata", {})
    writer = metadata.get(WRITER_META)
    if current.meta.layout >= 3:  # committed alone, on whatever snapshot (``committed``)
        alone = committed_alone(metadata)
    else:
        alone = metadata.get(BASE_META) == current.etag and PENDING_META not in metadata
    if not alone or writer in (None, ledger.writer):
        return False
    count = current.meta.count
    if count is None or seq <= count:
        return count is not None
    key = layout.entry_key(state_id, current.meta.generation, count)
    (first,) = yield from layout.send([layout.head(key)])
    if isinstance(first, Exception):
        if error_code(first) in NOT_FOUND_CODES:
            return False
        layout.fail(first, key, "HeadObject (before a claim)")
    return bool(first.get("Metadata", {}).get(WRITER_META) == writer)


def _settle(layout: Layout, ledger: Ledger, state_id: str, version: Version) -> Steps[Version]:
    """Find out whether snapshot PUTs that failed without an answer landed.

    Entries are saved on top of the snapshot stored now, so which one that is must be known: ours
    (one of the unanswered PUTs landed, or none did), or another writer's (refused).
    """
    current = yield from get_snapshot(layout, state_id, "GetObject (after a failed save)")
    if current is None:
        ledger.versions.pop(state_id, None)
        raise layout.not_found(state_id, ": it was deleted since this store object saved it")
    if current.etag == version.etag:
        settled = replace(version, unsure=frozenset())
    elif version.wrote(current.meta.generation, current.meta.token):
        # One of ours landed: the entries it counts are final, as after an answered PUT.
        settled = version.landed_as(current.etag, current.meta.count)
    else:
        raise refused(layout, state_id, version)
    ledger.versions[state_id] = settled
    return settled


def _create(
    layout: Layout,
    ledger: Ledger,
    state_id: str,
    entries: Sequence[dict[str, Any]],
    bodies: Mapping[int, bytes],
    body: bytes,
    snapshot: Mapping[str, Any] | None,
) -> Steps[None]:
    """Entries under a new generation, then the snapshot with ``If-None-Match: *``.

    A 412 is a taken id, unless the snapshot found is one this store object PUT in an attempt
    whose answer was lost (its write token says so): then the create happened, and the snapshot
    is brought up to date with ``If-Match``.
    """
    pending = ledger.pending_creates.get(state_id)
    # Bytes no PUT had before (the same JSON): a process still holding the ETag of a snapshot
    # of this id before it was deleted is refused, even if this State's first snapshot is
    # byte for byte the one it last wrote (a copy put back).
    body = claim_body(body)
    # A new generation for each attempt: entries of an earlier one may be swept meanwhile.
    generation = new_generation()
    mark = Mark(ledger.writer, pending=True)
    written = yield from put_entries(
        layout, state_id, Version(CREATE_BASE, generation), entries, bodies, mark
    )
    key = layout.snapshot_key(state_id)
    token = new_token()
    # This attempt's token, and those of earlier attempts of this store object that ended
    # without a clear answer; not those of attempts under way in other threads or tasks: a
    # concurrent create of the same id that wins took the id, as any other creator's would.
    tokens = (pending.tokens if pending else frozenset()) | {token}
    count = len(entries)
    opens = _opens(state_id, snapshot)
    put = layout.snapshot_put(state_id, body, generation, token, count, open=opens, IfNoneMatch="*")
    try:
        (outcome,) = yield from layout.send([put])
        if not isinstance(outcome, Exception):
            ledger.pending_creates.pop(state_id, None)
            ledger.versions[state_id] = Version(
                outcome["ETag"], generation, count=count
            ).checkpoint(outcome["ETag"], count, opens)
            _know_effective(ledger, state_id, body)
            logger.debug("created %s with %d entries at %s", state_id, count, layout.url(key))
            return
        if error_code(outcome) not in PRECONDITION_CODES:
            layout.fail(outcome, key, "PutObject", "If-None-Match: *")
        current = yield from get_snapshot(layout, state_id, "GetObject (a taken id)")
        if current is not None and current.meta.token in tokens:
            # An attempt of this very create was applied, but its answer was lost. The pending
            # create stays until this is done: a failure below leaves it to be tried again.
            _attempted(ledger, state_id, generation, token)
            landed = current.meta.generation
            if landed != generation:
                # An earlier attempt's: its generation is the State's. Entries it lacks go there.
                there = Version(CREATE_BASE, landed)
                moved = yield from put_entries(layout, state_id, there, entries, bodies, mark)
                yield from delete_keys(layout, written, required=False)
                written = moved
            ledger.versions[state_id] = Version(current.etag, landed, count=count).checkpoint(
                current.etag, count, current.meta.open
            )
            logger.debug("%s was created by an earlier attempt of this write", layout.url(key))
            if current.body != body:
                yield from _replace_snapshot(layout, ledger, state_id, body, written, opens=opens)
            _know_effective(ledger, state_id, body)
            ledger.pending_creates.pop(state_id, None)
            return
    except BaseException:
        # No clear answer (an error, a cancellation, SIGTERM's SystemExit while S3 applies
        # it): the next create of the id recognises this attempt's snapshot as its own.
        _attempted(ledger, state_id, generation, token)
        raise
    ledger.pending_creates.pop(state_id, None)
    yield from delete_keys(layout, written, required=False)
    raise StateExistsError(
        f"{layout.url(layout.root)} already has a State with id {state_id!r} "
        f"({layout.url(key)}): continue it with store.load({state_id!r}), or pick another id"
    )


def _attempted(ledger: Ledger, state_id: str, generation: str, token: str) -> None:
    """Record an attempt to create the State whose outcome this store object does not know."""
    prior = ledger.pending_creates.get(state_id)
    tokens = (prior.tokens if prior else frozenset()) | {token}
    ledger.pending_creates[state_id] = PendingCreate(generation, tokens)


def _replace_snapshot(
    layout: Layout,
    ledger: Ledger,
    state_id: str,
    body: bytes,
    written: list[str],
    claim: tuple[str, str] | None = None,
    *,
    opens: bool,
) -> Steps[None]:
    """PUT the snapshot with ``If-Match`` on the ETag this store object last wrote or read.

    A 412 is a second writer, unless the snapshot found carries the token of one of our own PUTs
    whose answer was lost (botocore retried it, or an earlier save raised): then it is ours, and
    the PUT is made again on its ETag. If the State was deleted meanwhile, the entries this save
    ``written`` are removed (no one else writes under its generation). ``opens``: entries may
    be committed alone after it, with changes of it (``_opens``). A snapshot that is not a
    claim counts every entry stored: it is a checkpoint (``Version.checkpoint``).
    """
    key = layout.snapshot_key(state_id)
    gone = f": {layout.url(key)} was deleted since this store object last saved it"
    version = ledger.versions[state_id]
    for _ in range(OWN_WRITE_CHECKS):
        version = ledger.versions[state_id]
        token = new_token()
        put = layout.snapshot_put(
            state_id,
            body,
            version.generation,
            token,
            version.count,
            claim,
            open=opens,
            IfMatch=version.etag,
        )
        # Its token is ours before it is sent: if the save is cut short while S3 applies it (a
        # SystemExit from SIGTERM, a cancellation), the next save recognises it; so does the
        # next attempt of a create whose answer was lost (bringing its snapshot up to date).
        ledger.versions[state_id] = replace(version, unsure=version.unsure | {token})
        pending = ledger.pending_creates.get(state_id)
        if pending is not None:
            ledger.pending_creates[state_id] = replace(pending, tokens=pending.tokens | {token})
        (outcome,) = yield from layout.send([put])
        if not isinstance(outcome, Exception):
            ledger.versions[state_id] = _landed(version, outcome["ETag"], claim, opens)
            return
        code = error_code(outcome)
        if code not in NOT_FOUND_CODES and code not in PRECONDITION_CODES:
            # It may have been applied: its token stays among the unsure ones.
            layout.fail(outcome, key, "PutObject", f"If-Match: {version.etag}")
        current = None
        if code in PRECONDITION_CODES:
            current = yield from get_snapshot(layout, state_id, "GetObject (a changed snapshot)")
        if current is None:
            ledger.versions.pop(state_id, None)
            yield from delete_keys(layout, written, required=False)
            raise layout.not_found(state_id, gone)
        if current.meta.generation != version.generation:
            # Deleted and created again: no one else writes under our generation, so what
            # this store object left there (its pending entries, what it committed alone)
            # is removed, as after a delete.
            ledger.versions[state_id] = replace(version, refused=True)
            yield from delete_keys(layout, written, required=False)
            raise refused(layout, state_id, version)
        ours = version.unsure | {token}
        if current.meta.token not in ours:
            break
        # Our own write, whose answer was lost.
        ledger.versions[state_id] = version.landed_as(current.etag, current.meta.count)
        if current.body == body:
            ledger.versions[state_id] = _landed(version, current.etag, claim, opens)
            return
    # Keep the old version: every later write of this State here is refused too.
    raise refused(layout, state_id, version)


def _landed(version: Version, etag: str, claim: tuple[str, str] | None, opens: bool) -> Version:
    """The Version once a snapshot PUT of ours landed: a claim, or a checkpoint."""
    if claim is not None:
        return replace(version.landed_as(etag, version.count), open=opens)
    return version.checkpoint(etag, version.count, opens)
