"""State and HistoryEntry: one run of an agent, as data.

A :class:`State` is everything a run needs to continue in another process: the task, the
history of every step, the user's ``data``, and how the last run stopped. History entries are
small records tagged by ``kind``; their ``data`` holds JSON of alpineagents' own, never a model
SDK's objects, so any store can keep them and any process can read them back.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from alpineagents._builtin_tools import ASK
from alpineagents.history import COMPACTION as COMPACTION
from alpineagents.history import CONTINUING_STOP_REASONS as CONTINUING_STOP_REASONS
from alpineagents.history import KINDS as KINDS
from alpineagents.history import MODEL as MODEL
from alpineagents.history import NOTICE as NOTICE
from alpineagents.history import TASK as TASK
from alpineagents.history import TOOL_RESULT as TOOL_RESULT
from alpineagents.history import USER as USER
from alpineagents.history import EntryKind as EntryKind
from alpineagents.history import HistoryEntry as HistoryEntry
from alpineagents.history import ToolCall as ToolCall
from alpineagents.history import UserData, check_json, check_stored_data, check_text
from alpineagents.history import ends_turn as ends_turn
from alpineagents.history import tool_calls as tool_calls
from alpineagents.history import utcnow as utcnow

# The history vocabulary above (kinds, HistoryEntry, tool_calls, …) stays importable from
# here, as before; alpineagents.history defines it.
__all__ = [
    "HistoryEntry",
    "SaveRecord",
    "State",
    "StoppedBy",
    "validate_id",
]

StoppedBy = Literal["reply", "finish", "ask", "max_steps"]

# How an accepted answer becomes JSON: ``dump(answer, path)``; raises NotJSONError.
AnswerDump = Callable[[Any, str], Any]

_ID_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,128}")


def validate_id(state_id: object) -> str:
    """Return ``state_id`` if it is a valid State id, else raise ``ValueError``.

    An id has ASCII letters, digits, ``_`` and ``-``, 1 to 128 characters, so that it is a
    safe file name and S3 key on every system.
    """
    if not isinstance(state_id, str) or not _ID_PATTERN.fullmatch(state_id):
        raise ValueError(
            f"invalid State id {state_id!r}: an id has letters, digits, _ and -, "
            "1 to 128 characters"
        )
    return state_id


@dataclass
class SaveRecord:
    """What the store has of one State: bookkeeping that is never saved itself.

    Only :mod:`alpineagents._saving` reads and writes it: a save plans its write from it and
    updates it once the store has the write; a load sets it to what was read.

    Attributes:
        store: The store the State is saved in (compared with ``==``), or ``None``.
        count: How many history entries the store has.
        snapshot: The snapshot the store has, or ``None`` for a State never saved.
        tried: Snapshots written since, by writes that did not report success: any of them
            may be the one the store has (see :class:`alpineagents._saving.Basis`).
    """

    store: object | None = None
    count: int = 0
    snapshot: dict[str, Any] | None = None
    tried: list[dict[str, Any]] = field(default_factory=list)


class State:
    """One run of an agent: its task, its history and your ``data``, ready to be saved.

    Args:
        task: What the agent is asked to do; the first message of the conversation.
        id: The State's id. Random unless given; letters, digits, ``_`` and ``-``, at most
            128 characters (``ValueError`` otherwise).
        data: Your own values, kept with the State. Must hold only JSON values when saved.
    """

    def __init__(self, task: str, *, id: str | None = None, data: dict[str, Any] | None = None):
        if not isinstance(task, str):
            raise TypeError(f"State task must be a str, not {type(task).__name__}")
        check_text(task, "the State's task")
        self.id: str = uuid.uuid4().hex if id is None else validate_id(id)
        self.task: str = task
        self.data: dict[str, Any] = {} if data is None else data
        self.history: list[HistoryEntry] = []
        self.stopped_by: StoppedBy | None = None
        self.answer: Any = None
        self.created_at: datetime = utcnow()
        self.updated_at: datetime = self.created_at
        # How the last run stopped, written only by the methods below (and read by the
        # serialiser): how many history entries the stop had, so that running again with
        # nothing added since returns the same answer without a model request; the Agent
        # that ran the State last; how to dump the answer it accepted, as (answer, dump).
        self._stop_seq: int | None = None
        self._agent_fingerprint: dict[str, Any] | None = None
        self._answer_dump: tuple[Any, AnswerDump] | None = None
        # What the store has; see SaveRecord.
        self._saved = SaveRecord()
        self.append(TASK, task)

    @classmethod
    def _restore(
        cls,
        state_id: str,
        task: str,
        *,
        data: dict[str, Any],
        history: list[HistoryEntry],
        stopped_by: StoppedBy | None,
        stop_seq: int | None,
        answer: Any,
        agent: dict[str, Any] | None,
        created_at: datetime,
        updated_at: datetime,
    ) -> State:
        """A State rebuilt from saved values (the serialiser's side of loading)."""
        state = cls(task, id=state_id, data=data)
        state.history = history
        state.stopped_by, state._stop_seq, state.answer = stopped_by, stop_seq, answer
        state._agent_fingerprint = agent
        state.created_at, state.updated_at = created_at, updated_at
        return state

    @property
    def _saved_count(self) -> int:
        # How many history entries the store has (read-only; kept for older callers).
        return self._saved.count

    # How the run stopped ---------------------------------------------------------------

    def _stop(self, how: StoppedBy, answer: Any, dump: AnswerDump | None = None) -> None:
        """Record that the run stopped now, with ``answer`` (and how to dump it, if known)."""
        self.stopped_by, self.answer = how, answer
        self._stop_seq = len(self.history)
        self._answer_dump = None if dump is None else (answer, dump)

    def _keep_stop(self) -> None:
        """If the run is stopped, count the entries added since as part of the stop."""
        if self.stopped_by is not None:
            self._stop_seq = len(self.history)

    def _restart(self) -> None:
        """Forget the last stop: a run is about to continue the conversation."""
        self.stopped_by, self.answer, self._stop_seq = None, None, None

    def _unchanged_since_stop(self) -> bool:
        """Whether the run stopped and nothing was added to history since."""
        return self.stopped_by is not None and self._stop_seq == len(self.history)

    def _run_by(self, fingerprint: dict[str, Any]) -> dict[str, Any] | None:
        """Record the Agent that runs the State now; return the one that ran it before."""
        before, self._agent_fingerprint = self._agent_fingerprint, fingerprint
        return before

    def __repr__(self) -> str:
        return (
            f"State(id={self.id!r}, task={_short(self.task)!r}, entries={len(self.history)}, "
            f"stopped_by={self.stopped_by!r})"
        )

    def append(
        self,
        kind: EntryKind,
        text: str = "",
        data: dict[str, Any] | None = None,
        *,
        error: BaseException | None = None,
    ) -> HistoryEntry:
        """Add an entry at the end of ``history`` and return it.

        Raises :class:`~alpineagents.errors.NotJSONError` if ``text`` or ``data`` hold
        something a store cannot keep (see :func:`alpineagents.history.check_json`), and
        ``ValueError`` if ``data`` is not what an entry of ``kind`` holds
        (a tool result without ``call_id``, a model entry's content block of no known shape,
        ...): what a load would refuse is never saved. The entry keeps a JSON copy of
        ``data``.
        """
        if kind not in KINDS:
            raise ValueError(f"unknown history entry kind {kind!r}: one of {sorted(KINDS)}")
        seq = len(self.history)
        check_text(text, f"the text of history entry {seq} ({kind})")
        data = check_json({} if data is None else data, f"the data of history entry {seq}")
        try:
            check_stored_data(kind, data, seq)
        except ValueError as e:
            raise ValueError(f"history entry {seq} ({kind}): {e}") from None
        entry = HistoryEntry(seq, kind, text, data, error)
        self.history.append(entry)
        return entry

    def add_user_message(self, text: str) -> None:
        """Add the person's message to the conversation.

        If the last run stopped with ``ask``, the message is the answer to that question.
        The message is saved by the next ``run`` or by ``agent.save(state)``.
        """
        if not isinstance(text, str):
            raise TypeError(f"a user message must be a str, not {type(text).__name__}")
        check_text(text, "the user message")
        self.append(USER, text, UserData(self.pending_ask()).to_data())

    # Reading history -------------------------------------------------------------------

    def live_entries(self) -> list[HistoryEntry]:
        """History without the entries a notice left out of the model's context.

        After a store failed halfway, entries it saved beyond a step that cannot be replayed
        stay in ``history`` but are no longer part of the conversation.
        """
        skipped: set[int] = set()
        for entry in self.history:
            if entry.kind == NOTICE and (notice := entry.as_notice()).skipped is not None:
                skipped.update(range(*notice.skipped))
        if not skipped:
            return self.history
        return [e for e in self.history if e.seq not in skipped]

    def last_model_entry(self) -> HistoryEntry | None:
        """The most recent model response in the conversation, or ``None``."""
        for entry in reversed(self.live_entries()):
            if entry.kind == MODEL:
                return entry
        return None

    def open_calls(self) -> list[ToolCall]:
        """Tool calls of the last model response that have no result in history yet."""
        last = self.last_model_entry()
        if last is None:
            return []
        answered = {
            e.as_tool_result().call_id if e.kind == TOOL_RESULT else e.as_user().answers
            for e in self.live_entries()
            if e.seq > last.seq and e.kind in (TOOL_RESULT, USER)
        }
        return [call for call in tool_calls(last) if call["id"] not in answered]

    def pending_ask(self) -> str | None:
        """The id of the ``ask`` call waiting for the person's answer, if any."""
        if self.stopped_by != ASK:
            return None
        for call in self.open_calls():
            if call["name"] == ASK:
                return str(call["id"])
        return None


def _short(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
