"""Listing States: one LIST of ``heads/``, then a GET of each head (docs/protocol.md, "List").

The listing is used as a set (invariant 10). An object smaller than any head of a State (a
tombstone head) is passed over without a GET (invariant 13), and so is a head whose ETag is that
of a head this process has seen: the last list's summary of it, or the head its saves and
loads hold (a list never moves that base). Each summary is the installed core's own, made from
the head's snapshot. A head deleted between the LIST and its GET is left out; one that cannot be
read is named in :class:`~alpineagents_s3.errors.IncompleteListError`, which still holds every
summary that was read.

With ``limit=k`` the heads are fetched newest first by ``LastModified`` (the time of their last
save), and the list stops when the k newest ``updated_at`` found are at least a second newer
than the ``LastModified`` of the next head (S3 gives it to the second): a save's
``updated_at`` is never later than the PUT of its head, so no head not fetched can be newer.
That is k GETs, then one wave of every head that could still be newer (saved in the same
second as the k-th), when clocks agree: 2 or 3 rounds. A head listed without a
``LastModified`` is fetched in the first wave; when the k-th newest found has no
``updated_at`` (a 0.5+ summary may not), every head left could be newer and is fetched.
"""

from __future__ import annotations

from copy import deepcopy
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from alpineagents_s3._codec import validate_id
from alpineagents_s3._contract import Summary, newest_first, summarize
from alpineagents_s3._head import SMALLEST_HEAD, Head
from alpineagents_s3._keys import fail, list_all
from alpineagents_s3._memory import Ctx
from alpineagents_s3._steps import Steps, error_code, send
from alpineagents_s3._translate import NOT_FOUND_CODES, translate
from alpineagents_s3.errors import (
    CorruptStateError,
    IncompleteListError,
    S3StoreError,
    SchemaVersionError,
)

__all__ = ["StoredObject", "check_limit", "list_states", "objects"]

_EPOCH = datetime.min.replace(tzinfo=UTC)
# Values a caller cannot change in place.
_PLAIN = (str, int, float, type(None), datetime)
# A head the LIST gives no time for could be the newest: it is fetched first, never passed over.
_UNKNOWN = datetime.max.replace(tzinfo=UTC)
# LastModified is given to the second: a head saved at 12:00:05.9 may say 12:00:05.
_TICK = timedelta(seconds=1)


def check_limit(limit: object) -> int | None:
    """``limit`` of ``list``: ``None`` or a whole number >= 0, else ``TypeError``/``ValueError``."""
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"limit is a whole number of States or None, not {limit!r}")
    if limit < 0:
        raise ValueError(f"limit must be a number of States >= 0, not {limit}")
    return limit


def list_states(ctx: Ctx, limit: int | None = None) -> Steps[list[Summary]]:
    """The summaries of the store's States, most recently updated first (``limit``: the newest)."""
    layout = ctx.layout
    if limit == 0:
        return []
    listed = yield from list_all(layout, layout.heads)
    last = ctx.memory.last_list(ctx.scope)
    candidates: list[tuple[datetime, str]] = []
    # By the LIST's ETag, not read again: summaries the last list made, heads saved or loaded.
    kept: dict[str, tuple[str, Summary]] = {}  # this list's summaries, for the next list
    held: dict[str, tuple[str, Head]] = {}
    for obj in listed:
        state_id = layout.id_of_head(obj["Key"])
        if state_id is None:  # anything else in heads/ is not a head's name: not ours
            continue
        if isinstance(size := obj.get("Size"), int) and 0 < size < SMALLEST_HEAD:
            # A tombstone head (a deleted State), or not ours: no State (invariant 13). A size
            # of 0 is no tombstone's either, but an engine that gives no sizes is read.
            continue
        modified = obj.get("LastModified")
        at = _as_utc(modified) if isinstance(modified, datetime) else _UNKNOWN
        candidates.append((at, state_id))
        etag, seen = obj.get("ETag"), ctx.seen(state_id)
        if etag is not None and state_id in last and last[state_id][0] == etag:
            kept[state_id] = last[state_id]
        elif etag is not None and seen.head is not None and seen.etag == etag:
            held[state_id] = (etag, seen.head)
    candidates.sort(reverse=True)
    found: list[Summary] = []
    failed: dict[str, S3StoreError] = {}
    while candidates:
        if limit is None:
            wave, candidates = candidates, []
        elif len(found) < limit:
            size = limit - len(found)
            wave, candidates = candidates[:size], candidates[size:]
        else:  # every head that could still be newer than the k-th found, in one wave
            newest = _newest(found, limit)
            if newest == _EPOCH:  # the k-th found has no time: any head left may be newer
                size = len(candidates)
            else:
                cutoff = newest - _TICK
                older = (n for n, (at, _) in enumerate(candidates) if at <= cutoff)
                size = next(older, len(candidates))
            if size == 0:
                break
            wave, candidates = candidates[:size], candidates[size:]
        ids = [state_id for _, state_id in wave]
        found += [_private(kept[i][1]) for i in ids if i in kept]
        heads = [(i, *held[i]) for i in ids if i in held]
        fetch = [i for i in ids if i not in held and i not in kept]
        calls = [layout.get(layout.head_key(i)) for i in fetch]
        outcomes = (yield from send(calls, layout.root)) if calls else []
        for state_id, outcome in zip(fetch, outcomes, strict=True):
            key = layout.head_key(state_id)
            if isinstance(outcome, Exception):
                if error_code(outcome) not in NOT_FOUND_CODES:  # not found: deleted meanwhile
                    failed[state_id] = translate(outcome, layout.where("GetObject", key))
                continue
            try:
                head = Head.decode(outcome["Body"], layout.url(key), state_id)
            except S3StoreError as e:
                failed[state_id] = e
                continue
            heads.append((state_id, str(outcome.get("ETag", "")), head))
        for state_id, etag, head in heads:
            # A tombstone head (deleted) has none; a State created without one is listed once
            # it has one.
            if head.snapshot is None:
                continue
            try:
                summary = _summary(state_id, head.snapshot, layout.url(layout.head_key(state_id)))
            except S3StoreError as e:
                failed[state_id] = e
                continue
            found.append(_private(summary))  # the one kept is handed out only as this is
            if etag:
                kept[state_id] = (etag, summary)
    ctx.memory.listed(ctx.scope, kept)
    summaries = newest_first(found)
    if limit is not None:
        summaries = summaries[:limit]
    if failed:
        raise IncompleteListError(layout.url(layout.heads), summaries, failed)
    return summaries


