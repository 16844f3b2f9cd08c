"""``S3Store.pack`` with whichever alpineagents is installed: this repository's core, or a
published release (0.4.0: snapshot contract, 0.7.1: info contract).

A State saved through the Store contract, or by the core itself, is packed (with and without
``remove_entries``) and must read and load through the core as it did before; the core's own
save path then saves on top of the packed State. Last, the core's own Agent is killed in a
tool, the State is packed with its entries removed, and a new process resumes it with the
core's Agent (the children of test_agent_e2e.py, ``children/agent_run.py``).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

import alpineagents
import alpineagents.store
import alpineagents.testing
from alpineagents_s3 import Packed, S3Store

# (conftest.py cannot be imported under --import-mode=importlib: these lines stand twice.)
CORE_VERSION = metadata.version("alpineagents")
GENERATION = "info" if hasattr(alpineagents.store, "StateInfo") else "snapshot"
MakeStore = Callable[..., S3Store]

CHILD = Path(__file__).resolve().parent / "children" / "agent_run.py"
ANSWER = "Booked AA100."  # what agent_run.py's scripted model answers
TIMEOUT = 60


@pytest.fixture(params=["sync", "async"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=[False, True], ids=["entries-kept", "entries-removed"])
def remove_entries(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


def call(store: S3Store, mode: str, name: str, *args: Any, **kwargs: Any) -> Any:
    """``store.name(...)``, or ``asyncio.run(store.aname(...))`` in mode ``async``."""
    if mode == "sync":
        return getattr(store, name)(*args, **kwargs)
    return asyncio.run(getattr(store, "a" + name)(*args, **kwargs))


def pack(store: S3Store, mode: str, state_id: str, remove_entries: bool) -> Packed:
    packed: Packed = call(store, mode, "pack", state_id, remove_entries=remove_entries)
    return packed


def small_of(record: Any) -> Any:
    return getattr(record, "info" if GENERATION == "info" else "snapshot")


def entry_kinds(store: S3Store, state_id: str) -> list[str]:
    """The kinds of the State's objects (``S3Store.objects``), sorted."""
    return sorted(o.kind for o in store.objects(state_id))


# Through the Store contract ------------------------------------------------------------------

# Values a JSON round trip could change, and ~150 KB a text: 10 entries are two segments.
ODD = {
    "float": 0.1 + 0.2,
    "big": 2**63 + 1,
    "text": 'caf\u00e9 \u2603 \U0001f600 \\ "',
    "nil": None,
}
LONG = "0123456789abcdef" * 9_600


def entries(start: int, stop: int) -> list[dict[str, Any]]:
    return [
        {"seq": seq, "kind": "note", "text": f"{seq}: {LONG}", "data": dict(ODD, n=[seq, {}])}
        for seq in range(start, stop)
    ]


def small(n: int) -> dict[str, Any]:
    return {"v": 1, "history_len": n, "data": ODD}


def test_a_state_written_through_the_contract_reads_the_same_packed(
    make_store: MakeStore, mode: str, remove_entries: bool
) -> None:
    writer, reader = make_store(), make_store()
    call(writer, mode, "write", "contract", entries(0, 4), small(4), create=True)
    call(writer, mode, "write", "contract", entries(4, 10), small(10))
    before = call(reader, mode, "read", "contract")
    assert list(before.entries) == entries(0, 10)

    packed = pack(make_store(), mode, "contract", remove_entries)
    assert packed.covered == 10 and len(packed.written) == 2, packed
    kinds = entry_kinds(reader, "contract")
    assert kinds.count("segment") == 2
    assert kinds.count("entry") == (0 if remove_entries else 10)
    after = call(make_store(), mode, "read", "contract")
    assert list(after.entries) == list(before.entries)
    assert small_of(after) == small_of(before) == small(10)

    # The writer saves on, on top of the packed State; a new store object reads it all.
    call(writer, mode, "write", "contract", entries(10, 12), small(12))
    again = call(make_store(), mode, "read", "contract")
    assert list(again.entries) == entries(0, 12) and small_of(again) == small(12)


# Through the core's own State and save path --------------------------------------------------


def new_state(state_id: str, task: str) -> Any:
    """A State made by the installed core's public API."""
    core: Any = alpineagents  # the 0.5+ calls are not this repository's core's
    if "messages" in inspect.signature(core.State).parameters:  # 0.5+
        return core.State(id=state_id, messages=[core.Message.user(task)])
    return core.State(task, id=state_id)


