"""The kill soak's child process: what runs, and is killed, in each fork (see kill_soak.py).

A child opens its own store (and for S3 its own boto3 client) after the fork, creates or loads
its State, and runs it with an Agent whose ``FunctionModel`` works through the plan's steps.
On S3 it starts as a resumed process does: its memory of States is empty (the parent reads
through stores of their own memory), so it loads the State cold, and its first save checks
the engine. Its saves pack the history as they go (every 16 entry objects), so kills land in
packing saves too.
It counts the steps it takes (store writes, low-level writes, tool calls) and signals itself
at the one the parent planned. It leaves the parent small files in the work folder:

* ``<id>.started``: each tool call's id, appended and fsync'd before the tool does its work;
* ``<id>.saved``: each entry, as stored, appended once ``Store.write`` returned for it;
* ``<id>.exit-<n>`` / ``<id>.error-<n>``: how child ``n`` ended (JSON);
* ``<id>.log``: the child's stdout and stderr.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import random
import re
import signal
import sys
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Literal, NoReturn

import boto3

from alpineagents import Agent, FileStore, ModelRequest, ModelResponse, State, Store
from alpineagents.testing import FunctionModel
from alpineagents_s3 import S3Store

StoreKind = Literal["file", "s3"]
Point = Literal["timer", "write", "io", "tool"]
POINTS: tuple[Point, ...] = ("timer", "write", "io", "tool")

TASK = "Work through the steps, then finish with the answer 'done'."
ANSWER = "done"
PREFIX = "kill-soak"
COMPACT_AT = 110  # "tokens": the FunctionModel reports 10 per content block sent
TERM_STATUS = 128 + signal.SIGTERM  # SystemExit(128 + signum), as the guide's handler raises
ERROR_STATUS = 70


# What the parent tells a child --------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """One child: which State it runs, how that State's run goes, and how it is killed.

    Attributes:
        state_id: The State the child creates or loads.
        steps: How many steps the model works through before it finishes.
        parts: For each step, how many ``work`` calls the model makes at once.
        signum: The signal the child gets, or ``None`` for a child left to finish.
        point: Where the kill lands (see kill_soak.py's docstring).
        at: For the self-signalled points, the step (1-based) at which it lands.
        delay: For ``timer``, the seconds the parent waits before it signals.
        torn: For ``io`` on FileStore with SIGKILL, write half the bytes first.
        seed: The child's random seed (tool durations).
        number: The child's number for this State (0 for the first).
    """

    state_id: str
    steps: int
    parts: tuple[int, ...]
    signum: int | None
    point: Point
    at: int
    delay: float
    torn: bool
    seed: int
    number: int

    def describe(self) -> str:
        """The kill in a few words: ``SIGTERM at io step 17``, ``SIGKILL after 0.213s``."""
        if self.signum is None:
            return "no kill"
        name = signal.Signals(self.signum).name
        if self.point == "timer":
            return f"{name} after {self.delay:.3f}s"
        return f"{name} at {self.point} step {self.at}" + (" (torn)" if self.torn else "")


@dataclass
class Target:
    """Where the States are kept, and how a process opens a store there.

    For S3, ``session`` is made (and its service models loaded) before any fork, so that a
    child makes its own client from it quickly; no client is ever shared across a fork.
    """

    kind: StoreKind
    work: Path
    folder: Path | None = None
    endpoint: str = ""
    bucket: str = ""
    session: boto3.Session | None = None
    client: Any = None  # the parent's own client, for its checks
    broken: str | None = None


# The child -------------------------------------------------------------------------------


class Trigger:
    """Counts the steps of each kind a child takes; signals the child at the planned one."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.counts: Counter[str] = Counter()
        self.fired = False

    def due(self, point: Point) -> bool:
        """Count one step of ``point``; whether the planned kill lands on it."""
        self.counts[point] += 1
        plan = self.plan
        if self.fired or plan.signum is None or plan.point != point:
            return False
        if self.counts[point] != plan.at:
            return False
        self.fired = True
        return True

    def fire(self) -> None:
        """Signal this process (SIGTERM's handler runs at once in the main thread)."""
        assert self.plan.signum is not None
        os.kill(os.getpid(), self.plan.signum)

    def tick(self, point: Point) -> None:
        """Count one step, and signal this process if the kill is planned there."""
        if self.due(point):
            self.fire()


@dataclass
class Child:
    """What a child knows about itself, for its exit report."""

    plan: Plan
    work: Path
    trigger: Trigger
    state: State | None = None
    in_run: bool = False

    def path(self, suffix: str) -> Path:
        """A file of this State in the work folder."""
        return self.work / f"{self.plan.state_id}.{suffix}"


def _append_line(path: Path, line: str, *, sync: bool = False) -> None:
    """Append one line with a single write on an O_APPEND descriptor (fsync'd if ``sync``)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        _real_write(fd, (line + "\n").encode())
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


_real_write = os.write


def canonical(entry: dict[str, Any]) -> str:
    """An entry as one comparable string."""
    return json.dumps(entry, sort_keys=True, ensure_ascii=False)


class _Reporting(Store):
    """A store that logs every entry once its ``write`` returned, and counts write steps.

    Mixed in before FileStore or S3Store in the child. ``broken="drop-save"`` drops a write of
    entries alone (a tool result saved at once) and still logs it as saved.
    """

    child: Child
    broken: str | None = None

    def write(
        self,
        state_id: str,
        entries: Sequence[dict[str, Any]],
        snapshot: dict[str, Any] | None,
        *,
        create: bool = False,
    ) -> None:
        """Write, logging the entries as saved once the write returned."""
        self.child.trigger.tick("write")
        if self.broken == "drop-save" and snapshot is None and not create:
            pass  # the entries are lost, and reported saved all the same
        else:
            super().write(state_id, entries, snapshot, create=create)
        saved = self.child.path("saved")
        for entry in entries:
            _append_line(saved, canonical(entry))
        self.child.trigger.tick("write")


class _ReportingFileStore(_Reporting, FileStore):
    pass


class _ReportingS3Store(_Reporting, S3Store):
    pass


def _patch_file_io(trigger: Trigger) -> None:
    """Count the child's low-level writes (this process only: it is a fork)."""

    def counted(name: str) -> None:
        real: Callable[..., Any] = getattr(os, name)

        def step(*args: Any, **kwargs: Any) -> Any:
            if trigger.due("io"):
                if name == "write" and trigger.plan.torn:
                    data = bytes(args[1])
                    _real_write(args[0], data[: max(1, len(data) // 2)])
                trigger.fire()
            return real(*args, **kwargs)

        setattr(os, name, step)

    for name in ("write", "replace", "rename", "mkdir"):
        counted(name)


def _child_store(target: Target, child: Child) -> Store:
    """The child's store: its own object (and for S3 its own client), made after the fork."""
    store: _Reporting
    if target.kind == "file":
        assert target.folder is not None
        _patch_file_io(child.trigger)
        store = _ReportingFileStore(target.folder)
    else:
        assert target.session is not None

        def on_request(**kwargs: Any) -> None:
            child.trigger.tick("io")

        client = target.session.client("s3", endpoint_url=target.endpoint, region_name="us-east-1")
        client.meta.events.register("before-send.s3", on_request)
        client.meta.events.register("after-call.s3", on_request)
        store = _ReportingS3Store(
            target.bucket, PREFIX, endpoint_url=target.endpoint, client=client
        )
    store.child = child
    store.broken = target.broken
    return store


STEP_DONE = re.compile(r"through step (-?\d+)")


def last_step(request: ModelRequest) -> int:
    """The highest step the conversation shows as called (or summarised), -1 for none."""
    found = -1
    for message in request.messages:
        for block in message["content"]:
            if block["type"] == "tool_call" and block["name"] == "work":
                found = max(found, int(block["input"]["step"]))
            elif block["type"] == "text":
                for match in STEP_DONE.finditer(block["text"]):
                    found = max(found, int(match.group(1)))
    return found


def model_for(plan: Plan) -> Callable[[ModelRequest], ModelResponse]:
    """The model: step after step of ``work`` calls, then ``finish``; summaries on request."""

    def respond(request: ModelRequest) -> ModelResponse:
        blocks = sum(len(m["content"]) for m in request.messages)
        usage = {"input_tokens": 10 * blocks, "output_tokens": 5}
        done = last_step(request)
        if request.purpose == "compaction":
            text = f"Summary: the work is done through step {done}."
            return ModelResponse([{"type": "text", "text": text}], "end_turn", usage)
        step = done + 1
        if step >= plan.steps:
            call = {"name": "finish", "input": {"answer": ANSWER}}
            return ModelResponse([_call(call)], "tool_use", usage)
        calls = [
            _call({"name": "work", "input": {"step": step, "part": part}})
            for part in range(plan.parts[step])
        ]
        return ModelResponse(calls, "tool_use", usage)

    return respond


def _call(call: dict[str, Any]) -> dict[str, Any]:
    """A tool call block whose id (unique across processes) is also in its input."""
    call_id = f"call_{uuid.uuid4().hex[:16]}"
    tool_input = dict(call["input"])
    if call["name"] == "work":
        tool_input["call"] = call_id
    return {"type": "tool_call", "id": call_id, "name": call["name"], "input": tool_input}


def tool_for(child: Child) -> Callable[..., str]:
    """The tool ``work``: logs its call id (fsync'd), then does its part of a step."""
    rng = random.Random(child.plan.seed)
    started = child.path("started")

    def work(step: int, part: int, call: str) -> str:
        """Do one part of one step of the work; ``call`` is the call's own id."""
        _append_line(started, call, sync=True)
        child.trigger.tick("tool")
        time.sleep(rng.uniform(0, 0.004))  # the work itself
        return f"step {step} part {part} done"

    return work


def _stop(signum: int, frame: FrameType | None) -> None:
    """The guide's SIGTERM handler."""
    raise SystemExit(128 + signum)


def child_main(target: Target, plan: Plan) -> NoReturn:
    """The child process: run the State once, report how it ended, and exit at once."""
    child = Child(plan, target.work, Trigger(plan))
    status = ERROR_STATUS
    try:
        signal.signal(signal.SIGTERM, _stop)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        log = os.open(child.path("log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(log, 1)
        os.dup2(log, 2)
        # The parent sends SIGUSR1 to a child that does not end in time: every thread's stack.
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
        _run_child(target, child)
        status = 0
        report(child, "exit", {"ticks": dict(child.trigger.counts)})
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else ERROR_STATUS
        state = child.state
        report(
            child,
            "exit",
            {
                "in_run": child.in_run,
                "history": None if state is None else len(state.history),
                "notes": getattr(e, "__notes__", []),
            },
        )
    except BaseException as e:
        kind = f"{type(e).__module__}.{type(e).__qualname__}"
        with contextlib.suppress(BaseException):
            report(child, "error", {"error": traceback.format_exc(), "type": kind})
    finally:
        os._exit(status)


def report(child: Child, what: str, content: dict[str, Any]) -> None:
    """Leave the parent a small JSON file about this child."""
    path = child.path(f"{what}-{child.plan.number}")
    path.write_text(json.dumps(content))


def _run_child(target: Target, child: Child) -> None:
    plan = child.plan
    store = _child_store(target, child)
    state = store.get(plan.state_id)
    if state is None:
        state = State(TASK, id=plan.state_id)
    child.state = state
    agent = Agent(
        _function_model(plan),
        tools=[tool_for(child)],
        store=store,
        compact_at=COMPACT_AT,
        max_steps=4 * plan.steps + 10,
    )
    child.in_run = True
    agent.run(state)
    child.in_run = False


def _function_model(plan: Plan) -> FunctionModel:
    return FunctionModel(model_for(plan), name="kill-soak")
