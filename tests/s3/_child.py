"""A separate process for the S3Store process tests: ``python -m tests.s3._child MODE ...``.

Modes:
    crash-before-snapshot ENDPOINT BUCKET ID sync|async
        Create a State, add a tool turn and a message, save: SIGKILL itself the moment the
        entries are stored and the snapshot PUT is about to be sent.
    crash-after-tool-result ENDPOINT BUCKET ID
        Create a State whose model turn calls two tools; save one tool result alone (as the
        Agent does while other tools still run), then SIGKILL itself.
    race ENDPOINT BUCKET WRITER
        For each line "go ID" on stdin, create State ID and print "won ID" or
        "lost ID ExceptionType"; print "ready" first.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from alpineagents import _saving
from alpineagents.state import MODEL, TOOL_RESULT, State
from alpineagents_s3 import S3Store


def tool_turn(state: State, *calls: str) -> None:
    content = [
        {"type": "tool_call", "id": call, "name": "lookup", "input": {"what": call}}
        for call in calls
    ]
    state.append(MODEL, "", {"content": content, "stop_reason": "tool_use"})


def crash_before_snapshot(endpoint: str, bucket: str, state_id: str, mode: str) -> None:
    def kill_at_snapshot(request: Any, **kwargs: Any) -> None:
        if request.url.endswith("/snapshot.json") and "If-Match" in request.headers:
            os.kill(os.getpid(), signal.SIGKILL)

    store = S3Store(
        bucket,
        "runs",
        endpoint_url=endpoint,
        event_hooks={"before-send.s3.PutObject": kill_at_snapshot},
    )
    state = State("crash test", id=state_id)
    _saving.save(store, state)
    tool_turn(state, "call-1")
    state.append(TOOL_RESULT, "result 1", {"call_id": "call-1", "name": "lookup"})
    state.add_user_message("and then?")
    if mode == "async":
        asyncio.run(_saving.asave(store, state))
    else:
        _saving.save(store, state)
    raise SystemExit("not killed")


def crash_after_tool_result(endpoint: str, bucket: str, state_id: str) -> None:
    store = S3Store(bucket, "runs", endpoint_url=endpoint)
    state = State("two tools", id=state_id)
    tool_turn(state, "fast", "slow")
    _saving.save(store, state)
    state.append(TOOL_RESULT, "fast result", {"call_id": "fast", "name": "lookup"})
    _saving.save(store, state, entries_only=True)
    os.kill(os.getpid(), signal.SIGKILL)


def race(endpoint: str, bucket: str, writer: str) -> None:
    store = S3Store(bucket, "runs", endpoint_url=endpoint)
    print("ready", flush=True)
    for line in sys.stdin:
        command, state_id = line.split()
        assert command == "go"
        try:
            _saving.save(store, State(f"writer {writer}", id=state_id))
        except Exception as e:  # noqa: BLE001 - reported to the parent
            print(f"lost {state_id} {type(e).__name__}", flush=True)
        else:
            print(f"won {state_id}", flush=True)
    store.close()


if __name__ == "__main__":
    mode, *args = sys.argv[1:]
    commands: dict[str, Callable[..., None]] = {
        "crash-before-snapshot": crash_before_snapshot,
        "crash-after-tool-result": crash_after_tool_result,
        "race": race,
    }
    commands[mode](*args)
