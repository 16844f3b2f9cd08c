"""The one serialiser: a State to (entries, snapshot) and back.

Every store keeps what this module produces and nothing else: history entries as small JSON
dicts (each with its ``seq``) and one snapshot dict with the rest of the State. Both carry the
schema version, so a newer format is refused instead of misread.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final, cast, get_args

import pydantic_core
from pydantic import BaseModel

from alpineagents.errors import CorruptStateError, NotJSONError, SchemaVersionError
from alpineagents.history import (
    KINDS,
    TASK,
    EntryKind,
    check_stored_data,
    check_text,
    is_int,
    shown,
)
from alpineagents.history import check_json as check_json
from alpineagents.state import HistoryEntry, State, StoppedBy, validate_id

SCHEMA_VERSION: Final = 1

_SNAPSHOT_KEYS: Final = ("id", "task", "entries", "data", "created_at", "updated_at")
_STOPS: Final = get_args(StoppedBy)
_KIND: Final = re.compile(r"[a-z][a-z0-9_]*")


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


class DamagedStateError(CorruptStateError):
    """A stored value the rebuild refused. ``detail`` says which and why, without the owner.

    The message is ``"<owner>, <detail>"``: ``State 'x', history entry 3 (tool_result):
    data['call_id'] is missing …``. A store's load names itself as the owner instead.
    """

    def __init__(self, owner: str, detail: str):
        super().__init__(f"{owner}, {detail}")
        self.detail = detail


def entry_from_dict(raw: Any, owner: str, position: int) -> HistoryEntry:
    """Rebuild a history entry, checking every field alpineagents reads.

    ``owner`` names the State (``State 'x'``) and ``position`` is where the entry was in
    what the store read. A damaged entry raises :class:`DamagedStateError` naming the entry
    by its seq once that is known, and the field by its path.
    """
    if not isinstance(raw, dict):
        raise DamagedStateError(
            owner,
            f"the history entry read at position {position} must be an alpineagents history "
            f"entry (a dict), not {shown(raw)}",
        )
    _check_version(raw, f"{owner}, the history entry read at position {position}")
    seq = raw.get("seq")
    if not is_int(seq) or seq < 0:
        raise DamagedStateError(
            owner,
            f"the history entry read at position {position}: seq must be an int >= 0, "
            f"not {shown(seq)}",
        )
    part = f"history entry {seq}"
    kind, data = raw.get("kind"), raw.get("data")
    if not isinstance(kind, str) or not _KIND.fullmatch(kind):
        # Any name passes: a kind this version does not know (a newer one's) is kept in
        # history, out of the model's context, and a resume does not replay past it.
        raise DamagedStateError(
            owner, f"{part}: kind must be a kind such as {sorted(KINDS)}, not {shown(kind)}"
        )
    part = f"{part} ({kind})"
    text = _checked_str(raw.get("text"), owner, part, "text")
    if not isinstance(data, dict):
        raise DamagedStateError(owner, f"{part}: data must be a dict, not {shown(data)}")
    try:
        check_stored_data(kind, data, seq)
    except ValueError as e:
        raise DamagedStateError(owner, f"{part}: {e}") from None
    when = _time(raw.get("at"), owner, part, "at")
    return HistoryEntry(seq, cast(EntryKind, kind), text, data, None, when)


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
    state_id: str, entries: Sequence[dict[str, Any]], snapshot: Any, owner: str = ""
) -> tuple[State, int]:
    """Rebuild a State from what a store read, exactly as it was saved.

    Returns the State and how many history entries its snapshot accounts for; entries
    saved after those (a tool result saved alone) are in ``history`` too. What a loaded
    State does with them is the resume policy's business (:mod:`alpineagents._resume`).

    Every field alpineagents reads is checked first: a damaged or foreign value raises
    :class:`DamagedStateError` (a :class:`CorruptStateError`) naming the State (``owner``,
    by default ``State '<id>'``), the entry's seq or the snapshot, and the field's path.
    """
    owner = owner or f"State {state_id!r}"
    try:
        validate_id(state_id)
    except ValueError as e:
        raise DamagedStateError(owner, f"id: {e}") from None
    values = _snapshot_values(snapshot, state_id, owner)
    covered = values["entries"]

    history = sorted(
        (entry_from_dict(raw, owner, i) for i, raw in enumerate(entries)), key=lambda e: e.seq
    )
    for position, entry in enumerate(history):
        if entry.seq < position:
            raise DamagedStateError(owner, f"history entry {entry.seq}: stored twice")
        if entry.seq > position:
            if position < covered:
                break  # reported below: the snapshot names a missing entry
            # A store that writes a save's entries in parallel was stopped halfway: what
            # follows the gap was never part of a complete save, and is left out.
            history = history[:position]
            break
    if covered > len(history) or history[covered - 1].seq != covered - 1:
        raise DamagedStateError(
            owner,
            f"snapshot: accounts for {covered} history entries, but the store has "
            f"{_unbroken(history)} in a row from seq 0",
        )
    if history[0].kind != TASK:
        raise DamagedStateError(
            owner, f"history entry 0: kind must be 'task', not {shown(history[0].kind)}"
        )
    if values["stop_seq"] is not None and values["stop_seq"] > covered:
        raise DamagedStateError(
            owner,
            f"snapshot: stop_seq must be at most the {covered} entries it accounts for, "
            f"not {values['stop_seq']}",
        )

    # The State gets its own copies: the snapshot stays what the store has.
    state = State._restore(
        state_id,
        values["task"],
        data=copy.deepcopy(values["data"]),
        history=history,
        stopped_by=values["stopped_by"],
        stop_seq=values["stop_seq"],
        answer=copy.deepcopy(values["answer"]),
        agent=copy.deepcopy(values["agent"]),
        created_at=values["created_at"],
        updated_at=values["updated_at"],
    )
    return state, covered


def _snapshot_values(snapshot: Any, state_id: str, owner: str) -> dict[str, Any]:
    """The values of a stored snapshot, each checked."""
    part = "snapshot"
    if not isinstance(snapshot, dict):
        raise DamagedStateError(
            owner, f"{part}: must be an alpineagents snapshot (a dict), not {shown(snapshot)}"
        )
    _check_version(snapshot, f"{owner}, {part}")
    missing = [k for k in _SNAPSHOT_KEYS if k not in snapshot]
    if missing:
        raise DamagedStateError(
            owner, f"{part}: {missing[0]} is missing: not an alpineagents snapshot"
        )
    if snapshot["id"] != state_id:
        raise DamagedStateError(owner, f"{part}: belongs to State {snapshot['id']!r}")
    task, covered = _checked_str(snapshot["task"], owner, part, "task"), snapshot["entries"]
    if not is_int(covered) or covered < 1:
        raise DamagedStateError(
            owner,
            f"{part}: entries must be a count of history entries (>= 1), not {shown(covered)}",
        )
    data = _stored_json(snapshot["data"], owner, part, "data")
    if not isinstance(data, dict):
        raise DamagedStateError(owner, f"{part}: data must be a dict, not {shown(data)}")
    stopped_by, stop_seq = snapshot.get("stopped_by"), snapshot.get("stop_seq")
    if stopped_by is not None and stopped_by not in _STOPS:
        raise DamagedStateError(
            owner,
            f"{part}: stopped_by must be null or one of {list(_STOPS)}, not {shown(stopped_by)}",
        )
    if stop_seq is not None and (not is_int(stop_seq) or stop_seq < 0):
        raise DamagedStateError(
            owner, f"{part}: stop_seq must be null or a count of entries, not {shown(stop_seq)}"
        )
    return {
        "task": task,
        "entries": covered,
        "data": data,
        "stopped_by": stopped_by,
        "stop_seq": stop_seq,
        "answer": _stored_json(snapshot.get("answer"), owner, part, "answer"),
        "agent": _agent(snapshot.get("agent"), owner, part),
        "created_at": _time(snapshot["created_at"], owner, part, "created_at"),
        "updated_at": _time(snapshot["updated_at"], owner, part, "updated_at"),
    }


def _agent(value: Any, owner: str, part: str) -> dict[str, Any] | None:
    """The fingerprint of the Agent that ran the State: its model, system and tools."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise DamagedStateError(owner, f"{part}: agent must be null or a dict, not {shown(value)}")
    for key in ("model", "system"):
        if value.get(key) is not None and not isinstance(value[key], str):
            raise DamagedStateError(
                owner, f"{part}: agent[{key!r}] must be null or a str, not {shown(value[key])}"
            )
    tools = value.get("tools", {})
    if not isinstance(tools, dict) or not all(isinstance(v, str) for v in tools.values()):
        raise DamagedStateError(
            owner,
            f"{part}: agent['tools'] must be a dict of tool digests (str), not {shown(tools)}",
        )
    checked: dict[str, Any] = _stored_json(value, owner, part, "agent")
    return checked


