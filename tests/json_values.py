"""What the property tests share: the rules of a State id and of JSON text, as the user guide
states them, and how the tests compare States and values.

Each property module draws its own values (its strategies differ on purpose: the FileStore
module draws more kinds of Python value than the one that also runs on S3Store); the rules
they are judged by are these.
"""

from __future__ import annotations

import json
import math
import re
import sys
from typing import Any

from hypothesis import strategies as st

from alpineagents import State
from alpineagents.history import MAX_DEPTH

# A State id: letters, digits, ``_`` and ``-``, 1 to 128 characters.
ID_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,128}")
# Text a State may keep has no lone surrogate (UTF-8 cannot encode one).
SURROGATES = re.compile("[\ud800-\udfff]")
LONE_SURROGATES = st.sampled_from(["\ud800", "\udfff", "caf\udce9", "a\udc80b"])
MAX_DIGITS = min(sys.int_info.default_max_str_digits, sys.get_int_max_str_digits() or 10**9)
LARGEST: int = 10**MAX_DIGITS  # an int this big has too many digits for json.loads


def nested(levels: int, inner: Any) -> Any:
    """``inner`` inside ``levels`` lists."""
    for _ in range(levels):
        inner = [inner]
    return inner


def same(a: Any, b: Any) -> bool:
    """Equal as JSON values (tuples as lists), -0.0 and 0.0 apart (JSON keeps the sign)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def history_of(state: State) -> list[tuple[int, str, str, str]]:
    """A State's history as comparable tuples: seq, kind, text, data as JSON."""
    return [(e.seq, e.kind, e.text, json.dumps(e.data, sort_keys=True)) for e in state.history]


def fits(value: Any, depth: int = 0) -> bool:
    """Whether a State may keep ``value`` at ``depth`` containers down: the oracle."""
    if value is None or isinstance(value, bool):
        return True
    if isinstance(value, int):
        return abs(value) < LARGEST
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, str):
        return not SURROGATES.search(value)
    if not isinstance(value, dict | list | tuple):
        return False
    if depth >= MAX_DEPTH:
        return False
    if isinstance(value, dict):
        return all(isinstance(k, str) and fits(k) and fits(v, depth + 1) for k, v in value.items())
    return all(fits(item, depth + 1) for item in value)
