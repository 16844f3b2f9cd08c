"""One conversation, several machines: each process adds a turn to a run kept in a bucket.

Every machine that runs this sees the same conversation, because it lives in the bucket, not
in the process. One turn: load the latest State (or start it), show its last answer, read a
message, add it, run the agent::

    python examples/shared_bucket.py s3://my-bucket/shared team-notes      # on machine A
    python examples/shared_bucket.py s3://my-bucket/shared team-notes      # on machine B

The rule is one process at a time per State. When two break it (A loaded the State, B saved a
turn since, then A saves), S3Store refuses A's save with ``ConcurrentWriteError`` instead of
overwriting B's turn. A recovers as docs/s3.md says: it loads the State again, which now has
B's turn, adds its message if that was not saved, and runs again. Two processes creating the
same new id at once meet the same way (``StateExistsError``: the id is taken).

With ``ANTHROPIC_API_KEY`` set, Claude answers; without it (or with ``--offline``) an offline
model repeats the message. ``--message TEXT`` gives the message instead of reading it.
"""

from __future__ import annotations

import argparse
import os
import sys

from alpineagents import (
    Agent,
    ConcurrentWriteError,
    Model,
    ModelRequest,
    State,
    StateExistsError,
    StateNotFoundError,
    Store,
    open_store,
)
from alpineagents.history import TASK, USER

ATTEMPTS = 3


def make_model(offline: bool) -> Model | str:
    """Claude when ANTHROPIC_API_KEY is set (and not ``offline``), else an offline model."""
    if os.environ.get("ANTHROPIC_API_KEY") and not offline:
        return os.environ.get("CLAUDE_MODEL", "claude-sonnet-5")
    from alpineagents.testing import FunctionModel

    def reply(request: ModelRequest) -> str:
        user = [m for m in request.messages if m["role"] == "user"][-1]
        texts = [b["text"] for b in user["content"] if b.get("type") == "text"]
        return f"Noted: {' '.join(texts)}"

    return FunctionModel(reply, name="offline-echo")


def latest(store: Store, state_id: str) -> State | None:
    """The conversation as the bucket has it now, or ``None`` if it has not started."""
    try:
        return store.load(state_id)
    except StateNotFoundError:
        return None


def take_turn(store: Store, agent: Agent, state_id: str, state: State | None, message: str) -> str:
    """Add ``message`` to the conversation and run it; reload and retry when refused."""
    for attempt in range(1, ATTEMPTS + 1):
        if state is None:
            state = State(message, id=state_id)
        else:
            state.add_user_message(message)
        start = len(state.history) - 1  # where this turn's message is
        try:
            return str(agent.run(state))
        except (ConcurrentWriteError, StateExistsError) as refused:
            print(f"refused ({type(refused).__name__}): {refused}", flush=True)
            if attempt == ATTEMPTS:
                raise
            state = latest(store, state_id)
            if state is None:
                continue  # the other process's State is gone: start it again
            print(f"reloaded {state_id}: {len(state.history)} entries", flush=True)
            if _saved(state, message, start):
                # The message made it into the bucket before the refusal: continue from
                # the State as it is, without adding it twice.
                return str(agent.run(state))
    raise AssertionError("unreachable")


def _saved(state: State, message: str, start: int) -> bool:
    """Whether ``message`` is among the user entries (or the task) from ``start`` on."""
    return any(e.kind in (TASK, USER) and e.text == message for e in state.history[start:])


def main(argv: list[str] | None = None) -> int:
    """Take one turn of the shared conversation; the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("store", help="s3://BUCKET/PREFIX (or a folder, on one machine)")
    parser.add_argument("id", help="the conversation's id, the same on every machine")
    parser.add_argument("--message", help="the message to add (default: read a line)")
    parser.add_argument("--offline", action="store_true", help="use the offline model")
    args = parser.parse_args(argv)

    with open_store(args.store) as store:
        agent = Agent(make_model(args.offline), store=store)
        state = latest(store, args.id)
        if state is None:
            print(f"loaded {args.id}: new conversation", flush=True)
        else:
            print(f"loaded {args.id}: {len(state.history)} entries", flush=True)
            print(f"last answer: {state.answer}", flush=True)
        message = args.message
        if message is None:
            try:
                message = input("> ").strip()
            except EOFError:
                message = ""
        if not message:
            return 0
        print(take_turn(store, agent, args.id, state, message), flush=True)
        agent.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
