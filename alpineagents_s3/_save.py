"""A save: new entry objects (and a segment when it packs), then the head (the commit).

docs/protocol.md, "Save", steps 1 to 6; invariants 2 to 7. In short: everything is checked
before a request; the base is the head this process last read or wrote; entries the base has
must be the stored ones; batch 1 writes the new parts, batch 2 the head with ``If-Match`` on the
base (``If-None-Match: *`` for a create); a 412 is this save's own commit only if the stored head
holds this save's wid; objects packed away are deleted after the commit.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from alpineagents_s3 import _keys, _pack
from alpineagents_s3._codec import dumps, join, loads_parts, own, validate_id
from alpineagents_s3._engine import Probe
from alpineagents_s3._head import Head, Part
from alpineagents_s3._keys import fail
from alpineagents_s3._load import MissingPartError, fetch, get_head
from alpineagents_s3._memory import Ctx
from alpineagents_s3._steps import Call, Hold, Outcome, Steps, error_code, send
from alpineagents_s3._translate import NOT_FOUND_CODES, PRECONDITION_CODES
from alpineagents_s3.errors import (
    ConcurrentWriteError,
    CorruptStateError,
    S3StoreError,
    StateExistsError,
    StateNotFoundError,
)

__all__ = ["Entry", "encode", "write"]

logger = logging.getLogger("alpineagents_s3")

# Saves begun again after finding that an earlier save of this process, thought lost, landed.
_AGAIN: Final = 2


@dataclass(frozen=True)
class Entry:
    """One history entry to save: its seq and its body."""

    seq: int
    body: bytes


def encode(state_id: str, entries: Sequence[Mapping[str, Any]]) -> list[Entry]:
    """The entries as bodies, in seq order; step 1: nothing is sent if this raises.

    Raises ``ValueError`` for an entry without a whole ``seq`` ≥ 0, seqs that repeat or leave a
    gap, and values JSON cannot hold (``TypeError`` for a type it cannot hold).
    """
    found: list[Entry] = []
    for entry in entries:
        if not isinstance(entry, Mapping):
            raise TypeError(
                f"a history entry of State {state_id!r} is a dict, not {type(entry).__name__}"
            )
        seq = entry.get("seq")
        if type(seq) is not int or seq < 0:
            raise ValueError(
                f"a history entry of State {state_id!r} has the seq {seq!r}: a seq is a whole "
                "number >= 0"
            )
        found.append(Entry(seq, dumps(entry, f"history entry {seq} of State {state_id!r}")))
    found.sort(key=lambda e: e.seq)
    for before, after in itertools.pairwise(found):
        if after.seq != before.seq + 1:
            raise ValueError(
                f"the history entries of State {state_id!r} sent to be saved go from "
                f"{before.seq} to {after.seq}: they must follow one another"
            )
    return found


def write(
    ctx: Ctx,
    state_id: str,
    entries: Sequence[Mapping[str, Any]],
    snapshot: Mapping[str, Any] | None,
    create: bool,
) -> Steps[None]:
    """The steps of one save (``Store.write``)."""
    validate_id(state_id)
    new = encode(state_id, entries)
    if snapshot is not None:  # refused before any request; the head keeps a copy of its own
        snapshot = own(snapshot, f"the snapshot of State {state_id!r}")
    if create and new and new[0].seq != 0:
        raise ValueError(
            f"a new State's history begins at entry 0; State {state_id!r} was sent {new[0].seq}"
        )
    yield Hold(ctx.memory.lock(ctx.scope, state_id))  # released by the driver at the end
    for _ in range(_AGAIN):
        done = yield from _save(ctx, state_id, new, snapshot, create)
        if done == "saved":
            return
        create = create and done != "landed"  # our own create landed: this save updates it
    raise ConcurrentWriteError(
        f"State {state_id!r} in {ctx.layout.url(ctx.layout.head_key(state_id))} kept changing "
        "while it was saved: load it again"
    )


def _save(
    ctx: Ctx,
    state_id: str,
    new: list[Entry],
    snapshot: Mapping[str, Any] | None,
    create: bool,
) -> Steps[str]:
    """One attempt of a save, and how it ended.

    ``"saved"``; ``"landed"``: an earlier save of this process, thought lost, had landed (it is
    the base now); ``"again"``: a create found the id freed meanwhile (the tombstone head it
    found is the one it replaces now).
    """
    layout, memory = ctx.layout, ctx.memory
    key = layout.head_key(state_id)
    wid = _keys.new_wid()
    base: Head | None = None  # the State's head this save continues
    prior: Head | None = None  # the head it replaces: the base, or a tombstone for a create
    etag: str | None = None  # prior's ETag
    seen = ctx.seen(state_id)
    if not create:
        base, etag = seen.head, seen.etag
        if base is None:  # step 2: a process that never read or wrote the State reads it
            sent = memory.tick()
            got = yield from get_head(ctx, state_id)
            if got is None:
                raise _not_found(ctx, state_id)
            base, etag = got
            if base.count and not any(e.seq == base.count - 1 for e in new):
                # Nothing ties the copy to this head: it must send its last entry again.
                raise ConcurrentWriteError(
                    f"State {state_id!r} in {layout.url(key)} was not read or written by this "
                    "process, and this save does not send its last stored entry "
                    f"({base.count - 1}) again, so nothing shows that the copy saved is the "
                    f"stored State; nothing was written. Load it (store.load({state_id!r})) "
                    "in this process and continue that copy"
                )
            memory.read(ctx.scope, state_id, base, etag, sent)
        if base.deleted:  # invariant 12: never a head on a deleted incarnation
            raise _not_found(ctx, state_id)
        prior = base
        fresh = yield from _new_entries(ctx, base, etag, new)
        if not fresh and (snapshot is None or _same(base.snapshot, snapshot)):
            return "saved"  # nothing new: nothing is sent
    else:
        fresh = new
        if seen.head is not None and seen.head.deleted:  # made again over the tombstone seen
            prior, etag = seen.head, seen.etag
    bodies = {Part(e.seq, e.seq, wid, "e", len(e.body)): e.body for e in fresh}
    parts = (base.parts if base is not None else ()) + tuple(bodies)
    packing, sources = yield from _packing(ctx, base, parts, bodies, wid)
    head = Head(
        state_id=state_id,
        inc=wid if base is None else base.inc,
        write=wid,
        after=None if prior is None else prior.write,
        rev=0 if base is None else base.rev + 1,
        parts=packing.parts if packing is not None else parts,
        snapshot=dict(snapshot) if snapshot is not None else base.snapshot if base else None,
    )
    writes = {
        part.key(layout, state_id, head.inc): (body, "entry") for part, body in bodies.items()
    }
    if packing is not None:
        for segment, joined_parts in packing.segments:
            joined = join([sources[part] for part in joined_parts])
            writes[segment.key(layout, state_id, head.inc)] = (joined, "segment")
    probe = None if ctx.engine_checked else Probe(layout)

    # Batch 1: the new parts (invariants 2, 3), and the engine check's first request.
    calls = [layout.put(k, body, role) for k, (body, role) in writes.items()]
    outcomes = yield from send(calls + ([probe.create()] if probe else []), layout.root)
    cleanup = yield from _check_engine(probe, outcomes[-1] if probe else None)
    for k, outcome in zip(writes, outcomes, strict=False):
        # A 412 at a key holding this save's wid is this save's PUT, answered twice.
        if isinstance(outcome, Exception) and error_code(outcome) not in PRECONDITION_CODES:
            if cleanup:
                yield from send(cleanup, layout.root)
            fail(layout, outcome, "PutObject", k, "If-None-Match: *")

    # Batch 2: the head, conditional on the base (invariant 4). Unsure from the moment it is
    # sent until its outcome is known (invariant 5): a head holding this wid is this save's.
    condition = "If-None-Match: *" if prior is None else f"If-Match: {etag}"
    put = layout.put(key, head.encode(), "head", if_match=etag if prior is not None else None)
    memory.unsure(ctx.scope, state_id, wid)
    outcome, *_ = yield from send([put, *cleanup], layout.root)
    if probe is not None:
        ctx.engine_passed()
    code = error_code(outcome)
    if code in PRECONDITION_CODES:
        sent = memory.tick()
        got = yield from get_head(ctx, state_id)
        stored = got[0] if got is not None else None
        replaced = prior.write if prior is not None else None
        if stored is not None and stored.write == wid:  # its own PUT, answered twice
            outcome = {"ETag": got[1]}  # type: ignore[index]
        elif stored is not None and wid in (stored.after, stored.inc):
            # It landed, and others have saved on top since, or deleted it: committed, and this
            # copy is behind now (its next save is refused: the base stays, or is forgotten).
            memory.settled(ctx.scope, state_id, forget=create)
            return "saved"
        elif stored is not None and stored.write in seen.unsure:  # an earlier save landed late
            # Its wid stays unsure until a save returns: the core was not told it landed, and
            # may send the same save again, even as a create.
            memory.read(ctx.scope, state_id, stored, got[1], sent)  # type: ignore[index]
            if stored.after == replaced:
                yield from _discard(ctx, list(writes))  # this attempt lost to it, for good
            return "landed"
        elif stored is None or stored.deleted:
            # Deleted: no head will name this save's parts (invariant 12). A create is made
            # again over the tombstone.
            memory.settled(ctx.scope, state_id)
            if stored is not None:
                memory.read(ctx.scope, state_id, stored, got[1], sent)  # type: ignore[index]
            yield from _discard(ctx, list(writes))
            if create:
                return "again"
            raise _not_found(ctx, state_id)
        else:
            memory.settled(ctx.scope, state_id)
            # Another head replaced the one this save replaces, or the head is of another
            # incarnation (this one was deleted): this save lost, for good (its parts are named
            # by no head, and never will be). A head further on in this incarnation may be a
            # successor of this save's: then it is not known whether it landed.
            lost = stored.after == replaced or stored.inc != head.inc
            if lost:
                yield from _discard(ctx, list(writes))
            if create and stored.inc not in seen.unsure:  # not a create of its own
                raise StateExistsError(
                    f"a State with id {state_id!r} already exists in {layout.url(key)}: "
                    f"continue it with store.load({state_id!r}), or pick another id"
                )
            why = "another writer saved it first"
            if not lost:
                why += "; this save may be part of the State, with saves of theirs after it"
            raise _conflict(ctx, state_id, why)
    elif code in NOT_FOUND_CODES and prior is not None:  # If-Match on a head gone
        memory.settled(ctx.scope, state_id, forget=create)  # a create: made again, afresh
        yield from _discard(ctx, list(writes))
        if create:
            return "again"
        raise _not_found(ctx, state_id)
    elif isinstance(outcome, Exception):
        fail(layout, outcome, "PutObject", key, condition)  # unsure: the next save reads first
    memory.wrote(ctx.scope, state_id, head, str(outcome["ETag"]))
    for k, (body, _) in writes.items():
        memory.bodies.put(layout.bucket, k, body)
    if packing is not None:  # step 6: after the commit (invariant 7)
        yield from _drop(ctx, state_id, head.inc, packing.replaced)
    return "saved"


def _check_engine(probe: Probe | None, created: Outcome | None) -> Steps[list[Call]]:
    """The engine check around batch 1 (invariant 11); the probe's deletes, for batch 2."""
    if probe is None:
        return []
    try:
        assert created is not None
        probe.created(created)
        yield from probe.test()
    except S3StoreError:
        yield from send(probe.cleanup(), probe.layout.root)
        raise
    if probe.problems:
        yield from send(probe.cleanup(), probe.layout.root)
        probe.verdict()
    return probe.cleanup()


