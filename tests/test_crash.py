"""Processes that stop in the middle of a run, and the States that continue after them.

Each crash test starts a real child process (tests/scripts/), kills it with SIGKILL at a
named point, and continues the saved State in a new process, as the user guide promises:
a call without a saved result gets the "(unknown: …)" result and is not run again; a model
request in flight is dropped and asked again; saved steps after a step that cannot be
replayed are left out with a notice. Ctrl+C, sys.exit and exceptions end the run the usual
way: open calls are closed with "(aborted: <type>)" and the State is saved.
"""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from alpineagents import Agent, FileStore, HistoryEntry, State
from alpineagents._serialize import entry_to_dict
from alpineagents.model import ModelRequest, ModelResponse
from alpineagents.testing import FunctionModel
from tests.helpers import kinds, stored_kinds
from tests.loopback_anthropic import loopback, message, text, tool_use
from tests.scripts.harness import (
    TIMEOUT,
    UNKNOWN,
    answer_of,
    child,
    ended,
    logged_requests,
    run_child,
    runs,
    sigkill,
    wait_for_file,
    wait_until,
)

MODES = ["run", "arun"]


def results(state: State) -> dict[str, str]:
    """Tool results by tool name."""
    return {e.data["name"]: e.text for e in state.history if e.kind == "tool_result"}


def texts_of(messages: list[dict[str, Any]]) -> str:
    """Everything a request's messages say (texts, results, call inputs), one per line."""
    said = []
    for block in (b for m in messages for b in m["content"]):
        if block["type"] == "text":
            said.append(block["text"])
        elif block["type"] == "tool_result":
            said.append(block["content"])
        else:
            said.append(json.dumps(block))
    return "\n".join(said)


# A tool that is running ------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.crash
@pytest.mark.parametrize("mode", MODES)
def test_killed_during_a_tool_the_call_gets_the_unknown_result_and_is_not_run_again(
    tmp_path: Path, mode: str
) -> None:
    runs_dir = tmp_path / "runs"
    args = (runs_dir, "tool", tmp_path, mode, "slow")
    with child("tools_child.py", *args) as proc:
        wait_for_file(tmp_path / "slow_tool.started", proc)
        sigkill(proc)
    store = FileStore(runs_dir)
    assert stored_kinds(store, "tool") == ["task", "model"]  # the call, without a result

    resumed = run_child("tools_child.py", *args, "--resume")

    # The model was given the seed's result for the call, and finished with it.
    assert json.loads(answer_of(resumed)) == {"slow_tool": UNKNOWN}
    assert runs(tmp_path, "slow_tool") == ["first"]  # not run again
    state = store.load("tool")
    assert state.stopped_by == "finish"
    assert kinds(state) == ["task", "model", "tool_result", "model", "tool_result"]
    assert state.history[2].text == UNKNOWN
    assert state.history[2].data["name"] == "slow_tool"
    assert state.history[2].data["call_id"] == state.history[1].data["content"][0]["id"]


@pytest.mark.slow
@pytest.mark.crash
@pytest.mark.parametrize("mode", MODES)
def test_killed_while_a_slow_tool_runs_the_saved_result_of_a_fast_one_is_kept(
    tmp_path: Path, mode: str
) -> None:
    runs_dir = tmp_path / "runs"
    store = FileStore(runs_dir)
    args = (runs_dir, "turn", tmp_path, mode, "fast_slow")

    def fast_result_saved() -> bool:
        # What the store holds: a load would add "(unknown: …)" results for both calls.
        record = store.read("turn")
        return record is not None and any(
            e["kind"] == "tool_result" and e["data"]["name"] == "fast_tool" for e in record.entries
        )

    with child("tools_child.py", *args) as proc:
        wait_for_file(tmp_path / "slow_tool.started", proc)
        wait_until(fast_result_saved, proc, "the fast tool's result is saved")
        sigkill(proc)
    assert stored_kinds(store, "turn") == ["task", "model", "tool_result"]

    resumed = run_child("tools_child.py", *args, "--resume")

    assert json.loads(answer_of(resumed)) == {"fast_tool": "fast a", "slow_tool": UNKNOWN}
    assert runs(tmp_path, "fast_tool") == ["first"]
    assert runs(tmp_path, "slow_tool") == ["first"]
    state = store.load("turn")
    assert state.stopped_by == "finish"
    assert {n: r for n, r in results(state).items() if n != "finish"} == {
        "fast_tool": "fast a",
        "slow_tool": UNKNOWN,
    }


