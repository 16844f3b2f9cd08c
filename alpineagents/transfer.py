"""Copy, move, export and import saved States between any two stores.

(Over 400 lines because each operation has a sync and an async twin side by side, so that the
two can be compared line by line; the decisions they share are helpers here.)

``copy_states(src, dst)`` copies States from one store to another (a folder into a bucket, one
prefix to another, …); ``move_states`` copies, then deletes each State from the source once the
destination holds it whole. ``export_state`` and ``import_state`` turn one State into a single
self-contained JSON document and back. Each has an async twin (``acopy_states``,
``amove_states``, ``aexport_state``, ``aimport_state``) that uses the stores' async methods.

All of them are built on the public store contract only (``read``, ``write(..., create=True)``,
``list``, ``delete``), so they work with any :class:`~alpineagents.Store`, including your own.

Copies are idempotent and resumable: a State the destination already holds identically (same
history entries, same snapshot) is skipped, so running a copy again after it was killed
finishes the job. A *different* State under the same id is refused with
:class:`TransferConflictError` unless ``on_exists`` says otherwise:

``"error"`` (default)
    raise :class:`TransferConflictError`, naming the id and both stores;
``"skip"``
    leave the destination's State as it is (a move then keeps the source's State too);
``"overwrite"``
    delete the destination's State, then write the source's. Not atomic: a process killed in
    between leaves the id absent from the destination (the source still has it; run again).

Each State is written with ``create=True``, which a store writes whole or not at all, so a
killed copy never leaves half a State behind.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

from alpineagents._serialize import state_from_record
from alpineagents.errors import (
    CorruptStateError,
    SchemaVersionError,
    StateExistsError,
    StateNotFoundError,
)
from alpineagents.history import is_int, shown
from alpineagents.store import Record, Store

__all__ = [
    "EXPORT_FORMAT",
    "EXPORT_VERSION",
    "Action",
    "OnExists",
    "Progress",
    "TransferConflictError",
    "Transferred",
    "acopy_states",
    "aexport_state",
    "aimport_state",
    "amove_states",
    "copy_states",
    "export_state",
    "import_state",
    "move_states",
    "parse_export",
]

EXPORT_FORMAT = "alpineagents.state"
"""The ``format`` marker of an exported State document."""
EXPORT_VERSION = 1
"""The version of the export document this module writes (and the newest it reads)."""

OnExists = Literal["error", "skip", "overwrite"]
"""What to do when the destination has a different State under the same id."""

Action = Literal["copied", "identical", "kept", "replaced"]
"""What happened to one State: ``copied`` (new in the destination), ``identical`` (the
destination already had it, nothing written), ``kept`` (the destination had a different State
and ``on_exists="skip"`` kept it), ``replaced`` (``on_exists="overwrite"`` replaced it)."""


@dataclass(frozen=True)
class Transferred:
    """The outcome for one State of a copy, move or import.

    Attributes:
        id: The State's id.
        action: What happened in the destination (see :data:`Action`).
        entries: How many history entries the source's State has.
        removed: Whether a move deleted the State from the source.
    """

    id: str
    action: Action
    entries: int
    removed: bool = False


Progress = Callable[[Transferred, int, int], None]
"""Called after each State as ``progress(outcome, done, total)``."""


class TransferConflictError(StateExistsError):
    """The destination has a different State under an id being copied or imported.

    A ``StateExistsError`` (so also a ``ValueError``). ``state_id``, ``source`` and
    ``destination`` name what clashed.
    """

    def __init__(self, state_id: str, source: str, destination: str):
        super().__init__(
            f"{destination} already has a different State with id {state_id!r} than {source}: "
            "pass on_exists='skip' to keep it or on_exists='overwrite' to replace it"
        )
        self.state_id = state_id
        self.source = source
        self.destination = destination


# The logic, once: generators that yield store operations and get their results back. --------


@dataclass(frozen=True)
class _Read:
    store: Store
    state_id: str


@dataclass(frozen=True)
class _Write:
    store: Store
    state_id: str
    record: Record


@dataclass(frozen=True)
class _Delete:
    store: Store
    state_id: str


@dataclass(frozen=True)
class _List:
    store: Store


_Op = _Read | _Write | _Delete | _List
_T = TypeVar("_T")
_Plan = Generator[_Op, Any, _T]


def _normal(record: Record) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A record's entries in seq order and its snapshot, for writing and comparing."""
    return sorted(record.entries, key=lambda e: e["seq"]), record.snapshot


def _same(a: Record, b: Record) -> bool:
    return _normal(a) == _normal(b)


def _put(
    record: Record, dst: Store, state_id: str, on_exists: OnExists, source: str
) -> _Plan[Action]:
    """Write ``record`` under ``state_id`` into ``dst`` unless it has it; what happened."""
    have: Record | None = yield _Read(dst, state_id)
    if have is not None:
        if _same(have, record):
            return "identical"
        if on_exists == "skip":
            return "kept"
        if on_exists != "overwrite":
            raise TransferConflictError(state_id, source, repr(dst))
        yield _Delete(dst, state_id)
    yield _Write(dst, state_id, record)
    return "copied" if have is None else "replaced"


