"""End to end: the installed core's own Agent, killed mid-tool, resumed from an S3Store.

Runs against whichever alpineagents is installed (this repository's core, or a published
release): the Agent runs in child processes (``children/agent_run.py``, which hold the
per-core differences in ``cores.py``). This module only reads the core's public API to know
what to expect (its summary class, whether it has ``arun``). The children talk to the moto
server of the session over HTTP.

1. A child runs an Agent whose offline model calls ``book_flight``; the tool writes a ledger
   line, then blocks, and the child is killed with SIGKILL.
2. A new child loads the State from the bucket and runs it on: the tool call gets the core's
   own "may or may not have run" result, the tool does not run again, the run ends with the
   scripted answer, and ``store.list()`` shows the State with the core's own summary class.
3. Both with ``agent.run`` and with ``await agent.arun`` (skipped, with the reason, on a core
   without ``arun``).
4. Two live processes on one State: the one whose save comes second is refused instead of
   overwriting the other's history.
"""

from __future__ import annotations

import inspect
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import boto3
import pytest

import alpineagents
import alpineagents.store

CHILD = Path(__file__).resolve().parent / "children" / "agent_run.py"
ANSWER = "Booked AA100."  # what the children's scripted model answers
# What the children's lookup_fares returns (children/agent_run.py, with --long).
LONG_RESULT = "fare,price\n" + "".join(f"AA{n},{100 + n}\n" for n in range(60))
TIMEOUT = 60  # the longest any wait here takes
# The installed core's list summary class, by its Store contract generation (as conftest.py).
SUMMARY_CLASS = "StateInfo" if hasattr(alpineagents.store, "StateInfo") else "SavedState"


class Children:
    """Starts child processes and kills whatever is still running at the end of the test."""

    def __init__(self, work: Path, moto_url: str, bucket: str):
        self.work = work
        self.endpoint, self.bucket = moto_url, bucket
        self.base = ["--endpoint", moto_url, "--bucket", bucket, "--prefix", "runs"]
        self.running: list[tuple[subprocess.Popen[bytes], Path, Path]] = []

    def command(self, command: str, *options: str) -> list[str]:
        # -P: neither the cwd nor the script's folder goes on sys.path.
        return [sys.executable, "-P", str(CHILD), command, *self.base, *options]

    def start(self, name: str, command: str, *options: str) -> subprocess.Popen[bytes]:
        out, err = self.work / f"{name}.out", self.work / f"{name}.err"
        with open(out, "wb") as stdout, open(err, "wb") as stderr:
            process = subprocess.Popen(
                self.command(command, *options),
                stdout=stdout,
                stderr=stderr,
                env=dict(os.environ),
                cwd=self.work,
            )
        self.running.append((process, out, err))
        return process

    def output(self, process: subprocess.Popen[bytes]) -> tuple[str, str]:
        for p, out, err in self.running:
            if p is process:
                return out.read_text(), err.read_text()
        raise LookupError(process)

    def finish(self, process: subprocess.Popen[bytes]) -> dict[str, Any]:
        """Wait for ``process`` to exit 0 and return the JSON object it printed."""
        try:
            process.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
            stdout, stderr = self.output(process)
            pytest.fail(f"child did not end in {TIMEOUT} s\nstdout:\n{stdout}\nstderr:\n{stderr}")
        stdout, stderr = self.output(process)
        assert process.returncode == 0, f"child exited {process.returncode}\n{stderr}"
        lines = stdout.strip().splitlines()
        assert lines, f"child printed nothing\nstderr:\n{stderr}"
        result: dict[str, Any] = json.loads(lines[-1])
        return result

    def wait_for(self, path: Path, process: subprocess.Popen[bytes]) -> None:
        """Wait until ``path`` exists; fail at once if ``process`` ends first."""
        deadline = time.monotonic() + TIMEOUT
        while not path.exists():
            if process.poll() is not None:
                stdout, stderr = self.output(process)
                pytest.fail(
                    f"child exited {process.returncode} before creating {path.name}\n"
                    f"stdout:\n{stdout}\nstderr:\n{stderr}"
                )
            if time.monotonic() > deadline:
                pytest.fail(f"{path.name} did not appear in {TIMEOUT} s")
            time.sleep(0.02)

    def kill_all(self) -> None:
        for process, _, _ in self.running:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)


