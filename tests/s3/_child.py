"""A separate process for the S3Store process tests: ``python -m tests.s3._child MODE ...``.

Modes:
    crash-before-head ENDPOINT BUCKET ID sync|async
        Create a State, add a tool turn and a message, save: SIGKILL itself the moment the
        entries are stored and the head PUT is about to be sent.
    crash-after-tool-result ENDPOINT BUCKET ID
        Create a State whose model turn calls two tools and let an Agent run them: the fast
        one's result is saved alone while the slow one still runs; SIGKILL itself the moment
        S3 has stored the head that commits it.
    purge ENDPOINT BUCKET ID K
        Delete State ID with purge=True; SIGKILL itself as its K-th request is sent (K = 0:
        never), printing "requests N" when it ends.
    race ENDPOINT BUCKET WRITER
        For each line "go ID" on stdin, create State ID and print "won ID" or
        "lost ID ExceptionType"; print "ready" first.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from alpineagents import Agent, State
from alpineagents.history import MODEL, TOOL_RESULT
from alpineagents.testing import TestModel
from alpineagents_s3 import S3Store


def tool_turn(state: State, *calls: str) -> None:
    content = [
        {"type": "tool_call", "id": call, "name": "lookup", "input": {"what": call}}
        for call in calls
    ]
    state.append(MODEL, "", {"content": content, "stop_reason": "tool_use"})


def crash_before_head(endpoint: str, bucket: str, state_id: str, mode: str) -> None:
    def kill_at_head(request: Any, **kwargs: Any) -> None:
        if "/heads/" in request.url and "If-Match" in request.headers:
            os.kill(os.getpid(), signal.SIGKILL)

    store = S3Store(
        bucket,
        "runs",
        endpoint_url=endpoint,
        event_hooks={"before-send.s3.PutObject": kill_at_head},
    )
    state = State("crash test", id=state_id)
    store.save(state)
    tool_turn(state, "call-1")
    state.append(TOOL_RESULT, "result 1", {"call_id": "call-1", "name": "lookup"})
    state.add_user_message("and then?")
    if mode == "async":
        asyncio.run(store.asave(state))
    else:
        store.save(state)
    raise SystemExit("not killed")


def crash_after_tool_result(endpoint: str, bucket: str, state_id: str) -> None:
    armed: list[bool] = []

    def kill_once_stored(http_response: Any, **kwargs: Any) -> None:
        if armed and "/heads/" in http_response.url and http_response.status_code == 200:
            os.kill(os.getpid(), signal.SIGKILL)

    store = S3Store(
        bucket,
        "runs",
        endpoint_url=endpoint,
        event_hooks={"after-call.s3.PutObject": kill_once_stored},
    )
    state = State("two tools", id=state_id)
    tool_turn(state, "fast", "slow")
    store.save(state)
    armed.append(True)  # the next entry stored is the fast tool's result
    never = threading.Event()

    def lookup(what: str) -> str:
        """Look something up; the slow lookup never ends."""
        if what == "slow":
            never.wait(60)
        return f"{what} result"

    Agent(TestModel(), tools=[lookup], store=store).use_tools(state)
    raise SystemExit("not killed")


def purge(endpoint: str, bucket: str, state_id: str, kill_at: str) -> None:
    sent = [0]

    def count(request: Any, **kwargs: Any) -> None:
        sent[0] += 1
        if sent[0] == int(kill_at):
            os.kill(os.getpid(), signal.SIGKILL)

    store = S3Store(bucket, "runs", endpoint_url=endpoint, event_hooks={"before-send.s3": count})
    store.delete(state_id, purge=True)
    print(f"requests {sent[0]}", flush=True)


def race(endpoint: str, bucket: str, writer: str) -> None:
    store = S3Store(bucket, "runs", endpoint_url=endpoint)
    print("ready", flush=True)
    for line in sys.stdin:
        command, state_id = line.split()
        assert command == "go"
        try:
            store.save(State(f"writer {writer}", id=state_id))
        except Exception as e:  # noqa: BLE001 - reported to the parent
            print(f"lost {state_id} {type(e).__name__}", flush=True)
        else:
            print(f"won {state_id}", flush=True)
    store.close()


if __name__ == "__main__":
    mode, *args = sys.argv[1:]
    commands: dict[str, Callable[..., None]] = {
        "crash-before-head": crash_before_head,
        "crash-after-tool-result": crash_after_tool_result,
        "purge": purge,
        "race": race,
    }
    commands[mode](*args)
