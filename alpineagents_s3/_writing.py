"""The steps of ``S3Store.write``: entries, orphans, and the conditional snapshot PUT.

* Entries are PUT with ``If-None-Match: *``: a 412 means the seq is stored; it is skipped after a
  GET confirms the same entry, else the State has a second writer.
* A new State's snapshot is PUT with ``If-None-Match: *``: a 412 means the id is taken, unless the
  snapshot found carries the token of one of this create's own attempts (an answer lost).
* A later snapshot is PUT with ``If-Match`` on the ETag this store object last wrote or read: a
  412 means another process wrote the State since, unless the snapshot found carries the token of
  one of our own PUTs whose answer was lost.
* Before a write fills the gap below orphans, it replaces them (``If-Match`` on their ETags) or
  deletes them, holding the State's lock: a delete never removes what a concurrent write of the
  same store object has just put in an orphan's place.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from alpineagents_s3._codec import dumps, loads_entry, validate_id
from alpineagents_s3._deleting import check_deletes, delete_keys
from alpineagents_s3._layout import (
    BASE_META,
    CREATE_BASE,
    ENTRIES_META,
    REFUSED_BASE,
    Layout,
    new_generation,
    new_token,
)
from alpineagents_s3._reading import get_snapshot, scan
from alpineagents_s3._steps import Hold, Release, Steps, error_code
from alpineagents_s3._translate import NOT_FOUND_CODES, PRECONDITION_CODES
from alpineagents_s3._versions import Ledger, PendingCreate, Version, first_seq
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
    # Every body first: a value JSON cannot hold fails before any request.
    bodies: dict[int, bytes] = {}
    for entry in entries:
        seq = entry.get("seq")
        if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
            raise ValueError(f"a history entry of State {state_id!r} has the seq {seq!r}")
        bodies[seq] = dumps(entry, f"history entry {seq} of State {state_id!r}")
    body = None if snapshot is None else dumps(snapshot, f"the snapshot of {state_id!r}")
    if create:
        yield from _create(layout, ledger, state_id, entries, bodies, body or b"null")
        return
    # The first seq this copy of the State has not saved yet.
    first = first_seq(entries) if entries else None
    version = ledger.versions.get(state_id)
    if version is None:
        version = yield from _first_write(layout, ledger, state_id, entries)
    elif first is not None and first < version.floor:
        raise ConcurrentWriteError(
            f"State {state_id!r} was saved by another writer since this copy of it was "
            f"loaded: this store object has read it since with {version.floor} history "
            f"entries ({layout.url(layout.snapshot_key(state_id))}), and this save continues "
            f"from entry {first}. Load it again with store.load({state_id!r}) and continue "
            "from what is saved"
        )
    if version.unsure:
        version = yield from _settle(layout, ledger, state_id, version)
    rest = entries
    written: list[str] = []
    if entries and version.orphans and first == version.gap:
        lock = ledger.lock(state_id)
        yield Hold(lock)
        version, stored = yield from _clear_orphans(layout, ledger, state_id, version, bodies)
        yield Release(lock)
        rest = [entry for entry in entries if entry["seq"] not in stored]
        written += [layout.entry_key(state_id, version.generation, seq) for seq in stored]
    written += yield from _put_entries(layout, state_id, version, rest, bodies)
    ledger.stored(state_id, {entry["seq"] for entry in entries})
    if body is not None:
        yield from _replace_snapshot(layout, ledger, state_id, body, written)
    elif entries:
        yield from _confirm(layout, ledger, state_id, version, written)
    logger.debug(
        "saved %d entries of %s in %s (snapshot: %s)",
        len(entries),
        state_id,
        layout.url(layout.root),
        snapshot is not None,
    )


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
    version = Version(stored.etag, stored.meta.generation, count=stored.meta.count)
    if entries:
        # The State was loaded through another store object: its copy has every seq below its
        # first unsaved one. A gap right there means orphans may follow.
        first = first_seq(entries)
        listed: dict[int, tuple[str, str]] = {}
        after = layout.entry_key(state_id, version.generation, first - 1) if first else None
        yield from scan(layout, state_id, version.generation, page[0], listed, after=after)
        gap = first
        while gap in listed:  # seqs below ``first`` are stored: the copy saved them
            gap += 1
        orphans = {seq: etag for seq, (_, etag) in listed.items() if seq > gap}
        version = replace(version, gap=gap, orphans=orphans, count=gap)
    return ledger.versions.setdefault(state_id, version)


def _clear_orphans(
    layout: Layout,
    ledger: Ledger,
    state_id: str,
    version: Version,
    bodies: Mapping[int, bytes],
) -> Steps[tuple[Version, set[int]]]:
    """Replace or delete the orphans, before a write fills the gap below them (lock held).

    Each orphan the write has an entry for is replaced (``If-Match`` on the orphan's ETag), the
    others are deleted, so that no entry of the save that was stopped ever joins the history.
    Returns the Version now, and the seqs stored here. Never touches a seq of the unbroken run:
    orphans all lie beyond ``version.gap``. The deletes are unconditional (S3-compatible servers
    such as LocalStack refuse a conditional DeleteObject), hence the lock.
    """
    cleared = replace(version, orphans={})
    current = ledger.versions.get(state_id)
    if current is None or current.generation != version.generation or not current.orphans:
        return cleared, set()  # cleared by a write that held the lock before us
    orphans = dict(current.orphans)
    stale = [
        layout.entry_key(state_id, version.generation, seq)
        for seq in sorted(orphans)
        if seq not in bodies
    ]
    puts = {
        seq: layout.entry_key(state_id, version.generation, seq) for seq in orphans if seq in bodies
    }
    calls = [
        layout.entry_put(
            state_id, version.generation, seq, bodies[seq], version.etag, IfMatch=orphans[seq]
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
                raise _second_writer(layout, state_id, key, seq)
            stored.add(seq)  # our own replacement, whose answer was lost
    if ledger.versions.get(state_id) is current:
        ledger.versions[state_id] = replace(current, orphans={})
    logger.debug(
        "cleared %d orphan entries of %s: %d replaced, %d deleted",
        len(orphans),
        state_id,
        len(stored),
        len(stale),
    )
    return cleared, stored


def _second_writer(layout: Layout, state_id: str, key: str, seq: int) -> ConcurrentWriteError:
    return ConcurrentWriteError(
        f"{layout.url(key)} already holds a different history entry {seq} of State "
        f"{state_id!r}: another process is running this State, or ran it since this one loaded "
        f"it. Load it again with store.load({state_id!r}) and continue from what is saved"
    )


def _put_entries(
    layout: Layout,
    state_id: str,
    version: Version,
    entries: Sequence[dict[str, Any]],
    bodies: Mapping[int, bytes],
) -> Steps[list[str]]:
    """PUT entries with If-None-Match, based on ``version``; return the keys written.

    A seq already stored is skipped when it holds the same entry from a writer with the same
    base (our own PUT whose answer was lost). One a writer stored on top of an older snapshot
    (a writer that lost, or a stale copy) beyond what the stored snapshot counts is replaced:
    that writer's snapshot PUT can never land, so its entry is no one's. Anything else is a
    second writer: then the entries this call did write are disowned, so no reader replays them.
    """
    generation, base = version.generation, version.etag
    seqs = [entry["seq"] for entry in entries]
    keys = [layout.entry_key(state_id, generation, seq) for seq in seqs]
    outcomes = yield from layout.send(
        [
            layout.entry_put(state_id, generation, seq, bodies[seq], base, IfNoneMatch="*")
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
                layout, state_id, version, seqs, keys, bodies, taken
            )
        except ConcurrentWriteError:
            yield from _disown(layout, state_id, version, seqs, bodies, mine)
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
) -> Steps[dict[int, str]]:
    """Decide about entries whose If-None-Match PUT found the seq stored; return those replaced."""
    found = yield from layout.send([layout.get(keys[i]) for i in taken])
    other_base: dict[int, tuple[str, bool]] = {}  # index -> (ETag, same entry as ours)
    for i, outcome in zip(taken, found, strict=True):
        if isinstance(outcome, Exception):
            layout.fail(outcome, keys[i], "GetObject (an entry already stored)")
        same = outcome["Body"] == bodies[seqs[i]] or loads_entry(
            outcome["Body"], layout.url(keys[i]), seqs[i]
        ) == json.loads(bodies[seqs[i]])
        if outcome.get("Metadata", {}).get(BASE_META) not in (None, version.etag):
            other_base[i] = (outcome["ETag"], same)
        elif not same:
            raise _second_writer(layout, state_id, keys[i], seqs[i])
        else:
            logger.debug("entry %s of %s is stored already: skipped", keys[i], state_id)
    if not other_base:
        return {}
    # Entries the stored snapshot counts are the State's, whoever based them where; one beyond
    # its count was saved on top of an older snapshot by a writer whose snapshot PUT can never
    # land: it is no one's, and is replaced.
    count = yield from _check_base(layout, state_id, version, "an entry stored by another writer")
    stale: dict[int, str] = {}
    for i, (etag, same) in other_base.items():
        if count is not None and seqs[i] >= count:
            stale[i] = etag
        elif not same:
            raise _second_writer(layout, state_id, keys[i], seqs[i])
    outcomes = yield from layout.send(
        [
            layout.entry_put(
                state_id, version.generation, seqs[i], bodies[seqs[i]], version.etag, IfMatch=etag
            )
            for i, etag in stale.items()
        ]
    )
    replaced: dict[int, str] = {}
    for i, outcome in zip(stale, outcomes, strict=True):
        if not isinstance(outcome, Exception):
            replaced[i] = outcome.get("ETag", "")
            logger.info("replaced %s, left by a refused writer", layout.url(keys[i]))
        elif error_code(outcome) in PRECONDITION_CODES:
            raise _second_writer(layout, state_id, keys[i], seqs[i])
        else:
            layout.fail(outcome, keys[i], "PutObject", f"If-Match: {stale[i]}")
    return replaced


def _disown(
    layout: Layout,
    state_id: str,
    version: Version,
    seqs: Sequence[int],
    bodies: Mapping[int, bytes],
    mine: Mapping[int, str],
) -> Steps[None]:
    """Mark the entries of a refused save as based on nothing, so no reader replays them.

    They were stored on top of the stored snapshot, like a tool result saved alone. Each is PUT
    again with ``If-Match`` on the ETag this save got for it: one a winner has replaced since
    is left alone. (A conditional delete would do, but S3-compatible servers refuse it.)
    """
    calls = [
        layout.entry_put(
            state_id, version.generation, seqs[i], bodies[seqs[i]], REFUSED_BASE, IfMatch=etag
        )
        for i, etag in mine.items()
    ]
    for outcome in (yield from layout.send(calls)):
        if isinstance(outcome, Exception) and error_code(outcome) not in PRECONDITION_CODES:
            logger.warning(
                "could not mark an entry of a refused save of %s as not part of it: %s",
                state_id,
                outcome,
            )


def _check_base(layout: Layout, state_id: str, version: Version, why: str) -> Steps[int | None]:
    """Confirm that the stored snapshot is still the one ``version`` names (HEAD, If-Match).

    Returns how many entries it counts (``None`` if its metadata does not say). Raises
    ``StateNotFoundError`` if the State was deleted, ``ConcurrentWriteError`` if another writer
    saved it since.
    """
    key = layout.snapshot_key(state_id)
    (outcome,) = yield from layout.send([layout.head(key, IfMatch=version.etag)])
    if not isinstance(outcome, Exception):
        raw = outcome.get("Metadata", {}).get(ENTRIES_META, "")
        return int(raw) if raw.isdigit() else None
    code = error_code(outcome)
    if code in NOT_FOUND_CODES:
        raise layout.not_found(state_id, f": {layout.url(key)} was deleted ({why})")
    if code in PRECONDITION_CODES:
        raise _refused(layout, state_id, version)
    layout.fail(outcome, key, f"HeadObject ({why})", f"If-Match: {version.etag}")


def _confirm(
    layout: Layout, ledger: Ledger, state_id: str, version: Version, written: list[str]
) -> Steps[None]:
    """Check that entries saved without a snapshot were saved on top of the stored snapshot.

    They are part of the State only if so. If the State was deleted meanwhile, they are removed
    (no one else writes under its generation) and ``StateNotFoundError`` is raised; if another
    writer saved it since, ``ConcurrentWriteError`` (no reader will replay them).
    """
    try:
        yield from _check_base(layout, state_id, version, "confirming a save of entries alone")
    except KeyError:
        ledger.versions.pop(state_id, None)
        yield from delete_keys(layout, written, required=False)
        raise


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
    elif current.meta.generation == version.generation and current.meta.token in version.unsure:
        settled = replace(version, etag=current.etag, unsure=frozenset())
    else:
        raise _refused(layout, state_id, version)
    ledger.versions[state_id] = settled
    return settled


def _refused(layout: Layout, state_id: str, version: Version) -> ConcurrentWriteError:
    return ConcurrentWriteError(
        f"State {state_id!r} was saved by another writer since this process last read or wrote "
        f"it ({layout.url(layout.snapshot_key(state_id))} no longer has ETag {version.etag}): "
        "two processes are running this State. What that writer saved is kept, and nothing of "
        f"this save will be read; load it again with store.load({state_id!r}) to continue from "
        "what is saved"
    )


def _create(
    layout: Layout,
    ledger: Ledger,
    state_id: str,
    entries: Sequence[dict[str, Any]],
    bodies: Mapping[int, bytes],
    body: bytes,
) -> Steps[None]:
    """Entries under a new generation, then the snapshot with ``If-None-Match: *``.

    A 412 is a taken id, unless the snapshot found is one this store object PUT in an attempt
    whose answer was lost (its write token says so): then the create happened, and the snapshot
    is brought up to date with ``If-Match``.
    """
    pending = ledger.pending_creates.get(state_id)
    generation = pending.generation if pending else new_generation()
    written = yield from _put_entries(
        layout, state_id, Version(CREATE_BASE, generation), entries, bodies
    )
    key = layout.snapshot_key(state_id)
    token = new_token()
    tokens = (pending.tokens if pending else frozenset()) | {token}
    ledger.pending_creates[state_id] = PendingCreate(generation, tokens)
    count = len(entries)
    put = layout.snapshot_put(state_id, body, generation, token, count, IfNoneMatch="*")
    (outcome,) = yield from layout.send([put])
    if not isinstance(outcome, Exception):
        del ledger.pending_creates[state_id]
        ledger.versions[state_id] = Version(outcome["ETag"], generation, count=count)
        logger.debug("created %s with %d entries at %s", state_id, count, layout.url(key))
        return
    if error_code(outcome) not in PRECONDITION_CODES:
        layout.fail(outcome, key, "PutObject", "If-None-Match: *")
    current = yield from get_snapshot(layout, state_id, "GetObject (a taken id)")
    if current is not None and current.meta.token in tokens:
        # An attempt of this very create was applied, but its answer was lost.
        del ledger.pending_creates[state_id]
        ledger.versions[state_id] = Version(current.etag, current.meta.generation, count=count)
        logger.debug("%s was created by an earlier attempt of this write", layout.url(key))
        if current.body != body:
            yield from _replace_snapshot(layout, ledger, state_id, body, written)
        return
    ledger.pending_creates.pop(state_id, None)
    yield from delete_keys(layout, written, required=False)
    raise StateExistsError(
        f"{layout.url(layout.root)} already has a State with id {state_id!r} "
        f"({layout.url(key)}): continue it with store.load({state_id!r}), or pick another id"
    )


def _replace_snapshot(
    layout: Layout, ledger: Ledger, state_id: str, body: bytes, written: list[str]
) -> Steps[None]:
    """PUT the snapshot with ``If-Match`` on the ETag this store object last wrote or read.

    A 412 is a second writer, unless the snapshot found carries the token of one of our own PUTs
    whose answer was lost (botocore retried it, or an earlier save raised): then it is ours, and
    the PUT is made again on its ETag. If the State was deleted meanwhile, the entries this save
    ``written`` are removed (no one else writes under its generation).
    """
    key = layout.snapshot_key(state_id)
    gone = f": {layout.url(key)} was deleted since this store object last saved it"
    version = ledger.versions[state_id]
    for _ in range(OWN_WRITE_CHECKS):
        version = ledger.versions[state_id]
        token = new_token()
        put = layout.snapshot_put(
            state_id, body, version.generation, token, version.count, IfMatch=version.etag
        )
        (outcome,) = yield from layout.send([put])
        if not isinstance(outcome, Exception):
            ledger.versions[state_id] = replace(version, etag=outcome["ETag"], unsure=frozenset())
            return
        code = error_code(outcome)
        if code not in NOT_FOUND_CODES and code not in PRECONDITION_CODES:
            # It may have been applied: remember its token.
            ledger.versions[state_id] = replace(version, unsure=version.unsure | {token})
            layout.fail(outcome, key, "PutObject", f"If-Match: {version.etag}")
        current = None
        if code in PRECONDITION_CODES:
            current = yield from get_snapshot(layout, state_id, "GetObject (a changed snapshot)")
        if current is None:
            ledger.versions.pop(state_id, None)
            yield from delete_keys(layout, written, required=False)
            raise layout.not_found(state_id, gone)
        ours = version.unsure | {token}
        if current.meta.generation != version.generation or current.meta.token not in ours:
            break
        # Our own write, whose answer was lost.
        ledger.versions[state_id] = replace(version, etag=current.etag, unsure=frozenset())
        if current.body == body:
            return
    # Keep the old version: every later write of this State here is refused too.
    raise _refused(layout, state_id, version)