def _summary(state_id: str, snapshot: dict[str, Any], where: str) -> Summary:
    """The core's summary; what the core refuses is a damaged head."""
    try:
        return summarize(state_id, snapshot)
    except S3StoreError:
        raise
    except Exception as e:
        kind = SchemaVersionError if type(e).__name__ == "SchemaVersionError" else CorruptStateError
        raise kind(f"{where}: the installed alpineagents cannot summarise it: {e}") from e


def _private(summary: Summary) -> Summary:
    """``summary``, or a copy if it holds something a caller could change in place.

    A summary is the core's frozen dataclass. One whose fields are all strings, numbers,
    datetimes or ``None`` (this repository's core) is shared with the memory's last list; any
    other is copied (0.2-0.4 keep a stopped run's tool call, its arguments in a dict), so that
    the memory shares nothing with a caller (docs/protocol.md, save step 2).
    """
    fields = getattr(summary, "__dict__", None)
    if fields is not None and all(isinstance(v, _PLAIN) for v in fields.values()):
        return summary
    return deepcopy(summary)


def _newest(found: list[Summary], limit: int) -> datetime:
    """The ``updated_at`` of the ``limit``-th newest summary found (a missing one is oldest)."""
    return sorted((_as_utc(getattr(s, "updated_at", None)) for s in found), reverse=True)[limit - 1]


def _as_utc(value: Any) -> datetime:
    if not isinstance(value, datetime):
        return _EPOCH
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


@dataclass(frozen=True)
class StoredObject:
    """One object of a State, as ``S3Store.objects()`` reports it.

    Attributes:
        key: Its key.
        size: Its size in bytes.
        role: ``"head"``, ``"entry"`` or ``"segment"`` when the head names it, ``"tombstone"``
            for the head of a deleted State; ``"unnamed"``
            for an object under the State's folder that no head names (left by a save that
            died or lost a race: ``sweep`` removes it).
        modified: When it was written, as S3 says.
    """

    key: str
    size: int
    role: str
    modified: datetime | None


def objects(ctx: Ctx, state_id: str) -> Steps[list[StoredObject]]:
    """The steps of ``objects``: the head and everything under the State's folder, by key."""
    layout = ctx.layout
    validate_id(state_id)
    listed = yield from list_all(layout, layout.state_folder(state_id))
    head_key = layout.head_key(state_id)
    (outcome,) = yield from send([layout.get(head_key)], layout.root)
    roles: dict[str, str] = {}
    found: list[StoredObject] = []
    if isinstance(outcome, dict):
        head = Head.decode(outcome["Body"], layout.url(head_key), state_id)
        roles = {
            part.key(layout, state_id, head.inc): "entry" if part.kind == "e" else "segment"
            for part in head.parts
        }
        role = "tombstone" if head.deleted else "head"
        found.append(
            StoredObject(head_key, len(outcome["Body"]), role, outcome.get("LastModified"))
        )
    elif error_code(outcome) not in NOT_FOUND_CODES:
        fail(layout, outcome, "GetObject", head_key)
    for obj in listed:
        role = roles.get(obj["Key"], "unnamed")
        found.append(StoredObject(obj["Key"], int(obj["Size"]), role, obj.get("LastModified")))
    return sorted(found, key=lambda o: o.key)
