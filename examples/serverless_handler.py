"""A serverless function that starts or continues a conversation by id, one event at a time.

Deploy it as a function handler (AWS Lambda: ``serverless_handler.handler``). Each event runs
the conversation until it stops (a reply, ``finish``, ``ask``, or ``MAX_STEPS`` model
requests), saving every step in the store, and returns. The next event, in this instance or
in another one, loads the conversation from the store and goes on.

Settings, from the environment:

    RUNS_URL    where conversations are kept: s3://BUCKET/PREFIX (pip install
                'alpineagents-s3[async]') or a folder
    MODEL       a Claude model id (default claude-sonnet-5; needs ANTHROPIC_API_KEY), or
                "offline" for a scripted stand-in that needs no key
    MAX_STEPS   model requests per event (default 10)

An event::

    {"conversation_id": "support-1042", "message": "Where is order 42?", "event_id": "e-7"}

* ``conversation_id``: letters, digits, ``_`` and ``-``. An id the store does not have starts
  a conversation with ``message`` as its task.
* ``message``: the person's next message. Leave it out to continue a conversation that
  stopped at ``MAX_STEPS`` without adding anything to it.
* ``event_id`` (optional, but set it if the platform retries events): the handler keeps the
  last event id in the conversation's ``data``, so a retry of an event that failed after its
  message was saved (the model's API was down, the key was missing, the instance was
  stopped) continues the conversation instead of adding the message a second time.

It returns ``{"conversation_id": ..., "stopped_by": ..., "reply": ...}``; ``reply`` is
``None`` when the conversation stopped at ``MAX_STEPS`` (send an event without a message to
continue it).

Try it on your machine, one event per call (a new process each time, as a cold start)::

    RUNS_URL=./runs MODEL=offline python examples/serverless_handler.py \
        '{"conversation_id": "support-1042", "message": "Where is order 42?"}'
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from typing import Any

from alpineagents import Agent, State, Store, open_store
from alpineagents.model import Model, ModelRequest
from alpineagents.testing import FunctionModel, call

LAST_EVENT = "last_event_id"  # the key in State.data

# Made on the first event and kept while the instance stays warm: the model's and the store's
# clients are reused by the next events (each asyncio.run gets clients of its own loop).
_agent: Agent | None = None
_store: Store | None = None


def handler(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    """The function's entry point: one event, one ``asyncio.run``."""
    return asyncio.run(handle(event))


async def handle(event: dict[str, Any]) -> dict[str, Any]:
    """Start or continue the event's conversation, run it until it stops, and report."""
    agent, store = _setup()
    conversation_id = event["conversation_id"]
    message: str | None = event.get("message")
    event_id: str | None = event.get("event_id")

    state = await store.aget(conversation_id)
    if state is None:
        if message is None:
            raise ValueError(
                f"there is no conversation {conversation_id!r} to continue: send a message "
                "to start it"
            )
        state = State(message, id=conversation_id)
    elif event_id is not None and state.data.get(LAST_EVENT) == event_id:
        pass  # a retry: this event's message is in the conversation already
    elif message is not None:
        state.add_user_message(message)
    if event_id is not None:
        state.data[LAST_EVENT] = event_id

    reply = await agent.arun(state)
    return {"conversation_id": state.id, "stopped_by": state.stopped_by, "reply": reply}


def _setup() -> tuple[Agent, Store]:
    global _agent, _store
    if _agent is None or _store is None:
        _store = open_store(os.environ["RUNS_URL"])
        _agent = Agent(
            _model(),
            system="You answer questions about orders. Look an order up before answering.",
            tools=[lookup_order],
            store=_store,
            max_steps=int(os.environ.get("MAX_STEPS", "10")),
        )
    return _agent, _store


def lookup_order(order_id: str) -> str:
    """The shipping status of an order."""
    return f"Order {order_id} left the warehouse on 28 November and arrives on 2 December."


def _model() -> Model | str:
    name = os.environ.get("MODEL", "claude-sonnet-5")
    return FunctionModel(_offline, name="offline") if name == "offline" else name


def _offline(request: ModelRequest) -> Any:
    """The offline stand-in: looks up an order it is asked about, then answers."""
    last = request.messages[-1]["content"]
    results = [block["content"] for block in last if block["type"] == "tool_result"]
    if results:
        return f"Here is what I found. {results[-1]}"
    asked = " ".join(block["text"] for block in last if block["type"] == "text")
    order = re.search(r"order (\w+)", asked, re.IGNORECASE)
    if order:
        return [call("lookup_order", order_id=order.group(1))]
    return f"You said: {asked}. Which order is it about?"


if __name__ == "__main__":
    print(json.dumps(handler(json.loads(sys.argv[1]), None), ensure_ascii=False))