@pytest.mark.slow
@pytest.mark.crash
def test_killed_right_after_a_tool_result_was_written_alone(tmp_path: Path) -> None:
    # The store signals once a write without a snapshot (the fast tool's result, saved at
    # once) has returned, and the process is killed before it records the write.
    runs_dir = tmp_path / "runs"
    args = (runs_dir, "turn", tmp_path, "run", "fast_slow_store")
    with child("tools_child.py", *args) as proc:
        # Both tools run on threads of their own: the slow one may start after the write.
        wait_for_file(tmp_path / "slow_tool.started", proc)
        wait_for_file(tmp_path / "entries-written", proc)
        sigkill(proc)
    assert json.loads((tmp_path / "entries-written").read_text()) == [2]  # that result alone
    store = FileStore(runs_dir)
    assert stored_kinds(store, "turn") == ["task", "model", "tool_result"]

    resumed = run_child("tools_child.py", *args, "--resume")

    assert json.loads(answer_of(resumed)) == {"fast_tool": "fast a", "slow_tool": UNKNOWN}
    assert runs(tmp_path, "fast_tool") == ["first"]
    assert runs(tmp_path, "slow_tool") == ["first"]
    assert store.load("turn").stopped_by == "finish"


# A model request in flight ---------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.crash
@pytest.mark.parametrize("mode", MODES)
def test_killed_during_a_model_request_the_next_run_asks_again(tmp_path: Path, mode: str) -> None:
    release = threading.Event()
    requests: list[dict[str, Any]] = []

    def respond(body: dict[str, Any]) -> dict[str, Any]:
        requests.append(body)
        if len(requests) == 1:
            return message(tool_use("toolu_1", "lookup", q="x"))
        if len(requests) == 2:  # held until the child is killed: its response is never read
            release.wait(TIMEOUT)
            return message(text("this response was dropped"))
        return message(text("x was found"))

    runs_dir = tmp_path / "runs"
    args = (runs_dir, "asked", tmp_path, mode)
    with loopback(respond) as server:
        try:
            with child("model_child.py", *args, env=server.env()) as proc:
                wait_until(lambda: len(requests) == 2, proc, "the second model request")
                sigkill(proc)
        finally:
            release.set()
        store = FileStore(runs_dir)
        assert stored_kinds(store, "asked") == ["task", "model", "tool_result"]

        resumed = run_child("model_child.py", *args, "--resume", env=server.env())

    assert answer_of(resumed) == "x was found"
    assert len(requests) == 3
    assert requests[2]["messages"] == requests[1]["messages"]  # asked again, the same way
    assert requests[1]["messages"][-1]["content"][0]["content"] == "found x"
    assert runs(tmp_path, "lookup") == ["first"]
    state = store.load("asked")
    assert [(e.kind, e.text) for e in state.history if e.kind == "model"] == [
        ("model", ""),
        ("model", "x was found"),
    ]
    assert "this response was dropped" not in json.dumps([e.data for e in state.history])
    assert state.stopped_by == "reply"


# Compaction ------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.crash
def test_killed_during_the_compaction_request_the_next_run_compacts_again(
    tmp_path: Path,
) -> None:
    runs_dir = tmp_path / "runs"
    args = (runs_dir, "compacting", tmp_path, "run", "inflight")
    with child("compaction_child.py", *args) as proc:
        wait_for_file(tmp_path / "compaction-request", proc)
        sigkill(proc)
    dropped = json.loads((tmp_path / "compaction-request").read_text())
    store = FileStore(runs_dir)
    assert stored_kinds(store, "compacting") == ["task", "model", "tool_result"]

    resumed = run_child("compaction_child.py", *args, "--resume")

    assert answer_of(resumed) == "done"
    requests = logged_requests(tmp_path, "resumed")
    assert [r["purpose"] for r in requests] == ["compaction", "step"]
    assert requests[0]["messages"] == dropped  # the same compaction, asked again
    assert "SUMMARY-resumed" in texts_of(requests[1]["messages"])
    assert runs(tmp_path, "note") == ["first"]
    state = store.load("compacting")
    assert [e.text for e in state.history if e.kind == "compaction"] == ["SUMMARY-resumed"]
    assert "notice" not in kinds(state)


