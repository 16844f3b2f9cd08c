"""The Agent loop on offline models: stops, tools, compaction.

Save points, refusals and failed saves are in test_save_points.py, test_refusals.py and
test_failed_saves.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from typing_extensions import TypedDict

from alpineagents import Agent, FileStore, State
from alpineagents.history import TOOL_RESULT
from alpineagents.model import ModelRequest, ModelResponse
from alpineagents.testing import FunctionModel, TestModel, call
from tests.helpers import (
    Mode,
    results,
    run,
    script,
)

# How a run stops ----------------------------------------------------------------------------


def test_reply_stops_the_run_and_returns_the_text() -> None:
    agent = Agent(script("Hello there"))
    state = State("hi")
    assert agent.run(state) == "Hello there"
    assert (state.stopped_by, state.answer) == ("reply", "Hello there")


class Verdict(BaseModel):
    approve: bool
    reason: str


@dataclasses.dataclass
class Point:
    x: int
    y: int


class Movie(TypedDict):
    title: str
    year: int


@pytest.mark.parametrize(
    ("output_type", "raw", "expected"),
    [
        (Verdict, {"approve": True, "reason": "ok"}, Verdict(approve=True, reason="ok")),
        (Point, {"x": 1, "y": 2}, Point(1, 2)),
        (Movie, {"title": "Heat", "year": 1995}, {"title": "Heat", "year": 1995}),
        (int, 42, 42),
        (list[str], ["a", "b"], ["a", "b"]),
        (
            Verdict,
            '{"approve": false, "reason": "as JSON text"}',
            Verdict(approve=False, reason="as JSON text"),
        ),
    ],
)
def test_finish_answer_is_typed_by_output_type(output_type: Any, raw: Any, expected: Any) -> None:
    agent = Agent(script([call("finish", answer=raw)]), output_type=output_type)
    state = State("decide")
    assert agent.run(state) == expected
    assert state.stopped_by == "finish"


def test_a_wrong_answer_goes_back_to_the_model_as_an_error() -> None:
    def second(request: ModelRequest) -> Any:
        last = request.messages[-1]["content"][0]
        assert last["type"] == "tool_result" and last["is_error"] is True
        assert "approve" in last["content"]
        return [call("finish", answer={"approve": False, "reason": "fixed"})]

    agent = Agent(
        script([call("finish", answer={"reason": "no approve"})], second), output_type=Verdict
    )
    assert agent.run(State("decide")) == Verdict(approve=False, reason="fixed")


def test_the_finish_schema_describes_the_output_type() -> None:
    agent = Agent(TestModel(), output_type=Verdict)
    finish = next(d for d in agent._definitions if d["name"] == "finish")
    answer = finish["input_schema"]["properties"]["answer"]
    assert answer["properties"]["approve"]["type"] == "boolean"
    assert isinstance(agent.run(State("x")), Verdict)


def test_ask_returns_the_question_and_the_next_message_answers_it() -> None:
    def answered(request: ModelRequest) -> Any:
        result = request.messages[-1]["content"][0]
        assert result["type"] == "tool_result" and result["content"] == "blue"
        return "Blue it is."

    agent = Agent(script([call("ask", question="Which colour?")], answered))
    state = State("paint the shed")
    assert agent.run(state) == "Which colour?"
    assert state.stopped_by == "ask"
    state.add_user_message("blue")
    assert agent.run(state) == "Blue it is."


def test_running_a_stopped_state_again_makes_no_request() -> None:
    model = script("only once")
    agent = Agent(model)
    state = State("hi")
    assert agent.run(state) == "only once"
    assert agent.run(state) == "only once"
    assert len(model.requests) == 1


def test_max_steps_stops_the_run() -> None:
    def forever(request: ModelRequest) -> Any:
        return [call("noop")]

    def noop() -> str:
        """Do nothing."""
        return "ok"

    model = FunctionModel(forever)
    state = State("loop")
    assert Agent(model, tools=[noop], max_steps=3).run(state) is None
    assert state.stopped_by == "max_steps" and len(model.requests) == 3


async def test_a_run_stopped_by_max_steps_continues_when_run_again(
    mode: Mode, tmp_path: Path
) -> None:
    def noop() -> str:
        """Do nothing."""
        return "ok"

    store = FileStore(tmp_path)
    model = script([call("noop")], [call("noop")], [call("noop")], "all three done")
    state = State("three notes", id="budget")
    assert await run(mode, Agent(model, tools=[noop], store=store, max_steps=2), state) is None
    assert state.stopped_by == "max_steps" and len(model.requests) == 2
    # Running it again, nothing added: it continues with a new budget, no invented message.
    loaded = store.load("budget")
    again = Agent(model, tools=[noop], store=store, max_steps=2)
    assert await run(mode, again, loaded) == "all three done"
    assert len(model.requests) == 4
    assert [e.kind for e in store.load("budget").history].count("user") == 0
    # Stopped by a reply, it stays stopped: the same answer, no request.
    assert await run(mode, again, loaded) == "all three done"
    assert len(model.requests) == 4


def test_pause_turn_sends_the_response_back() -> None:
    paused = ModelResponse([{"type": "text", "text": "searching"}], "pause_turn")
    model = script(paused, "found it")
    assert Agent(model).run(State("search")) == "found it"
    assert model.requests[1].messages[-1]["role"] == "assistant"


def test_a_call_cut_off_by_max_tokens_is_not_run() -> None:
    ran: list[str] = []

    def write(path: str) -> str:
        """Write a file."""
        ran.append(path)
        return "written"

    cut = ModelResponse([call("write", path="/tmp/half")], "max_tokens")
    state = State("write")
    Agent(script(cut, "ok"), tools=[write]).run(state)
    assert ran == []
    assert results(state)[0][1].startswith("(not run: the response was cut off")


def test_refusal_stops_with_the_text() -> None:
    refused = ModelResponse([{"type": "text", "text": "I can't help with that."}], "refusal")
    state = State("bad")
    assert Agent(script(refused)).run(state) == "I can't help with that."
    assert state.history[-1].data["stop_reason"] == "refusal"


# Tools --------------------------------------------------------------------------------------


def test_tool_results_exceptions_and_invalid_input_reach_the_model() -> None:
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    def fail(reason: str) -> str:
        """Always fails."""
        raise RuntimeError(reason)

    def profile(name: str) -> dict[str, Any]:
        """A profile."""
        return {"name": name, "tags": ("a", "b")}

    first = [
        call("add", a=1, b=2),
        call("fail", reason="boom"),
        call("add", a="x"),
        call("missing"),
        call("profile", name="ann"),
    ]
    state = State("use tools")
    Agent(script(first, "done"), tools=[add, fail, profile]).run(state)
    by_text = sorted(results(state))
    assert ("add", "3", False) in by_text
    assert ("fail", "RuntimeError: boom", True) in by_text
    assert ("profile", '{"name":"ann","tags":["a","b"]}', False) in by_text
    invalid = next(r for r in by_text if r[0] == "add" and r[2])
    assert "Invalid input for tool 'add'" in invalid[1] and "b: Field required" in invalid[1]
    missing = next(r for r in by_text if r[0] == "missing")
    assert missing[2] and "no tool named 'missing'" in missing[1]
    error_entry = next(e for e in state.history if e.text == "RuntimeError: boom")
    assert isinstance(error_entry.error, RuntimeError)


def test_tool_definitions_come_from_the_function() -> None:
    def search(query: str, limit: int = 10) -> list[str]:
        """Search the web."""
        return []

    agent = Agent(TestModel(), tools=[search])
    definition = agent._definitions[0]
    assert definition["name"] == "search" and definition["description"] == "Search the web."
    assert definition["input_schema"]["required"] == ["query"]
    assert definition["input_schema"]["properties"]["limit"]["default"] == 10


def test_reserved_and_duplicate_tool_names_are_refused() -> None:
    def finish(answer: str) -> str:
        """Mine."""
        return answer

    with pytest.raises(ValueError, match="cannot be named 'finish'"):
        Agent(TestModel(), tools=[finish])

    def t() -> None:
        """T."""

    with pytest.raises(ValueError, match="two tools are named 't'"):
        Agent(TestModel(), tools=[t, t])


def test_sync_tools_of_one_turn_run_concurrently() -> None:
    barrier = threading.Barrier(3, timeout=10)

    def wait(n: int) -> int:
        """Wait for the others."""
        barrier.wait()  # only passes if all three run at once
        return n

    state = State("x")
    Agent(script([call("wait", n=i) for i in range(3)], "ok"), tools=[wait]).run(state)
    assert sorted(r[1] for r in results(state)) == ["0", "1", "2"]


async def test_async_and_sync_tools_run_concurrently_under_arun() -> None:
    async def slow(n: int) -> int:
        """Sleep."""
        await asyncio.sleep(0.3)
        return n

    def blocking(n: int) -> int:
        """Block."""
        time.sleep(0.3)
        return n

    calls = [call("slow", n=1), call("slow", n=2), call("blocking", n=3), call("blocking", n=4)]
    state = State("x")
    started = time.perf_counter()
    await Agent(script(calls, "ok"), tools=[slow, blocking]).arun(state)
    assert time.perf_counter() - started < 1.0
    assert sorted(r[1] for r in results(state)) == ["1", "2", "3", "4"]


def test_async_tool_under_sync_run() -> None:
    async def fetch(url: str) -> str:
        """Fetch."""
        await asyncio.sleep(0)
        return f"page {url}"

    state = State("x")
    Agent(script([call("fetch", url="u")], "ok"), tools=[fetch]).run(state)
    assert results(state) == [("fetch", "page u", False)]


# Compaction ---------------------------------------------------------------------------------


def big(response: Any, tokens: int = 1000) -> Any:
    def make(request: ModelRequest) -> ModelResponse:
        from alpineagents.testing._models import as_response

        r = as_response(response, "big")
        return ModelResponse(r.content, r.stop_reason, {"input_tokens": tokens}, "big")

    return make


def test_compaction_replaces_older_context_and_history_keeps_everything(tmp_path: Path) -> None:
    def note(text: str) -> str:
        """Take a note."""
        return f"noted {text}"

    def after(request: ModelRequest) -> Any:
        first = request.messages[0]["content"][0]["text"]
        assert "Summary of the steps so far:\nSUMMARY" in first
        assert all("noted one" not in str(m) for m in request.messages)
        return [call("finish", answer="finished")]

    def summarise(request: ModelRequest) -> Any:
        assert request.purpose == "compaction" and request.tool_choice == "none"
        assert "noted one" in str(request.messages)
        return "SUMMARY"

    store = FileStore(tmp_path)
    agent = Agent(
        script(big([call("note", text="one")]), summarise, after),
        tools=[note],
        store=store,
        compact_at=500,
    )
    state = State("take notes", id="c")
    assert agent.run(state) == "finished"
    kinds = [e.kind for e in store.load("c").history]
    assert kinds == ["task", "model", "tool_result", "compaction", "model", "tool_result"]
    compaction = state.history[3]
    assert compaction.data["covers"] == 2 and compaction.text == "SUMMARY"


def test_context_window_exceeded_compacts_and_asks_again() -> None:
    over = ModelResponse([], "model_context_window_exceeded", {"input_tokens": 10})
    model = script(over, "SUMMARY", "answer after compaction")
    state = State("long")
    assert Agent(model, compact_at=None).run(state) == "answer after compaction"
    assert [e.kind for e in state.history] == ["task", "model", "compaction", "model"]


def test_model_request_without_store_type_errors_are_clear() -> None:
    with pytest.raises(TypeError, match="takes a State"):
        Agent(script()).run("not a state")  # type: ignore[arg-type]


def test_finish_with_ask_in_one_response_stays_stopped() -> None:
    model = script(
        [
            call("finish", answer="done"),
            call("ask", question="why?"),
            call("finish", answer="again"),
        ]
    )
    agent = Agent(model)
    state = State("t")
    assert agent.run(state) == "done"
    assert agent.run(state) == "done"
    assert len(model.requests) == 1
    assert [e.text for e in state.history if e.kind == TOOL_RESULT] == [
        "Answer accepted.",
        "(ignored: the run already finished)",
        "(not asked: the run finished)",
    ]


def test_model_function_may_be_async_under_run() -> None:
    async def reply(request: ModelRequest) -> str:
        await asyncio.sleep(0)
        return "async model"

    assert Agent(FunctionModel(reply)).run(State("x")) == "async model"
