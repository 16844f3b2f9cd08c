"""History entries: the typed shape of each kind, and the JSON every store keeps.

The stored form: a model entry whose text is its text blocks can be kept once (schema version
2: read now, written by a later release; the tests marked ``compact_entries`` write it), and
entries of the form before (``text`` in every entry, version 1) load as they did.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from alpineagents import Agent, CorruptStateError, FileStore, HistoryEntry, State
from alpineagents._serialize import entry_from_dict, entry_to_dict
from alpineagents.history import (
    KINDS,
    MODEL,
    CompactionData,
    ModelData,
    NoticeData,
    ToolResultData,
    UserData,
)
from alpineagents.store import SCHEMA_VERSION
from alpineagents.testing import FunctionModel, call
from tests.helpers import REPLY, agent_state, stored_lines


def test_each_kind_has_a_shape_whose_data_is_the_stored_dict() -> None:
    assert KINDS == {"task", "user", "model", "tool_result", "compaction", "notice"}
    cases: list[tuple[Any, dict[str, Any]]] = [
        (UserData(), {}),
        (UserData("call_1"), {"answers": "call_1"}),
        (
            ModelData([{"type": "text", "text": "hi"}], "end_turn", {"input_tokens": 3}, "m"),
            {
                "content": [{"type": "text", "text": "hi"}],
                "stop_reason": "end_turn",
                "usage": {"input_tokens": 3},
                "model": "m",
            },
        ),
        (
            ToolResultData("c1", "search", True),
            {"call_id": "c1", "name": "search", "is_error": True},
        ),
        (
            ToolResultData("c1", "search", unknown=True),
            {"call_id": "c1", "name": "search", "is_error": False, "unknown": True},
        ),
        (CompactionData(4, {}, None), {"covers": 4, "usage": {}, "model": None}),
        (NoticeData(), {}),
        (NoticeData((2, 5)), {"skipped": [2, 5]}),
    ]
    for shape, data in cases:
        assert shape.to_data() == data
        # Key order too: the stored JSON stays byte for byte what it was.
        assert json.dumps(shape.to_data()) == json.dumps(data)
        assert type(shape).from_data(data) == shape


def test_entries_are_read_through_their_kind() -> None:
    state = State("t")
    state.append("model", "x", ModelData([call("search", q="a")], "tool_use").to_data())
    entry = state.history[1]
    assert entry.as_model().stop_reason == "tool_use"
    assert [c["name"] for c in entry.as_model().tool_calls] == ["search"]
    with pytest.raises(ValueError, match="history entry 1 is a 'model' entry, not 'user'"):
        entry.as_user()
    # Missing keys read as the shape's defaults (entries written by hand, older entries).
    assert HistoryEntry(3, "tool_result", "r", {"call_id": "c"}).as_tool_result() == (
        ToolResultData("c")
    )


def test_the_agent_stores_each_kind_as_before(tmp_path: Path) -> None:
    def decide(request: Any) -> Any:
        if len(request.messages) == 1:
            return [call("lookup", key="k")]
        if request.purpose == "compaction":
            return "summary"
        return [call("finish", answer="done")]

    def lookup(key: str) -> str:
        return key.upper()

    store = FileStore(tmp_path)
    state = State("task", id="kinds")
    agent = Agent(FunctionModel(decide, name="fm"), tools=[lookup], store=store)
    assert agent.run(state) == "done"
    lines = (tmp_path / "kinds" / "entries.jsonl").read_text().splitlines()
    stored = [json.loads(line) for line in lines]
    assert [(e["kind"], e["data"]) for e in stored] == [
        ("task", {}),
        (
            "model",
            {
                "content": [stored[1]["data"]["content"][0]],
                "stop_reason": "tool_use",
                "usage": {},
                "model": "fm",
            },
        ),
        (
            "tool_result",
            {"call_id": stored[1]["data"]["content"][0]["id"], "name": "lookup", "is_error": False},
        ),
        (
            "model",
            {
                "content": [stored[3]["data"]["content"][0]],
                "stop_reason": "tool_use",
                "usage": {},
                "model": "fm",
            },
        ),
        (
            "tool_result",
            {"call_id": stored[3]["data"]["content"][0]["id"], "name": "finish", "is_error": False},
        ),
    ]
    assert list(stored[0]) == ["v", "seq", "kind", "text", "at", "data"]


def test_unknown_entry_kinds_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown history entry kind 'note'"):
        State("t").append("note", "x")  # type: ignore[arg-type]  # the wrong kind under test


# The stored form ---------------------------------------------------------------------------


def old_form(entry: dict[str, Any], text: str) -> dict[str, Any]:
    """An entry as alpineagents wrote it before issue 10: ``text`` in every entry, version 1."""
    return {"v": 1, "seq": entry["seq"], "kind": entry["kind"], "text": text,
            "at": entry["at"], "data": entry["data"]}  # fmt: skip


@pytest.mark.usefixtures("compact_entries")
def test_a_model_entry_keeps_its_text_once_and_loads_with_it(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    state = agent_state(store)
    lines = stored_lines(store, "run")
    models = [line for line in lines if line["kind"] == MODEL]
    assert len(models) == 4
    for line in models:
        assert "text" not in line
        assert line["v"] == 2 == SCHEMA_VERSION
        assert REPLY in json.dumps(line) or line["data"]["content"][0]["text"] == "All done."
    # Every other object keeps the form a version-1 alpineagents reads.
    assert {line["v"] for line in lines if line["kind"] != MODEL} == {1}
    snapshot = json.loads((tmp_path / "run" / "snapshot.json").read_text())
    assert snapshot["v"] == 1
    loaded = FileStore(tmp_path).load("run")
    assert loaded.history == state.history
    assert [e.text for e in loaded.history if e.kind == MODEL] == [REPLY] * 3 + ["All done."]


@pytest.mark.usefixtures("compact_entries")
def test_a_model_entry_whose_text_is_not_its_blocks_keeps_its_text(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    state = State("t", id="s")
    two: list[dict[str, Any]] = [
        {"type": "text", "text": "a"},
        {"type": "thinking", "x": 1},
        {"type": "text", "text": "b"},
    ]
    state.append(MODEL, "ab", ModelData(two, "end_turn").to_data())  # joined: stored once
    state.append(MODEL, "my own words", ModelData(two, "end_turn").to_data())
    state.append(MODEL, "", ModelData([], "end_turn").to_data())  # no blocks, no text
    store.save(state)
    lines = stored_lines(store, "s")
    assert ["text" in line for line in lines] == [True, False, True, False]
    assert lines[2]["text"] == "my own words" and lines[2]["v"] == 1
    assert store.load("s").history == state.history


@pytest.mark.usefixtures("compact_entries")
def test_entries_of_the_form_before_load_as_they_did(tmp_path: Path) -> None:
    # The same State in two folders: as this version stores it, and as one before it did.
    store = FileStore(tmp_path)
    state = agent_state(store)
    old = tmp_path / "old"
    old.mkdir(mode=0o700)
    lines = [old_form(entry_to_dict(e), e.text) for e in state.history]
    (old / "entries.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (old / "snapshot.json").write_bytes((tmp_path / "run" / "snapshot.json").read_bytes())
    snapshot = json.loads((old / "snapshot.json").read_text())
    snapshot["id"] = "old"
    (old / "snapshot.json").write_text(json.dumps(snapshot))

    before = FileStore(tmp_path).load("old")
    now = FileStore(tmp_path).load("run")
    assert before.history == now.history == state.history
    assert (
        (before.stopped_by, before.answer) == (now.stopped_by, now.answer) == ("reply", "All done.")
    )
    # Saving more appends the new form after the old lines; all of it loads.
    before.add_user_message("and more")
    FileStore(tmp_path).save(before)
    again = FileStore(tmp_path).load("old")
    assert [e.text for e in again.history] == [e.text for e in state.history] + ["and more"]


@pytest.mark.usefixtures("compact_entries")
@pytest.mark.parametrize(
    ("text", "words"),
    [
        (None, r"history entry 1 \(model\): text must be a str, not null"),
        (5, r"history entry 1 \(model\): text must be a str, not 5 \(int\)"),
        (["x"], r"history entry 1 \(model\): text must be a str"),
    ],
)
def test_a_model_entry_with_a_text_of_another_type_is_refused(
    tmp_path: Path, text: Any, words: str
) -> None:
    store = FileStore(tmp_path)
    agent_state(store, steps=1)
    path = tmp_path / "run" / "entries.jsonl"
    lines = stored_lines(store, "run")
    assert "text" not in lines[1]
    lines[1]["text"] = text
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.raises(CorruptStateError, match=r"^State 'run' in FileStore\(.*\), " + words):
        FileStore(tmp_path).load("run")


@pytest.mark.usefixtures("compact_entries")
def test_a_model_entry_without_text_is_checked_like_one_with_it(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    agent_state(store, steps=1)
    path = tmp_path / "run" / "entries.jsonl"
    good = path.read_text().splitlines()
    lines = [json.loads(line) for line in good]
    lines[1]["data"]["content"][0]["text"] = 7
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    words = r"entry 1 \(model\): data\['content'\]\[0\]\['text'\] must be a str, not 7"
    with pytest.raises(CorruptStateError, match=words):
        FileStore(tmp_path).load("run")
    # A lone surrogate in a text block is refused as it is in a text field.
    good[1] = good[1].replace("Let me", "\\ud800Let me", 1)
    path.write_text("\n".join(good) + "\n")
    with pytest.raises(CorruptStateError, match=r"entry 1 \(model\): .*lone surrogate"):
        FileStore(tmp_path).load("run")


def test_version_1_model_entry_without_text_is_refused() -> None:
    """Only a compact entry (schema version 2) may leave its text out.

    Every version-1 entry has its text: one without it is damaged, and a4fcc24 said so. The
    rewritten check derives the text of any model entry without one, whatever its version.
    """
    state = State("the task", id="s1")
    state.append("model", "hi", {"content": [{"type": "text", "text": "hi"}]})
    raw = entry_to_dict(state.history[1])
    assert raw["v"] == 1
    del raw["text"]
    with pytest.raises(CorruptStateError, match=r"history entry 1 \(model\): text must be a str"):
        entry_from_dict(raw, "State 's1'", 1)