@pytest.fixture
def children(tmp_path: Path, moto_url: str, bucket: str) -> Iterator[Children]:
    made = Children(tmp_path, moto_url, bucket)
    try:
        yield made
    finally:
        made.kill_all()


def async_support() -> str | None:
    """``None`` if the installed core runs an Agent with ``await agent.arun(state)`` and loads
    with ``await store.aload(id)``, else why not (found out from its public API)."""
    arun = getattr(alpineagents.Agent, "arun", None)
    if arun is None or not inspect.iscoroutinefunction(arun):
        return f"alpineagents {metadata.version('alpineagents')} has no async Agent.arun"
    if not inspect.iscoroutinefunction(getattr(alpineagents.store.Store, "aload", None)):
        return f"alpineagents {metadata.version('alpineagents')} has no async Store.aload"
    return None


@pytest.fixture(params=["sync", "async"])
def mode(request: pytest.FixtureRequest) -> str:
    reason = async_support() if request.param == "async" else None
    if reason is not None:
        pytest.skip(reason)
    return str(request.param)


def new_id() -> str:
    return f"e2e-{uuid.uuid4().hex[:12]}"


def start_pair(
    children: Children, state_id: str, mode: str, first: list[str], resume: list[str]
) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]:
    """Start the first child and the resuming one together (they start up in parallel); the
    resuming one loads the State only once book_flight runs in the first (``--after``) or
    later. Returns when book_flight runs."""
    common = ["--id", state_id, "--mode", mode, "--ledger", str(children.work / "ledger")]
    marker = children.work / "tool-started"
    one = children.start("first", "first", *common, "--marker", str(marker), *first)
    two = children.start("resume", "resume", *common, *resume)
    children.wait_for(marker, one)
    return one, two


def ledger(children: Children) -> list[str]:
    return (children.work / "ledger").read_text().splitlines()


def book_flight_calls(history: list[dict[str, Any]]) -> list[str]:
    return [e["id"] for e in history if e["kind"] == "call" and e["name"] == "book_flight"]


def results_for(history: list[dict[str, Any]], call_id: str) -> list[str]:
    return [e["text"] for e in history if e["kind"] == "result" and e["call_id"] == call_id]


def succeeded(outcome: dict[str, Any]) -> dict[str, Any]:
    assert "error" not in outcome, outcome["error"]["traceback"]
    assert outcome["answer"] == ANSWER
    assert {"kind": "reply", "text": ANSWER} in outcome["history"], outcome["history"]
    assert not [w for w in outcome["warnings"] if w["category"] == "ResumeWarning"]
    return outcome


def refused(outcome: dict[str, Any]) -> dict[str, Any]:
    """The error of a run whose save was refused: the plugin's ConcurrentWriteError."""
    assert "error" in outcome, f"the run was not refused: answer {outcome.get('answer')!r}"
    error: dict[str, Any] = outcome["error"]
    assert "alpineagents_s3.errors.ConcurrentWriteError" in error["mro"], error["traceback"]
    return error


