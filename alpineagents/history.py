"""History entries: one record per step of a run, tagged by ``kind``.

An entry keeps its kind-specific values in ``data``, a dict of JSON, exactly as stores keep
it. Each kind's shape is a small frozen dataclass here; read an entry through it
(``entry.as_model().stop_reason``) instead of ``entry.data.get(...)``, and write one with
``Shape(...).to_data()``, which gives the dict every store has kept so far.

* ``task`` (no data): the task the State was created with (always seq 0);
* ``user`` (:class:`UserData`): a message from the person, maybe the answer to ``ask``;
* ``model`` (:class:`ModelData`): one model response: content blocks, stop reason, usage;
* ``tool_result`` (:class:`ToolResultData`): one tool call's result (``text`` holds it);
* ``compaction`` (:class:`CompactionData`): older context replaced by a summary (``text``);
* ``notice`` (:class:`NoticeData`): something the model must be told, e.g. skipped steps.

What an entry (and a State) may hold is JSON that every store can write and read back:
:func:`check_json` and :func:`check_text` (in ``_json_rules``) refuse anything else with
:class:`NotJSONError`, naming the path to the value, before it is kept.

(Longer than this project's ~400 lines on purpose: each kind's shape and the check of what a
stored entry of that kind may hold are kept side by side, one record of each kind, so that a
shape and its check change together.)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, Literal, NoReturn, TypedDict, TypeGuard, get_args

from alpineagents._json_rules import MAX_DEPTH as MAX_DEPTH
from alpineagents._json_rules import check_json as check_json
from alpineagents._json_rules import check_text as check_text

__all__ = [
    "COMPACTION",
    "CONTINUING_STOP_REASONS",
    "KINDS",
    "MAX_DEPTH",
    "MODEL",
    "NOTICE",
    "TASK",
    "TOOL_RESULT",
    "USER",
    "CompactionData",
    "EntryKind",
    "HistoryEntry",
    "ModelData",
    "NoticeData",
    "ToolCall",
    "ToolResultData",
    "UserData",
    "check_json",
    "check_stored_data",
    "check_text",
    "ends_turn",
    "tool_calls",
    "utcnow",
]

EntryKind = Literal["task", "user", "model", "tool_result", "compaction", "notice"]

TASK: Final = "task"
USER: Final = "user"
MODEL: Final = "model"
TOOL_RESULT: Final = "tool_result"
COMPACTION: Final = "compaction"
NOTICE: Final = "notice"

KINDS: Final[frozenset[str]] = frozenset(get_args(EntryKind))
# Responses that need another request to finish the turn: no stop, even without tool calls.
CONTINUING_STOP_REASONS: Final = frozenset({"pause_turn", "model_context_window_exceeded"})


def utcnow() -> datetime:
    """The current time, timezone-aware, in UTC."""
    return datetime.now(UTC)


class ToolCall(TypedDict):
    """One tool call block of a model response."""

    type: Literal["tool_call"]
    id: str
    name: str
    input: dict[str, Any]


@dataclass(frozen=True)
class UserData:
    """A ``user`` entry's data: ``answers`` is the id of the ``ask`` call it answers."""

    answers: str | None = None

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> UserData:
        """Read an entry's ``data``."""
        return cls(data.get("answers"))

    def to_data(self) -> dict[str, Any]:
        """The entry's ``data``."""
        return {} if self.answers is None else {"answers": self.answers}


@dataclass(frozen=True)
class ModelData:
    """A ``model`` entry's data.

    The response's content blocks (text, tool calls, …), why it stopped, its token usage
    and the model that wrote it.
    """

    content: list[dict[str, Any]] = field(default_factory=list)
    stop_reason: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    model: str | None = None

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> ModelData:
        """Read an entry's ``data``."""
        return cls(
            data.get("content", []),
            data.get("stop_reason"),
            data.get("usage", {}),
            data.get("model"),
        )

    def to_data(self) -> dict[str, Any]:
        """The entry's ``data``."""
        return {
            "content": self.content,
            "stop_reason": self.stop_reason,
            "usage": self.usage,
            "model": self.model,
        }

    @property
    def text(self) -> str:
        """The text blocks of the content, joined (as a model entry's ``text`` usually is)."""
        return model_text(self.content) or ""

    @property
    def tool_calls(self) -> list[ToolCall]:
        """The tool call blocks of the content."""
        return [b for b in self.content if b.get("type") == "tool_call"]  # type: ignore[misc]


