"""What a State may keep: JSON that every store can write and read back.

:func:`check_text` refuses text UTF-8 cannot encode; :func:`check_json` refuses any value that
is not plain JSON, naming the path to it. Both raise :class:`NotJSONError` (a ``TypeError``).
"""

from __future__ import annotations

import math
import sys
from functools import cache
from typing import Any, Final

from alpineagents.errors import NotJSONError

__all__ = ["MAX_DEPTH", "check_json", "check_text"]

# Deeper values are refused: Python's own json reader (and others, such as serde_json at 128)
# stop at some depth, and a State must load wherever it was saved.
MAX_DEPTH: Final = 100
# Ints below 2**2000 (603 digits) are shorter than any digit limit Python allows (640 at least).
_SMALL_INT_BITS: Final = 2000


def check_text(text: str, path: str) -> str:
    r"""Return ``text`` if UTF-8 can encode it, else raise :class:`NotJSONError`.

    A lone surrogate (``b"caf\xe9".decode(errors="surrogateescape")``) is the one thing a
    Python str can hold that no store can write. ``path`` names the text in the message.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise NotJSONError(
            f"{path} holds a lone surrogate {e.object[e.start : e.end]!r} at index {e.start}, "
            "which UTF-8 cannot encode (decode bytes with errors='replace', not "
            "'surrogateescape')"
        ) from None
    return text


def check_json(value: Any, path: str, depth: int = 0) -> Any:
    """Return ``value`` as plain JSON (tuples become lists), or raise :class:`NotJSONError`.

    Refused, with the path to the value (``path`` names the value itself, e.g.
    ``state.data``): types JSON has not, non-string keys, NaN and infinity, text with a lone
    surrogate, ints of more digits than Python reads back (``sys.get_int_max_str_digits``),
    nesting deeper than :data:`MAX_DEPTH`, and a container that holds itself. ``depth`` is how
    many containers down ``value`` will sit in what is saved (a tool call's input sits inside
    the model's response entry), so that it passes here only if it will pass there.
    """
    return _checked(value, path, depth, set())


def _checked(value: Any, path: str, depth: int, within: set[int]) -> Any:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return check_text(value, path)
    if isinstance(value, int):
        if value.bit_length() > _SMALL_INT_BITS and abs(value) >= _digit_bound():
            raise NotJSONError(
                f"{path} is an int of more than {_max_digits()} digits, more than Python "
                "reads back from JSON (sys.get_int_max_str_digits)"
            )
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise NotJSONError(f"{path} is {value!r}, which JSON cannot hold")
        return value
    if not isinstance(value, dict | list | tuple):
        raise NotJSONError(
            f"{path} is a {type(value).__name__}, not a JSON value: a State keeps only dicts "
            "with string keys, lists, strings, numbers, booleans and None"
        )
    if id(value) in within:
        raise NotJSONError(f"{path} contains itself, which JSON cannot hold")
    if depth >= MAX_DEPTH:
        raise NotJSONError(
            f"{_short_path(path)} is nested more than {MAX_DEPTH} levels deep, deeper than a "
            "State may hold"
        )
    within.add(id(value))
    try:
        if isinstance(value, dict):
            out: dict[str, Any] = {}
            for key, item in value.items():
                if not isinstance(key, str):
                    raise NotJSONError(
                        f"{path} has the key {key!r} ({type(key).__name__}): "
                        "JSON object keys must be strings"
                    )
                check_text(key, f"a key of {path}")
                out[key] = _checked(item, f"{path}[{key!r}]", depth + 1, within)
            return out
        return [_checked(item, f"{path}[{i}]", depth + 1, within) for i, item in enumerate(value)]
    finally:
        within.discard(id(value))


def _max_digits() -> int:
    # The lower of this process's limit and Python's default: the process that loads the
    # State may not have raised its own.
    default = sys.int_info.default_max_str_digits
    current = sys.get_int_max_str_digits()
    return min(default, current) if current else default


def _digit_bound() -> int:
    return _power_of_ten(_max_digits())


@cache
def _power_of_ten(digits: int) -> int:
    power: int = 10**digits
    return power


def _short_path(path: str, limit: int = 120) -> str:
    return path if len(path) <= limit else f"{path[:60]}…{path[-50:]}"