@pytest.mark.slow
@pytest.mark.crash
def test_killed_between_the_compaction_entry_and_the_snapshot(tmp_path: Path) -> None:
    runs_dir = tmp_path / "runs"
    args = (runs_dir, "torn", tmp_path, "run", "torn")
    with child("compaction_child.py", *args) as proc:
        code, _, err = ended(proc)  # the store kills its own process
    assert code == -signal.SIGKILL, err
    store = FileStore(runs_dir)
    assert stored_kinds(store, "torn") == ["task", "model", "tool_result", "compaction"]

    loaded = store.load("torn")
    assert kinds(loaded) == ["task", "model", "tool_result", "compaction", "notice"]
    notice = loaded.history[-1].text
    assert "No tool calls" in notice

    resumed = run_child("compaction_child.py", *args, "--resume")

    assert answer_of(resumed) == "done"
    following = logged_requests(tmp_path, "resumed")[0]["messages"]
    assert "SUMMARY-first" not in texts_of(following)  # the compaction is not in effect
    assert notice in texts_of(following)
    state = store.load("torn")
    assert state.stopped_by == "finish"
    assert next(e.text for e in state.history if e.kind == "compaction") == "SUMMARY-first"
    assert kinds(state)[:5] == ["task", "model", "tool_result", "compaction", "notice"]
    assert kinds(state).count("notice") == 1
    assert runs(tmp_path, "note") == ["first"]


@pytest.mark.slow
@pytest.mark.crash
@pytest.mark.parametrize("mode", MODES)
def test_killed_mid_compaction_the_pending_message_stays_after_the_next_summary(
    tmp_path: Path, mode: str
) -> None:
    runs_dir = tmp_path / "runs"
    args = (runs_dir, "pending", tmp_path, mode, "pending")
    with child("compaction_child.py", *args) as proc:
        code, _, err = ended(proc)  # the store kills its own process
    assert code == -signal.SIGKILL, err
    store = FileStore(runs_dir)
    assert stored_kinds(store, "pending") == ["task", "model", "user", "compaction"]
    pending = store.load("pending").history[2]
    assert pending.text == "PENDING: what did the note say?"

    resumed = run_child("compaction_child.py", *args, "--resume")

    assert answer_of(resumed) == "ANSWER-resumed"
    compaction, step = logged_requests(tmp_path, "resumed")
    assert [compaction["purpose"], step["purpose"]] == ["compaction", "step"]
    # As without a kill: the summary, then the person's message, unanswered so far (the
    # notice about the compaction that was not saved in full follows it).
    blocks = [b["text"] for m in step["messages"] for b in m["content"]]
    assert blocks[0].endswith("SUMMARY-resumed")
    assert blocks[1] == pending.text
    assert blocks[2:] == [store.load("pending").history[4].text]
    state = store.load("pending")
    assert kinds(state) == ["task", "model", "user", "compaction", "notice", "compaction", "model"]
    assert state.history[5].as_compaction().covers == 1  # the reply, not the message
    assert (state.stopped_by, state.answer) == ("reply", "ANSWER-resumed")


def test_the_notice_names_the_calls_saved_after_a_compaction_and_they_get_no_result(
    tmp_path: Path,
) -> None:
    store = FileStore(tmp_path)
    sent: list[dict[str, Any]] = []

    def send_email(to: str, subject: str) -> str:
        """Send an email."""
        sent.append({"to": to, "subject": subject})
        return "sent"

    def decide(request: ModelRequest) -> ModelResponse | str:
        return "I will check the outbox first."

    model = FunctionModel(decide)
    agent = Agent(model, tools=[send_email], store=store)
    state = State("Email Bob", id="emails")
    agent.save(state)  # a normal save: the task and the snapshot
    # Then a store that failed halfway: entries beyond the snapshot, the first one a
    # compaction that only the snapshot would have made effective.
    beyond = [
        HistoryEntry(1, "compaction", "SUMMARY-lost", {"covers": 0, "usage": {}, "model": "m"}),
        HistoryEntry(
            2,
            "model",
            "",
            {
                "content": [
                    {
                        "type": "tool_call",
                        "id": "call_email",
                        "name": "send_email",
                        "input": {"to": "bob@example.com", "subject": "Quarterly report"},
                    }
                ],
                "stop_reason": "tool_use",
                "usage": {},
                "model": "m",
            },
        ),
    ]
    store.write("emails", [entry_to_dict(e) for e in beyond], None)

    loaded = store.load("emails")

    assert kinds(loaded) == ["task", "compaction", "model", "notice"]
    notice = loaded.history[-1].text
    assert "send_email" in notice
    assert "bob@example.com" in notice and "Quarterly report" in notice
    assert "may or may not have run" in notice
    assert not [e for e in loaded.history if e.kind == "tool_result"]
    assert loaded.open_calls() == []

    assert agent.run(loaded) == "I will check the outbox first."
    following = texts_of(model.requests[0].messages)
    assert notice in following
    assert "SUMMARY-lost" not in following
    assert "call_email" not in following
    assert sent == []  # the skipped call is not run
    assert kinds(store.load("emails")) == ["task", "compaction", "model", "notice", "model"]


