"""A chat whose conversation outlives the process: the guide's chat loop on any store.

Run it with a store URL, type a message per line, and stop with an empty line or Ctrl+D::

    python examples/chat_loop.py .agent-runs               # a folder (FileStore)
    python examples/chat_loop.py s3://my-bucket/chats      # a bucket (alpineagents-s3)
    python examples/chat_loop.py .agent-runs --resume      # continue the latest conversation

``--resume`` continues the most recently updated conversation of the store; on a store with
none it says "nothing to resume" and starts a new one. Each message is saved as soon as it is
typed (``agent.save``), so a conversation killed while the model thinks resumes with it.

With ``ANTHROPIC_API_KEY`` set, Claude answers. Without it (or with ``--offline``) an offline
model answers by repeating the message: no network, no account, same saves.
"""

from __future__ import annotations

import argparse
import os
import sys

from alpineagents import Agent, Model, ModelRequest, State, open_store

SYSTEM = "You are a helpful assistant."


def last_user_text(request: ModelRequest) -> str:
    """The text of the newest user message of a model request."""
    for message in reversed(request.messages):
        if message["role"] == "user":
            texts = [b["text"] for b in message["content"] if b.get("type") == "text"]
            if texts:
                return " ".join(texts)
    return ""


def make_model(offline: bool) -> Model | str:
    """Claude when ANTHROPIC_API_KEY is set (and not ``offline``), else an offline model."""
    if os.environ.get("ANTHROPIC_API_KEY") and not offline:
        return os.environ.get("CLAUDE_MODEL", "claude-sonnet-5")
    from alpineagents.testing import FunctionModel

    def reply(request: ModelRequest) -> str:
        return f"You said: {last_user_text(request)}"

    return FunctionModel(reply, name="offline-echo")


def read_message() -> str | None:
    """The next message typed, or ``None`` at an empty line or the end of input."""
    try:
        text = input("> ").strip()
    except EOFError:
        return None
    return text or None


def main(argv: list[str] | None = None) -> int:
    """Run the chat loop; the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("store", help="a folder, file://PATH or s3://BUCKET/PREFIX")
    parser.add_argument("--resume", action="store_true", help="continue the latest conversation")
    parser.add_argument("--offline", action="store_true", help="use the offline model")
    args = parser.parse_args(argv)

    with open_store(args.store) as store:
        agent = Agent(make_model(args.offline), system=SYSTEM, store=store)
        state: State | None = None
        if args.resume:
            saved = store.list()  # most recently updated first
            if saved:
                state = store.load(saved[0].id)
                print(f"resuming {state.id}: {saved[0].task.splitlines()[0]!r}", flush=True)
            else:
                print("nothing to resume: starting a new conversation", flush=True)
        if state is None:
            first = read_message()
            if first is None:
                return 0
            state = State(first)
            print(f"new conversation {state.id}", flush=True)

        while True:
            print(agent.run(state), flush=True)
            message = read_message()
            if message is None:
                break
            state.add_user_message(message)
            agent.save(state)  # saved before the model is asked: a crash keeps it
        agent.close()
        print(f"saved as {state.id}; continue with --resume", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