def test_killed_in_a_tool_resumes_from_the_bucket(children: Children, mode: str) -> None:
    state_id = new_id()
    killed = children.work / "killed"
    first, second = start_pair(children, state_id, mode, [], ["--after", str(killed)])

    os.kill(first.pid, signal.SIGKILL)
    first.wait(timeout=TIMEOUT)
    assert first.returncode == -signal.SIGKILL, children.output(first)
    assert len(ledger(children)) == 1
    killed.touch()  # only now does the second process load the State

    resumed = succeeded(children.finish(second))
    assert resumed["summary_class"] == SUMMARY_CLASS
    history = resumed["history"]
    calls = book_flight_calls(history)
    assert len(calls) == 1, history
    # The core's own result for a call whose result was never saved.
    (result,) = results_for(history, calls[0])
    assert "may or may not have run" in result, result
    assert result.startswith("(unknown:"), result
    # The tool ran once, in the killed child; the resumed run did not run it again.
    (line,) = ledger(children)
    assert line.startswith("first "), line
    # The bucket holds the finished run: a new store object reads it back as it ran.
    assert resumed["reloaded"] == history
    assert resumed["list"] == [{"id": state_id, "class": SUMMARY_CLASS}]


def test_second_process_is_refused_after_the_first_saved(children: Children, mode: str) -> None:
    """Both hold the State with the tool call open; the first saves its tool result and
    finishes; the second's save is refused instead of overwriting that."""
    state_id = new_id()
    release, loaded, go = (children.work / n for n in ("release", "loaded", "go"))
    first, second = start_pair(
        children,
        state_id,
        mode,
        ["--release", str(release)],
        ["--after", str(children.work / "tool-started"), "--loaded", str(loaded), "--go", str(go)],
    )
    children.wait_for(loaded, second)  # the second process holds the State, tool call open

    release.touch()  # the first process's tool returns; its run saves the result and ends
    done_first = succeeded(children.finish(first))
    (call,) = book_flight_calls(done_first["history"])
    assert results_for(done_first["history"], call) == ["booked AA100"]

    go.touch()
    done_second = children.finish(second)
    refused(done_second)

    # The bucket keeps the first process's run, with the real result.
    assert done_second["reloaded"] == done_first["history"]
    assert done_second["list"] == [{"id": state_id, "class": SUMMARY_CLASS}]
    assert len(ledger(children)) == 1


def test_first_process_is_refused_after_the_second_took_over(children: Children, mode: str) -> None:
    """The second loads and finishes the State while the first still runs the tool; the
    first's save of the tool result is refused instead of overwriting that."""
    state_id = new_id()
    release = children.work / "release"
    first, second = start_pair(
        children,
        state_id,
        mode,
        ["--release", str(release)],
        ["--after", str(children.work / "tool-started")],
    )
    done_second = succeeded(children.finish(second))
    (call,) = book_flight_calls(done_second["history"])
    (result,) = results_for(done_second["history"], call)
    assert "may or may not have run" in result

    release.touch()
    done_first = children.finish(first)
    refused(done_first)

    # The bucket keeps the second process's run, with the core's unknown result.
    assert done_first["reloaded"] == done_second["history"]
    assert len(ledger(children)) == 1


def test_killed_in_a_tool_after_a_long_result_resumes_with_the_result_whole(
    children: Children, mode: str
) -> None:
    """A ~600-character tool result, then book_flight killed: the resumed run and a new store
    object read the result whole."""
    state_id = new_id()
    killed = children.work / "killed"
    first, second = start_pair(
        children, state_id, mode, ["--long"], ["--after", str(killed), "--long"]
    )
    os.kill(first.pid, signal.SIGKILL)
    first.wait(timeout=TIMEOUT)
    assert first.returncode == -signal.SIGKILL, children.output(first)
    s3 = boto3.client("s3", endpoint_url=children.endpoint, region_name="us-east-1")
    got = s3.get_object(Bucket=children.bucket, Key=f"runs/heads/{state_id}.json")
    assert got["Metadata"] == {"alpineagents-s3": "head"}
    killed.touch()

    resumed = succeeded(children.finish(second))
    history = resumed["history"]
    lookups = [e["id"] for e in history if e["kind"] == "call" and e["name"] == "lookup_fares"]
    assert len(lookups) == 1, history
    assert results_for(history, lookups[0]) == [LONG_RESULT]
    assert len(book_flight_calls(history)) == 1 and len(ledger(children)) == 1
    assert resumed["reloaded"] == history
