"""Runs an Agent on the real anthropic SDK, pointed by the environment at a loopback server.

Usage: python model_child.py STORE STATE_ID WORK MODE [--resume]

ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY come from the parent, whose loopback server
decides every response (and holds the one the parent kills this process during).
"""

from __future__ import annotations

import common
from common import print_answer, run

from alpineagents import Agent, FileStore, State


def lookup(q: str) -> str:
    """Look something up."""
    common.record("lookup")
    return f"found {q}"


args = common.parse_args()
store = FileStore(args.store)
agent = Agent("claude-sonnet-5", system="Be brief.", tools=[lookup], store=store)
if args.resume:
    state = store.load(args.state_id)
else:
    state = State("Look up x, then say what you found.", id=args.state_id)
print_answer(run(agent, state))