def _same(stored: Any, sent: Mapping[str, Any] | bytes | None) -> bool:
    """Whether what is stored is, spelled as a save spells it, what a save sends."""
    try:
        return dumps(stored, "") == (sent if isinstance(sent, bytes) else dumps(sent, ""))
    except (TypeError, ValueError):  # a stored value this store would not write: not the same
        return False


def _new_entries(ctx: Ctx, base: Head, etag: str | None, new: list[Entry]) -> Steps[list[Entry]]:
    """Step 3: the entries the base lacks; a re-sent one must be the stored one (invariant 6)."""
    count = base.count
    fresh = [e for e in new if e.seq >= count]
    if fresh and fresh[0].seq != count:
        raise _conflict(
            ctx,
            base.state_id,
            f"the save continues from entry {fresh[0].seq}, but the State has {count} entries",
        )
    again = [e for e in new if e.seq < count]
    if not again:
        return fresh
    parts = base.covering(again[0].seq, again[-1].seq)
    try:
        bodies = yield from fetch(ctx, base, parts)
    except MissingPartError as e:
        got = yield from get_head(ctx, base.state_id)
        if got is None or got[1] != etag:
            raise _conflict(ctx, base.state_id, "it changed while the save read it") from None
        raise CorruptStateError(
            f"{ctx.layout.url(e.key)} is missing: the State is damaged"
        ) from None
    layout = ctx.layout
    stored = loads_parts(
        [
            (bodies[p], p.first, p.last, p.kind, p.key(layout, base.state_id, base.inc))
            for p in parts
        ],
        layout.url,
    )
    by_seq = {entry["seq"]: entry for entry in stored}
    for entry in again:
        if not _same(by_seq[entry.seq], entry.body):
            raise _conflict(
                ctx, base.state_id, f"its entry {entry.seq} is not the one this save sends again"
            )
    return fresh


