"""The Agent's own tools, ``finish`` and ``ask``: their names, definitions and rules.

``finish(answer)`` stops the run with the answer, typed by the Agent's ``output_type``;
``ask(question)`` stops it with a question, and the person's next message is that call's
result. Neither has side effects, so a loaded State never gets an "(unknown: …)" result or
an "(aborted: …)" result for them: the Agent handles them again. User tools cannot take
their names.

This module knows no State: :func:`settle` decides what a response's built-in calls do,
and the Agent records the results and the stop.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from alpineagents.history import ToolCall

__all__ = ["ASK", "FINISH", "NAMES", "Settled", "definitions", "settle"]

FINISH: Final = "finish"
ASK: Final = "ask"
NAMES: Final = frozenset({FINISH, ASK})

FINISH_DESCRIPTION: Final = "Call this when the task is done, with the final answer."
ASK_DESCRIPTION: Final = (
    "Ask the person a question and wait for the answer. Use it only when you cannot go on "
    "without them."
)


def definitions(answer_schema: dict[str, Any]) -> list[dict[str, Any]]:
    """The two tools as the model sees them; ``finish`` takes an answer of ``answer_schema``."""
    answer_schema = dict(answer_schema)
    defs = answer_schema.pop("$defs", None)
    finish: dict[str, Any] = {
        "type": "object",
        "properties": {"answer": answer_schema},
        "required": ["answer"],
    }
    if defs:
        finish["$defs"] = defs
    return [
        {"name": FINISH, "description": FINISH_DESCRIPTION, "input_schema": finish},
        {
            "name": ASK,
            "description": ASK_DESCRIPTION,
            "input_schema": {
                "type": "object",
                "properties": {"question": {"type": "string"}},
                "required": ["question"],
            },
        },
    ]


@dataclass(frozen=True)
class Result:
    """The result one built-in call gets."""

    call: ToolCall
    text: str
    is_error: bool = False
    error: BaseException | None = None


@dataclass(frozen=True)
class Settled:
    """What a response's built-in calls do: their results, and how the run stops (if it does).

    ``answer_json`` is the JSON form of an accepted ``finish`` answer, made by the answer's own
    type, so that saving it needs no guess.
    """

    results: list[Result]
    stopped_by: Literal["finish", "ask"] | None = None
    answer: Any = None
    answer_json: tuple[Any, Any] | None = None


def settle(
    calls: Sequence[ToolCall],
    accept: Callable[[dict[str, Any]], tuple[Any, Any]],
    invalid: tuple[type[BaseException], ...],
) -> Settled:
    """Decide the built-in calls among ``calls`` (the open calls of the last response).

    The first ``finish`` whose answer ``accept`` takes (it returns the answer and its JSON
    form, or raises one of ``invalid``) stops the run; later ones are ignored. Otherwise the
    first ``ask`` stops it, and other questions are not asked.
    """
    results: list[Result] = []
    finished: tuple[Any, Any] | None = None
    for call in (c for c in calls if c["name"] == FINISH):
        if finished is not None:
            results.append(Result(call, "(ignored: the run already finished)"))
            continue
        try:
            finished = accept(call["input"])
        except invalid as e:
            text = f"The answer is not valid: {e}. Call finish again with a valid answer."
            results.append(Result(call, text, True, e))
            continue
        results.append(Result(call, "Answer accepted."))
    asks = [c for c in calls if c["name"] == ASK]
    if finished is not None:
        results += [Result(call, "(not asked: the run finished)") for call in asks]
        return Settled(results, FINISH, finished[0], finished)
    results += [Result(call, "(not asked: one question at a time)") for call in asks[1:]]
    if asks:
        return Settled(results, ASK, str(asks[0]["input"].get("question", "")))
    return Settled(results)
