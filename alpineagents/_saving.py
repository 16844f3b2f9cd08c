"""Saving and loading a State: the one owner of what the store has of it.

A save writes only what the store lacks, and nothing when nothing changed. ``plan`` decides
the write (new entries, the snapshot if it changed, whether the State is new); the store does
the I/O; ``done`` records what the store now has. A failed write records nothing, so the next
save sends the same entries again (stores skip seqs they have). ``restore`` is the mirror of
a save: it rebuilds a State from what a store read and records that the store has all of it.

Only this module reads and writes ``State._saved`` (a :class:`~alpineagents.state.SaveRecord`).
It knows a store only as something with ``write``/``awrite`` that compares with ``==``; the
public entry points are ``Store.save``/``asave`` and ``Store.load``/``aload``.

While a save's write runs, :func:`basis` answers what the copy being saved last saw of its
State in the store (a :class:`Basis`). The Store contract does not carry it: ``write`` keeps
its arguments, and the snapshot is the same opaque dict for every store. A store of this
repository that checks for a second writer (FileStore) reads it, so that the check follows
the copy's own history rather than the memory of the store object that happens to write it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from alpineagents._serialize import entry_to_dict, same_snapshot, snapshot_of, state_from_record
from alpineagents.state import TOOL_RESULT, SaveRecord, State, utcnow

__all__ = [
    "Basis",
    "Pending",
    "Writer",
    "asave",
    "basis",
    "check_store",
    "done",
    "plan",
    "restore",
    "save",
    "saved_in",
]


class Writer(Protocol):
    """What saving needs of a store: its two write methods (``Store`` has both)."""

    def write(
        self,
        state_id: str,
        entries: Sequence[dict[str, Any]],
        snapshot: dict[str, Any] | None,
        *,
        create: bool = False,
    ) -> None: ...

    async def awrite(
        self,
        state_id: str,
        entries: Sequence[dict[str, Any]],
        snapshot: dict[str, Any] | None,
        *,
        create: bool = False,
    ) -> None: ...


@dataclass(frozen=True)
class Pending:
    """One write a save needs."""

    entries: list[dict[str, Any]]
    snapshot: dict[str, Any] | None
    create: bool
    count: int  # len(state.history) when planned


@dataclass(frozen=True)
class Basis:
    """What the copy of a State being saved last saw of it in the store.

    Attributes:
        state_id: The State's id.
        count: How many history entries the store had, as far as this copy knows.
        snapshot: The snapshot this copy last saved or loaded.
        tried: Snapshots of this copy's writes since, whose write did not report success
            (it failed, or was cancelled): each may have landed all the same.
    """

    state_id: str
    count: int
    snapshot: dict[str, Any]
    tried: tuple[dict[str, Any], ...]


# The write under way in this context (a thread, or a task; asyncio.to_thread takes it along).
_writing: ContextVar[Basis | None] = ContextVar("alpineagents_saving_basis", default=None)

# How many snapshots of failed writes a copy keeps in ``SaveRecord.tried``. Past that, the
# oldest is forgotten: finding it on disk then refuses the save (a safe mistake: load again).
_TRIED_KEPT = 8


def basis(state_id: str) -> Basis | None:
    """The basis of the save of ``state_id`` that is writing in this context, or ``None``.

    ``None`` for a create, and for a write made through the Store API directly (not by a
    save of a State).
    """
    current = _writing.get()
    return current if current is not None and current.state_id == state_id else None


@contextmanager
def _writing_from(state: State, pending: Pending) -> Iterator[None]:
    """Make ``state``'s basis the answer of :func:`basis` while its write runs."""
    saved = state._saved
    if pending.create or saved.snapshot is None:
        yield
        return
    token = _writing.set(Basis(state.id, saved.count, saved.snapshot, tuple(saved.tried)))
    if pending.snapshot is not None:
        # Recorded before the write: a write that fails or is cancelled may still land.
        saved.tried = [*saved.tried[-(_TRIED_KEPT - 1) :], pending.snapshot]
    try:
        yield
    finally:
        _writing.reset(token)


