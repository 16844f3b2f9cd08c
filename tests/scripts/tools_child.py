"""Runs an Agent whose model calls tools, to be killed while they run.

Usage: python tools_child.py STORE STATE_ID WORK MODE SCENARIO [--resume]

The model calls the SCENARIO's tools in one response; once it has their results it calls
finish with them as JSON ({tool name: result}), which the child prints. Scenarios:

* ``slow``: slow_tool, which blocks its thread;
* ``slow_async``: slow_async_tool, which awaits;
* ``fast_slow``: fast_tool and slow_tool in one turn;
* ``fast_slow_store``: the same with a FileStore that, after writing new entries alone
  (snapshot None: a tool result saved at once), creates WORK/entries-written and blocks;
* ``exit``: exit_tool, which calls sys.exit(3).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import common
from common import print_answer, run, signal_ready, tool_call, tool_results

from alpineagents import Agent, FileStore, State
from alpineagents.model import ModelRequest, ModelResponse
from alpineagents.testing import FunctionModel

FIRST_CALLS = {
    "slow": ["slow_tool"],
    "slow_async": ["slow_async_tool"],
    "fast_slow": ["fast_tool", "slow_tool"],
    "fast_slow_store": ["fast_tool", "slow_tool"],
    "exit": ["exit_tool"],
}


class SignallingStore(FileStore):
    """A FileStore that stops right after it wrote entries without a snapshot."""

    def write(
        self,
        state_id: str,
        entries: Sequence[dict[str, Any]],
        snapshot: dict[str, Any] | None,
        *,
        create: bool = False,
    ) -> None:
        super().write(state_id, entries, snapshot, create=create)
        if snapshot is None:
            signal_ready("entries-written", json.dumps([e["seq"] for e in entries]))
            time.sleep(common.BLOCK_SECONDS)


def decide(request: ModelRequest) -> ModelResponse:
    common.log_request(request)
    results = tool_results(request)
    if not results:
        calls = [
            tool_call(name) if name == "exit_tool" else tool_call(name, x="a")
            for name in FIRST_CALLS[args.scenario]
        ]
        return ModelResponse(calls, "tool_use")
    return ModelResponse([tool_call("finish", answer=json.dumps(results))], "tool_use")


args = common.parse_args("scenario")
if args.scenario == "fast_slow_store" and not args.resume:
    store: FileStore = SignallingStore(args.store)
else:
    store = FileStore(args.store)
agent = Agent(FunctionModel(decide), tools=common.TOOLS, store=store)
state = store.load(args.state_id) if args.resume else State("Use the tools.", id=args.state_id)
print_answer(run(agent, state))
