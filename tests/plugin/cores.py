"""The small differences between the alpineagents cores the plugin suite runs against.

Loaded by the child scripts of ``children/`` (by path: this folder is not a package), never by
the test modules themselves. Only the PUBLIC API of whichever alpineagents is installed is used:

=====================  ===================================  ==================================
                       this repository's core (0.4.1+seed)  published 0.4.0 / 0.7.1
=====================  ===================================  ==================================
offline model          ``alpineagents.testing.FunctionModel``  ``alpineagents.testing.FakeModel``
tools                  plain functions                      ``@alpineagents.tool`` functions
a State with an id     ``State(task, id=...)``              0.4: ``State(task, id=...)``;
                                                            0.7: ``State(id=..., messages=[...])``
a model's tool calls   ``"model"`` entries, ``data.content``  ``ReplyEntry`` / ``ModelReplyEntry``
tool results           ``entry.text``, ``data.call_id``     ``entry.content``, ``entry.call.id``
``store.list()``       ``SavedState``                       0.4: ``SavedState``; 0.7: ``StateInfo``
=====================  ===================================  ==================================

Which core is installed is found out from what it has (and reported with its version), never
from a hard-coded version list.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Sequence
from importlib import metadata
from typing import Any

import alpineagents
import alpineagents.store
import alpineagents.testing

CORE_VERSION = metadata.version("alpineagents")
# The Store contract generation: "snapshot" (0.2-0.4, this repository's core) or "info" (0.5+).
GENERATION = "info" if hasattr(alpineagents.store, "StateInfo") else "snapshot"
SUMMARY_CLASS = "StateInfo" if GENERATION == "info" else "SavedState"
# "repo": this repository's core (FunctionModel, plain-function tools, dict history data);
# "published": the released API (FakeModel, @tool, typed history entries).
FLAVOUR = "repo" if hasattr(alpineagents.testing, "FunctionModel") else "published"

# A scripted model turn: ("call", tool name, tool input) or ("answer", text).
Step = tuple[Any, ...]


def describe() -> dict[str, str]:
    return {
        "core_version": CORE_VERSION,
        "generation": GENERATION,
        "flavour": FLAVOUR,
        "summary_class": SUMMARY_CLASS,
    }


# Building ------------------------------------------------------------------------------------


def make_tool(function: Callable[..., Any]) -> Any:
    """``function`` as a tool of the installed core."""
    if FLAVOUR == "repo":
        return function
    return alpineagents.tool(function)


def make_model(script: Sequence[Step]) -> Any:
    """The core's own offline model, answering each model request with the next step."""
    if FLAVOUR == "repo":
        from alpineagents.testing import FunctionModel, call

        steps = list(script)

        def respond(request: Any) -> Any:
            if not steps:
                raise RuntimeError("the scripted model ran out of steps")
            step = steps.pop(0)
            if step[0] == "call":
                return [call(step[1], **step[2])]
            return step[1]

        return FunctionModel(respond, name="scripted")

    # The published API, which this repository's core (the one type-checked against) lacks.
    published: Any = alpineagents.testing
    replies: list[Any] = []
    for step in script:
        if step[0] == "call":
            replies.append(published.tool_call(step[1], **step[2]))
        else:
            replies.append(step[1])
    return published.FakeModel(replies, name="scripted")


def make_agent(model: Any, tools: Sequence[Callable[..., Any]], store: Any) -> Any:
    """An Agent of the installed core: no terminal output, no human, saving to ``store``."""
    tool_objects = [make_tool(t) for t in tools]
    if FLAVOUR == "repo":
        return alpineagents.Agent(model, tools=tool_objects, store=store)
    published_agent: Any = alpineagents.Agent  # its reporter and human: published cores only
    return published_agent(model, tools=tool_objects, store=store, reporter=None, human=None)


def make_state(task: str, state_id: str) -> Any:
    """A new State with the id ``state_id`` and ``task`` as the first user message."""
    state_class: Any = alpineagents.State  # typed as this repository's, which has no messages
    if "messages" in inspect.signature(state_class).parameters:  # 0.5+: keyword-only, messages
        return state_class(id=state_id, messages=[alpineagents.Message.user(task)])
    return state_class(task, id=state_id)


# Running -------------------------------------------------------------------------------------


def run(agent: Any, state: Any, mode: str) -> Any:
    """``agent.run(state)`` (mode ``sync``) or ``await agent.arun(state)`` (mode ``async``)."""
    if mode == "sync":
        return agent.run(state)
    if mode == "async":
        return asyncio.run(agent.arun(state))
    raise ValueError(f"unknown mode {mode!r}")


def load(store: Any, state_id: str, mode: str) -> Any:
    """``store.load(id)``, or ``await store.aload(id)`` in mode ``async``."""
    if mode == "async":
        return asyncio.run(store.aload(state_id))
    return store.load(state_id)


# Reading -------------------------------------------------------------------------------------


def _text(content: Any) -> str:
    """A published tool result's content (a str, or blocks) as text."""
    if isinstance(content, str):
        return content
    if isinstance(content, (tuple, list)):
        return "".join(getattr(block, "text", "") for block in content)
    return str(content)


def history(state: Any) -> list[dict[str, Any]]:
    """The State's history as plain dicts, the same shape for every core.

    ``{"kind": "call", "id", "name"}`` for each tool call of a model reply,
    ``{"kind": "reply", "text"}`` for a model reply's text,
    ``{"kind": "result", "call_id", "name", "text"}`` for a tool result,
    ``{"kind": <the core's kind>}`` for anything else.
    """
    out: list[dict[str, Any]] = []
    for entry in state.history:
        kind = entry.kind
        if FLAVOUR == "repo":
            if kind == "model":
                for block in entry.data.get("content", []):
                    if block.get("type") == "tool_call":
                        out.append({"kind": "call", "id": block["id"], "name": block["name"]})
                if entry.text:
                    out.append({"kind": "reply", "text": entry.text})
            elif kind == "tool_result":
                out.append(
                    {
                        "kind": "result",
                        "call_id": entry.data.get("call_id"),
                        "name": entry.data.get("name"),
                        "text": entry.text,
                    }
                )
            else:
                out.append({"kind": kind})
            continue
        if kind in ("reply", "model_reply"):  # 0.4 ReplyEntry, 0.7 ModelReplyEntry
            reply = entry.content
            for call in reply.tool_calls:
                out.append({"kind": "call", "id": call.id, "name": call.name})
            if reply.text:
                out.append({"kind": "reply", "text": reply.text})
        elif kind == "tool_result":
            out.append(
                {
                    "kind": "result",
                    "call_id": entry.call.id,
                    "name": entry.call.name,
                    "text": _text(entry.content),
                }
            )
        else:
            out.append({"kind": kind})
    return out


def summaries(store: Any) -> list[dict[str, str]]:
    """``store.list()`` as ``{"id", "class"}`` dicts."""
    return [{"id": s.id, "class": type(s).__name__} for s in store.list()]