# Ctrl+C and sys.exit: the run ends the usual way ----------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "scenario", "tool", "closed"),
    [
        ("run", "slow", "slow_tool", "(aborted: KeyboardInterrupt)"),
        # asyncio.run turns Ctrl+C into cancelling the task.
        ("arun", "slow_async", "slow_async_tool", "(aborted: CancelledError)"),
    ],
)
def test_ctrl_c_closes_the_running_call_and_saves(
    tmp_path: Path, mode: str, scenario: str, tool: str, closed: str
) -> None:
    runs_dir = tmp_path / "runs"
    with child("tools_child.py", runs_dir, "ctrl-c", tmp_path, mode, scenario) as proc:
        wait_for_file(tmp_path / f"{tool}.started", proc)
        proc.send_signal(signal.SIGINT)
        code, _, err = ended(proc)
    assert code == -signal.SIGINT, err  # Python's exit for an uncaught KeyboardInterrupt
    assert "KeyboardInterrupt" in err
    store = FileStore(runs_dir)
    assert stored_kinds(store, "ctrl-c") == ["task", "model", "tool_result"]  # saved
    state = store.load("ctrl-c")
    assert kinds(state) == ["task", "model", "tool_result"]
    assert state.history[2].text == closed
    assert state.history[2].data["is_error"] is True
    assert runs(tmp_path, tool) == ["first"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_sys_exit_in_a_tool_closes_the_call_and_saves(tmp_path: Path, mode: str) -> None:
    runs_dir = tmp_path / "runs"
    with child("tools_child.py", runs_dir, "exiting", tmp_path, mode, "exit") as proc:
        code, out, err = ended(proc)
    assert code == 3, err  # SystemExit is not a tool error: it ends the process
    assert out == ""
    store = FileStore(runs_dir)
    assert stored_kinds(store, "exiting") == ["task", "model", "tool_result"]  # saved
    state = store.load("exiting")
    assert state.history[2].text == "(aborted: SystemExit)"
    assert state.history[2].data["is_error"] is True


def test_an_exception_closes_the_open_calls_and_saves(tmp_path: Path) -> None:
    # A tool's own exception is an error result, so an exception that ends a run with calls
    # open comes from around the tools: here, a use_tools override that fails.
    ran: list[str] = []

    def lookup(q: str) -> str:
        """Look something up."""
        ran.append(q)
        return q

    class Failing(Agent):
        def use_tools(self, state: State) -> None:
            raise RuntimeError("the tool runner is broken")

    def decide(request: ModelRequest) -> list[dict[str, Any]]:
        calls = [("c1", "a"), ("c2", "b")]
        return [
            {"type": "tool_call", "id": i, "name": "lookup", "input": {"q": q}} for i, q in calls
        ]

    store = FileStore(tmp_path)
    state = State("t", id="failing")
    with pytest.raises(RuntimeError, match="the tool runner is broken"):
        Failing(FunctionModel(decide), tools=[lookup], store=store).run(state)
    assert ran == []
    assert stored_kinds(store, "failing") == ["task", "model", "tool_result", "tool_result"]
    loaded = store.load("failing")
    assert [e.text for e in loaded.history[2:]] == ["(aborted: RuntimeError)"] * 2
    assert loaded.open_calls() == []
