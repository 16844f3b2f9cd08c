"""Shared parts of the child processes the crash tests start and kill.

Every child takes: STORE (a FileStore folder), STATE_ID, WORK (a folder for counters and
readiness markers), MODE (``run`` or ``arun``) and ``--resume`` (load the State and run it
again instead of creating it). Tools record each run in ``WORK/<tool>.count`` and create
``WORK/<tool>.started`` before they block, so the parent knows when to kill. In a resumed
child nothing blocks: a tool run again shows up in its count, not as a hang.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from alpineagents import Agent, State
from alpineagents.model import ModelRequest

# Set by parse_args().
ARGS = argparse.Namespace()
WORK = Path()
RESUMED = False
PHASE = "first"

# Ctrl+C is a KeyboardInterrupt here even when the tests were started with SIGINT ignored
# (a shell's background job, nohup): Python installs its handler only if SIGINT was not.
signal.signal(signal.SIGINT, signal.default_int_handler)


def parse_args(*extra: str) -> argparse.Namespace:
    """Parse STORE STATE_ID WORK MODE, then ``extra`` positionals, then ``--resume``."""
    global ARGS, WORK, RESUMED, PHASE
    parser = argparse.ArgumentParser()
    parser.add_argument("store")
    parser.add_argument("state_id")
    parser.add_argument("work", type=Path)
    parser.add_argument("mode", choices=["run", "arun"])
    for name in extra:
        parser.add_argument(name)
    parser.add_argument("--resume", action="store_true")
    ARGS = parser.parse_args()
    WORK, RESUMED = ARGS.work, ARGS.resume
    PHASE = "resumed" if RESUMED else "first"
    return ARGS


BLOCK_SECONDS = 60  # longer than any test waits: the parent kills before it ends


def signal_ready(name: str, content: str = "") -> None:
    """Create WORK/name with its content at once (write, then rename)."""
    temp = WORK / f".{name}.{os.getpid()}.tmp"
    temp.write_text(content)
    os.replace(temp, WORK / name)


def record(name: str) -> None:
    with open(WORK / f"{name}.count", "a") as counter:
        counter.write(f"{PHASE}\n")


def block(name: str) -> None:
    signal_ready(f"{name}.started")
    if not RESUMED:
        time.sleep(BLOCK_SECONDS)


async def ablock(name: str) -> None:
    signal_ready(f"{name}.started")
    if not RESUMED:
        await asyncio.sleep(BLOCK_SECONDS)


def slow_tool(x: str) -> str:
    """Takes long (blocks its thread)."""
    record("slow_tool")
    block("slow_tool")
    return f"slow {x}"


async def slow_async_tool(x: str) -> str:
    """Takes long (awaits)."""
    record("slow_async_tool")
    await ablock("slow_async_tool")
    return f"slow async {x}"


def fast_tool(x: str) -> str:
    """Returns at once."""
    record("fast_tool")
    return f"fast {x}"


def exit_tool() -> str:
    """Ends the process with sys.exit(3)."""
    record("exit_tool")
    sys.exit(3)


TOOLS: list[Callable[..., Any]] = [slow_tool, slow_async_tool, fast_tool, exit_tool]


def tool_call(name: str, **tool_input: Any) -> dict[str, Any]:
    """A tool call block with an id unique across processes."""
    return {
        "type": "tool_call",
        "id": f"call_{uuid.uuid4().hex[:12]}",
        "name": name,
        "input": tool_input,
    }


def tool_results(request: ModelRequest) -> dict[str, str]:
    """The results in a request, by the name of the tool that was called."""
    names = {
        block["id"]: block["name"]
        for message in request.messages
        for block in message["content"]
        if block["type"] == "tool_call"
    }
    return {
        names[block["call_id"]]: block["content"]
        for message in request.messages
        for block in message["content"]
        if block["type"] == "tool_result"
    }


def log_request(request: ModelRequest) -> None:
    """Append the request to WORK/requests-<phase>.jsonl (kept when the process is killed)."""
    line = json.dumps({"purpose": request.purpose, "messages": request.messages})
    with open(WORK / f"requests-{PHASE}.jsonl", "a") as log:
        log.write(line + "\n")


def run(agent: Agent, state: State) -> Any:
    if ARGS.mode == "run":
        return agent.run(state)
    return asyncio.run(agent.arun(state))


def print_answer(answer: Any) -> None:
    print(json.dumps({"answer": answer}), flush=True)
