"""State, HistoryEntry and the serialiser: ids, JSON rules, and what changes after loading."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from alpineagents import (
    Agent,
    CorruptStateError,
    FileStore,
    HistoryEntry,
    SchemaVersionError,
    State,
    _saving,
)
from alpineagents._serialize import SCHEMA_VERSION, check_json, entry_to_dict, snapshot_of
from alpineagents.state import MODEL, TOOL_RESULT, USER
from alpineagents.testing import call
from tests.helpers import script


@pytest.fixture
def store(tmp_path: Path) -> FileStore:
    return FileStore(tmp_path / "runs")


# Ids ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("good", ["a", "review-pr-42", "A_b-9", "x" * 128, "0", "-", "_"])
def test_valid_ids(good: str) -> None:
    assert State("t", id=good).id == good


@pytest.mark.parametrize(
    "bad", ["", "x" * 129, "a b", "a/b", "../x", "a.b", "é", "a\n", "日本", "a:b", "a*"]
)
def test_invalid_ids_are_refused_at_once(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid State id"):
        State("t", id=bad)


def test_id_must_be_a_string() -> None:
    with pytest.raises(ValueError, match="invalid State id 42"):
        State("t", id=42)  # type: ignore[arg-type]


def test_random_ids_are_valid_and_distinct() -> None:
    ids = {State("t").id for _ in range(100)}
    assert len(ids) == 100
    for state_id in ids:
        assert State("t", id=state_id).id == state_id


def test_task_must_be_text() -> None:
    with pytest.raises(TypeError, match="task must be a str"):
        State(["not", "text"])  # type: ignore[arg-type]


def test_new_state_starts_with_its_task() -> None:
    state = State("Review pull request 42", id="review-pr-42")
    assert [(e.seq, e.kind, e.text) for e in state.history] == [
        (0, "task", "Review pull request 42")
    ]
    assert state.stopped_by is None and state.answer is None and state.data == {}


# JSON rules for state.data -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "path"),
    [
        ({"a": [1, 2, {1, 2}]}, "state.data['a'][2] is a set"),
        ({"a": {"b": object()}}, "state.data['a']['b'] is a object"),
        ({"when": __import__("datetime").date(2026, 1, 1)}, "state.data['when'] is a date"),
        ({"a": {3: "x"}}, "state.data['a'] has the key 3 (int)"),
        ({"n": float("nan")}, "state.data['n'] is nan"),
        ({"b": b"bytes"}, "state.data['b'] is a bytes"),
    ],
)
def test_non_json_data_is_a_type_error_naming_the_path(
    store: FileStore, data: dict[str, object], path: str
) -> None:
    state = State("t", data=data)
    with pytest.raises(TypeError) as caught:
        store.save(state)
    assert path in str(caught.value)
    assert store.read(state.id) is None  # nothing was written


def test_bad_data_later_keeps_what_was_saved(store: FileStore) -> None:
    state = State("t", data={"ok": 1})
    store.save(state)
    state.add_user_message("next")
    state.data["bad"] = {1, 2}
    with pytest.raises(TypeError, match=r"state\.data\['bad'\]"):
        store.save(state)
    loaded = store.load(state.id)
    assert loaded.data == {"ok": 1} and len(loaded.history) == 1
    # Fixing the data saves everything that was waiting, the message included.
    state.data["bad"] = [1, 2]
    assert store.save(state) is True
    assert [e.text for e in store.load(state.id).history] == ["t", "next"]


def test_check_json_converts_tuples_and_keeps_values() -> None:
    value = {"t": (1, (2, 3)), "s": "x", "f": 1.5, "b": True, "n": None, "l": [{"k": []}]}
    assert check_json(value, "v") == {
        "t": [1, [2, 3]],
        "s": "x",
        "f": 1.5,
        "b": True,
        "n": None,
        "l": [{"k": []}],
    }


# What changes after loading ---------------------------------------------------------------


class Report(BaseModel):
    title: str
    score: float


@dataclasses.dataclass
class Point:
    x: int
    y: tuple[int, int]


def test_after_loading_table(store: FileStore) -> None:
    state = State("t", id="table", data={"pair": (1, 2), "nested": {"l": [(3,)]}})
    failure = ValueError("bad input")
    state.append(
        TOOL_RESULT, "ValueError: bad input", {"call_id": "c1", "is_error": True}, error=failure
    )
    state.answer = Report(title="x", score=0.5)
    store.save(state)
    loaded = store.load("table")
    # state.data: tuples come back as lists.
    assert loaded.data == {"pair": [1, 2], "nested": {"l": [[3]]}}
    # finish answers: pydantic models come back as dicts.
    assert loaded.answer == {"title": "x", "score": 0.5}
    # HistoryEntry.error is None; the text keeps the type and message.
    assert state.history[1].error is failure
    assert loaded.history[1].error is None
    assert loaded.history[1].text == "ValueError: bad input"
    # Dataclasses come back as dicts too.
    state.answer = Point(1, (2, 3))
    store.save(state)
    assert store.load("table").answer == {"x": 1, "y": [2, 3]}


def test_non_json_answer_is_a_type_error(store: FileStore) -> None:
    state = State("t")
    state.answer = {"at": object()}
    with pytest.raises(TypeError, match=r"state\.answer\['at'\]"):
        store.save(state)


def test_entries_are_plain_json_of_our_own() -> None:
    entry = HistoryEntry(3, USER, "hi", {})
    raw = entry_to_dict(entry)
    assert json.loads(json.dumps(raw)) == raw
    assert set(raw) == {"v", "seq", "kind", "text", "at", "data"}
    # A model entry keeps its text field (version 1, which alpineagents 0.4.0 reads too: a
    # process of the version before resumes what this one saved, as in a rolling deploy).
    content = {"content": [{"type": "text", "text": "hi"}]}
    model = entry_to_dict(HistoryEntry(3, MODEL, "hi", content))
    assert set(model) == {"v", "seq", "kind", "text", "at", "data"} and model["v"] == 1


def test_compact_model_entries_are_read_not_yet_written(monkeypatch: pytest.MonkeyPatch) -> None:
    from alpineagents import _serialize

    content = {"content": [{"type": "text", "text": "hi"}]}
    monkeypatch.setattr(_serialize, "_WRITE_COMPACT", True)
    compact = entry_to_dict(HistoryEntry(3, MODEL, "hi", content))
    assert set(compact) == {"v", "seq", "kind", "at", "data"} and compact["v"] == 2
    assert entry_to_dict(HistoryEntry(3, MODEL, "other", content))["text"] == "other"
    assert _serialize.entry_from_dict(compact, "State 's'", 0).text == "hi"


# Incremental saves -------------------------------------------------------------------------


class CountingStore(FileStore):
    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.writes: list[tuple[list[int], bool, bool]] = []

    def write(self, state_id, entries, snapshot, *, create=False):  # type: ignore[no-untyped-def]
        self.writes.append(([e["seq"] for e in entries], snapshot is not None, create))
        super().write(state_id, entries, snapshot, create=create)


def test_a_save_writes_only_what_the_store_lacks(tmp_path: Path) -> None:
    store = CountingStore(tmp_path)
    state = State("t")
    assert store.save(state) is True
    assert store.save(state) is False  # nothing changed: nothing written
    state.add_user_message("a")
    state.add_user_message("b")
    store.save(state)
    state.data["k"] = 1  # a change outside history: the snapshot alone
    store.save(state)
    state.append(TOOL_RESULT, "r", {"call_id": "c"})
    _saving.save(store, state, entries_only=True)  # a tool result, saved alone
    assert store.writes == [
        ([0], True, True),
        ([1, 2], True, False),
        ([], True, False),
        ([3], False, False),
    ]


def test_a_failed_write_is_sent_again(tmp_path: Path) -> None:
    store = CountingStore(tmp_path)
    state = State("t")
    store.save(state)
    state.add_user_message("a")
    original = FileStore.write

    def failing(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        raise OSError(28, "No space left on device")

    FileStore.write = failing  # type: ignore[method-assign]
    try:
        with pytest.raises(OSError, match="No space left"):
            store.save(state)
    finally:
        FileStore.write = original  # type: ignore[method-assign]
    assert state.history[-1].text == "a"  # nothing is lost from the State
    store.save(state)
    assert store.writes[-1] == ([1], True, False)
    assert [e.text for e in store.load(state.id).history] == ["t", "a"]


# Refusing what cannot be read -------------------------------------------------------------


def _rewrite_snapshot(store: FileStore, state_id: str, **changes: object) -> None:
    path = store.path / state_id / "snapshot.json"
    snapshot = json.loads(path.read_text())
    snapshot.update(changes)
    path.write_text(json.dumps(snapshot))


def test_snapshot_from_a_newer_schema_is_refused(store: FileStore) -> None:
    store.save(State("t", id="future"))
    _rewrite_snapshot(store, "future", v=SCHEMA_VERSION + 1)
    newer = rf"schema version {SCHEMA_VERSION + 1}.*upgrade alpineagents"
    with pytest.raises(SchemaVersionError, match=newer):
        store.load("future")


def test_foreign_snapshot_is_refused(store: FileStore) -> None:
    store.save(State("t", id="mine"))
    (store.path / "mine" / "snapshot.json").write_text('{"hello": "world"}')
    with pytest.raises(CorruptStateError, match="no schema version"):
        store.load("mine")


def test_snapshot_of_another_state_is_refused(store: FileStore) -> None:
    store.save(State("t", id="mine"))
    _rewrite_snapshot(store, "mine", id="theirs")
    with pytest.raises(CorruptStateError, match="belongs to State 'theirs'"):
        store.load("mine")


def test_snapshot_naming_missing_entries_is_refused(store: FileStore) -> None:
    store.save(State("t", id="mine"))
    _rewrite_snapshot(store, "mine", entries=5)
    with pytest.raises(CorruptStateError, match="accounts for 5 history entries"):
        store.load("mine")


def test_snapshot_is_small_and_does_not_grow_with_history() -> None:
    state = State("t", data={"k": "v"})
    small = len(json.dumps(snapshot_of(state)))
    for n in range(1000):
        state.append(TOOL_RESULT, f"result {n} " * 20, {"call_id": f"c{n}"})
    assert len(json.dumps(snapshot_of(state))) <= small + 3  # only the count grows


class Item(BaseModel):
    name: str
    when: dt.date


@dataclasses.dataclass
class Trip:
    start: dt.date
    stops: list[Item]


@pytest.mark.parametrize(
    ("output_type", "raw", "saved"),
    [
        (list[Item], [{"name": "a", "when": "2026-12-12"}], [{"name": "a", "when": "2026-12-12"}]),
        (dt.date, "2026-12-12", "2026-12-12"),
        (
            Trip,
            {"start": "2026-12-01", "stops": [{"name": "b", "when": "2026-12-02"}]},
            {"start": "2026-12-01", "stops": [{"name": "b", "when": "2026-12-02"}]},
        ),
    ],
)
def test_an_accepted_typed_answer_is_always_saved(
    tmp_path: Path, output_type: Any, raw: Any, saved: Any
) -> None:
    store = FileStore(tmp_path)
    state = State("t", id="typed")
    answer = Agent(script([call("finish", answer=raw)]), output_type=output_type, store=store).run(
        state
    )
    assert not isinstance(answer, dict | str) or output_type is dt.date
    assert store.load("typed").answer == saved
    assert Agent(script(), output_type=output_type, store=store).run(state) == answer


@pytest.mark.parametrize(
    ("kind", "data", "words"),
    [
        (TOOL_RESULT, {}, r"history entry 1 \(tool_result\): data\['call_id'\] is missing"),
        (TOOL_RESULT, {"call_id": 5}, r"data\['call_id'\] must be a call id"),
        (MODEL, {"content": [{"type": 3}]}, r"history entry 1 \(model\): data\['content'\]\[0\]"),
        (MODEL, {"content": "hi"}, r"data\['content'\] must be a list of content blocks"),
    ],
)
def test_append_refuses_data_a_load_would_refuse(
    store: FileStore, kind: str, data: dict[str, object], words: str
) -> None:
    state = State("t", id="shapes")
    with pytest.raises(ValueError, match=words):
        state.append(kind, "x", data)  # type: ignore[arg-type]
    assert len(state.history) == 1  # nothing was added
    store.save(state)
    assert [e.kind for e in store.load("shapes").history] == ["task"]


def test_a_model_response_of_no_kept_shape_is_refused_naming_the_model(store: FileStore) -> None:
    from alpineagents import Agent
    from alpineagents.testing import FunctionModel

    def look(q: str) -> str:
        """Look something up."""
        raise AssertionError("a call with an empty id must not run")

    bad = [{"type": "tool_call", "id": "", "name": "look", "input": {"q": "x"}}]
    agent = Agent(FunctionModel(lambda request: bad, name="homemade"), tools=[look], store=store)
    state = State("t", id="shapeless")
    with pytest.raises(ValueError, match=r"State 'shapeless': the response of the model "
                       r"'homemade' cannot be kept: history entry 1 \(model\): "):  # fmt: skip
        agent.run(state)
    assert [e.kind for e in state.history] == ["task"]
    assert [e.kind for e in store.load("shapeless").history] == ["task"]