@dataclass(frozen=True)
class ToolResultData:
    """A ``tool_result`` entry's data: which call it answers, and whether it is an error.

    ``unknown`` marks the result a loaded State gives a call that was running when its
    process stopped.
    """

    call_id: str = ""
    name: str = ""
    is_error: bool = False
    unknown: bool = False

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> ToolResultData:
        """Read an entry's ``data``."""
        return cls(
            data.get("call_id", ""),
            data.get("name", ""),
            data.get("is_error", False),
            data.get("unknown", False),
        )

    def to_data(self) -> dict[str, Any]:
        """The entry's ``data``."""
        data: dict[str, Any] = {
            "call_id": self.call_id,
            "name": self.name,
            "is_error": self.is_error,
        }
        if self.unknown:
            data["unknown"] = True
        return data


@dataclass(frozen=True)
class CompactionData:
    """A ``compaction`` entry's data: the last seq the summary covers, usage and model."""

    covers: int
    usage: dict[str, int] = field(default_factory=dict)
    model: str | None = None

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> CompactionData:
        """Read an entry's ``data``."""
        return cls(data["covers"], data.get("usage", {}), data.get("model"))

    def to_data(self) -> dict[str, Any]:
        """The entry's ``data``."""
        return {"covers": self.covers, "usage": self.usage, "model": self.model}


@dataclass(frozen=True)
class NoticeData:
    """A ``notice`` entry's data.

    ``skipped`` is the range of seqs ``[start, end)`` the notice leaves out of the model's
    context, if any.
    """

    skipped: tuple[int, int] | None = None

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> NoticeData:
        """Read an entry's ``data``."""
        skipped = data.get("skipped")
        return cls(None if skipped is None else (skipped[0], skipped[1]))

    def to_data(self) -> dict[str, Any]:
        """The entry's ``data``."""
        return {} if self.skipped is None else {"skipped": list(self.skipped)}


@dataclass(eq=True)
class HistoryEntry:
    """One step of a run, in the order it happened.

    Attributes:
        seq: The entry's position in ``State.history`` (0, 1, 2, …).
        kind: What the entry records: ``"task"``, ``"user"``, ``"model"``, ``"tool_result"``,
            ``"compaction"`` or ``"notice"``.
        text: The entry as text: the message, the model's reply, the tool result, the summary.
        data: Kind-specific JSON data (the model's content blocks, a tool call's id, …); the
            ``as_…`` methods read it as the kind's shape.
        error: The exception behind an error result while in memory; ``None`` after loading
            (``text`` still holds the exception type and message).
        at: When the entry was made (UTC).
    """

    seq: int
    kind: EntryKind
    text: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    error: BaseException | None = field(default=None, compare=False, repr=False)
    at: datetime = field(default_factory=utcnow)

    def as_user(self) -> UserData:
        """A ``user`` entry's data; ``ValueError`` for another kind."""
        return UserData.from_data(self._data_of(USER))

    def as_model(self) -> ModelData:
        """A ``model`` entry's data; ``ValueError`` for another kind."""
        return ModelData.from_data(self._data_of(MODEL))

    def as_tool_result(self) -> ToolResultData:
        """A ``tool_result`` entry's data; ``ValueError`` for another kind."""
        return ToolResultData.from_data(self._data_of(TOOL_RESULT))

    def as_compaction(self) -> CompactionData:
        """A ``compaction`` entry's data; ``ValueError`` for another kind.

        A compaction appended without ``covers`` covers every entry before it.
        """
        data = self._data_of(COMPACTION)
        if "covers" not in data:
            data = {**data, "covers": self.seq - 1}
        return CompactionData.from_data(data)

    def as_notice(self) -> NoticeData:
        """A ``notice`` entry's data; ``ValueError`` for another kind."""
        return NoticeData.from_data(self._data_of(NOTICE))

    def _data_of(self, kind: EntryKind) -> dict[str, Any]:
        if self.kind != kind:
            raise ValueError(f"history entry {self.seq} is a {self.kind!r} entry, not {kind!r}")
        return self.data


def tool_calls(entry: HistoryEntry) -> list[ToolCall]:
    """The tool calls of a model entry: dicts with ``id``, ``name`` and ``input``."""
    return entry.as_model().tool_calls if entry.kind == MODEL else []


def ends_turn(entry: HistoryEntry) -> bool:
    """Whether a model entry is a reply that ends the run: no tool calls, and done."""
    if entry.kind != MODEL:
        return False
    response = entry.as_model()
    return not response.tool_calls and response.stop_reason not in CONTINUING_STOP_REASONS


