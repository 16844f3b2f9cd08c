"""The table of damaged fields: one saved State, and the fields that damage it one at a time.

Each case of ``CASES`` damages one field of :func:`saved_state`, saved by any store, and names
the words of the ``CorruptStateError`` its load must raise. Used by test_corrupt_load.py (a
FileStore's files), test_transfer.py (an export) and tests/s3/test_damaged_objects.py (S3
objects).
"""

from __future__ import annotations

import json
from typing import Any, Final

from alpineagents import State
from alpineagents.history import (
    COMPACTION,
    MODEL,
    NOTICE,
    TOOL_RESULT,
    CompactionData,
    ModelData,
    NoticeData,
    ToolResultData,
)

ID: Final = "damaged"
DELETE: Final = object()  # as a case's value: remove the field


def saved_state() -> State:
    """A State with an entry of every kind: task, user, model, tool_result, compaction, notice."""
    state = State("the task", id=ID, data={"k": [1, 2]})
    state.add_user_message("hello")  # 1
    content: list[dict[str, Any]] = [
        {"type": "text", "text": "let me look"},
        {"type": "tool_call", "id": "c1", "name": "lookup", "input": {"q": "x"}},
    ]
    state.append(  # 2
        MODEL, "let me look", ModelData(content, "tool_use", {"input_tokens": 12}, "m").to_data()
    )
    state.append(TOOL_RESULT, "found", ToolResultData("c1", "lookup").to_data())  # 3
    state.append(COMPACTION, "summary", CompactionData(3, {"input_tokens": 1}, "m").to_data())
    state.append(NOTICE, "a notice", NoticeData((4, 5)).to_data())  # 5
    state._stop("reply", "done")
    return state


# (what: "snapshot" or an entry's seq, path into that object, the new value, the message)
Case = tuple[str | int, tuple[str | int, ...], Any, str]

