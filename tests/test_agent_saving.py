"""The Agent and its store: save points, refusals before a run, and failed saves."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from alpineagents import Agent, FileStore, ResumeWarning, State, Store
from alpineagents.history import MODEL, TOOL_RESULT
from alpineagents.model import ModelRequest
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


def test_store_by_url(tmp_path: Path) -> None:
    agent = Agent(script("x"), store=str(tmp_path / "runs"))
    assert isinstance(agent.store, FileStore)
    assert isinstance(agent.store, Store)
