"""The model's context, rebuilt from history.

The context is the conversation since the last compaction: a summary of what came before,
then every entry after it, without the entries a notice left out. History itself keeps
every entry, so nothing here is saved; any process rebuilds the same context.
"""

from __future__ import annotations

from typing import Any

from alpineagents.history import COMPACTION, MODEL, NOTICE, TASK, TOOL_RESULT, USER
from alpineagents.state import State


def summary_message(task: str, summary: str) -> str:
    """The user turn that stands for the steps a compaction replaced."""
    return (
        f"{task}\n\n(The earlier steps of this conversation were replaced by this summary "
        f"to keep the context short.)\n\nSummary of the steps so far:\n{summary}"
    )


def build_messages(state: State) -> list[dict[str, Any]]:
    """The conversation to send, as alternating user and assistant turns."""
    live = state.live_entries()
    last_compaction = next((e for e in reversed(live) if e.kind == COMPACTION), None)
    turns: list[tuple[str, dict[str, Any]]] = []
    if last_compaction is not None:
        covers = last_compaction.as_compaction().covers
        turns.append(("user", _text(summary_message(state.task, last_compaction.text))))
        live = [e for e in live if e.seq > covers and e.kind != COMPACTION]
    for entry in live:
        if entry.kind == TASK:
            turns.append(("user", _text(entry.text)))
        elif entry.kind == USER:
            answers = entry.as_user().answers
            if answers is None:
                turns.append(("user", _text(entry.text)))
            else:
                turns.append(("user", _result(answers, entry.text, False)))
        elif entry.kind == MODEL:
            for block in entry.as_model().content:
                turns.append(("assistant", block))
        elif entry.kind == TOOL_RESULT:
            result = entry.as_tool_result()
            turns.append(("user", _result(result.call_id, entry.text, result.is_error)))
        elif entry.kind == NOTICE:
            turns.append(("user", _text(entry.text)))
        # An older compaction (replaced by a later one) adds nothing.
    return _merge(turns)


def _merge(turns: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Join consecutive blocks of one role; tool results go first in a user turn."""
    messages: list[dict[str, Any]] = []
    for role, block in turns:
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].append(block)
        else:
            messages.append({"role": role, "content": [block]})
    for message in messages:
        if message["role"] == "user":
            message["content"].sort(key=lambda b: b["type"] != "tool_result")
    return messages


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text or "(empty)"}


def _result(call_id: str, content: str, is_error: bool) -> dict[str, Any]:
    return {"type": "tool_result", "call_id": call_id, "content": content, "is_error": is_error}
