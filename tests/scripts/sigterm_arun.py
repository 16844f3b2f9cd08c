"""The seed's SIGTERM advice for ``arun``: cancel the task with loop.add_signal_handler.

Usage: python sigterm_arun.py STORE STATE_ID WORK arun

The model calls slow_async_tool, which awaits until the parent sends SIGTERM. The child
prints "cancelled" when the task ends cancelled.
"""

from __future__ import annotations

import asyncio
import signal

import common
from common import tool_call

from alpineagents import Agent, FileStore, State
from alpineagents.testing import FunctionModel


async def main() -> None:
    args = common.parse_args()
    store = FileStore(args.store)
    model = FunctionModel(lambda request: [tool_call("slow_async_tool", x="a")])
    agent = Agent(model, tools=common.TOOLS, store=store)
    state = State("Run the slow tool.", id=args.state_id)

    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(agent.arun(state))
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        await task
    except asyncio.CancelledError:
        print("cancelled", flush=True)


asyncio.run(main())
