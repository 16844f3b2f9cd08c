"""The Agent and its store: save points, refusals before a run, and failed saves."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from alpineagents import Agent, FileStore, ResumeWarning, State, Store
from alpineagents.agent import SavePoint
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

# Save points: one test per row of the guide's "When the Agent saves" ------------------------
#
# Each test runs the Agent on a store that records its writes, and reads which SavePoint each
# write came from in the Agent's DEBUG log (one record per save point reached). Removing a save
# point from the Agent removes its records, and these tests fail.

Write = tuple[list[int], bool, bool]  # seqs of the entries, snapshot written?, create


class SavePoints(logging.Handler):
    """The save points an Agent reached, each with the write it made (``None``: nothing new)."""

    def __init__(self, store: RecordingStore) -> None:
        super().__init__(logging.DEBUG)
        self.store = store
        self.reached: list[tuple[SavePoint, Write | None]] = []
        self._writes_seen = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "save point" not in record.msg:
            return
        _, point, outcome = record.args  # type: ignore[misc]
        write = None
        if outcome == "saved":
            assert len(self.store.writes) > self._writes_seen, f"{point} saved without a write"
            write = self.store.writes[-1]
        self._writes_seen = len(self.store.writes)
        self.reached.append((SavePoint(str(point)), write))

    def last(self) -> SavePoint:
        return self.reached[-1][0]

    def wrote(self, point: SavePoint) -> list[Write]:
        return [write for p, write in self.reached if p == point and write is not None]


@pytest.fixture
def store() -> RecordingStore:
    return RecordingStore()


@pytest.fixture
def points(store: RecordingStore) -> Iterator[SavePoints]:
    handler = SavePoints(store)
    logger = logging.getLogger("alpineagents.agent")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


def stored_seqs(store: Store, state_id: str) -> list[int]:
    record = store.read(state_id)
    return [] if record is None else sorted(e["seq"] for e in record.entries)


async def test_run_starts_and_ends(mode: Mode, store: RecordingStore, points: SavePoints) -> None:
    state = State("hello", id="row-run")
    assert await run(mode, Agent(script("hi"), store=store), state) == "hi"
    assert points.reached == [
        (SavePoint.RUN_STARTS, ([0], True, True)),  # the new State, whole, before any request
        (SavePoint.BEFORE_THINK, None),
        (SavePoint.RUN_ENDS, ([1], True, False)),  # the reply and the stop
    ]
    assert store.load("row-run").stopped_by == "reply"
    # A stopped State run again makes no request; what changed since is saved as it starts.
    points.reached.clear()
    state.data["seen"] = True
    assert await run(mode, Agent(script(), store=store), state) == "hi"
    assert points.reached == [
        (SavePoint.RUN_STARTS, ([], True, False)),
        (SavePoint.RUN_ENDS, None),
    ]
    assert store.load("row-run").data == {"seen": True}


async def test_before_and_after_each_think(
    mode: Mode, store: RecordingStore, points: SavePoints
) -> None:
    asked_after: list[SavePoint] = []
    unsaved_when_asked: list[int] = []
    state = State("look it up", id="row-think")

    def respond(reply: Any) -> Any:
        def answer(request: ModelRequest) -> Any:
            asked_after.append(points.last())
            unsaved_when_asked.append(len(state.history) - len(stored_seqs(store, "row-think")))
            return reply

        return answer

    seen_by_tool: list[list[int]] = []

    def lookup() -> str:
        """Look up."""
        seen_by_tool.append(stored_seqs(store, "row-think"))
        return "found"

    agent = Agent(script(respond([call("lookup")]), respond("done")), tools=[lookup], store=store)
    assert await run(mode, agent, state) == "done"
    assert asked_after == [SavePoint.BEFORE_THINK, SavePoint.BEFORE_THINK]
    assert unsaved_when_asked == [0, 0]
    # The response with the call is saved before the tool runs.
    assert points.wrote(SavePoint.AFTER_THINK) == [([1], True, False)]
    assert seen_by_tool == [[0, 1]]


async def test_after_each_tool_result(
    mode: Mode, store: RecordingStore, points: SavePoints
) -> None:
    fast_done = threading.Event()
    seen_by_slow: list[list[int]] = []

    def fast() -> str:
        """Answer at once."""
        fast_done.set()
        return "fast"

    def slow() -> str:
        """Answer once the fast tool's result is saved."""
        fast_done.wait(5)
        deadline = time.monotonic() + 5
        while 2 not in stored_seqs(store, "row-tool") and time.monotonic() < deadline:
            time.sleep(0.01)
        seen_by_slow.append(stored_seqs(store, "row-tool"))
        return "slow"

    agent = Agent(
        script([call("slow"), call("fast")], "both done"), tools=[fast, slow], store=store
    )
    assert await run(mode, agent, State("two tools", id="row-tool")) == "both done"
    # The fast result was in the store while the slow tool still ran.
    assert seen_by_slow == [[0, 1, 2]]
    # Each result alone, without the snapshot, at once.
    assert points.wrote(SavePoint.AFTER_TOOL_RESULT) == [([2], False, False), ([3], False, False)]