# What a stored entry's data may be -----------------------------------------------------------

# Content blocks of a model response that alpineagents reads; any other type is a block the
# model's API wrote (thinking, server tools, …), kept and sent back as it is. ``tool_use``
# and ``tool_result`` are the API's names for blocks an adapter translates: never stored.
_TRANSLATED_BLOCKS: Final = frozenset({"tool_use", "tool_result"})
_BLOCK_TYPE: Final = re.compile(r"[a-z][a-z0-9_]*")
# What a model entry's data without ``content`` or ``usage`` has (never changed).
_NO_BLOCKS: Final[list[dict[str, Any]]] = []
_NO_USAGE: Final[dict[str, int]] = {}


def check_stored_data(kind: str, data: dict[str, Any], seq: int) -> None:
    """Check the ``data`` of a stored entry of ``kind`` at ``seq``; ``ValueError`` if bad.

    Checked is what alpineagents reads of it (the shapes above, the model's content blocks),
    so that a damaged entry is refused when it is loaded instead of failing later, on the
    next run or when a request is formatted. The message starts with the field's path
    (``data['content'][0]['text'] must be a str, not 5 (int)``). Keys alpineagents does not
    read are left alone. A load checks every entry, so the checks build no message (and no
    path) unless one fails.
    """
    if kind == MODEL:
        check_model_data(data)
    elif kind == TOOL_RESULT:
        if "call_id" not in data:
            raise ValueError("data['call_id'] is missing: a tool result names the call it answers")
        if not isinstance(data["call_id"], str) or not data["call_id"]:
            _bad("data['call_id']", "a call id (a non-empty str)", data["call_id"])
        _optional(data, "name", str)
        _optional(data, "is_error", bool)
        _optional(data, "unknown", bool)
    elif kind == USER:
        _optional(data, "answers", str)
    elif kind == COMPACTION:
        covers = data.get("covers", seq - 1)  # without it: every entry before
        if not is_int(covers) or not 0 <= covers < seq:
            _bad("data['covers']", f"the seq of an earlier entry (0 to {seq - 1})", covers)
        _check_usage(data)
        _optional(data, "model", str)
    elif kind == NOTICE:
        skipped = data.get("skipped")
        if skipped is not None and not (
            isinstance(skipped, list)
            and len(skipped) == 2
            and all(is_int(n) for n in skipped)
            and 1 <= skipped[0] <= skipped[1] <= seq
        ):
            _bad(
                "data['skipped']", f"null or [start, end] with 1 <= start <= end <= {seq}", skipped
            )
    # Any other kind (``task``, or a newer alpineagents' kind) has no data alpineagents reads.


def check_model_data(data: dict[str, Any]) -> str:
    """Check the ``data`` of a stored model entry (see :func:`check_stored_data`).

    Returns the text of its text blocks, joined: the entry's text when it has no other.
    """
    content = data.get("content", [])
    if type(content) is not list and not isinstance(content, list):
        _bad("data['content']", "a list of content blocks", content)
    texts = []
    for index, block in enumerate(content):
        _check_block(block, index)
        if block["type"] == "text":
            texts.append(block["text"])
    stop_reason, model = data.get("stop_reason"), data.get("model")
    if stop_reason is not None and type(stop_reason) is not str:
        _optional(data, "stop_reason", str)
    _check_usage(data)
    if model is not None and type(model) is not str:
        _optional(data, "model", str)
    return texts[0] if len(texts) == 1 else "".join(texts)


def plain_model_text(data: dict[str, Any]) -> str | None:
    """The text of a stored model entry's ``data`` of the usual shape, else ``None``.

    The quick half of :func:`check_model_data`, for a load: exact JSON types only, no path
    or message built. A ``data`` it answers for passes :func:`check_model_data`, which would
    return the same text; ``None`` means "check it with :func:`check_model_data`", which
    then says what is wrong, or accepts a shape this one leaves to it.
    """
    content = data.get("content", _NO_BLOCKS)
    if type(content) is not list:
        return None
    texts = []
    for block in content:
        if type(block) is not dict:
            return None
        kind = block.get("type")
        if kind == "text":
            text = block.get("text")
            if type(text) is not str:
                return None
            texts.append(text)
        elif kind == "tool_call":
            call_id, name = block.get("id"), block.get("name")
            if (
                type(call_id) is not str
                or not call_id
                or type(name) is not str
                or not name
                or type(block.get("input")) is not dict
            ):
                return None
        elif type(kind) is not str or kind in _TRANSLATED_BLOCKS or not _BLOCK_TYPE.fullmatch(kind):
            return None
    stop_reason, model = data.get("stop_reason"), data.get("model")
    if stop_reason is not None and type(stop_reason) is not str:
        return None
    if model is not None and type(model) is not str:
        return None
    usage = data.get("usage", _NO_USAGE)
    if type(usage) is not dict:
        return None
    for count in usage.values():
        if type(count) is not int:
            return None
    return texts[0] if len(texts) == 1 else "".join(texts)