def _transfer(
    src: Store,
    dst: Store,
    ids: Iterable[str] | None,
    on_exists: OnExists,
    progress: Progress | None,
    move: bool,
) -> _Plan[list[Transferred]]:
    if on_exists not in ("error", "skip", "overwrite"):
        raise ValueError(f"on_exists must be 'error', 'skip' or 'overwrite', not {on_exists!r}")
    if src == dst:
        raise ValueError(f"cannot copy {src!r} onto itself")
    if ids is None:
        listed = yield _List(src)
        wanted = [saved.id for saved in listed]
    else:
        wanted = list(dict.fromkeys(ids))  # once each, in the order given
    done: list[Transferred] = []
    for state_id in wanted:
        record: Record | None = yield _Read(src, state_id)
        if record is None:
            raise StateNotFoundError(f"no saved State with id {state_id!r} in {src!r}")
        action = yield from _put(record, dst, state_id, on_exists, repr(src))
        removed = False
        if move and action != "kept":
            # Delete the source's State only once the destination is seen to hold it whole.
            check: Record | None = yield _Read(dst, state_id)
            if check is None or not _same(check, record):
                raise CorruptStateError(
                    f"{dst!r} does not hold State {state_id!r} as written; "
                    f"it was not removed from {src!r}"
                )
            yield _Delete(src, state_id)
            removed = True
        outcome = Transferred(state_id, action, len(record.entries), removed)
        done.append(outcome)
        if progress is not None:
            progress(outcome, len(done), len(wanted))
    return done


# The two I/O paths. ----------------------------------------------------------------------


def _run(plan: _Plan[_T]) -> _T:
    result: Any = None
    try:
        while True:
            op = plan.send(result)
            if isinstance(op, _Read):
                result = op.store.read(op.state_id)
            elif isinstance(op, _Write):
                entries, snapshot = _normal(op.record)
                op.store.write(op.state_id, entries, snapshot, create=True)
                result = None
            elif isinstance(op, _Delete):
                op.store.delete(op.state_id)
                result = None
            else:
                result = op.store.list()
    except StopIteration as stop:
        value: _T = stop.value
        return value


async def _arun(plan: _Plan[_T]) -> _T:
    result: Any = None
    try:
        while True:
            op = plan.send(result)
            if isinstance(op, _Read):
                result = await op.store.aread(op.state_id)
            elif isinstance(op, _Write):
                entries, snapshot = _normal(op.record)
                await op.store.awrite(op.state_id, entries, snapshot, create=True)
                result = None
            elif isinstance(op, _Delete):
                await op.store.adelete(op.state_id)
                result = None
            else:
                result = await op.store.alist()
    except StopIteration as stop:
        value: _T = stop.value
        return value


# Copy and move. --------------------------------------------------------------------------


def copy_states(
    src: Store,
    dst: Store,
    ids: Iterable[str] | None = None,
    *,
    on_exists: OnExists = "error",
    progress: Progress | None = None,
) -> list[Transferred]:
    """Copy saved States from ``src`` to ``dst``; one :class:`Transferred` per State.

    Args:
        src: The store to copy from; it is only read.
        dst: The store to copy into.
        ids: The ids to copy, in this order; ``None`` copies every State ``src.list()`` has.
        on_exists: What to do when ``dst`` has a *different* State under an id (an identical
            one is always skipped): ``"error"``, ``"skip"`` or ``"overwrite"``.
        progress: Called after each State with ``(outcome, done, total)``.

    Raises:
        KeyError: ``StateNotFoundError`` for an id ``src`` does not have.
        TransferConflictError: ``dst`` has a different State under an id (``on_exists="error"``).
        ValueError: ``src`` and ``dst`` are the same store.

    States copied before an error stay copied; running the same copy again skips them.
    """
    return _run(_transfer(src, dst, ids, on_exists, progress, move=False))


async def acopy_states(
    src: Store,
    dst: Store,
    ids: Iterable[str] | None = None,
    *,
    on_exists: OnExists = "error",
    progress: Progress | None = None,
) -> list[Transferred]:
    """Async :func:`copy_states`, through the stores' ``aread``/``awrite``/``alist``."""
    return await _arun(_transfer(src, dst, ids, on_exists, progress, move=False))


def move_states(
    src: Store,
    dst: Store,
    ids: Iterable[str] | None = None,
    *,
    on_exists: OnExists = "error",
    progress: Progress | None = None,
) -> list[Transferred]:
    """Move saved States from ``src`` to ``dst``: copy each, then delete it from ``src``.

    A State is deleted from ``src`` only after ``dst`` has been read back and holds it whole
    and identical. A State that ``on_exists="skip"`` kept different in ``dst`` stays in
    ``src`` (``removed`` is false). Arguments and errors as :func:`copy_states`; a move killed
    halfway is finished by running it again.
    """
    return _run(_transfer(src, dst, ids, on_exists, progress, move=True))


async def amove_states(
    src: Store,
    dst: Store,
    ids: Iterable[str] | None = None,
    *,
    on_exists: OnExists = "error",
    progress: Progress | None = None,
) -> list[Transferred]:
    """Async :func:`move_states`."""
    return await _arun(_transfer(src, dst, ids, on_exists, progress, move=True))