def add_message(state: Any, text: str) -> None:
    """A user message added to ``state`` by the installed core's public API."""
    if hasattr(state, "add_user_message"):  # 0.2-0.4 and this repository's core
        state.add_user_message(text)
    else:  # 0.5+
        core: Any = alpineagents
        state.add_message(core.Message.user(text))


def save(store: S3Store, state: Any, mode: str) -> None:
    """Save the way the installed core does: ``store.save`` (0.5+), else ``agent.save``."""
    core: Any = alpineagents
    if GENERATION == "info":
        saver: Any = store
    elif hasattr(core.testing, "FakeModel"):  # published 0.2-0.4
        saver = core.Agent(model=core.testing.FakeModel([]), store=store, reporter=None)
    else:  # this repository's core
        saver = core.Agent(model=core.testing.TestModel(), store=store)
    if mode == "sync":
        saver.save(state)
    else:
        asyncio.run(saver.asave(state))


def saved_by_the_core(
    make_store: MakeStore,
    store: S3Store,
    mode: str,
    state_id: str,
    task: str,
    *,
    messages: int,
    size: int,
) -> Any:
    """A State the core saved, then saved again after each of ``messages`` messages.

    The last message is saved by another store object, which loads the State first: its
    save replaces the snapshot, which then counts every entry. (The saves of one message
    before it may commit by their entry alone; ``pack`` packs what the snapshot counts.)
    """
    state = new_state(state_id, task)
    save(store, state, mode)
    for n in range(messages - 1):
        add_message(state, f"message {n}: " + "\u00e9" * size)
        save(store, state, mode)
    other = make_store()
    state = call(other, mode, "load", state_id)
    add_message(state, f"message {messages - 1}: " + "\u00e9" * size)
    save(other, state, mode)
    return state


def test_a_state_the_core_saved_loads_the_same_packed_and_saves_on(
    make_store: MakeStore, mode: str, remove_entries: bool
) -> None:
    store = make_store()
    state = saved_by_the_core(make_store, store, mode, "core", "pack me", messages=6, size=200)
    before = call(make_store(), mode, "load", "core")
    record = call(make_store(), mode, "read", "core")
    assert len(before.history) == len(state.history) == len(record.entries)

    packed = pack(make_store(), mode, "core", remove_entries)
    assert packed.covered == len(record.entries) and len(packed.written) == 1
    assert entry_kinds(store, "core").count("entry") == (
        0 if remove_entries else len(record.entries)
    )
    after = call(make_store(), mode, "load", "core")
    assert after.history == before.history
    assert after.id == "core"
    again = call(make_store(), mode, "read", "core")
    assert list(again.entries) == list(record.entries)
    assert small_of(again) == small_of(record)

    # The core's own save path, on the loaded (packed) State, from another store object.
    continued = make_store()
    loaded = call(continued, mode, "load", "core")
    add_message(loaded, "after the pack")
    save(continued, loaded, mode)
    reloaded = call(make_store(), mode, "load", "core")
    assert len(reloaded.history) == len(before.history) + 1
    assert reloaded.history[: len(before.history)] == before.history
    assert reloaded.history == loaded.history
    # And packed again: what was saved since joins the segment.
    repacked = pack(make_store(), mode, "core", remove_entries)
    assert repacked.covered == len(loaded.history)
    assert call(make_store(), mode, "load", "core").history == loaded.history


def test_a_load_through_an_auto_pack_store_packs_what_the_core_saved(
    make_store: MakeStore, mode: str
) -> None:
    store = make_store()
    saved_by_the_core(
        make_store, store, mode, "auto", "pack me as you load me", messages=8, size=100
    )
    record = call(make_store(), mode, "read", "auto")
    before = call(make_store(), mode, "load", "auto")
    assert "segment" not in entry_kinds(store, "auto")

    # The core's own load, through a store that packs as it loads: the same State, and one
    # segment of the entries the snapshot counts (0.4.0 saves the last ones beyond it).
    loaded = call(make_store(auto_pack=2), mode, "load", "auto")
    assert loaded.history == before.history
    assert entry_kinds(store, "auto").count("segment") == 1
    again = call(make_store(), mode, "read", "auto")
    assert list(again.entries) == list(record.entries)
    assert small_of(again) == small_of(record)

    # The core saves on from that load, through the same store object; all of it loads.
    packing = make_store(auto_pack=2)
    loaded = call(packing, mode, "load", "auto")
    add_message(loaded, "after the pack")
    save(packing, loaded, mode)
    assert call(make_store(), mode, "load", "auto").history == loaded.history


