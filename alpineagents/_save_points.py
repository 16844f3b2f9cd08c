"""The Agent's save points, the checks before a run, and the note of a failed save.

The sequence of the steps and the saves between them is :meth:`alpineagents.Agent._steps`;
this module names the save points (one per row of the user guide's table "When the Agent
saves"), logs each one reached on the Agent's logger (``alpineagents.agent``, DEBUG), checks a
State before its run (the store it is saved in, the Agent that saved it), and notes a save
that failed on the exception the run raises.
"""

from __future__ import annotations

import logging
import warnings
from enum import StrEnum
from typing import Any

from alpineagents import _saving
from alpineagents.errors import ResumeWarning
from alpineagents.state import State
from alpineagents.store import Store
from alpineagents.tools import error_text

__all__ = ["SavePoint", "check_before_run", "log_save", "note_failed_save"]

# The Agent's logger: the save points are part of its log.
logger = logging.getLogger("alpineagents.agent")


class SavePoint(StrEnum):
    """Where the Agent saves a State, one member per row of the guide's "When the Agent saves".

    A save writes only what the store does not have yet, and nothing when nothing changed.
    """

    RUN_STARTS = "run_starts"
    """``run``/``arun`` starts: a new State is created in the store, a changed one updated."""
    RUN_ENDS = "run_ends"
    """The run stops (reply, ``finish``, ``ask``, ``max_steps``): the last steps and the stop."""
    BEFORE_THINK = "before_think"
    """Before each model request, so that the model is never asked about a step the store
    lacks (the saves before it have usually written everything; then it writes nothing)."""
    AFTER_THINK = "after_think"
    """After a model response that does not end the turn (tool calls, a pause)."""
    AFTER_TOOL_RESULT = "after_tool_result"
    """Each tool result alone, at once, while the other tools of the turn still run."""
    AFTER_USE_TOOLS = "after_use_tools"
    """After all the tool calls of a turn have results: everything not saved yet."""
    AFTER_COMPACT = "after_compact"
    """After a compaction: the summary entry."""
    AGENT_SAVE = "agent_save"
    """``agent.save(state)``: changes made outside the Agent's steps, such as a message."""


def log_save(state: State, point: SavePoint, wrote: bool) -> bool:
    """Log a save point reached, and what it wrote, on the Agent's logger; ``wrote``."""
    logger.debug(
        "State %s: save point %s: %s", state.id, point, "saved" if wrote else "nothing new"
    )
    return wrote


def check_before_run(state: State, store: Store | None, fingerprint: dict[str, Any]) -> None:
    """Refuse a State the Agent may not run here; warn when another Agent saved it.

    A State saved in a store is refused by an Agent without one, or with another store
    (``ValueError``); a State saved by an Agent that differs gets a ``ResumeWarning``.
    """
    saved_in = _saving.saved_in(state)
    if saved_in is not None and store is None:
        raise ValueError(
            f"State {state.id!r} is saved in {saved_in!r}, but this Agent has no "
            "store: give the Agent that store to run it"
        )
    if store is not None:
        _saving.check_store(state, store)
    saved_by = state._run_by(fingerprint)
    if saved_by is not None and saved_by != fingerprint:
        warnings.warn(
            ResumeWarning(
                f"State {state.id!r} was saved by a different Agent "
                f"({_differences(saved_by, fingerprint)}); this Agent runs it now"
            ),
            stacklevel=5,
        )


def note_failed_save(error: BaseException, save_error: Exception) -> None:
    """Attach a failed save to the run's own error, as the guide's "If saving fails" says."""
    error.add_note(f"saving the state also failed: {error_text(save_error)}")


def _differences(saved: dict[str, Any], current: dict[str, Any]) -> str:
    found = []
    if saved.get("model") != current["model"]:
        found.append(f"model {saved.get('model')!r} is now {current['model']!r}")
    if saved.get("system") != current["system"]:
        found.append("the system prompt changed")
    old, new = saved.get("tools", {}), current["tools"]
    if set(old) - set(new):
        found.append(f"tools removed: {', '.join(sorted(set(old) - set(new)))}")
    if set(new) - set(old):
        found.append(f"tools added: {', '.join(sorted(set(new) - set(old)))}")
    changed = sorted(n for n in set(old) & set(new) if old[n] != new[n])
    if changed:
        found.append(f"tools changed: {', '.join(changed)}")
    return "; ".join(found) or "its settings changed"
