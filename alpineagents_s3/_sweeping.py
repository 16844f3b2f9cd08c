"""The steps of ``S3Store.sweep``: removing what killed creates left behind.

A create writes its entries under a new generation, then the snapshot that names it. A create
that died before its snapshot, or lost a race and died before removing its entries, leaves a
generation no snapshot names (an *abandoned* one, see ``S3Store.objects``): never read, but kept
until the State is deleted, or for good when there is no State. ``sweep`` removes the
generations that no snapshot names and whose newest object is older than a threshold, so that
a create under way (its entries are written a moment before its snapshot) is never touched.

It leaves alone: the entries of the generation the snapshot names (pending entries of a stopped
save are replaced by the State's next save, and removed with the State), and keys S3Store did
not name.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Final

from alpineagents_s3._deleting import delete_keys
from alpineagents_s3._layout import GENERATION_META, SNAPSHOT, Layout
from alpineagents_s3._reading import list_all
from alpineagents_s3._steps import Steps, error_code
from alpineagents_s3._timestamps import as_datetime
from alpineagents_s3._translate import NOT_FOUND_CODES

logger = logging.getLogger("alpineagents_s3")

# Leftovers younger than this (seconds) are kept: a day, far beyond any create under way.
SWEEP_AGE: Final = 86_400.0


def sweep(layout: Layout, older_than: float, now: datetime | None = None) -> Steps[list[str]]:
    """Remove abandoned generations older than ``older_than`` seconds; return the keys removed.

    One listing of the store's prefix (1 request per 1,000 objects), one HEAD per State that
    has a snapshot and entries, and one DeleteObjects per 1,000 keys removed.
    """
    if older_than < 0:
        raise ValueError(f"older_than is a number of seconds, 0 or more, not {older_than!r}")
    cutoff = (now or datetime.now(UTC)) - timedelta(seconds=older_than)
    items = yield from list_all(layout, layout.root)
    # State id -> generation -> (keys, newest LastModified)
    found: dict[str, dict[str, tuple[list[str], datetime]]] = defaultdict(dict)
    snapshots: set[str] = set()
    for item in items:
        key: str = item["Key"]
        state_id, _, rest = key.removeprefix(layout.root).partition("/")
        if rest == SNAPSHOT:
            snapshots.add(state_id)
            continue
        generation = layout.generation_of(state_id, key) if state_id else None
        if generation is None:
            continue
        modified = as_datetime(item["LastModified"])
        keys, newest = found[state_id].get(generation, ([], modified))
        keys.append(key)
        found[state_id][generation] = (keys, max(newest, modified))
    named = yield from _named_generations(layout, [s for s in found if s in snapshots])
    doomed: list[str] = []
    for state_id, generations in found.items():
        for generation, (keys, newest) in generations.items():
            if generation != named.get(state_id) and newest < cutoff:
                doomed.extend(keys)
    yield from delete_keys(layout, doomed, required=True)
    if doomed:
        logger.info(
            "swept %d abandoned entry objects from %s", len(doomed), layout.url(layout.root)
        )
    return doomed


def _named_generations(layout: Layout, state_ids: list[str]) -> Steps[dict[str, str | None]]:
    """The generation each State's snapshot names (HEADs, in parallel)."""
    heads = yield from layout.send([layout.head(layout.snapshot_key(s)) for s in state_ids])
    named: dict[str, str | None] = {}
    for state_id, outcome in zip(state_ids, heads, strict=True):
        if isinstance(outcome, Exception):
            if error_code(outcome) not in NOT_FOUND_CODES:
                layout.fail(outcome, layout.snapshot_key(state_id), "HeadObject (a sweep)")
            named[state_id] = None  # deleted since the listing: its objects are being removed
            continue
        named[state_id] = outcome.get("Metadata", {}).get(GENERATION_META)
    return named