# Export and import. ----------------------------------------------------------------------


def _export(store: Store, state_id: str) -> _Plan[dict[str, Any]]:
    record: Record | None = yield _Read(store, state_id)
    if record is None:
        raise StateNotFoundError(f"no saved State with id {state_id!r} in {store!r}")
    entries, snapshot = _normal(record)
    return {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "id": state_id,
        "exported_at": datetime.now(UTC).isoformat(),
        "entries": entries,
        "snapshot": snapshot,
    }


def export_state(store: Store, state_id: str) -> dict[str, Any]:
    """One saved State as a self-contained JSON document (a dict; ``json.dumps`` it).

    The document has ``format`` (``"alpineagents.state"``), ``version``, ``id``,
    ``exported_at``, and the State exactly as the store keeps it: ``entries`` (in seq order)
    and ``snapshot``. :func:`import_state` writes it into any store.

    Raises:
        KeyError: ``StateNotFoundError`` when ``store`` has no State ``state_id``.
    """
    return _run(_export(store, state_id))


async def aexport_state(store: Store, state_id: str) -> dict[str, Any]:
    """Async :func:`export_state`."""
    return await _arun(_export(store, state_id))


def parse_export(document: str | bytes | Mapping[str, Any], where: str = "") -> tuple[str, Record]:
    """Check an exported document and return its id and record.

    ``document`` is the JSON text or the parsed dict; ``where`` names it in errors (a file).

    The State in it gets the checks a load makes (every field alpineagents reads, see
    ``Store.load``), so a damaged export is refused before anything is written.

    Raises:
        CorruptStateError: It is not JSON, not an alpineagents State export, or the State
            in it is damaged (the message names the entry or the snapshot, and the field).
        SchemaVersionError: It was exported by a newer alpineagents (a later ``version``),
            or holds an object of a newer schema.
    """
    where = where or "the document"
    if isinstance(document, str | bytes):
        try:
            document = json.loads(document)
        except ValueError as e:
            raise CorruptStateError(f"{where} is not JSON: {e}") from e
    if not isinstance(document, Mapping) or document.get("format") != EXPORT_FORMAT:
        raise CorruptStateError(
            f"{where} is not an exported alpineagents State (no format {EXPORT_FORMAT!r})"
        )
    version = document.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise CorruptStateError(f"{where} has an invalid version {version!r}")
    if version > EXPORT_VERSION:
        raise SchemaVersionError(
            f"{where} was exported in format version {version}, newer than this alpineagents "
            f"reads ({EXPORT_VERSION}): upgrade alpineagents"
        )
    state_id = document.get("id")
    entries = document.get("entries")
    snapshot = document.get("snapshot")
    if not isinstance(state_id, str):
        raise CorruptStateError(f"{where} has no State id")
    if not isinstance(entries, list) or not entries:
        raise CorruptStateError(f"{where} has no list of history entries")
    for i, entry in enumerate(entries):
        seq = entry.get("seq") if isinstance(entry, dict) else None
        if not is_int(seq) or seq < 0:
            raise CorruptStateError(
                f"State {state_id!r} in {where}, the history entry read at position {i}: "
                f"seq must be an int >= 0, not {shown(seq)}"
            )
    if not isinstance(snapshot, dict):
        raise CorruptStateError(f"{where} has no snapshot")
    # The same checks as a load: what a store is given here must be a State it can load.
    state_from_record(state_id, entries, snapshot, f"State {state_id!r} in {where}")
    return state_id, Record(entries, snapshot)


def _import(
    store: Store, document: str | bytes | Mapping[str, Any], on_exists: OnExists, where: str
) -> _Plan[Transferred]:
    if on_exists not in ("error", "skip", "overwrite"):
        raise ValueError(f"on_exists must be 'error', 'skip' or 'overwrite', not {on_exists!r}")
    state_id, record = parse_export(document, where)
    action = yield from _put(record, store, state_id, on_exists, where or "the document")
    return Transferred(state_id, action, len(record.entries))


def import_state(
    store: Store,
    document: str | bytes | Mapping[str, Any],
    *,
    on_exists: OnExists = "error",
    where: str = "",
) -> Transferred:
    """Write a State exported by :func:`export_state` into ``store``, under its own id.

    If ``store`` already has that State identically nothing is written (``"identical"``). A
    different State under the id is refused with :class:`TransferConflictError` unless
    ``on_exists`` is ``"skip"`` or ``"overwrite"``. ``where`` names the document in errors.

    Raises:
        CorruptStateError, SchemaVersionError: See :func:`parse_export`.
        TransferConflictError: The id is taken by a different State (``on_exists="error"``).
    """
    return _run(_import(store, document, on_exists, where))


async def aimport_state(
    store: Store,
    document: str | bytes | Mapping[str, Any],
    *,
    on_exists: OnExists = "error",
    where: str = "",
) -> Transferred:
    """Async :func:`import_state`."""
    return await _arun(_import(store, document, on_exists, where))
