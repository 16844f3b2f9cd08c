"""What a save writes: only what the store lacks, and nothing when nothing changed.

``plan`` decides the write (new entries, the snapshot if it changed, whether the State is
new); the store does the I/O; ``done`` records what the store now has. A failed write
records nothing, so the next save sends the same entries again (stores skip seqs they have).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from alpineagents._serialize import entry_to_dict, same_snapshot, snapshot_of
from alpineagents.state import State, utcnow
from alpineagents.store import Store


@dataclass(frozen=True)
class Pending:
    """One write a save needs."""

    entries: list[dict[str, Any]]
    snapshot: dict[str, Any] | None
    create: bool
    count: int  # len(state.history) when planned


def check_store(state: State, store: Store) -> None:
    """Refuse to save a State in a store other than the one it is saved in."""
    if state._store is not None and state._store != store:
        raise ValueError(
            f"State {state.id!r} is saved in {state._store!r}, not in {store!r}: a State is "
            "saved in one store; run it with an Agent on that store"
        )


def plan(state: State, *, entries_only: bool = False) -> Pending | None:
    """The write that brings the store up to date with ``state``, or ``None``.

    ``entries_only`` writes new entries without the snapshot (a tool result, at once); a
    State the store does not have yet is always written whole. Raises ``TypeError`` if
    ``state.data`` or the answer hold a value JSON cannot.
    """
    count = len(state.history)
    entries = [entry_to_dict(e) for e in state.history[state._saved_count :]]
    create = state._saved_snapshot is None
    if entries_only and not create:
        return Pending(entries, None, False, count) if entries else None
    snapshot = snapshot_of(state)
    if not create and not entries and same_snapshot(snapshot, state._saved_snapshot):
        return None
    snapshot["updated_at"] = utcnow().isoformat()
    return Pending(entries, snapshot, create, count)


def done(state: State, store: Store, pending: Pending) -> None:
    """Record that the store has what ``pending`` wrote."""
    state._store = store
    # Saves of one turn's tool results may finish out of order: never count backwards.
    state._saved_count = max(state._saved_count, pending.count)
    if pending.snapshot is not None:
        state._saved_snapshot = pending.snapshot
        state.updated_at = datetime.fromisoformat(pending.snapshot["updated_at"])


def save(store: Store, state: State, *, entries_only: bool = False) -> bool:
    """Write what ``store`` lacks of ``state``; whether anything was written."""
    check_store(state, store)
    pending = plan(state, entries_only=entries_only)
    if pending is None:
        return False
    store.write(state.id, pending.entries, pending.snapshot, create=pending.create)
    done(state, store, pending)
    return True


async def asave(store: Store, state: State, *, entries_only: bool = False) -> bool:
    """Async ``save``."""
    check_store(state, store)
    pending = plan(state, entries_only=entries_only)
    if pending is None:
        return False
    await store.awrite(state.id, pending.entries, pending.snapshot, create=pending.create)
    done(state, store, pending)
    return True
