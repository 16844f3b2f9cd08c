"""Helpers shared by the test modules: offline scripts, small stores, and the two modes.

Test modules import from here, never from each other.
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import io
import json
import logging
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from alpineagents import Agent, FileStore, SavedState, State, Store
from alpineagents.history import MODEL, TOOL_RESULT, ModelData
from alpineagents.model import ModelRequest
from alpineagents.store import Record
from alpineagents.testing import FunctionModel, TestModel, call

if TYPE_CHECKING:
    import pytest

Mode = Literal["sync", "async"]

# ``make(versioned=False) -> name``: a new, empty bucket (the ``moto_bucket`` fixture).
MakeBucket = Callable[..., str]

ROOT = Path(__file__).resolve().parent.parent


def run_bench(
    script: str, *args: str, timeout: float, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python bench/<script> <args>`` as a user starts it; a failed run fails the test with
    the end of what it printed on stderr."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


# S3 servers ----------------------------------------------------------------------------------


# Dummy credentials moto and LocalStack accept; the machine's AWS configuration is kept out.
AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",
}
AWS_UNSET = (
    "AWS_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_RETRY_MODE",
    "AWS_MAX_ATTEMPTS",
)


def bench_module(name: str) -> Any:
    """The module ``bench/<name>.py``, imported as the bench scripts import each other."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "bench"))


def _moto_modules_listed_once() -> None:
    """Make moto's server list its own service modules once, not at every request.

    For each request it cannot route by path, moto's server looks for the service in
    ``moto.backends.list_of_moto_modules()``, which lists moto's package folder and stats
    every entry in it: about a sixth of the CPU an S3 request costs here, client and server.
    The folder does not change while the tests run, so its listing is kept; what moto answers
    is the same.
    """
    from moto import backends

    if getattr(backends.list_of_moto_modules, "listed_once", False):
        return
    modules = tuple(backends.list_of_moto_modules())

    def listed() -> tuple[str, ...]:
        return modules

    listed.listed_once = True  # type: ignore[attr-defined]
    backends.list_of_moto_modules = listed


@contextmanager
def moto_server() -> Iterator[str]:
    """moto's S3 server (ThreadedMotoServer) on 127.0.0.1, a free port, while the block runs.

    moto is imported here, so a test run that starts no server never imports it.
    """
    from moto.server import ThreadedMotoServer

    _moto_modules_listed_once()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


# Running in either mode --------------------------------------------------------------------


async def run(mode: Mode, agent: Agent, state: State) -> Any:
    """``agent.run(state)`` on a worker thread (it refuses a running loop), or ``arun``."""
    if mode == "async":
        return await agent.arun(state)
    return await asyncio.to_thread(agent.run, state)


# Models ------------------------------------------------------------------------------------


@contextmanager
def paused_in_a_thread(
    paused: Callable[[], AbstractContextManager[None]],
) -> Iterator[Callable[[], None]]:
    """Hold ``with paused():`` (a garbage-collector pause) in another thread while the block
    runs. Yields the call that ends it there (and waits for that thread); the block's end
    calls it too."""
    inside, leave = threading.Event(), threading.Event()

    def hold() -> None:
        with paused():
            inside.set()
            leave.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()

    def release() -> None:
        leave.set()
        thread.join(10)

    try:
        assert inside.wait(10)
        yield release
    finally:
        release()


def big_state(n: int, reply: str = "Let me look that up. " * 4) -> State:
    """A State of ``n`` entries (odd): model responses with a tool call, and their results."""
    state = State("many steps", id="big")
    while len(state.history) < n:
        k = len(state.history)
        if k % 2:
            tool_call = {"type": "tool_call", "id": f"c{k}", "name": "lookup", "input": {"q": k}}
            data = ModelData([{"type": "text", "text": reply}, tool_call], "tool_use").to_data()
            state.append(MODEL, reply, data)
        else:
            result = {"call_id": f"c{k - 1}", "name": "lookup"}
            state.append(TOOL_RESULT, "row,value\n" * 40, result)
    return state


def script(*replies: Any) -> FunctionModel:
    """A model that gives these replies in order."""
    queue = list(replies)

    def respond(request: ModelRequest) -> Any:
        if not queue:
            raise AssertionError("the model was asked more often than scripted")
        reply = queue.pop(0)
        return reply(request) if callable(reply) else reply

    return FunctionModel(respond)


