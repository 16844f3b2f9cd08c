"""The bytes of S3Store's objects, and the ids it accepts. No alpineagents internals.

An entry object's body is the entry dict as compact UTF-8 JSON; a segment's body is a JSON
array of entry dicts in seq order, made by joining their bodies. The store reads nothing in an
entry but its ``seq``.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from alpineagents_s3._gc import paused
from alpineagents_s3.errors import CorruptStateError

__all__ = ["copy", "dumps", "join", "loads", "loads_parts", "own", "validate_id"]

_ID: Final = re.compile(r"[A-Za-z0-9_-]{1,128}")
# A body this large is parsed by pydantic_core, when it is installed (see _fast_parser).
_LARGE: Final = 64 * 1024


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


def dumps(obj: Mapping[str, Any] | Sequence[Any] | None, what: str) -> bytes:
    """Compact UTF-8 JSON of what the core handed over; ``what`` names it in errors.

    Raises ``ValueError`` for NaN, an infinity or a lone surrogate, and ``TypeError`` for a
    value JSON cannot hold, before anything is sent, so nothing half-written is left behind.
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


def loads(body: bytes, where: str) -> Any:
    """Parse JSON read from the bucket; damage is a ``CorruptStateError`` naming ``where``."""
    parse = _fast_parser() if len(body) >= _LARGE else None
    with paused():
        if parse is not None:
            try:
                return parse(body)
            except (ValueError, RecursionError):
                pass  # json.loads decides, and words the error
        try:
            return json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError) as e:
            raise CorruptStateError(f"{where} is not valid JSON: {e}") from e


@functools.cache
def _fast_parser() -> Callable[[bytes], Any] | None:
    """pydantic_core's parser: about twice as fast as ``json.loads`` on large bodies.

    It gives the same values for what it accepts; what it refuses goes to ``json.loads``.
    Imported at the first large body, not at start-up; optional (pydantic is the core's).
    """
    try:
        from pydantic_core import from_json
    except ImportError:  # pragma: no cover - depends on what is installed
        return None
    return functools.partial(from_json, allow_inf_nan=True, cache_strings="keys")


def own(value: Mapping[str, Any], what: str) -> dict[str, Any]:
    """A copy of a dict a caller sent, as JSON holds it; :func:`dumps`'s errors, naming ``what``.

    What the process's memory keeps is never an object a caller holds: a caller that changes
    a snapshot it sent or was given cannot change the head that later saves compare with.
    """
    copied: dict[str, Any] = json.loads(dumps(value, what))
    return copied


def copy(value: dict[str, Any]) -> dict[str, Any]:
    """A copy of a dict the memory holds (JSON's values only), for a caller: see :func:`own`."""
    try:
        return _tree(value)  # type: ignore[no-any-return]
    except RecursionError:  # nested deeper than Python recurses: JSON's parser goes deeper
        return own(value, "a snapshot")


def _tree(value: Any) -> Any:
    if type(value) is dict:
        return {key: _tree(item) for key, item in value.items()}
    if type(value) is list:
        return [_tree(item) for item in value]
    return value  # str, int, float, bool or None


def join(bodies: Sequence[bytes]) -> bytes:
    """A segment's body: entry bodies (from :func:`dumps`) or segments, as one JSON array."""
    inner = [body[1:-1] if body.startswith(b"[") else body for body in bodies]
    return b"[" + b",".join(part for part in inner if part) + b"]"


def loads_parts(
    bodies: Sequence[tuple[bytes, int, int, str, str]], where: Callable[[str], str]
) -> list[dict[str, Any]]:
    """The entries in the bodies of parts, checked: ``(body, first, last, kind, key)``.

    An entry object's (kind ``e``) body is one entry, a segment's (``s``) a JSON array of them;
    each must hold the seqs its key names, in order. ``where(key)`` names an object in errors.
    """
    entries: list[dict[str, Any]] = []
    for body, first, last, kind, key in bodies:
        value = loads(body, where(key))
        held = value if kind == "s" else [value]
        if not isinstance(held, list) or len(held) != last - first + 1:
            raise CorruptStateError(
                f"{where(key)} does not hold the entries {first} to {last} its key names: "
                "the object was damaged or not written by S3Store"
            )
        for seq, entry in enumerate(held, first):
            if not isinstance(entry, dict) or entry.get("seq") != seq:
                got = entry.get("seq") if isinstance(entry, dict) else type(entry).__name__
                raise CorruptStateError(
                    f"{where(key)} holds {got!r} where history entry {seq} belongs: the object "
                    "was damaged or not written by S3Store"
                )
        entries.extend(held)
    return entries
