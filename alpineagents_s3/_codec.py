"""The bytes of S3Store's objects, and the ids it accepts. No alpineagents internals.

An entry object's body is the entry dict as JSON; the snapshot object's body is the snapshot
(or info) dict as JSON, or ``null`` for a State created without one (alpineagents 0.2-0.4 may
do that in the middle of a turn). A packed segment's body is a JSON object naming its format and
range, with the entries of that range, in seq order, under ``"entries"``. The store reads nothing
in them but an entry's ``seq``.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from alpineagents_s3._gc import paused
from alpineagents_s3.errors import CorruptStateError, SchemaVersionError

__all__ = [
    "dumps",
    "dumps_segment",
    "loads_entry",
    "loads_segment",
    "loads_snapshot",
    "validate_id",
]

# The format of a packed segment's body; a newer one is refused, not misread.
SEGMENT_FORMAT: Final = 1
SEGMENT_FIELD: Final = "alpineagents-segment"

_ID: Final = re.compile(r"[A-Za-z0-9_-]{1,128}")


def validate_id(state_id: object) -> str:
    """``state_id`` if it is a State id (letters, digits, ``_``, ``-``; 1 to 128), else raise.

    Every alpineagents version has this rule; it also makes ids safe S3 key segments.
    """
    if not isinstance(state_id, str):
        raise TypeError(f"a State id is a string, not {type(state_id).__name__}: {state_id!r}")
    if not _ID.fullmatch(state_id):
        raise ValueError(
            f"invalid State id {state_id!r}: an id has letters, digits, _ and -, "
            "1 to 128 characters"
        )
    return state_id


def dumps(obj: Mapping[str, Any] | None, what: str) -> bytes:
    """Compact UTF-8 JSON of a dict the core handed over; ``what`` names it in errors.

    Raises ``ValueError`` for NaN or infinity and ``TypeError`` for a value JSON cannot hold,
    before anything is sent, so nothing half-written is left behind.
    """
    try:
        text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError as e:
        raise ValueError(f"{what} cannot be saved: {e}") from e
    except (TypeError, RecursionError) as e:
        raise TypeError(f"{what} cannot be saved as JSON: {e}") from e
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"{what} cannot be saved: it holds a lone surrogate ({e.object[e.start : e.end]!r} "
            f"at {e.start}), which UTF-8 cannot encode"
        ) from e


def dumps_as_read(obj: Mapping[str, Any], what: str) -> bytes:
    """The JSON of a dict read from the bucket, to be written again (a pack's segments).

    What a load accepts a pack must keep: an object written by another tool may hold NaN, an
    infinity or an escaped lone surrogate, which ``json.loads`` reads and :func:`dumps` refuses.
    Such a dict is written with ASCII escapes and those literals, which the readers take.
    """
    try:
        return dumps(obj, what)
    except ValueError:
        text = json.dumps(obj, ensure_ascii=True, separators=(",", ":"), allow_nan=True)
        return text.encode("ascii")


def _loads(body: bytes, where: str) -> Any:
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise CorruptStateError(f"{where} is not valid JSON: {e}") from e


def loads_entry(body: bytes, where: str, seq: int) -> dict[str, Any]:
    """An entry object's dict; it must be a JSON object whose ``seq`` is ``seq``."""
    entry = _loads(body, where)
    if not isinstance(entry, dict):
        raise CorruptStateError(f"{where} is not a history entry: not a JSON object")
    if entry.get("seq") != seq:
        raise CorruptStateError(
            f"{where} holds history entry {entry.get('seq')!r}, not {seq}: the object was "
            "damaged or moved"
        )
    return entry


def dumps_segment(start: int, bodies: Sequence[bytes]) -> bytes:
    """A packed segment of the entries ``start`` on, given as their JSON (from :func:`dumps`)."""
    end = start + len(bodies)
    head = f'{{"{SEGMENT_FIELD}":{SEGMENT_FORMAT},"start":{start},"end":{end},"entries":['
    return head.encode() + b",".join(bodies) + b"]}"


def begins_as_segment(body: bytes) -> bool:
    """Whether ``body`` begins as :func:`dumps_segment` begins each segment it writes.

    A segment that does not read right but begins so is S3Store's own, damaged; an object that
    does not begin so is not S3Store's.
    """
    return body.startswith(f'{{"{SEGMENT_FIELD}":'.encode())


def _loads_large(body: bytes, where: str) -> Any:
    """:func:`_loads` of a large body, by pydantic_core's parser when it is installed.

    It parses in about half the time ``json.loads`` takes and shares the str of each key
    between entries. It gives the same value for what it takes; what it refuses (a lone
    surrogate, a byte order mark, damage) goes to ``json.loads``, which decides.
    """
    quick = _quick_json()
    if quick is not None:
        try:
            return quick(body, allow_inf_nan=True, cache_strings=True)
        except (ValueError, RecursionError):
            pass
    return _loads(body, where)


@functools.cache
def _quick_json() -> Callable[..., Any] | None:
    """pydantic_core's ``from_json``, imported on the first segment read (not at start-up)."""
    try:  # installed with pydantic, which alpineagents needs; optional here
        from pydantic_core import from_json
    except ImportError:  # pragma: no cover - depends on what is installed
        return None
    return from_json


def check_format(version: Any, known: int, where: str, thing: str, kind: str) -> None:
    """Refuse a format number that is not one, or is newer than ``known`` (the one we read).

    ``thing`` names the object in errors (``"a packed segment"``), ``kind`` its format.
    """
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise CorruptStateError(f"{where} has the {kind} format {version!r}")
    if version > known:
        raise SchemaVersionError(
            f"{where} is {thing} of format {version}, newer than the installed "
            f"alpineagents-s3 reads ({known}): upgrade alpineagents-s3 to read it"
        )


def loads_segment(body: bytes, where: str, start: int, end: int) -> list[dict[str, Any]]:
    """The entries ``start`` to ``end - 1`` of a packed segment, checked like entry objects.

    The cyclic garbage collector is paused while it parses (see :mod:`alpineagents_s3._gc`).
    """
    with paused():
        segment = _loads_large(body, where)
    if not isinstance(segment, dict) or SEGMENT_FIELD not in segment:
        raise CorruptStateError(f"{where} is not a packed segment of S3Store")
    check_format(segment[SEGMENT_FIELD], SEGMENT_FORMAT, where, "a packed segment", "segment")
    entries = segment.get("entries")
    if (segment.get("start"), segment.get("end")) != (start, end) or not isinstance(entries, list):
        raise CorruptStateError(
            f"{where} does not hold entries {start} to {end - 1} as its name says: the object "
            "was damaged or moved"
        )
    if len(entries) != end - start:
        raise CorruptStateError(
            f"{where} holds {len(entries)} entries, not the {end - start} its name says"
        )
    for seq, entry in enumerate(entries, start):
        if not isinstance(entry, dict) or entry.get("seq") != seq:
            got = entry.get("seq") if isinstance(entry, dict) else type(entry).__name__
            raise CorruptStateError(
                f"{where} holds {got!r} where history entry {seq} belongs: the object was damaged"
            )
    return entries


def loads_snapshot(body: bytes, where: str) -> dict[str, Any] | None:
    """A snapshot object's dict, or ``None`` for a State created without one."""
    snapshot = _loads(body, where)
    if snapshot is not None and not isinstance(snapshot, dict):
        raise CorruptStateError(f"{where} is not a State snapshot: not a JSON object or null")
    return snapshot