def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def make_states(store: Store, count: int, prefix: str = "run") -> list[str]:
    """Run ``count`` States to their finish in ``store`` (5 entries each); their ids."""
    ids = []
    for i in range(count):
        state = State(f"task {i}\nsecond line", id=f"{prefix}-{i}", data={"i": i})
        Agent(TestModel(answer=f"answer {i}"), tools=[add], store=store).run(state)
        ids.append(state.id)
    return ids


# Reading a State ---------------------------------------------------------------------------


def results(state: State) -> list[tuple[str, str, bool]]:
    """The tool results of a State as (tool name, text, is_error)."""
    found = []
    for entry in state.history:
        if entry.kind == TOOL_RESULT:
            result = entry.as_tool_result()
            found.append((result.name, entry.text, result.is_error))
    return found


def kinds(state: State) -> list[str]:
    """The kinds of a State's history entries."""
    return [e.kind for e in state.history]


def stored_kinds(store: Store, state_id: str) -> list[str]:
    """The kinds of the entries the store holds, before any loading adds to them."""
    record = store.read(state_id)
    assert record is not None
    return [e["kind"] for e in sorted(record.entries, key=lambda e: e["seq"])]


def tool_turn(state: State, n: int) -> None:
    """Append a model response calling the tool ``lookup``, and the tool's result."""
    call = {"type": "tool_call", "id": f"call-{n}", "name": "lookup", "input": {"n": n}}
    state.append(MODEL, "", {"content": [call], "stop_reason": "tool_use"})
    state.append(TOOL_RESULT, f"result {n}", {"call_id": f"call-{n}", "name": "lookup"})


# What a save writes, for tests that call ``Store.write`` themselves --------------------------

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def _saved(state: State) -> Record:
    store = MemoryStore()
    store.save(state)
    record = store.read(state.id)
    assert record is not None
    return record


def entry_dicts(first: int, stop: int, text: str = "entry") -> list[dict[str, Any]]:
    """The entries with seqs ``first`` to ``stop - 1`` of a State whose entries read
    ``"{text} {seq}"``, as a save hands them to ``Store.write``; the same each call."""
    state = State(f"{text} 0", id="entries")
    for seq in range(1, stop):
        state.append(TOOL_RESULT, f"{text} {seq}", {"call_id": f"call-{seq}", "name": "t"})
    for seq, entry in enumerate(state.history):
        entry.at = EPOCH + timedelta(seconds=seq)
    return list(_saved(state).entries)[first:]


def snapshot_dict(state_id: str, entries: int, **changes: Any) -> dict[str, Any]:
    """The snapshot a save of a new State ``state_id`` hands to ``Store.write``, accounting for
    ``entries`` entries, with ``changes``; the same each call."""
    state = State("the task", id=state_id)
    state.created_at = EPOCH
    snapshot = dict(_saved(state).snapshot)
    snapshot.update({"updated_at": EPOCH.isoformat(), "entries": entries, **changes})
    return snapshot


def entries_beyond_snapshot(store: FileStore, state: State, *entries: dict[str, Any]) -> None:
    """Store entries without a snapshot, as a save that stopped halfway leaves them."""
    store.write(state.id, list(entries), None)


# Stores ------------------------------------------------------------------------------------


class MemoryStore(Store):
    """A small in-memory store, written the way a user would."""

    def __init__(self) -> None:
        self._states: dict[str, tuple[dict[int, dict[str, Any]], dict[str, Any]]] = {}
        self._lock = threading.Lock()

    def write(
        self,
        state_id: str,
        entries: Sequence[dict[str, Any]],
        snapshot: dict[str, Any] | None,
        *,
        create: bool = False,
    ) -> None:
        with self._lock:
            if create:
                if state_id in self._states:
                    raise ValueError(f"id {state_id!r} is taken")
                assert snapshot is not None
                self._states[state_id] = (
                    {e["seq"]: copy.deepcopy(e) for e in entries},
                    copy.deepcopy(snapshot),
                )
                return
            if state_id not in self._states:
                raise KeyError(state_id)
            saved = self._states[state_id][0]
            for entry in entries:
                saved.setdefault(entry["seq"], copy.deepcopy(entry))
            if snapshot is not None:
                self._states[state_id] = (saved, copy.deepcopy(snapshot))

    def read(self, state_id: str) -> Record | None:
        with self._lock:
            if state_id not in self._states:
                return None
            saved, snapshot = self._states[state_id]
            return Record(
                [copy.deepcopy(e) for _, e in sorted(saved.items())], copy.deepcopy(snapshot)
            )

    def list(self) -> list[SavedState]:
        with self._lock:
            found = [SavedState.from_snapshot(i, s) for i, (_, s) in self._states.items()]
        return sorted(found, key=lambda s: s.updated_at, reverse=True)

    def delete(self, state_id: str) -> None:
        with self._lock:
            del self._states[state_id]


