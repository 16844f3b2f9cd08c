"""The seed's "Stop cleanly on SIGTERM" sample around ``agent.run`` with a slow tool.

Usage: python sigterm.py STORE STATE_ID WORK run

The handler below is the seed's code, verbatim. The model calls slow_tool, which blocks
until the parent sends SIGTERM.
"""

import signal


def stop(signum, frame):
    raise SystemExit(128 + signum)


signal.signal(signal.SIGTERM, stop)

# The sample ends here. ---------------------------------------------------------------------

import common  # noqa: E402
from common import print_answer, run, tool_call  # noqa: E402

from alpineagents import Agent, FileStore, State  # noqa: E402
from alpineagents.testing import FunctionModel  # noqa: E402

args = common.parse_args()
store = FileStore(args.store)
agent = Agent(
    FunctionModel(lambda request: [tool_call("slow_tool", x="a")]), tools=common.TOOLS, store=store
)
print_answer(run(agent, State("Run the slow tool.", id=args.state_id)))
