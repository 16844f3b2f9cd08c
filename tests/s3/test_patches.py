"""The snapshot changes entries committed alone carry (``alpineagents_s3._patches``), no server.

For any two JSON dicts, the change between them turns the first into the second, is ASCII
without a space (a header value S3 keeps as sent), and leaves the first unchanged; one too
large is not made; a damaged one names the object.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from alpineagents_s3 import CorruptStateError
from alpineagents_s3._patches import NO_CHANGE, PATCH_LIMIT, apply, decode, diff

# Keys and texts with what a header or JSON could mangle: quotes, backslashes, runs of spaces,
# control characters, non-BMP characters, the separators of the change itself.
TEXT = st.text(
    alphabet=st.sampled_from(
        [
            "a",
            "b",
            " ",
            '"',
            "\\",
            "\n",
            "\t",
            "\x00",
            "é",
            "\U0001f600",
            "-",
            "s",
            "d",
            "[",
            "{",
            ":",
            ",",
            "\u2028",
        ]
    ),
    max_size=8,
)
LEAF = (
    st.none()
    | st.booleans()
    | st.integers(-(10**20), 10**20)
    | TEXT
    | st.floats(allow_nan=False, allow_infinity=False)
)
JSON = st.recursive(
    LEAF,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)
SNAPSHOT = st.dictionaries(TEXT, JSON, max_size=5)


def as_stored(value: Any) -> Any:
    return json.loads(json.dumps(value))


def canonical(value: Any) -> str:
    """JSON with sorted keys: equal only if the same once stored (``True`` is not ``1``)."""
    return json.dumps(value, sort_keys=True)


@settings(max_examples=300, deadline=None)
@given(SNAPSHOT, SNAPSHOT)
def test_a_change_turns_one_snapshot_into_the_other(before: dict[str, Any], after: Any) -> None:
    before, after = as_stored(before), as_stored(after)
    kept = copy.deepcopy(before)
    change = diff(before, after)
    if change is None:  # only a change that would not fit is refused
        assert len(json.dumps(after, ensure_ascii=True)) > PATCH_LIMIT // 4
        return
    assert change.isascii() and " " not in change and change == change.strip()
    assert canonical(apply(before, change, "e")) == canonical(after)
    assert before == kept  # the stored snapshot is never changed in place


@settings(max_examples=100, deadline=None)
@given(SNAPSHOT)
def test_no_change_is_a_dash(snapshot: dict[str, Any]) -> None:
    snapshot = as_stored(snapshot)
    assert diff(snapshot, copy.deepcopy(snapshot)) == NO_CHANGE
    assert apply(snapshot, NO_CHANGE, "e") is snapshot


def test_a_value_that_only_python_calls_equal_is_a_change() -> None:
    for before, after in [(1, True), (1, 1.0), (0, False), ({"a": 1}, {"a": True})]:
        change = diff({"k": before}, {"k": after})
        assert change not in (None, NO_CHANGE)
        assert canonical(apply({"k": before}, change, "e")) == canonical({"k": after})


def test_a_nested_change_names_its_path_and_sends_only_what_changed() -> None:
    big = "x" * 1000
    before = {"data": {"big": big, "n": 1, "gone": 2}, "entries": 3}
    after = {"data": {"big": big, "n": 2}, "entries": 4}
    change = diff(before, after)
    assert change is not None and big not in change
    assert json.loads(change) == {
        "s": [[["data", "n"], 2], [["entries"], 4]],
        "d": [["data", "gone"]],
    }
    assert apply(before, change, "e") == after


def test_a_change_too_large_for_the_metadata_is_not_made() -> None:
    assert diff({}, {"k": "x" * PATCH_LIMIT}) is None
    assert diff({}, {"k": "x" * (PATCH_LIMIT - 20)}) is not None


@pytest.mark.parametrize(
    "damaged",
    ["{", "[]", '{"s":{}}', '{"s":[[[], 1]]}', '{"s":[[["a"]]]}', '{"d":[[1]]}', '{"x":[]}'],
)
def test_a_damaged_change_names_the_object(damaged: str) -> None:
    with pytest.raises(CorruptStateError, match="s3://b/k"):
        decode(damaged, "s3://b/k")


def test_a_change_through_a_value_that_is_not_a_dict_replaces_it_and_a_load_never_fails() -> None:
    """Another writer's save of data alone may have replaced what a change goes through."""
    change = json.dumps({"s": [[["data", "n"], 1]], "d": [["data", "cfg", "x"], ["gone", "y"]]})
    before = {"data": [1], "gone": 5}
    assert apply(before, change, "s3://b/k") == {"data": {"n": 1}, "gone": 5}
    assert before == {"data": [1], "gone": 5}
