"""History entries: the typed shape of each kind, and the JSON every store keeps."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from alpineagents import Agent, FileStore, HistoryEntry, State
from alpineagents.history import (
    KINDS,
    CompactionData,
    ModelData,
    NoticeData,
    ToolResultData,
    UserData,
)
from alpineagents.testing import FunctionModel, call


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
