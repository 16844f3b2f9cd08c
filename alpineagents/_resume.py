"""What a loaded State does with the steps that were running when its process stopped.

A killed process leaves history as its last save left it. Loading continues from there:

* entries saved after the snapshot (a tool result saved alone) are replayed as they are;
* replay stops at an entry that cannot be replayed (a compaction, which only the snapshot
  makes effective): the entries from there on stay in history but leave the model's context,
  and a notice tells the model which tool calls among them may or may not have run;
* a tool call without a saved result gets the "(unknown: …)" result and is not run again.
"""

from __future__ import annotations

import json
from typing import Final

from alpineagents import _builtin_tools as builtin_tools
from alpineagents.history import NoticeData, ToolResultData
from alpineagents.state import (
    MODEL,
    NOTICE,
    TASK,
    TOOL_RESULT,
    USER,
    HistoryEntry,
    State,
    ends_turn,
    tool_calls,
)

UNKNOWN_RESULT: Final = (
    "(unknown: the run stopped before this result was saved, so the tool may or may not have "
    "run. Check whether it took effect before relying on it or running it again)"
)

_REPLAYABLE: Final = frozenset({TASK, USER, MODEL, TOOL_RESULT, NOTICE})


def continue_loaded(state: State, covered: int) -> None:
    """Continue a State just read from a store whose snapshot accounts for ``covered`` entries."""
    history = state.history
    stop = next((e.seq for e in history[covered:] if e.kind not in _REPLAYABLE), None)
    if stop is not None:
        skipped = history[stop:]
        notice = NoticeData((stop, len(history))).to_data()
        state.append(NOTICE, missing_steps_notice(skipped), notice)
    live = state.live_entries()
    if live and ends_turn(live[-1]) and not state._unchanged_since_stop():
        # The reply was saved, the stop was not: the run had ended with that reply.
        state._stop("reply", live[-1].text)
    for call in state.open_calls():
        if call["name"] not in builtin_tools.NAMES:  # those are handled again
            state.append(
                TOOL_RESULT,
                UNKNOWN_RESULT,
                ToolResultData(call["id"], call["name"], unknown=True).to_data(),
            )


def missing_steps_notice(skipped: list[HistoryEntry]) -> str:
    """The notice for entries that were saved but cannot be replayed."""
    first = skipped[0]
    results = {e.as_tool_result().call_id: e for e in skipped if e.kind == TOOL_RESULT}
    uncertain, ran = [], []
    for entry in skipped:
        if entry.kind != MODEL:
            continue
        for call in tool_calls(entry):
            if call["name"] in builtin_tools.NAMES:
                continue
            text = f"{call['name']}({json.dumps(call.get('input', {}), ensure_ascii=False)})"
            result = results.get(call["id"])
            if result is None:
                uncertain.append(text)
            else:
                ran.append(f"{text} -> {_clip(result.text)}")
    messages = [repr(e.text) for e in skipped if e.kind == USER]
    parts = [
        f"(notice: the run stopped while it was being saved. The steps saved from entry "
        f"{first.seq} on ({first.kind} and after) could not be replayed, so the conversation "
        "continues from the last complete save and those steps are missing here."
    ]
    if uncertain:
        parts.append(
            "These tool calls may or may not have run: " + "; ".join(uncertain) + ". Check "
            "whether they took effect before relying on them or running them again."
        )
    if ran:
        parts.append("These tool calls ran, with these results: " + "; ".join(ran) + ".")
    if not uncertain and not ran:
        parts.append("No tool calls were among the missing steps.")
    if messages:
        parts.append("The person's messages among them: " + "; ".join(messages) + ".")
    return " ".join(parts) + ")"


def _clip(text: str, limit: int = 500) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
