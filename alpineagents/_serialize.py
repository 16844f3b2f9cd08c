"""The one serialiser: a State to (entries, snapshot) and back.

Every store keeps what this module produces and nothing else: history entries as small JSON
dicts (each with its ``seq``) and one snapshot dict with the rest of the State. Both carry the
schema version, so a newer format is refused instead of misread.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final

import pydantic_core
from pydantic import BaseModel

from alpineagents.errors import CorruptStateError, NotJSONError, SchemaVersionError
from alpineagents.history import check_json as check_json
from alpineagents.state import HistoryEntry, State, validate_id

SCHEMA_VERSION: Final = 1

_SNAPSHOT_KEYS: Final = ("id", "task", "entries", "data", "created_at", "updated_at")


def answer_to_json(value: Any, path: str = "answer") -> Any:
    """An answer as JSON: pydantic models and dataclasses become dicts, the rest must be JSON.

    Raises :class:`NotJSONError` naming ``path`` for an answer JSON cannot hold.
    """
    if isinstance(value, BaseModel) or (
        dataclasses.is_dataclass(value) and not isinstance(value, type)
    ):
        try:
            value = pydantic_core.to_jsonable_python(value)
        except (ValueError, TypeError, RecursionError) as e:
            raise NotJSONError(f"{path} cannot be saved as JSON: {e}") from e
    return check_json(value, path)


def dumps(obj: Any) -> bytes:
    """Compact UTF-8 JSON, the bytes every store keeps.

    What the serialiser hands a store was checked already; anything else that JSON cannot
    hold raises :class:`NotJSONError` here, before a store writes a byte.
    """
    try:
        text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        return text.encode()
    except (ValueError, TypeError, RecursionError) as e:  # UnicodeEncodeError is a ValueError
        raise NotJSONError(f"cannot be saved as JSON: {e}") from e


def loads(raw: bytes | str, where: str) -> Any:
    """Parse JSON kept by a store; ``where`` names the object in the error."""
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise CorruptStateError(f"{where} is not valid JSON: {e}") from e


# Entries ----------------------------------------------------------------------------------


def entry_to_dict(entry: HistoryEntry) -> dict[str, Any]:
    """One history entry as a JSON dict (``error`` is not kept; ``text`` describes it)."""
    return {
        "v": SCHEMA_VERSION,
        "seq": entry.seq,
        "kind": entry.kind,
        "text": entry.text,
        "at": entry.at.isoformat(),
        "data": copy.deepcopy(entry.data),  # a store may keep the dict: it must not share it
    }


def entry_from_dict(raw: Any, where: str) -> HistoryEntry:
    """Rebuild a history entry; ``where`` names it in errors."""
    if not isinstance(raw, dict):
        raise CorruptStateError(f"{where} is not an alpineagents history entry")
    _check_version(raw, where)
    try:
        seq, kind, text, at, data = raw["seq"], raw["kind"], raw["text"], raw["at"], raw["data"]
        ok = (
            isinstance(seq, int)
            and seq >= 0
            and isinstance(kind, str)
            and isinstance(text, str)
            and isinstance(data, dict)
        )
        when = datetime.fromisoformat(at)
    except (KeyError, TypeError, ValueError) as e:
        raise CorruptStateError(f"{where} is not an alpineagents history entry: {e!r}") from e
    if not ok:
        raise CorruptStateError(f"{where} is not an alpineagents history entry")
    return HistoryEntry(seq, kind, text, data, None, when)


# Snapshots --------------------------------------------------------------------------------


def snapshot_of(state: State) -> dict[str, Any]:
    """The State without its history, as JSON. Raises ``TypeError`` for non-JSON values.

    The snapshot holds the number of history entries it accounts for, not the entries
    themselves, so its size does not grow with the conversation.
    """
    return {
        "v": SCHEMA_VERSION,
        "id": state.id,
        "task": state.task,
        "entries": len(state.history),
        "data": check_json(state.data, "state.data"),
        "stopped_by": state.stopped_by,
        "stop_seq": state._stop_seq,
        "answer": _answer_json(state),
        "agent": state._agent_fingerprint,
        "created_at": state.created_at.isoformat(),
        "updated_at": state.updated_at.isoformat(),
    }


def _answer_json(state: State) -> Any:
    # An answer the Agent accepted is dumped by the answer's own type adapter, as long as it
    # is the object accepted; dumped again at every save, so that a change made to it in
    # place (``state.answer.n = 4``) is saved too.
    if state._answer_dump is not None and state._answer_dump[0] is state.answer:
        return state._answer_dump[1](state.answer, "state.answer")
    return answer_to_json(state.answer, "state.answer")


def same_snapshot(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """Whether two snapshots differ only in ``updated_at``."""
    if a is None or b is None:
        return a is b
    return {k: v for k, v in a.items() if k != "updated_at"} == {
        k: v for k, v in b.items() if k != "updated_at"
    }


def state_from_record(
    state_id: str, entries: Sequence[dict[str, Any]], snapshot: Any
) -> tuple[State, int]:
    """Rebuild a State from what a store read, exactly as it was saved.

    Returns the State and how many history entries its snapshot accounts for; entries
    saved after those (a tool result saved alone) are in ``history`` too. What a loaded
    State does with them is the resume policy's business (:mod:`alpineagents._resume`).
    """
    where = f"the snapshot of State {state_id!r}"
    if not isinstance(snapshot, dict):
        raise CorruptStateError(f"{where} is not an alpineagents snapshot")
    _check_version(snapshot, where)
    missing = [k for k in _SNAPSHOT_KEYS if k not in snapshot]
    if missing:
        raise CorruptStateError(f"{where} is not an alpineagents snapshot (no {missing[0]!r})")
    if snapshot["id"] != state_id:
        raise CorruptStateError(f"{where} belongs to State {snapshot['id']!r}")

    history = sorted(
        (entry_from_dict(raw, f"entry {i} of State {state_id!r}") for i, raw in enumerate(entries)),
        key=lambda e: e.seq,
    )
    covered = snapshot["entries"]
    if not isinstance(covered, int) or covered < 1:
        raise CorruptStateError(f"{where} accounts for {covered!r} history entries")
    for position, entry in enumerate(history):
        if entry.seq < position:
            raise CorruptStateError(f"State {state_id!r} has history entry {entry.seq} twice")
        if entry.seq > position:
            if position < covered:
                break  # reported below: the snapshot names a missing entry
            # A store that writes a save's entries in parallel was stopped halfway: what
            # follows the gap was never part of a complete save, and is left out.
            history = history[:position]
            break
    if covered > len(history) or history[covered - 1].seq != covered - 1:
        raise CorruptStateError(
            f"{where} accounts for {covered} history entries, but the store has "
            f"{_unbroken(history)} in a row from seq 0"
        )

    # The State gets its own copies: the snapshot stays what the store has.
    state = State._restore(
        validate_id(state_id),
        snapshot["task"],
        data=copy.deepcopy(snapshot["data"]),
        history=history,
        stopped_by=snapshot.get("stopped_by"),
        stop_seq=snapshot.get("stop_seq"),
        answer=copy.deepcopy(snapshot.get("answer")),
        agent=snapshot.get("agent"),
        created_at=datetime.fromisoformat(snapshot["created_at"]),
        updated_at=datetime.fromisoformat(snapshot["updated_at"]),
    )
    return state, covered


def check_stored(obj: Any, where: str) -> dict[str, Any]:
    """Check that a stored object (entry or snapshot) is one this version can read.

    Returns the object; raises ``CorruptStateError`` for something alpineagents did not
    write and ``SchemaVersionError`` for a newer schema. ``where`` names the object (a path,
    a bucket and key) in the message.
    """
    if not isinstance(obj, dict):
        raise CorruptStateError(f"{where} is not an alpineagents object: not a JSON object")
    _check_version(obj, where)
    return obj


def _unbroken(history: list[HistoryEntry]) -> int:
    return next((i for i, e in enumerate(history) if e.seq != i), len(history))


def _check_version(obj: dict[str, Any], where: str) -> None:
    version = obj.get("v")
    if not isinstance(version, int):
        raise CorruptStateError(f"{where} has no schema version: not written by alpineagents")
    if version > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"{where} was written with schema version {version}, newer than this alpineagents "
            f"reads ({SCHEMA_VERSION}): upgrade alpineagents to load it"
        )