# The core's Agent resumes a packed State ----------------------------------------------------


def async_support() -> str | None:
    """``None`` if the installed core has ``Agent.arun`` and ``Store.aload``, else why not."""
    arun = getattr(alpineagents.Agent, "arun", None)
    if arun is None or not inspect.iscoroutinefunction(arun):
        return f"alpineagents {CORE_VERSION} has no async Agent.arun"
    if not inspect.iscoroutinefunction(getattr(alpineagents.store.Store, "aload", None)):
        return f"alpineagents {CORE_VERSION} has no async Store.aload"
    return None


def agent_run(
    command: str, work: Path, moto_url: str, bucket: str, *options: str
) -> subprocess.Popen[bytes]:
    """Start ``children/agent_run.py COMMAND`` (see there); output in ``work/COMMAND.*``."""
    args = [sys.executable, "-P", str(CHILD), command, "--endpoint", moto_url]
    args += ["--bucket", bucket, "--prefix", "runs", *options]
    with open(work / f"{command}.out", "wb") as out, open(work / f"{command}.err", "wb") as err:
        return subprocess.Popen(args, stdout=out, stderr=err, env=dict(os.environ), cwd=work)


def wait_for(path: Path, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not path.exists():
        assert process.poll() is None, f"the child exited {process.returncode} first"
        assert time.monotonic() < deadline, f"{path.name} did not appear in {TIMEOUT} s"
        time.sleep(0.02)


def test_a_killed_run_packed_without_its_entries_resumes_with_the_cores_agent(
    make_store: MakeStore, moto_url: str, bucket: str, tmp_path: Path, mode: str
) -> None:
    reason = async_support() if mode == "async" else None
    if reason is not None:
        pytest.skip(reason)
    state_id = f"packed-{uuid.uuid4().hex[:12]}"
    common = ["--id", state_id, "--mode", mode, "--ledger", str(tmp_path / "ledger")]
    marker, packed_file = tmp_path / "tool-started", tmp_path / "packed"
    first = agent_run("first", tmp_path, moto_url, bucket, *common, "--marker", str(marker))
    # Started now (it starts up meanwhile), it loads the State only once it was packed.
    resume = agent_run("resume", tmp_path, moto_url, bucket, *common, "--after", str(packed_file))
    try:
        wait_for(marker, first)
        os.kill(first.pid, signal.SIGKILL)
        assert first.wait(timeout=TIMEOUT) == -signal.SIGKILL

        store = make_store()
        before = store.read(state_id)
        assert before is not None
        packed = pack(store, mode, state_id, remove_entries=True)
        # The entries the snapshot counts are packed and removed; an entry saved alone after
        # it (published 0.4 saves the model's reply so) stays an object of its own.
        assert 0 < packed.covered <= len(before.entries)
        left = sorted(
            o.seq for o in store.objects(state_id) if o.seq is not None and o.kind == "entry"
        )
        assert left == list(range(packed.covered, len(before.entries)))
        packed_file.touch()

        assert resume.wait(timeout=TIMEOUT) == 0, (tmp_path / "resume.err").read_text()
    finally:
        for process in (first, resume):
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)
    outcome = json.loads((tmp_path / "resume.out").read_text().strip().splitlines()[-1])
    assert "error" not in outcome, outcome["error"]["traceback"]
    assert outcome["answer"] == ANSWER
    history = outcome["history"]
    calls = [e["id"] for e in history if e["kind"] == "call" and e["name"] == "book_flight"]
    assert len(calls) == 1, history
    # The core's own result for the call the killed process never saved a result of; the
    # tool did not run again.
    (result,) = [e["text"] for e in history if e["kind"] == "result" and e["call_id"] == calls[0]]
    assert result.startswith("(unknown:") and "may or may not have run" in result, result
    assert len((tmp_path / "ledger").read_text().splitlines()) == 1
    # A new store object reads the resumed run back: the segment, then the entries saved since.
    assert outcome["reloaded"] == history
    record = store.read(state_id)
    assert record is not None
    assert list(record.entries)[: len(before.entries)] == list(before.entries)
    assert len(record.entries) > len(before.entries)
