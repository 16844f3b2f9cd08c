"""The one serialiser: a State to (entries, snapshot) and back.

Every store keeps what this module produces and nothing else: history entries as small JSON
dicts (each with its ``seq``) and one snapshot dict with the rest of the State. Both carry the
schema version (``v``), so a newer format is refused instead of misread.

An object carries the oldest schema version that reads it. That is 1, except for a compact
model entry: one whose text is its content's text blocks joined (as the Agent records every
response), kept once, in the blocks, without a ``text`` field. It carries 2, so that an
alpineagents from before asks to be upgraded instead of calling the entry damaged. Entries
with ``text`` (of any kind, and of every version so far) load as they always did.

This version reads compact entries but does not write them yet (``_WRITE_COMPACT``): during a
rolling deploy, or after a rollback, a process of the version before may resume a State this
one saved, and it cannot read them. A later release writes them, once every process that
reads the store understands them.

(Longer than this project's ~400 lines on purpose: it is the one adapter every store uses, as
the design asks, and the entry and snapshot halves share the schema version, the checks of
stored values and the errors that name the State, the entry and the field.)
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from collections.abc import Sequence
from datetime import datetime
from operator import attrgetter
from typing import Any, Final, cast, get_args

import pydantic_core
from pydantic import BaseModel

from alpineagents._gc import paused
from alpineagents.errors import CorruptStateError, NotJSONError, SchemaVersionError
from alpineagents.history import (
    KINDS,
    MODEL,
    TASK,
    EntryKind,
    check_model_data,
    check_stored_data,
    check_text,
    is_int,
    model_text,
    plain_model_text,
    plain_stored_data,
    shown,
)
from alpineagents.history import check_json as check_json
from alpineagents.state import HistoryEntry, State, StoppedBy, validate_id

# The newest schema version this alpineagents reads (and writes, where it must).
SCHEMA_VERSION: Final = 2
# The version of every object that a version-1 alpineagents reads as well.
_FIRST_VERSION: Final = 1
# Whether model entries are written compact (schema version 2): not yet, see the docstring.
_WRITE_COMPACT = False

_SNAPSHOT_KEYS: Final = ("id", "task", "entries", "data", "created_at", "updated_at")
_STOPS: Final = get_args(StoppedBy)
_KIND: Final = re.compile(r"[a-z][a-z0-9_]*")
_SEQ: Final = attrgetter("seq")


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
    """One history entry as a JSON dict (``error`` is not kept; ``text`` describes it).

    Written compact (``_WRITE_COMPACT``), a model entry whose text is its text blocks joined
    keeps the text once, in the blocks.
    """
    try:
        data = copy.deepcopy(entry.data)  # a store may keep the dict: it must not share it
    except RecursionError as e:  # data changed in place after append, past what was checked
        raise NotJSONError(
            f"history entry {entry.seq} ({entry.kind}) cannot be saved as JSON: its data is "
            f"nested too deeply ({e})"
        ) from e
    if _WRITE_COMPACT and entry.kind == MODEL and model_text(data.get("content", [])) == entry.text:
        return {
            "v": SCHEMA_VERSION,
            "seq": entry.seq,
            "kind": entry.kind,
            "at": entry.at.isoformat(),
            "data": data,
        }
    return {
        "v": _FIRST_VERSION,
        "seq": entry.seq,
        "kind": entry.kind,
        "text": entry.text,
        "at": entry.at.isoformat(),
        "data": data,
    }


class DamagedStateError(CorruptStateError):
    """A stored value the rebuild refused. ``detail`` says which and why, without the owner.

    The message is ``"<owner>, <detail>"``: ``State 'x', history entry 3 (tool_result):
    data['call_id'] is missing …``. A store's load names itself as the owner instead.
    """

    def __init__(self, owner: str, detail: str):
        super().__init__(f"{owner}, {detail}")
        self.detail = detail


_ABSENT: Final = object()


def entry_from_dict(raw: Any, owner: str, position: int) -> HistoryEntry:
    """Rebuild a history entry, checking every field alpineagents reads.

    ``owner`` names the State (``State 'x'``) and ``position`` is where the entry was in
    what the store read. A damaged entry raises :class:`DamagedStateError` naming the entry
    by its seq once that is known, and the field by its path. A model entry without
    ``text`` gets the text of its text blocks.

    A load calls this for every entry. An entry of the shape alpineagents writes (exact JSON
    types, ASCII text, a model response, tool result, message or task) is checked here with
    type tests alone; any other goes through :func:`_checked_entry`, which checks each field
    in turn and names the one that is wrong. Both accept and refuse the same entries, and
    build the same entry from one they accept.
    """
    if type(raw) is dict:
        try:
            version, seq, kind, data, at = raw["v"], raw["seq"], raw["kind"], raw["data"], raw["at"]
        except KeyError:
            return _checked_entry(raw, owner, position)
        text = raw.get("text", _ABSENT)
        if (
            type(version) is int
            and version <= SCHEMA_VERSION
            and type(seq) is int
            and seq >= 0
            and type(kind) is str
            and type(data) is dict
            and type(at) is str
        ):
            if kind == MODEL:
                blocks_text = plain_model_text(data)
                plain = blocks_text is not None
                if text is _ABSENT and version >= 2:
                    text = blocks_text
            else:
                plain = plain_stored_data(kind, data)
            if plain and type(text) is str and text.isascii():
                try:
                    when = _from_iso(at)
                except ValueError:
                    when = None
                if when is not None and when.tzinfo is not None:
                    return HistoryEntry(seq, cast(EntryKind, kind), text, data, None, when)
    return _checked_entry(raw, owner, position)


_from_iso: Final = datetime.fromisoformat


def _checked_entry(raw: Any, owner: str, position: int) -> HistoryEntry:
    """:func:`entry_from_dict` one check at a time, each field named when it is wrong."""
    if not isinstance(raw, dict):
        raise DamagedStateError(
            owner,
            f"the history entry read at position {position} must be an alpineagents history "
            f"entry (a dict), not {shown(raw)}",
        )
    version = raw.get("v")
    if type(version) is not int or version > SCHEMA_VERSION:
        _check_version(raw, f"{owner}, the history entry read at position {position}")
    seq = raw.get("seq")
    if (type(seq) is not int and not is_int(seq)) or seq < 0:
        raise DamagedStateError(
            owner,
            f"the history entry read at position {position}: seq must be an int >= 0, "
            f"not {shown(seq)}",
        )
    kind = raw.get("kind")
    if not (type(kind) is str and kind in KINDS) and (
        not isinstance(kind, str) or not _KIND.fullmatch(kind)
    ):
        # Any name passes: a kind this version does not know (a newer one's) is kept in
        # history, out of the model's context, and a resume does not replay past it.
        raise DamagedStateError(
            owner,
            f"history entry {seq}: kind must be a kind such as {sorted(KINDS)}, not {shown(kind)}",
        )
    text = raw.get("text", _ABSENT)
    derived = text is _ABSENT and kind == MODEL and is_int(version) and version >= 2
    if not derived and (type(text) is not str or not text.isascii()):
        text = _checked_str(None if text is _ABSENT else text, owner, _part(seq, kind), "text")
    data = raw.get("data")
    if not isinstance(data, dict):
        raise DamagedStateError(
            owner, f"{_part(seq, kind)}: data must be a dict, not {shown(data)}"
        )
    try:
        if kind == MODEL:
            blocks_text = check_model_data(data)
            if derived:
                text = blocks_text
        else:
            check_stored_data(kind, data, seq)
    except ValueError as e:
        raise DamagedStateError(owner, f"{_part(seq, kind)}: {e}") from None
    if derived and not text.isascii():
        text = _checked_str(text, owner, _part(seq, kind), "the text of data['content']")
    at = raw.get("at")
    try:
        when = datetime.fromisoformat(at) if type(at) is str else _time(at)
    except ValueError:
        when = None
    if when is None or when.tzinfo is None:
        raise _bad_time(owner, _part(seq, kind), "at", at)
    return HistoryEntry(seq, cast(EntryKind, kind), text, data, None, when)


def _part(seq: int, kind: str) -> str:
    """An entry as a message names it: ``history entry 3 (tool_result)``."""
    return f"history entry {seq} ({kind})"


# Snapshots --------------------------------------------------------------------------------


def snapshot_of(state: State) -> dict[str, Any]:
    """The State without its history, as JSON. Raises ``TypeError`` for non-JSON values.

    The snapshot holds the number of history entries it accounts for, not the entries
    themselves, so its size does not grow with the conversation.
    """
    return {
        "v": _FIRST_VERSION,  # its form has not changed since
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

    with paused():  # many objects at once, none garbage (see alpineagents._gc)
        history = [entry_from_dict(raw, owner, i) for i, raw in enumerate(entries)]
    # Entries read in seq order with none missing (as FileStore reads them) need neither.
    if list(map(_SEQ, history)) != list(range(len(history))):
        history = _in_seq_order(history, covered, owner)
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


def _in_seq_order(history: list[HistoryEntry], covered: int, owner: str) -> list[HistoryEntry]:
    """History sorted by seq, up to its first gap past the ``covered`` entries; no seq twice."""
    history = sorted(history, key=_SEQ)
    for position, entry in enumerate(history):
        if entry.seq < position:
            raise DamagedStateError(owner, f"history entry {entry.seq}: stored twice")
        if entry.seq > position:
            if position < covered:
                break  # reported by the caller: the snapshot names a missing entry
            # A store that writes a save's entries in parallel was stopped halfway: what
            # follows the gap was never part of a complete save, and is left out.
            return history[:position]
    return history


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
        "created_at": _checked_time(snapshot["created_at"], owner, part, "created_at"),
        "updated_at": _checked_time(snapshot["updated_at"], owner, part, "updated_at"),
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


def _time(value: Any) -> datetime | None:
    """A stored ISO 8601 time with its timezone, or ``None``."""
    if isinstance(value, str):
        try:
            when = datetime.fromisoformat(value)
        except ValueError:
            return None
        if when.tzinfo is not None:
            return when
    return None


def _checked_time(value: Any, owner: str, part: str, field: str) -> datetime:
    when = _time(value)
    if when is None:
        raise _bad_time(owner, part, field, value)
    return when


def _bad_time(owner: str, part: str, field: str, value: Any) -> DamagedStateError:
    return DamagedStateError(
        owner, f"{part}: {field} must be an ISO 8601 time with a timezone, not {shown(value)}"
    )


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