async def test_after_use_tools_and_compact(
    mode: Mode, store: RecordingStore, points: SavePoints
) -> None:
    def note() -> str:
        """Take a note."""
        return "noted"

    big = ModelResponse([call("note")], "tool_use", {"input_tokens": 1000})
    agent = Agent(script(big, "SUMMARY", "done"), tools=[note], store=store, compact_at=500)
    assert await run(mode, agent, State("take notes", id="row-steps")) == "done"
    order = [p for p, _ in points.reached]
    assert order.index(SavePoint.AFTER_USE_TOOLS) < order.index(SavePoint.AFTER_COMPACT)
    # The tool result was saved alone; use_tools' save has nothing to add: the snapshot would
    # only count the result, which a load replays after the entries the snapshot counts.
    assert points.wrote(SavePoint.AFTER_USE_TOOLS) == []
    assert points.reached.count((SavePoint.AFTER_USE_TOOLS, None)) == 1  # reached, nothing new
    # The compaction entry is saved before the next request.
    assert points.wrote(SavePoint.AFTER_COMPACT) == [([3], True, False)]
    assert [e["kind"] for e in store.read("row-steps").entries if e["seq"] == 3] == [  # type: ignore[union-attr]
        "compaction"
    ]


async def test_agent_save(mode: Mode, store: RecordingStore, points: SavePoints) -> None:
    agent = Agent(script("first reply"), store=store)
    state = State("hello", id="row-save")
    await run(mode, agent, state)
    points.reached.clear()
    state.add_user_message("second")
    for _ in range(2):
        if mode == "async":
            await agent.asave(state)
        else:
            agent.save(state)
    assert points.reached == [
        (SavePoint.AGENT_SAVE, ([2], True, False)),  # the message, at once
        (SavePoint.AGENT_SAVE, None),  # nothing changed: nothing written
    ]
    assert store.load("row-save").history[-1].text == "second"


# The guide's rows, in its order, and the save points each one names.
GUIDE_ROWS: dict[str, tuple[SavePoint, ...]] = {
    "`run` starts and ends": (SavePoint.RUN_STARTS, SavePoint.RUN_ENDS),
    "before and after each `think`": (SavePoint.BEFORE_THINK, SavePoint.AFTER_THINK),
    "after each tool result": (SavePoint.AFTER_TOOL_RESULT,),
    "after `use_tools` and `compact`": (SavePoint.AFTER_USE_TOOLS, SavePoint.AFTER_COMPACT),
    "`agent.save(state)`": (SavePoint.AGENT_SAVE,),
}


def test_the_save_points_map_one_to_one_to_the_guide_table_and_the_docstring() -> None:
    guide = (Path(__file__).parent.parent / "docs" / "guide.md").read_text()
    table = guide.split("## When the Agent saves", 1)[1].split("\n\n")[1]
    cells = [[c.strip() for c in line.split("|")[1:-1]] for line in table.splitlines()[2:]]
    assert [row[0].lower() for row in cells] == list(GUIDE_ROWS)
    named = [tuple(SavePoint[n.strip(" `")] for n in row[2].split(",")) for row in cells]
    assert named == list(GUIDE_ROWS.values())  # the table's SavePoint column
    assert [p for row in GUIDE_ROWS.values() for p in row] == list(SavePoint)
    doc = Agent.__doc__ or ""
    positions = [doc.index(f"SavePoint.{p.name}") for p in SavePoint]
    assert positions == sorted(positions)


# More about saving --------------------------------------------------------------------------


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
        ([0], True, True),  # RUN_STARTS: the new State, whole
        ([1], True, False),  # AFTER_THINK: the response with the call
        ([2], False, False),  # AFTER_TOOL_RESULT: the result, at once, alone
        ([3], True, False),  # RUN_ENDS: the reply (which ends the turn) and the stop
    ]  # BEFORE_THINK (twice): nothing changed, nothing written; AFTER_USE_TOOLS: nothing is
    # missing (the snapshot would only count the result, which a load replays)
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