CASES: Final[list[Case]] = [
    # The snapshot.
    ("snapshot", ("created_at",), "yesterday", r"snapshot: created_at must be an ISO 8601 time"),
    ("snapshot", ("created_at",), 1700000000, r"snapshot: created_at must be .* not 1700000000"),
    ("snapshot", ("updated_at",), "2026-01-01T00:00:00", r"snapshot: updated_at .* a timezone"),
    ("snapshot", ("task",), 5, r"snapshot: task must be a str, not 5 \(int\)"),
    ("snapshot", ("task",), ["t"], r"snapshot: task must be a str, not \['t'\] \(list\)"),
    ("snapshot", ("data",), [1, 2], r"snapshot: data must be a dict, not \[1, 2\] \(list\)"),
    ("snapshot", ("data",), "k", r"snapshot: data must be a dict, not 'k' \(str\)"),
    ("snapshot", ("agent",), "claude", r"snapshot: agent must be null or a dict, not 'claude'"),
    ("snapshot", ("agent",), {"tools": ["a"]}, r"snapshot: agent\['tools'\] must be a dict"),
    ("snapshot", ("agent",), {"model": 5}, r"snapshot: agent\['model'\] must be null or a str"),
    ("snapshot", ("stopped_by",), "crashed", r"snapshot: stopped_by must be null or one of"),
    ("snapshot", ("stopped_by",), 1, r"snapshot: stopped_by must be .*, not 1 \(int\)"),
    ("snapshot", ("stop_seq",), "6", r"snapshot: stop_seq must be null or a count"),
    ("snapshot", ("stop_seq",), 99, r"snapshot: stop_seq must be at most the 6 entries"),
    ("snapshot", ("entries",), True, r"snapshot: entries must be a count .*, not True"),
    ("snapshot", ("entries",), 9, r"snapshot: accounts for 9 history entries, but .* 6 in a row"),
    ("snapshot", ("id",), "other", r"snapshot: belongs to State 'other'"),
    ("snapshot", ("created_at",), DELETE, r"snapshot: created_at is missing"),
    # Any entry.
    (1, ("at",), "soon", r"history entry 1 \(user\): at must be an ISO 8601 time"),
    (1, ("at",), 17, r"history entry 1 \(user\): at must be .*, not 17 \(int\)"),
    (1, ("kind",), 5, r"history entry 1: kind must be a kind such as .*, not 5 \(int\)"),
    (1, ("kind",), "", r"history entry 1: kind must be a kind such as .*, not ''"),
    (1, ("text",), None, r"history entry 1 \(user\): text must be a str, not null"),
    (1, ("data",), [], r"history entry 1 \(user\): data must be a dict, not \[\] \(list\)"),
    (1, ("seq",), "1", r"entry read at position 1: seq must be an int >= 0, not '1' \(str\)"),
    (2, ("seq",), 1, r"history entry 1: stored twice"),
    (2, ("seq",), 8, r"accounts for 6 history entries, but the store has 2 in a row"),
    (0, ("kind",), "user", r"history entry 0: kind must be 'task', not 'user'"),
    # A user message, a tool result.
    (1, ("data", "answers"), 5, r"\(user\): data\['answers'\] must be null or a str, not 5"),
    (3, ("data", "call_id"), DELETE, r"entry 3 \(tool_result\): data\['call_id'\] is missing"),
    (3, ("data", "call_id"), 7, r"entry 3 \(tool_result\): data\['call_id'\] must be a call id"),
    (3, ("data", "call_id"), "", r"data\['call_id'\] must be a call id .*, not ''"),
    (3, ("data", "is_error"), "yes", r"data\['is_error'\] must be null or a bool, not 'yes'"),
    (3, ("data", "name"), ["lookup"], r"data\['name'\] must be null or a str"),
    # A model response and its content blocks.
    (2, ("data", "content"), "hi", r"entry 2 \(model\): data\['content'\] must be a list"),
    (2, ("data", "content", 0), "hi", r"data\['content'\]\[0\] must be a content block"),
    (2, ("data", "content", 0, "text"), DELETE, r"\['content'\]\[0\]\['text'\] must be a str"),
    (2, ("data", "content", 0, "text"), 3, r"\['content'\]\[0\]\['text'\] must be a str, not 3"),
    (2, ("data", "content", 0, "type"), 5, r"\['content'\]\[0\]\['type'\] must be a content"),
    (2, ("data", "content", 0, "type"), DELETE, r"\[0\]\['type'\] must be .*, not null"),
    (2, ("data", "content", 0, "type"), "Text!", r"\[0\]\['type'\] must be a content block"),
    (2, ("data", "content", 1, "type"), "tool_use", r"\[1\]\['type'\] must be .* 'tool_use'"),
    (2, ("data", "content", 1, "id"), DELETE, r"data\['content'\]\[1\]\['id'\] must be the"),
    (2, ("data", "content", 1, "name"), 5, r"data\['content'\]\[1\]\['name'\] must be the"),
    (2, ("data", "content", 1, "input"), ["x"], r"\[1\]\['input'\] must be a dict"),
    (2, ("data", "stop_reason"), 5, r"data\['stop_reason'\] must be null or a str"),
    (2, ("data", "usage"), [12], r"data\['usage'\] must be a dict of token counts"),
    (2, ("data", "usage", "input_tokens"), "12", r"data\['usage'\]\['input_tokens'\] must be"),
    (2, ("data", "model"), {"name": "m"}, r"\(model\): data\['model'\] must be null or a str"),
    # A compaction, a notice.
    (4, ("data", "covers"), "3", r"entry 4 \(compaction\): data\['covers'\] must be the seq"),
    (4, ("data", "covers"), 4, r"data\['covers'\] must be the seq of an earlier entry .*, not 4"),
    (5, ("data", "skipped"), [5, 2], r"entry 5 \(notice\): data\['skipped'\] must be null or"),
    (5, ("data", "skipped"), "4-5", r"data\['skipped'\] must be null or \[start, end\]"),
]


def case_id(case: Case) -> str:
    what, path, value, _ = case
    shown = "deleted" if value is DELETE else json.dumps(value)
    return f"{what}:{'.'.join(map(str, path))}={shown}"


def damage(obj: dict[str, Any], path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    """``obj`` (a stored entry or snapshot) with the field at ``path`` set or deleted."""
    obj = json.loads(json.dumps(obj))
    holder: Any = obj
    for key in path[:-1]:
        holder = holder[key]
    if value is DELETE:
        del holder[path[-1]]
    else:
        holder[path[-1]] = value
    return obj
