"""Runs an Agent that compacts its context, to be killed while it compacts.

Usage: python compaction_child.py STORE STATE_ID WORK MODE VARIANT [--resume]

The model calls ``note`` with a response whose usage passes ``compact_at``, so the Agent
compacts after the tool result; then it finishes. Every request is logged to
WORK/requests-<phase>.jsonl. Variants (first phase only):

* ``inflight``: the compaction request writes its messages to WORK/compaction-request
  and blocks, for the parent to kill the process;
* ``torn``: the store appends the compaction entry, then kills its own process before it
  replaces the snapshot.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Sequence
from typing import Any

import common
from common import log_request, print_answer, run, signal_ready, tool_call

from alpineagents import Agent, FileStore, State
from alpineagents.model import ModelRequest, ModelResponse
from alpineagents.testing import FunctionModel

TASK = "Take a note, then finish."


def note(text: str) -> str:
    """Keep a note."""
    common.record("note")
    return f"noted {text}"


class DiesBeforeSnapshot(FileStore):
    """Appends a compaction entry, then dies (SIGKILL) before the snapshot is replaced."""

    def write(
        self,
        state_id: str,
        entries: Sequence[dict[str, Any]],
        snapshot: dict[str, Any] | None,
        *,
        create: bool = False,
    ) -> None:
        if snapshot is not None and any(e["kind"] == "compaction" for e in entries):
            super().write(state_id, entries, None)
            os.kill(os.getpid(), signal.SIGKILL)
        super().write(state_id, entries, snapshot, create=create)


def decide(request: ModelRequest) -> ModelResponse:
    log_request(request)
    if request.purpose == "compaction":
        if args.variant == "inflight" and not args.resume:
            signal_ready("compaction-request", json.dumps(request.messages))
            time.sleep(common.BLOCK_SECONDS)
        summary = f"SUMMARY-{common.PHASE}"
        return ModelResponse([{"type": "text", "text": summary}], usage={"input_tokens": 10})
    if request.messages == [{"role": "user", "content": [{"type": "text", "text": TASK}]}]:
        call = tool_call("note", text="n1")
        return ModelResponse([call], "tool_use", usage={"input_tokens": 1000})
    call = tool_call("finish", answer="done")
    return ModelResponse([call], "tool_use", usage={"input_tokens": 10})


args = common.parse_args("variant")
if args.variant == "torn" and not args.resume:
    store: FileStore = DiesBeforeSnapshot(args.store)
else:
    store = FileStore(args.store)
agent = Agent(FunctionModel(decide), tools=[note], store=store, compact_at=500)
state = store.load(args.state_id) if args.resume else State(TASK, id=args.state_id)
print_answer(run(agent, state))
