"""Runs chat.py, the guide's sample, unchanged, with its second ``agent.run`` held back.

Usage (in the folder that holds chat.py): python chat_stopped_before_run.py

Before the second run does anything (no save, no model request), it creates
``second-run.started`` in the current folder and blocks, so the parent can kill the process
right after ``agent.save(state)`` saved the person's message.
"""

from __future__ import annotations

import runpy
import sys
import time
from pathlib import Path
from typing import Any

from alpineagents import Agent, State

_run = Agent.run
_calls = 0


def held_run(self: Agent, state: State) -> Any:
    global _calls
    _calls += 1
    if _calls == 2:
        Path("second-run.started").touch()
        time.sleep(60)
    return _run(self, state)


Agent.run = held_run  # type: ignore[method-assign]
sys.argv = ["chat.py", *sys.argv[1:]]
runpy.run_path("chat.py", run_name="__main__")