def _stored_json(value: Any, owner: str, part: str, field: str) -> Any:
    """``value`` if a State may keep it (see :func:`check_json`), else DamagedStateError."""
    try:
        return check_json(value, field)
    except NotJSONError as e:
        raise DamagedStateError(owner, f"{part}: {e}") from None


def _checked_str(value: Any, owner: str, part: str, field: str) -> str:
    if not isinstance(value, str):
        raise DamagedStateError(owner, f"{part}: {field} must be a str, not {shown(value)}")
    try:
        return check_text(value, field)
    except NotJSONError as e:
        raise DamagedStateError(owner, f"{part}: {e}") from None


def _time(value: Any, owner: str, part: str, field: str) -> datetime:
    """A stored ISO 8601 time with its timezone."""
    when = None
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            when = datetime.fromisoformat(value)
    if when is None or when.tzinfo is None:
        raise DamagedStateError(
            owner,
            f"{part}: {field} must be an ISO 8601 time with a timezone, not {shown(value)}",
        )
    return when


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
    if not is_int(version):
        raise CorruptStateError(f"{where} has no schema version: not written by alpineagents")
    if version > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"{where} was written with schema version {version}, newer than this alpineagents "
            f"reads ({SCHEMA_VERSION}): upgrade alpineagents to load it"
        )
