"""Sweeping: what saves that died or lost a race left behind (docs/protocol.md, "Sweep").

An object under ``states/`` that no head names (the head of its id, for its incarnation) is
garbage once no save can still be writing it: older than ``older_than`` seconds. It is removed
only if the store can prove it wrote it (invariant 9): its key is one the store gives and its
metadata carries the store's mark (a HEAD each). Probes of the engine check left by a killed
process are removed the same way.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Final

from alpineagents_s3._delete import marked, remove
from alpineagents_s3._head import Head
from alpineagents_s3._keys import fail, list_all
from alpineagents_s3._memory import Ctx
from alpineagents_s3._steps import Steps, error_code, send
from alpineagents_s3._translate import NOT_FOUND_CODES
from alpineagents_s3.errors import S3StoreError

__all__ = ["SWEEP_AGE", "sweep"]

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
    age = check_age(older_than)
    if not layout.root and not at_bucket_root:
        raise ValueError(
            f"sweep() of a store at the root of the bucket {layout.bucket!r} (an empty prefix) "
            "could reach objects of other applications; give the store a prefix, or call "
            "sweep(at_bucket_root=True) to sweep the root anyway"
        )
    cutoff = (now or datetime.now(UTC)) - timedelta(seconds=age)
    parts = yield from list_all(layout, layout.states)
    probes = yield from list_all(layout, layout.probes)
    old = [obj for obj in parts + probes if _when(obj) < cutoff]
    named_by: dict[str, list[str]] = {}
    for obj in old:
        name = layout.part_name(obj["Key"])
        if name is not None:
            named_by.setdefault(name.state_id, []).append(obj["Key"])
    ids = sorted(named_by)
    outcomes = yield from send([layout.get(layout.head_key(i)) for i in ids], layout.root)
    named: set[str] = set()
    for state_id, outcome in zip(ids, outcomes, strict=True):
        key = layout.head_key(state_id)
        if isinstance(outcome, Exception):
            if error_code(outcome) in NOT_FOUND_CODES:
                continue
            fail(layout, outcome, "GetObject", key)
        try:
            named.update(Head.decode(outcome["Body"], layout.url(key), state_id).keys(layout))
        except S3StoreError:  # a head it cannot read: none of that State's objects are touched
            named.update(named_by[state_id])
    candidates = [
        obj["Key"]
        for obj in old
        if obj["Key"] not in named
        and (layout.part_name(obj["Key"]) is not None or layout.is_probe(obj["Key"]))
    ]
    ours, _ = yield from marked(ctx, candidates, set())
    yield from remove(layout, [(key, None) for key in ours])
    return sorted(ours)


def _when(obj: dict[str, object]) -> datetime:
    value = obj.get("LastModified")
    if not isinstance(value, datetime):
        return datetime.max.replace(tzinfo=UTC)  # unknown: never old enough
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
