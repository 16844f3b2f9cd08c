"""How ``alpineagents`` prints: the ``ls`` table, the ``show`` transcript, progress, outcomes."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

from alpineagents._cli.redact import shown
from alpineagents.state import HistoryEntry, State
from alpineagents.store import SavedState, Store
from alpineagents.transfer import Transferred

_INDENT = "    "


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _cut(text: str, width: int) -> str:
    if width < 1:
        return ""
    return text if len(text) <= width else text[: width - 1] + "…"


def _time(when: datetime | None) -> str:
    if when is None:
        return "-"
    if when.tzinfo is not None:
        when = when.astimezone(UTC)
    return when.strftime("%Y-%m-%d %H:%M:%S")


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


# ls ---------------------------------------------------------------------------------------


def summary_json(saved: SavedState, entries: int | None) -> dict[str, Any]:
    """One State of ``ls --json``."""
    return {
        "id": saved.id,
        "updated_at": saved.updated_at.isoformat(),
        "stopped_by": saved.stopped_by,
        "entries": entries,
        "task": saved.task,
    }


def table(rows: Sequence[tuple[SavedState, int | None]], width: int | None) -> Iterator[str]:
    """The ``ls`` table: a header, then one line per State; the task cut to fit ``width``."""
    header = ("ID", "UPDATED (UTC)", "STOPPED_BY", "ENTRIES", "TASK")
    cells = [
        (
            saved.id,
            _time(saved.updated_at),
            saved.stopped_by or "-",
            "?" if entries is None else str(entries),
        )
        for saved, entries in rows
    ]
    widths = [max([len(header[i]), *(len(c[i]) for c in cells)]) for i in range(4)]

    def line(values: Sequence[str], task: str) -> str:
        left = "  ".join(
            v.rjust(w) if i == 3 else v.ljust(w)
            for i, (v, w) in enumerate(zip(values, widths, strict=True))
        )
        room = (width - len(left) - 2) if width else 80
        return f"{left}  {_cut(_one_line(task), max(room, 10))}".rstrip()

    yield line(header[:4], header[4])
    for (saved, _), values in zip(rows, cells, strict=True):
        yield line(values, saved.task)


# show -------------------------------------------------------------------------------------


def _status(state: State) -> str:
    if state.stopped_by is None:
        return "not stopped (still running, or its process stopped mid-run)"
    return f"stopped by {state.stopped_by}"


def state_json(state: State, saved: int) -> dict[str, Any]:
    """The whole State for ``show --json``."""
    return {
        "id": state.id,
        "task": state.task,
        "stopped_by": state.stopped_by,
        "answer": state.answer,
        "data": state.data,
        "created_at": getattr(state, "created_at", None),
        "updated_at": getattr(state, "updated_at", None),
        "saved_entries": saved,
        "history": [
            {
                "seq": e.seq,
                "kind": e.kind,
                "text": e.text,
                "data": e.data,
                "at": getattr(e, "at", None),
                "saved": e.seq < saved,
            }
            for e in state.history
        ],
    }


def transcript(state: State, saved: int) -> Iterator[str]:
    """A header with the State's status and data, then its history, entry by entry."""
    yield f"State {state.id}"
    yield f"  status   {_status(state)}"
    if state.stopped_by in ("finish", "reply", "ask"):
        label = {"finish": "answer", "reply": "reply", "ask": "question"}[state.stopped_by]
        yield f"  {label:<8} {_one_line(_text(state.answer))}"
    yield f"  updated  {_time(getattr(state, 'updated_at', None))} UTC"
    yield f"  created  {_time(getattr(state, 'created_at', None))} UTC"
    yield f"  entries  {len(state.history)}" + (
        f" ({len(state.history) - saved} added when loading)" if len(state.history) > saved else ""
    )
    yield f"  data     {_json(state.data)}"
    for entry in state.history:
        yield ""
        yield from _entry(entry, unsaved=entry.seq >= saved)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else _json(value)


def _block(text: str) -> Iterator[str]:
    for line in text.splitlines() or [""]:
        yield f"{_INDENT}{line}".rstrip()


