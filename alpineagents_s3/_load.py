"""Reading a State: its head, then the parts the head names (docs/protocol.md, "Load").

Invariant 8: a load returns what one head named. A part that is missing means the head moved on
(a save packed the part away) and the head is read again; a part still missing under the same
head is a damaged State. Bodies the process holds (:class:`~alpineagents_s3._memory.Bodies`)
are not fetched again, and a head unchanged since the process last saw it answers 304.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from alpineagents_s3._codec import copy, loads_parts, validate_id
from alpineagents_s3._head import Head, Part
from alpineagents_s3._keys import fail
from alpineagents_s3._memory import Ctx
from alpineagents_s3._steps import Outcome, Steps, error_code, http_status, send
from alpineagents_s3._translate import NOT_FOUND_CODES
from alpineagents_s3.errors import CorruptStateError

__all__ = ["fetch", "get_head", "read"]

# Reads of the head a load makes when parts go missing under it, before it gives up.
ATTEMPTS: Final = 3


class MissingPartError(Exception):
    """A part named by a head was not found (the head may have moved on)."""

    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def get_head(
    ctx: Ctx, state_id: str, known: tuple[Head, str] | None = None
) -> Steps[tuple[Head, str] | None]:
    """The State's head and its ETag (a tombstone head too); ``None`` if there is none.

    With ``known`` (a head and its ETag), the GET asks ``If-None-Match`` and a 304 returns it.
    """
    key = ctx.layout.head_key(state_id)
    condition = known[1] if known is not None else None
    (outcome,) = yield from send([ctx.layout.get(key, if_none_match=condition)], ctx.layout.root)
    if isinstance(outcome, Exception):
        if known is not None and http_status(outcome) == 304:
            return known
        if error_code(outcome) in NOT_FOUND_CODES:
            return None
        fail(ctx.layout, outcome, "GetObject", key)
    head = Head.decode(outcome["Body"], ctx.layout.url(key), state_id)
    return head, str(outcome["ETag"])


def fetch(ctx: Ctx, head: Head, parts: Sequence[Part]) -> Steps[dict[Part, bytes]]:
    """The bodies of ``parts`` of ``head``: those the process holds, the others fetched at once.

    Raises :class:`MissingPartError` for a part not found.
    """
    layout, bodies = ctx.layout, ctx.memory.bodies
    found: dict[Part, bytes] = {}
    wanted: list[tuple[Part, str]] = []
    for part in parts:
        key = part.key(layout, head.state_id, head.inc)
        body = bodies.get(layout.bucket, key)
        if body is None:
            wanted.append((part, key))
        else:
            found[part] = body
    outcomes: list[Outcome] = yield from send([layout.get(key) for _, key in wanted], layout.root)
    for (part, key), outcome in zip(wanted, outcomes, strict=True):
        if isinstance(outcome, Exception):
            if error_code(outcome) in NOT_FOUND_CODES:
                raise MissingPartError(key)
            fail(layout, outcome, "GetObject", key)
        body = outcome["Body"]
        bodies.put(layout.bucket, key, body)
        found[part] = body
    return found


def read(
    ctx: Ctx, state_id: str
) -> Steps[tuple[list[dict[str, Any]], dict[str, Any] | None] | None]:
    """The entries and snapshot of a State (``None``: no such State); the head becomes the base."""
    validate_id(state_id)
    layout = ctx.layout
    last: tuple[str, str] | None = None  # (head ETag, missing key) of the previous attempt
    for _ in range(ATTEMPTS):
        seen = ctx.seen(state_id)
        known = seen.head
        cached = known is not None and seen.etag is not None and _held(ctx, known)
        held = (known, seen.etag) if cached and known and seen.etag else None
        sent = ctx.memory.tick()
        got = yield from get_head(ctx, state_id, held)
        if got is None:
            return None
        head, etag = got
        if head.deleted:  # the base: a create of this process replaces it (invariant 12)
            ctx.memory.read(ctx.scope, state_id, head, etag, sent)
            return None
        try:
            bodies = yield from fetch(ctx, head, head.parts)
        except MissingPartError as e:
            if last == (etag, e.key):
                raise CorruptStateError(
                    f"{layout.url(e.key)} is missing, but the head "
                    f"{layout.url(layout.head_key(state_id))} names it: the State is damaged "
                    "(an object of it was deleted by something other than S3Store)"
                ) from None
            last = (etag, e.key)
            continue
        entries = loads_parts(
            [
                (
                    bodies[part],
                    part.first,
                    part.last,
                    part.kind,
                    part.key(layout, state_id, head.inc),
                )
                for part in head.parts
            ],
            layout.url,
        )
        ctx.memory.read(ctx.scope, state_id, head, etag, sent)
        return entries, None if head.snapshot is None else copy(head.snapshot)
    raise CorruptStateError(
        f"the State {state_id!r} under {layout.url(layout.root)} kept changing while it was "
        f"read ({ATTEMPTS} times): try again"
    )


def _held(ctx: Ctx, head: Head) -> bool:
    """Whether the process holds the body of every part of ``head``."""
    layout, bodies = ctx.layout, ctx.memory.bodies
    return all(
        bodies.get(layout.bucket, part.key(layout, head.state_id, head.inc)) is not None
        for part in head.parts
    )
