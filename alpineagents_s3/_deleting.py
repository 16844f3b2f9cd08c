"""The steps of ``S3Store.delete``, and removing objects in batches.

The snapshot goes first, so a State is gone at once, whole: readers find no snapshot and no State,
even while its entry objects are still being removed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from alpineagents_s3 import _contract
from alpineagents_s3._codec import validate_id
from alpineagents_s3._layout import PAGE, Layout
from alpineagents_s3._reading import list_all
from alpineagents_s3._steps import Outcome, Steps, error_code
from alpineagents_s3._translate import NOT_FOUND_CODES, Fault, translate_fault
from alpineagents_s3._versions import Ledger
from alpineagents_s3.errors import S3StoreError

logger = logging.getLogger("alpineagents_s3")


def delete(layout: Layout, ledger: Ledger, state_id: str) -> Steps[None]:
    """Delete the snapshot, then list and delete every other object of the State.

    Listing after the snapshot is gone closes a race with a writer of the State: an entry PUT
    that the listing misses came after the snapshot was deleted, so that writer's check of the
    snapshot (``_writing``) finds it gone, removes the entry and raises ``StateNotFoundError``.

    An unknown id raises ``StateNotFoundError`` where the installed core says so (this
    repository's core), and does nothing where its contract says that (published alpineagents).
    """
    validate_id(state_id)
    prefix = layout.state_prefix(state_id)
    snap_key = layout.snapshot_key(state_id)
    ledger.forget(state_id)
    (head,) = yield from layout.send([layout.head(snap_key)])
    exists = not isinstance(head, Exception)
    if isinstance(head, Exception) and error_code(head) not in NOT_FOUND_CODES:
        layout.fail(head, snap_key, "HeadObject")
    if exists:
        (outcome,) = yield from layout.send([layout.delete(snap_key)])
        if isinstance(outcome, Exception):
            layout.fail(outcome, snap_key, "DeleteObject")
    keys = [item["Key"] for item in (yield from list_all(layout, prefix))]
    # Without a snapshot, what is left is a create that did not finish: removed if possible.
    yield from delete_keys(layout, keys, required=exists)
    if not exists and _contract.DELETE_OF_UNKNOWN_RAISES:
        raise layout.not_found(state_id)
    logger.debug("deleted %s: %d objects", layout.url(prefix), len(keys) + exists)


def delete_keys(layout: Layout, keys: Iterable[str], *, required: bool) -> Steps[None]:
    """DeleteObjects in batches of 1,000, in parallel. Failures raise if ``required``."""
    keys = list(keys)
    outcomes = yield from layout.send(layout.delete_many(keys))
    check_deletes(layout, keys, outcomes, required=required)


def check_deletes(
    layout: Layout, keys: Sequence[str], outcomes: Sequence[Outcome], *, required: bool
) -> None:
    """Raise (if ``required``) or log the first failure of ``layout.delete_many(keys)``.

    A DeleteObjects call fails as a whole (an exception), or answers 200 with an error per key
    it could not remove.
    """
    batches = [keys[i : i + PAGE] for i in range(0, len(keys), PAGE)]
    for batch, outcome in zip(batches, outcomes, strict=True):
        failure: S3StoreError | None = None
        if isinstance(outcome, Exception):
            failure = layout.error(outcome, batch[0], "DeleteObjects")
        elif outcome.get("Errors"):
            first = outcome["Errors"][0]
            fault = Fault(str(first.get("Code", "?")), None, str(first.get("Message", "")))
            action = f"DeleteObjects ({len(outcome['Errors'])} of {len(batch)} keys failed)"
            failure = translate_fault(fault, layout.where(first.get("Key", batch[0]), action))
        if failure is None:
            continue
        if required:
            raise failure
        logger.warning("could not remove leftover objects: %s", failure)
