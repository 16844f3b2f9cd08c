"""The Agent's save points: one test per row of the user guide's "When the Agent saves", and
what a save writes (only what the store lacks; nothing when nothing changed).

Refusals before a run are in test_refusals.py, failed saves in test_failed_saves.py.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from alpineagents import Agent, FileStore, State, Store
from alpineagents.agent import SavePoint
from alpineagents.model import ModelRequest, ModelResponse
from alpineagents.testing import call
from tests.helpers import (
    Mode,
    RecordingStore,
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


def test_store_by_url(tmp_path: Path) -> None:
    agent = Agent(script("x"), store=str(tmp_path / "runs"))
    assert isinstance(agent.store, FileStore)
    assert isinstance(agent.store, Store)
