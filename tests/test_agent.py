"""The Agent loop on offline models: stops, tools, save points, refusals, failures."""

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

from alpineagents import Agent, FileStore, ResumeWarning, State, Store
from alpineagents.history import MODEL, TOOL_RESULT
from alpineagents.model import ModelRequest, ModelResponse
from alpineagents.testing import FunctionModel, TestModel, call
from tests.helpers import (
    AsyncMemoryStore,
    FailingStore,
    MemoryStore,
    Mode,
    RecordingStore,
    disk_full,
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


# Save points --------------------------------------------------------------------------------


def test_save_points_of_a_run_with_a_tool() -> None:
    def lookup(key: str) -> str:
        """Look up."""
        return "value"

    store = RecordingStore()
    agent = Agent(
        script([call("lookup", key="k")], "the value is value"), tools=[lookup], store=store
    )
    agent.run(State("find k", id="run"))
    assert store.writes == [
        ([0], True, True),  # run starts: the new State, whole
        ([1], True, False),  # after think: the response
        ([2], False, False),  # the tool result, at once, alone
        ([], True, False),  # after use_tools: what is missing (the snapshot)
        ([3], True, False),  # after think: the reply; the stop
    ]  # before think and at the end: nothing changed, nothing written
    writes = len(store.writes)
    agent.run(store.load("run"))
    assert len(store.writes) == writes  # a stopped State that runs again writes nothing


def test_agent_save_writes_the_message_at_once_and_nothing_when_unchanged(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    agent = Agent(script("first reply"), store=store)
    state = State("hello", id="chat")
    agent.run(state)
    state.add_user_message("second")
    agent.save(state)
    assert store.load("chat").history[-1].text == "second"
    mtime = (tmp_path / "chat" / "snapshot.json").stat().st_mtime_ns
    agent.save(state)
    assert (tmp_path / "chat" / "snapshot.json").stat().st_mtime_ns == mtime


def test_agent_without_store_saves_nothing_and_refuses_save() -> None:
    agent = Agent(script("hi"))
    state = State("x")
    agent.run(state)
    assert state._saved_count == 0
    with pytest.raises(ValueError, match="no store"):
        agent.save(state)


# Refusals -----------------------------------------------------------------------------------


def test_new_state_with_a_saved_id_is_refused_before_the_first_request(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    Agent(script("one"), store=store).run(State("first", id="review-pr-42"))
    model = script()
    with pytest.raises(ValueError, match=r"review-pr-42.*store\.load"):
        Agent(model, store=store).run(State("second", id="review-pr-42"))
    assert model.requests == []
    assert store.load("review-pr-42").task == "first"


def test_state_run_with_an_agent_on_another_store_is_refused(tmp_path: Path) -> None:
    state = State("x")
    Agent(script("a"), store=FileStore(tmp_path / "a")).run(state)
    state.add_user_message("more")
    model = script()
    with pytest.raises(ValueError, match="is saved in FileStore"):
        Agent(model, store=FileStore(tmp_path / "b")).run(state)
    with pytest.raises(ValueError, match="this Agent has no store"):
        Agent(model).run(state)
    assert model.requests == []
    # Another FileStore object on the same folder is the same store.
    assert Agent(script("b"), store=FileStore(tmp_path / "a")).run(state) == "b"


def test_non_json_data_is_refused_before_the_next_model_request(tmp_path: Path) -> None:
    model = script("one")
    agent = Agent(model, store=FileStore(tmp_path))
    state = State("x", data={"when": object()})
    with pytest.raises(TypeError, match=r"state\.data\['when'\]"):
        agent.run(state)
    assert model.requests == []


def test_resume_warning_when_the_agent_differs(tmp_path: Path) -> None:
    store = FileStore(tmp_path)

    def a() -> None:
        """A."""

    Agent(script("x"), system="be brief", tools=[a], store=store).run(State("t", id="w"))
    state = store.load("w")
    state.add_user_message("more")

    def b() -> None:
        """B."""

    other = Agent(script("y", "z"), system="be verbose", tools=[b], store=store)
    with pytest.warns(
        ResumeWarning, match=r"system prompt changed; tools removed: a; tools added: b"
    ):
        other.run(state)
    state.add_user_message("again")
    other.run(state)  # only the first run warns (filterwarnings=error would fail otherwise)


def test_no_resume_warning_for_the_same_agent(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    Agent(TestModel(), store=store).run(State("t", id="same"))
    state = store.load("same")
    state.add_user_message("more")
    Agent(TestModel(), store=store).run(state)  # warnings are errors in this suite


def test_run_inside_an_event_loop_is_refused() -> None:
    async def main() -> None:
        with pytest.raises(RuntimeError, match=r"await agent\.arun\(state\)"):
            Agent(script()).run(State("x"))

    asyncio.run(main())


def test_async_only_store_needs_arun() -> None:
    store = AsyncMemoryStore()
    agent = Agent(script("async ok"), store=store)
    with pytest.raises(TypeError, match=r"async-only store: use `await agent\.arun"):
        agent.run(State("x"))
    state = State("y", id="async-store")
    assert asyncio.run(agent.arun(state)) == "async ok"
    assert asyncio.run(store.aload("async-store")).answer == "async ok"


async def test_sync_store_works_under_arun(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    assert await Agent(script("sync store"), store=store).arun(State("x", id="s")) == "sync store"
    assert (await store.aload("s")).answer == "sync store"


# If saving fails ----------------------------------------------------------------------------


def test_a_failed_save_in_a_good_run_raises_the_store_exception() -> None:
    store = FailingStore()
    state = State("x", id="s")
    agent = Agent(script("never"), store=store)
    agent.save(state)
    store.failing = disk_full()
    with pytest.raises(OSError, match="No space left") as caught:
        agent.run(state)
    assert not getattr(caught.value, "__notes__", None)


class NotingAgent(Agent):
    """An advanced user's Agent: its think notes each attempt in state.data first."""

    def think(self, state: State) -> Any:
        state.data["attempts"] = state.data.get("attempts", 0) + 1
        return super().think(state)

    async def athink(self, state: State) -> Any:
        state.data["attempts"] = state.data.get("attempts", 0) + 1
        return await super().athink(state)


def rate_limited_model() -> Any:
    """Claude through the real SDK, answering 429 (retries exhausted at once)."""
    import anthropic
    import httpx2

    from alpineagents import AnthropicModel

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(
            429,
            json={"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}},
        )

    return AnthropicModel(
        "claude-sonnet-5",
        client=anthropic.Anthropic(
            api_key="test",
            max_retries=0,
            http_client=httpx2.Client(transport=httpx2.MockTransport(handler)),
        ),
        async_client=anthropic.AsyncAnthropic(
            api_key="test",
            max_retries=0,
            http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(handler)),
        ),
    )


async def test_the_original_exception_wins_with_the_failed_save_as_a_note(mode: Mode) -> None:
    import anthropic

    store = FailingStore()
    agent = NotingAgent(rate_limited_model(), store=store)
    state = State("x", id="s")
    agent.save(state)
    # Saves before think pass; the save after the failed think (with the note) fails.
    store.failing = disk_full()
    store.fail_when = lambda entries, snapshot: (
        snapshot is not None and "attempts" in snapshot["data"]
    )
    try:
        await run(mode, agent, state)
    except anthropic.RateLimitError as e:  # `except RateLimitError:` still catches it
        caught = e
    assert caught.__notes__ == [
        "saving the state also failed: OSError: [Errno 28] No space left on device"
    ]
    # Nothing that failed to save is lost from the State: the next save writes it.
    store.failing = None
    agent.save(state)
    assert store.load("s").data == {"attempts": 1}


def test_ctrl_c_while_saving_is_raised_instead_of_the_original() -> None:
    def fails(request: ModelRequest) -> Any:
        raise ConnectionError("network down")

    store = FailingStore()
    agent = NotingAgent(FunctionModel(fails), store=store)
    state = State("x", id="s")
    agent.save(state)
    store.failing = KeyboardInterrupt()
    store.fail_when = lambda entries, snapshot: (
        snapshot is not None and "attempts" in snapshot["data"]
    )
    with pytest.raises(KeyboardInterrupt) as caught:
        agent.run(state)
    assert isinstance(caught.value.__context__, ConnectionError)
    assert state.data == {"attempts": 1}  # still in memory


async def test_cancellation_while_saving_is_raised_instead_of_the_original() -> None:
    class CancelledWhileSaving(AsyncMemoryStore):
        async def awrite(self, state_id, entries, snapshot, *, create=False):  # type: ignore[no-untyped-def]
            if snapshot is not None and "attempts" in snapshot["data"]:
                raise asyncio.CancelledError
            await super().awrite(state_id, entries, snapshot, create=create)

    def fails(request: ModelRequest) -> Any:
        raise ConnectionError("network down")

    agent = NotingAgent(FunctionModel(fails), store=CancelledWhileSaving())
    state = State("x", id="s")
    with pytest.raises(asyncio.CancelledError) as caught:
        await agent.arun(state)
    assert isinstance(caught.value.__context__, ConnectionError)


async def test_a_failed_tool_result_save_does_not_stop_the_other_tools(mode: Mode) -> None:
    ran: list[int] = []

    def work(n: int) -> str:
        """Work."""
        time.sleep(0.05 * n)
        ran.append(n)
        return f"done {n}"

    store = RecordingFailing()
    agent = Agent(
        script([call("work", n=1), call("work", n=2), call("work", n=3)], "all done"),
        tools=[work],
        store=store,
    )
    state = State("x", id="s")
    await run(mode, agent, state)
    assert sorted(ran) == [1, 2, 3]
    # The first result's own save failed; the end-of-use_tools save wrote what was missing.
    loaded = store.load("s")
    assert sorted(e.text for e in loaded.history if e.kind == TOOL_RESULT) == [
        "done 1",
        "done 2",
        "done 3",
    ]
    assert store.failures == 1


class RecordingFailing(MemoryStore):
    """Fails the first entries-only write (a tool result saved alone)."""

    def __init__(self) -> None:
        super().__init__()
        self.failures = 0

    def write(self, state_id, entries, snapshot, *, create=False):  # type: ignore[no-untyped-def]
        if snapshot is None and self.failures == 0:
            self.failures += 1
            raise disk_full()
        super().write(state_id, entries, snapshot, create=create)


def test_a_failed_final_use_tools_save_raises() -> None:
    def work() -> str:
        """Work."""
        return "done"

    store = FailingStore()
    store.fail_when = lambda entries, snapshot: (
        snapshot is None or any(e["kind"] == TOOL_RESULT for e in entries)
    )
    agent = Agent(script([call("work")]), tools=[work], store=store)
    state = State("x", id="s")
    agent.save(state)
    store.failing = disk_full()
    with pytest.raises(OSError, match="No space left"):
        agent.run(state)
    assert results(state) == [("work", "done", False)]  # kept in memory


def test_exception_in_a_run_closes_open_calls_and_saves(tmp_path: Path) -> None:
    def interrupted() -> str:
        """Gets Ctrl+C."""
        raise KeyboardInterrupt

    store = FileStore(tmp_path)
    agent = Agent(
        script([call("interrupted"), call("interrupted")]), tools=[interrupted], store=store
    )
    state = State("x", id="s")
    with pytest.raises(KeyboardInterrupt):
        agent.run(state)
    saved = results(store.load("s"))
    assert saved == [
        ("interrupted", "(aborted: KeyboardInterrupt)", True),
        ("interrupted", "(aborted: KeyboardInterrupt)", True),
    ]


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


def test_store_by_url(tmp_path: Path) -> None:
    agent = Agent(script("x"), store=str(tmp_path / "runs"))
    assert isinstance(agent.store, FileStore)
    assert isinstance(agent.store, Store)


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


def test_ctrl_c_during_a_save_still_closes_the_calls_and_saves() -> None:
    class InterruptedOnce(MemoryStore):
        interrupted = False

        def write(self, state_id, entries, snapshot, *, create=False):  # type: ignore[no-untyped-def]
            if not self.interrupted and any(e["kind"] == MODEL for e in entries):
                self.interrupted = True
                raise KeyboardInterrupt  # Ctrl+C while saving the response with its calls
            super().write(state_id, entries, snapshot, create=create)

    def send_email(to: str) -> str:
        """Send an email."""
        raise AssertionError("never runs")

    store = InterruptedOnce()
    agent = Agent(script([call("send_email", to="a@b.c")]), tools=[send_email], store=store)
    with pytest.raises(KeyboardInterrupt):
        agent.run(State("t", id="ctrl-c"))
    saved = store.load("ctrl-c")
    assert [e.text for e in saved.history if e.kind == TOOL_RESULT] == [
        "(aborted: KeyboardInterrupt)"
    ]


def test_model_function_may_be_async_under_run() -> None:
    async def reply(request: ModelRequest) -> str:
        await asyncio.sleep(0)
        return "async model"

    assert Agent(FunctionModel(reply)).run(State("x")) == "async model"