def _call(call: dict[str, Any]) -> str:
    arguments = call.get("input")
    if isinstance(arguments, dict):
        shown = ", ".join(f"{k}={_json(v)}" for k, v in arguments.items())
    else:
        shown = _json(arguments)
    return f"-> {call.get('name', '?')}({shown})  [{call.get('id', '?')}]"


def _entry(entry: HistoryEntry, *, unsaved: bool) -> Iterator[str]:
    at = getattr(entry, "at", None)
    when = at.strftime("%H:%M:%S") if isinstance(at, datetime) else ""
    note = "  (not saved: added when loading)" if unsaved else ""
    data = entry.data if isinstance(entry.data, dict) else {}
    kind = entry.kind

    def head(label: str) -> str:
        return f"[{entry.seq}] {label}  {when}{note}".rstrip()

    if kind == "task":
        yield head("task")
        yield from _block(entry.text)
    elif kind == "user":
        answers = data.get("answers")
        yield head(f"user (answers {answers})" if answers else "user")
        yield from _block(entry.text)
    elif kind == "model":
        yield head("model")
        blocks = data.get("content")
        blocks = blocks if isinstance(blocks, list) else []
        texts = [
            b.get("text", "") for b in blocks if isinstance(b, dict) and b.get("type") == "text"
        ]
        text = entry.text or "\n".join(texts)
        if text:
            yield from _block(text)
        for block in blocks:
            if not isinstance(block, dict) or block.get("type") == "text":
                continue
            if block.get("type") == "tool_call":
                yield f"{_INDENT}{_call(block)}"
            else:
                yield f"{_INDENT}[{block.get('type', 'block')}]"
    elif kind == "tool_result":
        error = " ERROR" if data.get("is_error") else ""
        yield head(f"tool result {data.get('name', '?')} [{data.get('call_id', '?')}]{error}")
        yield from _block(entry.text)
    elif kind == "compaction":
        yield head("compaction: older context replaced by this summary")
        yield from _block(entry.text)
    elif kind == "notice":
        skipped = data.get("skipped")
        yield head(
            f"notice (entries {skipped[0]}-{skipped[1] - 1} left out)"
            if isinstance(skipped, list) and len(skipped) == 2
            else "notice"
        )
        yield from _block(entry.text)
    else:
        yield head(kind)
        if entry.text:
            yield from _block(entry.text)
        if data:
            yield f"{_INDENT}{_json(data)}"


# cp / mv / import -------------------------------------------------------------------------

_DONE = {
    "copied": "copied",
    "identical": "already there",
    "kept": "kept a different one in",
    "replaced": "replaced in",
}


def outcome_line(outcome: Transferred, dst: Store) -> str:
    """One State's outcome: ``copied run-1 (5 entries)``."""
    words = {
        "copied": f"copied {outcome.id} ({outcome.entries} entries)",
        "identical": f"{outcome.id} is already there, identical",
        "kept": f"kept the different {outcome.id} of {shown(dst)}",
        "replaced": f"replaced {outcome.id} ({outcome.entries} entries)",
    }[outcome.action]
    return words + (", removed from the source" if outcome.removed else "")


def transfer_summary(done: Sequence[Transferred], move: bool, src: Store, dst: Store) -> str:
    """The closing line of ``cp``/``mv``."""
    counts = {action: sum(t.action == action for t in done) for action in _DONE}
    parts = [f"{counts['copied']} copied", f"{counts['identical']} already there"]
    parts += [f"{counts[a]} {a}" for a in ("kept", "replaced") if counts[a]]
    if move:
        parts.append(f"{sum(t.removed for t in done)} removed from {shown(src)}")
    return f"{len(done)} State(s) {shown(src)} -> {shown(dst)}: " + ", ".join(parts)


class ProgressBar:
    """A one-line progress bar on a terminal, redrawn in place."""

    def __init__(self, stream: TextIO, width: int = 30):
        self.stream = stream
        self.width = width
        self._shown = False

    def draw(self, done: int, total: int, label: str) -> None:
        """Show ``done`` of ``total``."""
        filled = self.width * done // total if total else self.width
        bar = "#" * filled + "." * (self.width - filled)
        self.stream.write(f"\r[{bar}] {done}/{total} {_cut(label, 40)}\x1b[K")
        self.stream.flush()
        self._shown = True

    def clear(self) -> None:
        """Remove the bar from its line."""
        if self._shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._shown = False