def _packing(
    ctx: Ctx, base: Head | None, parts: tuple[Part, ...], bodies: dict[Part, bytes], wid: str
) -> Steps[tuple[_pack.Plan | None, dict[Part, bytes]]]:
    """The packing of this save (``bodies``: its new entries), and the bodies it joins."""
    packing = _pack.plan(parts, wid)
    if packing is None:
        return None, {}
    wanted = {source for _, joined in packing.segments for source in joined}
    sources = {part: bodies[part] for part in wanted if part in bodies}
    old = [part for part in wanted if part not in bodies]
    if old:
        assert base is not None
        try:
            sources.update((yield from fetch(ctx, base, old)))
        except MissingPartError:  # the base moved on: this save will not commit, so no packing
            return None, {}
    return packing, sources


def _drop(ctx: Ctx, state_id: str, inc: str, parts: Sequence[Part]) -> Steps[None]:
    """Delete the parts a committed head no longer names; failures are left to ``sweep``."""
    layout = ctx.layout
    keys = [part.key(layout, state_id, inc) for part in parts]
    outcomes = yield from send(layout.delete_many([(k, None) for k in keys]), layout.root)
    for outcome in outcomes:
        errors = outcome.get("Errors", ()) if isinstance(outcome, dict) else ("request",)
        if errors:
            logger.warning(
                "could not delete %d objects of State %s packed away (sweep removes them): %s",
                len(errors),
                state_id,
                outcome if isinstance(outcome, Exception) else errors,
            )
    ctx.memory.bodies.drop(layout.bucket, keys)


def _discard(ctx: Ctx, keys: list[str]) -> Steps[None]:
    """Delete the parts of a save refused for good (a failure is left to ``sweep``)."""
    outcomes = yield from send(ctx.layout.delete_many([(k, None) for k in keys]), ctx.layout.root)
    if any(isinstance(o, Exception) or o.get("Errors") for o in outcomes):
        logger.info("could not delete the %d objects of a refused save (sweep does)", len(keys))


def _conflict(ctx: Ctx, state_id: str, why: str) -> ConcurrentWriteError:
    return ConcurrentWriteError(
        f"State {state_id!r} in {ctx.layout.url(ctx.layout.head_key(state_id))} was saved by "
        f"another writer since this process last read or wrote it ({why}); nothing of this "
        f"save was kept. Load it again (store.load({state_id!r})) and continue that copy"
    )


def _not_found(ctx: Ctx, state_id: str) -> StateNotFoundError:
    return StateNotFoundError(
        f"no State with id {state_id!r} in {ctx.layout.url(ctx.layout.root)}: it was deleted "
        "(or never saved); nothing of this save was kept"
    )
