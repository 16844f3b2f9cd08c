"""Sweeping: what saves, creates and deletes that died or lost a race left behind.

docs/protocol.md, "Sweep". One rule: an object under ``P states/`` is removed when the head of
its State does not name it and it is older than ``older_than`` seconds: the parts of saves that
died or lost a race, of creates that died, and of deleted incarnations a delete did not finish
(a tombstone head names nothing). A create under way is younger than that.

Each object removed is proven the store's own (invariant 9): its key is one the store gives and
its metadata carries the store's mark (a HEAD each). Probes of the engine check left by a
killed process are removed the same way, once old.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from alpineagents_s3._delete import marked, remove
from alpineagents_s3._head import Head
from alpineagents_s3._keys import fail, list_all
from alpineagents_s3._memory import Ctx
from alpineagents_s3._steps import Steps, error_code, send
from alpineagents_s3._translate import NOT_FOUND_CODES
from alpineagents_s3.errors import S3StoreError

__all__ = ["SWEEP_AGE", "check_age", "sweep"]

# One day: no save takes that long between its parts and its head.
SWEEP_AGE: Final = 24 * 3600.0
_AGE_LIMIT: Final = 100 * 365 * 24 * 3600.0


def check_age(older_than: object) -> float:
    """``older_than`` as seconds, or ``ValueError`` naming what is wrong with it."""
    if isinstance(older_than, bool) or not isinstance(older_than, int | float):
        raise TypeError(f"older_than is a number of seconds, not {older_than!r}")
    if not math.isfinite(older_than) or not 0 <= older_than <= _AGE_LIMIT:
        raise ValueError(
            f"older_than must be a number of seconds from 0 to {_AGE_LIMIT:.0f} (100 years), "
            f"not {older_than!r}"
        )
    return float(older_than)


def sweep(
    ctx: Ctx, older_than: float, at_bucket_root: bool, now: datetime | None = None
) -> Steps[list[str]]:
    """The steps of ``sweep``: the keys removed."""
    layout = ctx.layout
    cutoff = (now or datetime.now(UTC)) - timedelta(seconds=check_age(older_than))
    if not layout.root and not at_bucket_root:
        raise ValueError(
            f"sweep() of a store at the root of the bucket {layout.bucket!r} (an empty prefix) "
            "could reach objects of other applications; give the store a prefix, or call "
            "sweep(at_bucket_root=True) to sweep the root anyway"
        )
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for obj in (yield from list_all(layout, layout.states)):
        folder = layout.folder_of(obj["Key"])
        if folder is not None:
            groups.setdefault(folder, []).append(obj)
    # Only a State with an old object can have something to remove.
    ids = sorted(
        {
            state_id
            for (state_id, _), objects in groups.items()
            if any(_older(obj, cutoff) for obj in objects)
        }
    )
    outcomes = yield from send([layout.get(layout.head_key(i)) for i in ids], layout.root)
    heads: dict[str, Head | None] = {}
    for state_id, outcome in zip(ids, outcomes, strict=True):
        key = layout.head_key(state_id)
        if isinstance(outcome, Exception):
            if error_code(outcome) not in NOT_FOUND_CODES:
                fail(layout, outcome, "GetObject", key)
            heads[state_id] = None
            continue
        try:
            heads[state_id] = Head.decode(outcome["Body"], layout.url(key), state_id)
        except S3StoreError:
            continue  # a head it cannot read: nothing of that State is touched
    candidates: list[str] = []
    for (state_id, inc), objects in groups.items():
        if state_id not in heads:
            continue
        head = heads[state_id]
        named = set(head.keys(layout)) if head is not None and head.inc == inc else set()
        candidates += [
            obj["Key"]
            for obj in objects
            if obj["Key"] not in named and _older(obj, cutoff) and layout.part_name(obj["Key"])
        ]
    for obj in (yield from list_all(layout, layout.probes)):
        if layout.is_probe(obj["Key"]) and _older(obj, cutoff):
            candidates.append(obj["Key"])
    ours, _ = yield from marked(ctx, candidates, set())
    yield from remove(layout, [(key, None) for key in ours])
    return sorted(ours)


def _older(obj: dict[str, Any], cutoff: datetime) -> bool:
    value = obj.get("LastModified")
    if not isinstance(value, datetime):
        return False  # unknown: never old enough
    return (value if value.tzinfo is not None else value.replace(tzinfo=UTC)) < cutoff
