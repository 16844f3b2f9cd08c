"""Archive finished conversations: move them from the live store to a colder one.

A conversation is finished when its run stopped with an answer (``stopped_by`` is ``reply``
or ``finish``) and nobody has touched it for a while. This job moves every such State from
SOURCE to ARCHIVE with ``alpineagents.transfer.move_states``: each State is copied, read back
from ARCHIVE, and only then deleted from SOURCE::

    python examples/archive.py s3://my-bucket/live s3://my-bucket/archive --older-than 30d
    python examples/archive.py .agent-runs s3://archive-bucket/2026 --older-than 12h --dry-run

Run it as often as you like (a cron job, a scheduled function): it is idempotent. A run that
was killed halfway is finished by the next one (States ARCHIVE already holds identically are
skipped, then removed from SOURCE); a second run with nothing new to archive moves nothing.
States that are still running, were killed mid-run, wait for an answer (``ask``) or hit
``max_steps`` stay where they are.

"Colder" is up to the archive's location: another prefix whose S3 lifecycle rules expire or
transition objects (docs/s3.md, "Lifecycle rules"), another bucket, another account. An S3
archive keeps each State as its head and a few large segments (S3Store packs them as it
writes), which lifecycle rules transition.
"""

from __future__ import annotations

import argparse
import re
import sys
from datetime import UTC, datetime, timedelta

from alpineagents import Store, open_store
from alpineagents.transfer import Transferred, move_states

FINISHED = ("reply", "finish")
_AGE = re.compile(r"(\d+)([smhd])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_age(text: str) -> timedelta:
    """``30d``, ``12h``, ``45m``, ``0s`` as a timedelta."""
    found = _AGE.fullmatch(text.strip())
    if found is None:
        raise argparse.ArgumentTypeError(f"not an age: {text!r} (use 30d, 12h, 45m or 0s)")
    return timedelta(**{_UNITS[found[2]]: int(found[1])})


def finished_ids(store: Store, older_than: timedelta) -> list[str]:
    """The ids of States that stopped with an answer and were last updated before the cut-off."""
    cutoff = datetime.now(UTC) - older_than
    return [
        saved.id
        for saved in store.list()
        if saved.stopped_by in FINISHED and saved.updated_at <= cutoff
    ]


def report(outcome: Transferred, done: int, total: int) -> None:
    """Print one line per State moved (or found already archived)."""
    how = "archived" if outcome.action == "copied" else f"archived ({outcome.action})"
    print(f"[{done}/{total}] {how}: {outcome.id} ({outcome.entries} entries)", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Move the finished States; the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", help="the live store: a folder or s3://BUCKET/PREFIX")
    parser.add_argument("archive", help="where finished States go")
    parser.add_argument(
        "--older-than",
        type=parse_age,
        default=timedelta(days=30),
        help="only States not updated for this long (30d, 12h, 45m, 0s; default 30d)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print what would move, move none")
    args = parser.parse_args(argv)

    with open_store(args.source) as source, open_store(args.archive) as archive:
        ids = finished_ids(source, args.older_than)
        if not ids:
            print("nothing to archive", flush=True)
            return 0
        if args.dry_run:
            for state_id in ids:
                print(f"would archive: {state_id}", flush=True)
            return 0
        # on_exists="error": a *different* State under the same id in the archive is a
        # conflict to look at, never overwritten; an identical one is skipped.
        moved = move_states(source, archive, ids, progress=report)
    print(f"moved {sum(t.removed for t in moved)} State(s) to {args.archive}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