class AsyncOver(Store):
    """Another store reached only asynchronously: a store that implements only the async API."""

    def __init__(self, inner: Store) -> None:
        self._inner = inner

    async def awrite(
        self,
        state_id: str,
        entries: Sequence[dict[str, Any]],
        snapshot: dict[str, Any] | None,
        *,
        create: bool = False,
    ) -> None:
        self._inner.write(state_id, entries, snapshot, create=create)

    async def aread(self, state_id: str) -> Record | None:
        return self._inner.read(state_id)

    async def alist(self) -> list[SavedState]:
        return self._inner.list()

    async def adelete(self, state_id: str) -> None:
        self._inner.delete(state_id)


class AsyncMemoryStore(AsyncOver):
    """A MemoryStore reached only asynchronously."""

    def __init__(self) -> None:
        super().__init__(MemoryStore())


class RecordingStore(MemoryStore):
    """Records every write as (seqs of entries, snapshot written?, create)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[tuple[list[int], bool, bool]] = []

    def write(
        self,
        state_id: str,
        entries: Sequence[dict[str, Any]],
        snapshot: dict[str, Any] | None,
        *,
        create: bool = False,
    ) -> None:
        super().write(state_id, entries, snapshot, create=create)
        self.writes.append(([e["seq"] for e in entries], snapshot is not None, create))


class FailingStore(MemoryStore):
    """Fails writes while ``failing`` is set, with the given exception."""

    def __init__(self) -> None:
        super().__init__()
        self.failing: BaseException | None = None
        self.fail_when: Any = lambda entries, snapshot: True

    def write(
        self,
        state_id: str,
        entries: Sequence[dict[str, Any]],
        snapshot: dict[str, Any] | None,
        *,
        create: bool = False,
    ) -> None:
        if self.failing is not None and self.fail_when(entries, snapshot):
            raise self.failing
        super().write(state_id, entries, snapshot, create=create)


def disk_full() -> OSError:
    """The error of a full disk."""
    return OSError(28, "No space left on device")


# S3 buckets --------------------------------------------------------------------------------


def bucket_maker(client: Any) -> MakeBucket:
    """``make(versioned=False) -> name``: creates a new, empty bucket through a boto3 client."""

    def make(*, versioned: bool = False) -> str:
        name = f"t-{uuid.uuid4().hex[:20]}"
        client.create_bucket(Bucket=name)
        if versioned:
            client.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
        return name

    return make


# A State an Agent ran, for the tests of the stored form ---------------------------------------

REPLY = "Let me look that up. " * 4


def lookup(q: str) -> str:
    """Look something up."""
    return f"rows for {q}"


def agent_state(store: FileStore, steps: int = 3) -> State:
    """A State an Agent ran for ``steps`` tool-using steps, saved in ``store``."""
    made = 0

    def respond(request: Any) -> Any:
        nonlocal made
        made += 1
        if made > steps:
            return "All done."
        return [{"type": "text", "text": REPLY}, call("lookup", q=f"q{made}")]

    agent = Agent(FunctionModel(respond), tools=[lookup], store=store)
    state = State("look things up", id="run")
    agent.run(state)
    return state


def stored_lines(store: FileStore, state_id: str) -> list[dict[str, Any]]:
    """The JSON lines of a State's entries.jsonl."""
    text = (store.path / state_id / "entries.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


# The command line ----------------------------------------------------------------------------


class CliRun:
    """``alpineagents.cli.main(argv)``'s status and what it printed (the ``cli`` fixture)."""

    def __init__(self, capsys: pytest.CaptureFixture[str], *argv: str):
        from alpineagents.cli import main

        self.status = main(list(argv))
        captured = capsys.readouterr()
        self.out, self.err = captured.out, captured.err

    def error_line(self) -> str:
        lines = self.err.splitlines()
        assert len(lines) == 1, self.err
        assert lines[0].startswith("alpineagents: error: ")
        assert "Traceback" not in self.err
        return lines[0]


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True