def plain_stored_data(kind: str, data: dict[str, Any]) -> bool:
    """Whether the ``data`` of a stored entry of ``kind`` (not a model entry) is of the usual shape.

    The quick half of :func:`check_stored_data` for the kinds a run makes most (tool results,
    the person's messages, the task): exact JSON types only, no message built. True means
    that check passes; False means "check it with :func:`check_stored_data`".
    """
    if kind == TOOL_RESULT:
        call_id, name = data.get("call_id"), data.get("name")
        is_error, unknown = data.get("is_error"), data.get("unknown")
        return (
            type(call_id) is str
            and call_id != ""
            and (name is None or type(name) is str)
            and (is_error is None or type(is_error) is bool)
            and (unknown is None or type(unknown) is bool)
        )
    if kind == USER:
        answers = data.get("answers")
        return answers is None or type(answers) is str
    return kind == TASK


def model_text(content: list[dict[str, Any]]) -> str | None:
    """The text of a model response: its text blocks joined (``None`` if a block has no str).

    A model entry's ``text`` is this, unless it was appended with other text; a store keeps
    the text only in the content blocks then (see :mod:`alpineagents._serialize`).
    """
    if not isinstance(content, list):
        return None
    texts = []
    for block in content:
        if isinstance(block, dict) and block.get("type") == "text":
            text = block.get("text")
            if not isinstance(text, str):
                return None
            texts.append(text)
    return texts[0] if len(texts) == 1 else "".join(texts)


def _check_block(block: Any, index: int) -> None:
    if not isinstance(block, dict):
        _bad(f"data['content'][{index}]", "a content block (a dict)", block)
    kind = block.get("type")
    # The two types alpineagents writes pass without the pattern (``kind`` may be unhashable).
    if (
        kind != "text"
        and kind != "tool_call"
        and (
            not isinstance(kind, str)
            or not _BLOCK_TYPE.fullmatch(kind)
            or kind in _TRANSLATED_BLOCKS
        )
    ):
        path = f"data['content'][{index}]['type']"
        _bad(path, "a content block type such as 'text' or 'tool_call'", kind)
    if kind == "text":
        if not isinstance(block.get("text"), str):
            _bad(f"data['content'][{index}]['text']", "a str", block.get("text"))
    elif kind == "tool_call":
        for key in ("id", "name"):
            value = block.get(key)
            if not isinstance(value, str) or not value:
                path = f"data['content'][{index}][{key!r}]"
                _bad(path, f"the call's {key} (a non-empty str)", value)
        if not isinstance(block.get("input"), dict):
            _bad(
                f"data['content'][{index}]['input']",
                "a dict of the call's arguments",
                block.get("input"),
            )


def _check_usage(data: dict[str, Any]) -> None:
    usage = data.get("usage", {})
    if not isinstance(usage, dict):
        _bad("data['usage']", "a dict of token counts", usage)
    for key, count in usage.items():
        if type(count) is not int and not is_int(count):
            _bad(f"data['usage'][{key!r}]", "a token count (an int)", count)


def _optional(data: dict[str, Any], key: str, kind: type) -> None:
    value = data.get(key)
    if value is not None and not isinstance(value, kind):
        _bad(f"data[{key!r}]", f"null or a {kind.__name__}", value)


def is_int(value: object) -> TypeGuard[int]:
    """Whether ``value`` is an int as JSON has them (``True`` is not)."""
    return isinstance(value, int) and not isinstance(value, bool)


def shown(value: Any) -> str:
    """A stored value as an error message shows it: short, with its type."""
    if value is None:
        return "null"
    text = repr(value)
    if len(text) > 40:
        text = text[:39] + "…"
    return f"{text} ({type(value).__name__})"


def _bad(path: str, expected: str, value: Any) -> NoReturn:
    raise ValueError(f"{path} must be {expected}, not {shown(value)}")
