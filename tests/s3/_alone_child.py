"""The process of tests/s3/test_commit_alone_crash.py: saves committing alone, SIGKILLed.

``python -m tests.s3._alone_child ENDPOINT BUCKET ID MODE EVENT K`` makes the saves of
:func:`steps` through this repository's core (``Store.save``, sync or async by ``MODE``): a
create, a model response that calls a tool (committed alone), its result saved alone, a change
of ``data`` with the next response (committed alone, the change in its metadata), and the
reply that stops the run (a snapshot PUT). It sends itself SIGKILL at its ``K``-th request, in
the botocore hook ``EVENT`` (``before-send``: not sent; ``after-call``: its answer came back);
``K`` = 0 kills nothing. Prints ``saved N`` (the history's length) after each save that
returned, and ``requests N`` once all have.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from alpineagents import State, _saving
from alpineagents.history import MODEL, TOOL_RESULT
from alpineagents_s3 import S3Store

TASK = "look it up"


def steps() -> list[tuple[Callable[[State], None], bool]]:
    """What each save adds to the State, and whether it is a tool result saved alone."""

    def respond(n: int) -> Callable[[State], None]:
        def add(state: State) -> None:
            call = {"type": "tool_call", "id": f"c{n}", "name": "lookup", "input": {"n": n}}
            state.append(MODEL, f"looking {n} up", {"content": [call], "stop_reason": "tool_use"})

        return add

    def result(n: int) -> Callable[[State], None]:
        def add(state: State) -> None:
            state.append(
                TOOL_RESULT, f'{n} is "found"  twice\\', {"call_id": f"c{n}", "name": "lookup"}
            )

        return add

    def with_data(state: State) -> None:
        state.data["seen"] = {"n": 0, "note": "  spaced \u00e9 \U0001f600 ", "list": [1, 2.5, None]}
        respond(1)(state)

    def reply(state: State) -> None:
        state.append(
            MODEL, "done: " + "the answer " * 40, {"content": [], "stop_reason": "end_turn"}
        )
        state._stop("reply", state.history[-1].text)

    return [
        (lambda state: None, False),  # the create
        (respond(0), False),
        (result(0), True),
        (with_data, False),
        (result(1), True),
        (reply, False),
    ]


def build(upto: int) -> State:
    """The State as it is after the first ``upto`` steps."""
    state = State(TASK, id="x")
    for add, _ in steps()[:upto]:
        add(state)
    return state


def main(endpoint: str, bucket: str, state_id: str, mode: str, event: str, kill_at: int) -> None:
    seen = [0]

    def hook(**kwargs: Any) -> None:
        seen[0] += 1
        if seen[0] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    store = S3Store(bucket, "runs", endpoint_url=endpoint, event_hooks={f"{event}.s3": hook})
    state = State(TASK, id=state_id)
    if mode == "async":
        asyncio.run(_asaves(store, state))
    else:
        for add, alone in steps():
            add(state)
            _saving.save(store, state, entries_only=alone)
            print(f"saved {len(state.history)}", flush=True)
        store.close()
    print(f"requests {seen[0]}", flush=True)


async def _asaves(store: S3Store, state: State) -> None:
    try:
        for add, alone in steps():
            add(state)
            await _saving.asave(store, state, entries_only=alone)
            print(f"saved {len(state.history)}", flush=True)
    finally:
        await store.aclose()


if __name__ == "__main__":
    endpoint, bucket, state_id, mode, event, k = sys.argv[1:]
    main(endpoint, bucket, state_id, mode, event, int(k))
