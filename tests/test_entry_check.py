"""The check of a stored entry at load: the usual shapes are checked by type tests alone,
every other entry by the full check, field by field, and the two never disagree (on any field
of any kind, swapped for values of every JSON type)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from alpineagents import CorruptStateError, FileStore
from alpineagents import _serialize as serialize_module
from alpineagents._serialize import entry_from_dict
from alpineagents.errors import SchemaVersionError
from alpineagents.history import MODEL
from tests.helpers import agent_state, stored_lines


@pytest.mark.parametrize("compact", [True, False])
def test_an_agents_entries_load_without_the_full_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compact: bool
) -> None:
    # What a run saves (its task, replies with tool calls, results, the person's message) is
    # all of the usual shape, with model entries of either form: none is checked one field at
    # a time.
    monkeypatch.setattr(serialize_module, "_WRITE_COMPACT", compact)
    store = FileStore(tmp_path)
    state = agent_state(store, steps=5)
    state.add_user_message("thanks")
    store.save(state)
    full: list[Any] = []
    monkeypatch.setattr(serialize_module, "_checked_entry", lambda *args: full.append(args))
    loaded = FileStore(tmp_path).load("run")
    assert full == [] and loaded.history == state.history
    assert {e.kind for e in loaded.history} == {"task", "model", "tool_result", "user"}
    versions = {line["v"] for line in stored_lines(store, "run") if line["kind"] == MODEL}
    assert versions == ({2} if compact else {1})


AT = "2026-03-01T12:00:00.000001+00:00"


# Entries of every shape the quick check takes, and of shapes it leaves to the full check.
BASES: list[dict[str, Any]] = [
    {"v": 1, "seq": 3, "kind": "task", "text": "t", "at": AT, "data": {}},
    {"v": 1, "seq": 3, "kind": "user", "text": "hi", "at": AT, "data": {"answers": "c1"}},
    {"v": 1, "seq": 3, "kind": "user", "text": "hi", "at": AT, "data": {}},
    {"v": 1, "seq": 3, "kind": "tool_result", "text": "rows", "at": AT,
     "data": {"call_id": "c1", "name": "q", "is_error": False, "unknown": True}},
    {"v": 1, "seq": 3, "kind": "model", "text": "ab", "at": AT,
     "data": {"content": [{"type": "text", "text": "a"},
                          {"type": "tool_call", "id": "c1", "name": "q", "input": {"q": 1}},
                          {"type": "thinking", "thinking": "hm"},
                          {"type": "text", "text": "b"}],
              "stop_reason": "tool_use", "usage": {"input_tokens": 5}, "model": "m"}},
    {"v": 2, "seq": 3, "kind": "model", "at": AT,
     "data": {"content": [{"type": "text", "text": "a"}], "stop_reason": None}},
    {"v": 1, "seq": 3, "kind": "model", "text": "", "at": AT, "data": {}},
    {"v": 1, "seq": 3, "kind": "compaction", "text": "sum", "at": AT,
     "data": {"covers": 1, "usage": {}, "model": None}},
    {"v": 1, "seq": 3, "kind": "notice", "text": "n", "at": AT, "data": {"skipped": [1, 2]}},
    {"v": 1, "seq": 3, "kind": "newer_kind", "text": "n", "at": AT, "data": {"x": 1}},
]  # fmt: skip


MISSING = object()


VALUES: list[Any] = [
    MISSING, None, True, False, 0, 1, 2, 3, -1, 1.5, 10**30, "", "x", "caf\u00e9", "\ud800",
    "text", "tool_call", "tool_use", "model", "user", "Not A Kind", [], ["x"], [1, 2], {},
    {"a": 1}, {"type": "text", "text": "x"}, "2026-01-01T00:00:00", AT, "yesterday",
]  # fmt: skip


def paths_of(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key and index path into ``value``, the value itself first."""
    paths = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            paths += paths_of(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            paths += paths_of(item, (*path, index))
    return paths


def mutants(base: dict[str, Any]) -> list[dict[str, Any]]:
    """``base`` with one value swapped (or removed) at each path, for each of ``VALUES``."""
    made = []
    targets = [p for p in paths_of(base) if p]
    targets += [(key,) for key in ("text", "v", "extra") if key not in base]
    targets += [("data", key) for key in ("content", "usage", "call_id", "answers", "model")]
    for path in targets:
        for value in VALUES:
            mutant = copy.deepcopy(base)
            parent = mutant
            for step in path[:-1]:
                parent = parent[step]
            if isinstance(parent, list):
                if value is MISSING:
                    del parent[path[-1]]
                else:
                    parent[path[-1]] = value
            elif value is MISSING:
                parent.pop(path[-1], None)
            else:
                parent[path[-1]] = value
            made.append(mutant)
    made += [copy.deepcopy(base) for base in BASES] + [[], "x", None]  # type: ignore[list-item]
    return made


def outcome(check: Any, raw: Any) -> Any:
    try:
        return check(raw, "State 's'", 7)
    except Exception as e:  # noqa: BLE001 (whatever either raises, the other must too)
        return (type(e), str(e))


def test_the_quick_check_of_an_entry_agrees_with_the_full_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    full = serialize_module._checked_entry
    quick = 0
    for base in BASES:
        for raw in mutants(base):
            got, expected = outcome(entry_from_dict, raw), outcome(full, raw)
            assert got == expected, raw
            if isinstance(got, tuple):
                assert issubclass(got[0], CorruptStateError | SchemaVersionError), raw
    # Not vacuous: the usual shapes (and a good share of the mutants) never reach the full check.
    monkeypatch.setattr(serialize_module, "_checked_entry", None)
    for base in BASES[:7]:
        assert entry_from_dict(copy.deepcopy(base), "State 's'", 7).seq == 3
    for base in BASES:
        for raw in mutants(base):
            if outcome(entry_from_dict, raw) == outcome(full, raw):
                quick += 1
    print(f"{quick} of the mutants took the quick check")
    assert quick > 1000


def test_an_entry_of_the_usual_shape_with_another_text_takes_the_full_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Non-ASCII text (it may hold a lone surrogate) and a time without a zone go the long way.
    calls: list[Any] = []
    full = serialize_module._checked_entry

    def counted(raw: Any, owner: str, position: int) -> Any:
        calls.append(raw)
        return full(raw, owner, position)

    monkeypatch.setattr(serialize_module, "_checked_entry", counted)
    base = BASES[3]
    assert entry_from_dict({**base, "text": "caf\u00e9"}, "State 's'", 7).text == "caf\u00e9"
    with pytest.raises(CorruptStateError, match=r"history entry 3 \(tool_result\): .*surrogate"):
        entry_from_dict({**base, "text": "\ud800"}, "State 's'", 7)
    with pytest.raises(CorruptStateError, match=r"at must be an ISO 8601 time with a timezone"):
        entry_from_dict({**base, "at": "2026-01-01T00:00:00"}, "State 's'", 7)
    assert len(calls) == 3
