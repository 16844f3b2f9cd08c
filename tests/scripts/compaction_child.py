"""Runs an Agent that compacts its context, to be killed while it compacts.

Usage: python compaction_child.py STORE STATE_ID WORK MODE VARIANT [--resume]

STORE is a folder (a FileStore) or any URL ``open_store`` takes (``s3://bucket/prefix``,
with the endpoint in ``AWS_ENDPOINT_URL_S3``). Every request is logged to
WORK/requests-<phase>.jsonl. Variants:

* ``inflight``: the model calls ``note`` with a response whose usage passes ``compact_at``,
  so the Agent compacts after the tool result; the compaction request writes its messages
  to WORK/compaction-request and blocks, for the parent to kill the process (first phase);
* ``torn``: the same run, but the store appends the compaction entry, then kills its own
  process before it replaces the snapshot (first phase);
* ``pending``: the model replies with a response whose usage passes ``compact_at``; the
  person then sends PENDING_MESSAGE, which is saved, and the next run compacts first: the
  store kills its own process as in ``torn`` (first phase). The resumed run answers it.
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

from alpineagents import Agent, State, Store, open_store
from alpineagents.model import ModelRequest, ModelResponse
from alpineagents.store import Record
from alpineagents.testing import FunctionModel

TASK = "Take a note, then finish."
PENDING_MESSAGE = "PENDING: what did the note say?"


def note(text: str) -> str:
    """Keep a note."""
    common.record("note")
    return f"noted {text}"


class DiesBeforeSnapshot(Store):
    """Appends a compaction entry, then dies (SIGKILL) before the snapshot is replaced."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner

    def write(
        self,
        state_id: str,
        entries: Sequence[dict[str, Any]],
        snapshot: dict[str, Any] | None,
        *,
        create: bool = False,
    ) -> None:
        if snapshot is not None and any(e["kind"] == "compaction" for e in entries):
            self.inner.write(state_id, entries, None)
            os.kill(os.getpid(), signal.SIGKILL)
        self.inner.write(state_id, entries, snapshot, create=create)

    def read(self, state_id: str) -> Record | None:
        return self.inner.read(state_id)


def decide(request: ModelRequest) -> ModelResponse:
    log_request(request)
    if request.purpose == "compaction":
        if args.variant == "inflight" and not args.resume:
            signal_ready("compaction-request", json.dumps(request.messages))
            time.sleep(common.BLOCK_SECONDS)
        summary = f"SUMMARY-{common.PHASE}"
        return ModelResponse([{"type": "text", "text": summary}], usage={"input_tokens": 10})
    if request.messages == [{"role": "user", "content": [{"type": "text", "text": TASK}]}]:
        if args.variant == "pending":
            reply = {"type": "text", "text": "Noted."}
            return ModelResponse([reply], "end_turn", usage={"input_tokens": 1000})
        call = tool_call("note", text="n1")
        return ModelResponse([call], "tool_use", usage={"input_tokens": 1000})
    if args.variant == "pending":
        reply = {"type": "text", "text": f"ANSWER-{common.PHASE}"}
        return ModelResponse([reply], "end_turn", usage={"input_tokens": 10})
    call = tool_call("finish", answer="done")
    return ModelResponse([call], "tool_use", usage={"input_tokens": 10})


args = common.parse_args("variant")
store = open_store(args.store)
if args.variant in ("torn", "pending") and not args.resume:
    store = DiesBeforeSnapshot(store)
agent = Agent(FunctionModel(decide), tools=[note], store=store, compact_at=500)
if args.resume:
    print_answer(run(agent, store.load(args.state_id)))
else:
    state = State(TASK, id=args.state_id)
    answer = run(agent, state)
    if args.variant == "pending":
        state.add_user_message(PENDING_MESSAGE)
        agent.save(state)  # saved: the person's message must survive what follows
        answer = run(agent, state)
    print_answer(answer)
