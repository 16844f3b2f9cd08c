"""If saving fails, as the user guide says: a good run raises the store's exception; a failing
run raises its own, with the failed save as a note; Ctrl+C or cancellation while saving wins;
a failed save after one tool result does not stop the other tools; nothing unsaved is lost.
And a run that ends by an exception closes its open calls and saves."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from alpineagents import Agent, FileStore, State
from alpineagents.history import MODEL, TOOL_RESULT
from alpineagents.model import ModelRequest
from alpineagents.testing import FunctionModel, call
from tests.helpers import (
    AsyncMemoryStore,
    FailingStore,
    MemoryStore,
    Mode,
    disk_full,
    results,
    run,
    script,
)


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
