"""The user guide's samples, run as the guide shows them, in real processes.

tests/scripts/chat.py is the guide's chat loop, verbatim; tests/scripts/sigterm.py starts with
the guide's SIGTERM handler, verbatim. They run against the real anthropic SDK pointed at a
loopback server, or with offline models, and are stopped the way the guide describes.
"""

from __future__ import annotations

import shutil
import signal
import stat
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from alpineagents import FileStore
from tests.helpers import stored_kinds
from tests.loopback_anthropic import loopback, message, text
from tests.scripts.harness import (
    SCRIPTS,
    TIMEOUT,
    LineReader,
    child,
    ended,
    runs,
    sigkill,
    wait_for_file,
    wait_until,
)

# Every test here runs the samples in child processes.
pytestmark = pytest.mark.slow


# Stop cleanly on SIGTERM -----------------------------------------------------------------


def test_sigterm_sample_closes_the_running_call_and_saves(tmp_path: Path) -> None:
    runs_dir = tmp_path / "runs"
    with child("sigterm.py", runs_dir, "term", tmp_path, "run") as proc:
        wait_for_file(tmp_path / "slow_tool.started", proc)
        proc.send_signal(signal.SIGTERM)
        code, out, err = ended(proc)
    assert code == 143, err  # 128 + SIGTERM, from the sample's SystemExit
    assert out == ""
    store = FileStore(runs_dir)
    assert stored_kinds(store, "term") == ["task", "model", "tool_result"]  # saved
    state = store.load("term")
    assert [e.kind for e in state.history] == ["task", "model", "tool_result"]
    assert state.history[2].text == "(aborted: SystemExit)"
    assert state.history[2].data["name"] == "slow_tool"
    assert state.open_calls() == []
    assert runs(tmp_path, "slow_tool") == ["first"]


def test_sigterm_under_arun_cancels_the_task_which_closes_the_call_and_saves(
    tmp_path: Path,
) -> None:
    runs_dir = tmp_path / "runs"
    with child("sigterm_arun.py", runs_dir, "term", tmp_path, "arun") as proc:
        wait_for_file(tmp_path / "slow_async_tool.started", proc)
        proc.send_signal(signal.SIGTERM)
        code, out, err = ended(proc)
    assert (code, out) == (0, "cancelled\n"), err
    store = FileStore(runs_dir)
    assert stored_kinds(store, "term") == ["task", "model", "tool_result"]  # saved
    state = store.load("term")
    assert state.history[2].text == "(aborted: CancelledError)"
    assert state.history[2].data["name"] == "slow_async_tool"
    assert runs(tmp_path, "slow_async_tool") == ["first"]


# The chat loop ---------------------------------------------------------------------------