def saved_in(state: State) -> object | None:
    """The store ``state`` is saved in, or ``None`` if it was never saved or loaded."""
    return state._saved.store


def check_store(state: State, store: object) -> None:
    """Refuse to save a State in a store other than the one it is saved in."""
    current = state._saved.store
    if current is not None and current != store:
        raise ValueError(
            f"State {state.id!r} is saved in {current!r}, not in {store!r}: a State is "
            "saved in one store; run it with an Agent on that store"
        )


def plan(state: State, *, entries_only: bool = False) -> Pending | None:
    """The write that brings the store up to date with ``state``, or ``None``.

    ``entries_only`` writes new entries without the snapshot (a tool result, at once); a
    State the store does not have yet is always written whole. Raises ``TypeError`` if
    ``state.data`` or the answer hold a value JSON cannot, naming its path
    (:class:`~alpineagents.errors.NotJSONError`, a ``TypeError``); nothing is recorded then.
    """
    saved = state._saved
    count = len(state.history)
    entries = [entry_to_dict(e) for e in state.history[saved.count :]]
    create = saved.snapshot is None
    if entries_only and not create:
        return Pending(entries, None, False, count) if entries else None
    snapshot = snapshot_of(state)
    if not create and not entries and same_snapshot(snapshot, saved.snapshot):
        return None
    if not create and not entries and _only_counts_results(state, snapshot, saved.snapshot):
        return None
    snapshot["updated_at"] = utcnow().isoformat()
    return Pending(entries, snapshot, create, count)


def _only_counts_results(
    state: State, snapshot: dict[str, Any], saved: dict[str, Any] | None
) -> bool:
    """Whether ``snapshot`` only counts tool results the store has (saved alone, at once).

    Besides ``updated_at``, nothing else of it differs from the saved one. A load replays
    those results after the entries the snapshot counts, so the State loaded is the same
    without writing the snapshot again (the save after ``use_tools``).
    """
    if saved is None or same_snapshot(snapshot, saved):
        return False
    counted = saved.get("entries")
    if not isinstance(counted, int) or snapshot["entries"] < counted:
        return False
    if {**snapshot, "entries": counted, "updated_at": None} != {**saved, "updated_at": None}:
        return False
    return all(entry.kind == TOOL_RESULT for entry in state.history[counted:])


def done(state: State, store: object, pending: Pending) -> None:
    """Record that the store has what ``pending`` wrote."""
    saved = state._saved
    saved.store = store
    # Saves of one turn's tool results may finish out of order: never count backwards.
    saved.count = max(saved.count, pending.count)
    if pending.snapshot is not None:
        saved.snapshot = pending.snapshot
        saved.tried = []  # the store has this snapshot: none tried before can be there now
        state.updated_at = datetime.fromisoformat(pending.snapshot["updated_at"])


def save(store: Writer, state: State, *, entries_only: bool = False) -> bool:
    """Write what ``store`` lacks of ``state``; whether anything was written."""
    check_store(state, store)
    pending = plan(state, entries_only=entries_only)
    if pending is None:
        return False
    with _writing_from(state, pending):
        store.write(state.id, pending.entries, pending.snapshot, create=pending.create)
    done(state, store, pending)
    return True


async def asave(store: Writer, state: State, *, entries_only: bool = False) -> bool:
    """Async ``save``."""
    check_store(state, store)
    pending = plan(state, entries_only=entries_only)
    if pending is None:
        return False
    with _writing_from(state, pending):
        await store.awrite(state.id, pending.entries, pending.snapshot, create=pending.create)
    done(state, store, pending)
    return True


def restore(
    store: object,
    state_id: str,
    entries: Sequence[dict[str, Any]],
    snapshot: Any,
    owner: str = "",
) -> tuple[State, int]:
    """Rebuild a State from what ``store`` read, recorded as saved there in full.

    Returns the State and how many entries its snapshot accounts for (see
    :func:`alpineagents._serialize.state_from_record`, which names the State as ``owner`` in
    its errors).
    """
    state, covered = state_from_record(state_id, entries, snapshot, owner)
    state._saved = SaveRecord(store, len(state.history), snapshot)
    return state, covered