def _type(proc: subprocess.Popen[str], line: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(line + "\n")
    proc.stdin.flush()


def readme_chat_loop() -> str:
    """README's chat loop, as README.md has it (the fenced block under "Save and resume")."""
    readme = (SCRIPTS.parents[1] / "README.md").read_text()
    section = readme.split("## Save and resume", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_readme_chat_loop_with_resume_on_an_empty_store_starts_a_conversation(
    tmp_path: Path,
) -> None:
    chat = tmp_path / "chat.py"
    chat.write_text(readme_chat_loop())
    assert "while True:" in chat.read_text() and "--resume" in chat.read_text()
    with loopback(lambda body: message(text("Hello! Nothing to resume yet."))) as server:
        with child(chat, "--resume", env=server.env(), cwd=tmp_path, stdin=subprocess.PIPE) as proc:
            out = LineReader(proc)
            _type(proc, "Plan a weekend.")
            assert out.line() == "> Hello! Nothing to resume yet."
            assert proc.stdin is not None
            proc.stdin.close()  # the person leaves: input() ends the loop with EOFError
            proc.wait(timeout=TIMEOUT)
            assert out.rest() == ["> "]
            assert proc.stderr is not None
            errors = proc.stderr.read()
            assert errors.rstrip().splitlines()[-1].startswith("EOFError")  # not IndexError
    [saved] = FileStore(tmp_path / ".agent-runs").list()
    assert saved.task == "Plan a weekend." and saved.stopped_by == "reply"


@pytest.mark.crash
def test_chat_loop_resumes_the_last_conversation_after_a_kill(tmp_path: Path) -> None:
    shutil.copy(SCRIPTS / "chat.py", tmp_path / "chat.py")
    chat = tmp_path / "chat.py"
    release = threading.Event()
    requests: list[dict[str, Any]] = []

    def respond(body: dict[str, Any]) -> dict[str, Any]:
        requests.append(body)
        if len(requests) == 1:
            return message(text("Hello! What shall we plan?"))
        if len(requests) == 2:  # held until the child is killed
            release.wait(TIMEOUT)
            return message(text("this reply was never read"))
        return message(text("A trip to the lakes, then."))

    with loopback(respond) as server:
        try:
            with child(chat, env=server.env(), cwd=tmp_path, stdin=subprocess.PIPE) as proc:
                out = LineReader(proc)
                _type(proc, "Plan a weekend.")
                assert out.line() == "> Hello! What shall we plan?"
                _type(proc, "Somewhere with lakes.")
                wait_until(lambda: len(requests) == 2, proc, "the second message's request")
                sigkill(proc)
                out.rest()
        finally:
            release.set()

        store = FileStore(tmp_path / ".agent-runs")
        [saved] = store.list()
        # agent.save(state) saved the message before the run that was killed.
        assert stored_kinds(store, saved.id) == ["task", "model", "user"]

        with child(chat, "--resume", env=server.env(), cwd=tmp_path, stdin=subprocess.PIPE) as proc:
            out = LineReader(proc)
            assert out.line() == "A trip to the lakes, then."
            assert proc.stdin is not None
            proc.stdin.close()  # the person leaves: input() ends the loop with EOFError
            proc.wait(timeout=TIMEOUT)
            assert out.rest() == ["> "]

    assert len(requests) == 3
    assert requests[0]["system"] == "You are a helpful assistant."
    assert requests[0]["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Plan a weekend."}]}
    ]
    assert requests[1]["messages"][-1] == {
        "role": "user",
        "content": [{"type": "text", "text": "Somewhere with lakes."}],
    }
    assert requests[2]["messages"] == requests[1]["messages"]  # the same conversation
    state = store.load(saved.id)
    assert [(e.kind, e.text) for e in state.history] == [
        ("task", "Plan a weekend."),
        ("model", "Hello! What shall we plan?"),
        ("user", "Somewhere with lakes."),
        ("model", "A trip to the lakes, then."),
    ]
    assert state.stopped_by == "reply"

    # A folder per State, readable only by its owner.
    root = tmp_path / ".agent-runs"
    assert [p.name for p in root.iterdir()] == [saved.id]
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert stat.S_IMODE((root / saved.id).stat().st_mode) == 0o700
    files = sorted((root / saved.id).iterdir())
    assert [f.name for f in files] == ["entries.jsonl", "snapshot.json"]
    assert {stat.S_IMODE(f.stat().st_mode) for f in files} == {0o600}


@pytest.mark.crash
def test_chat_loop_saves_the_message_before_the_next_run(tmp_path: Path) -> None:
    # chat.py runs unchanged; a wrapper holds its second agent.run before it does anything,
    # so only agent.save(state) can have saved the person's message when the kill comes.
    shutil.copy(SCRIPTS / "chat.py", tmp_path / "chat.py")
    requests: list[dict[str, Any]] = []

    def respond(body: dict[str, Any]) -> dict[str, Any]:
        requests.append(body)
        return message(text("Hello! What shall we plan?"))

    with loopback(respond) as server:
        with child(
            "chat_stopped_before_run.py", env=server.env(), cwd=tmp_path, stdin=subprocess.PIPE
        ) as proc:
            out = LineReader(proc)
            _type(proc, "Plan a weekend.")
            assert out.line() == "> Hello! What shall we plan?"
            _type(proc, "Somewhere with lakes.")
            wait_for_file(tmp_path / "second-run.started", proc)
            sigkill(proc)
            out.rest()

    assert len(requests) == 1
    store = FileStore(tmp_path / ".agent-runs")
    [saved] = store.list()
    assert stored_kinds(store, saved.id) == ["task", "model", "user"]
    state = store.load(saved.id)
    assert state.history[-1].text == "Somewhere with lakes."
