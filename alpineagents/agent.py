"""The Agent: the run loop, its steps, and every save point.

This module is long on purpose: the run loop, its steps and the save points between them are
one sequence, kept in one place so that it can be read, and checked against the guide, in order.

A run is a sequence of steps (``think``, ``use_tools``, ``compact``) with saves between them.
The sequence lives once, in :meth:`Agent._steps`, a generator that yields what to do next;
``run`` and ``arun`` are two thin drivers that do it, one with blocking calls and one with
awaits. Each save happens at a named :class:`SavePoint`, in the order of the user guide's
table "When the Agent saves":

* ``RUN_STARTS`` and ``RUN_ENDS``: everything not saved yet;
* ``BEFORE_THINK`` and ``AFTER_THINK``: everything not saved yet;
* ``AFTER_TOOL_RESULT``: that result alone, at once, while other tools still run;
* ``AFTER_USE_TOOLS`` and ``AFTER_COMPACT``: everything not saved yet;
* ``AGENT_SAVE`` (``agent.save(state)``): everything not saved yet.

Every save point reached is logged at DEBUG level on this module's logger, with what it wrote.

When the run ends with an exception (Ctrl+C, ``sys.exit``, SIGTERM turned into
``SystemExit``, cancellation, an API error), tool calls without a result are closed with
``(aborted: <ExceptionType>)`` and the State is saved before the exception propagates.

(Longer than this project's ~400 lines on purpose: the steps are public methods of one class,
each with its async twin, that users override, and the sequence of steps and save points above
is read best in one place. What is not the loop lives elsewhere: the save points themselves,
the checks before a run and the note of a failed save in ``_save_points``, the context in
``_context``, the built-in tools in ``_builtin_tools``, saving in ``Store.save``.)
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import queue
import re
import threading
from collections.abc import Callable, Generator, Iterable
from typing import Any, Final, Literal

import pydantic

from alpineagents import _builtin_tools as builtin_tools
from alpineagents import _save_points, _saving
from alpineagents._context import build_messages
from alpineagents._save_points import SavePoint
from alpineagents.errors import AlpineAgentsError, NotJSONError
from alpineagents.history import (
    COMPACTION,
    MAX_DEPTH,
    MODEL,
    NOTICE,
    TOOL_RESULT,
    USER,
    CompactionData,
    HistoryEntry,
    ModelData,
    ToolCall,
    ToolResultData,
    check_json,
    check_text,
    ends_turn,
)
from alpineagents.model import Model, ModelRequest, ModelResponse
from alpineagents.state import State
from alpineagents.store import Store, open_store
from alpineagents.tools import Tool, ToolOutcome, as_tools, error_text

__all__ = ["Agent", "SavePoint"]

logger = logging.getLogger(__name__)

_SURROGATE: Final = re.compile(r"[\ud800-\udfff]")


Step = Literal["think", "use_tools", "compact"]
Op = Step | SavePoint

COMPACTION_PROMPT: Final = (
    "Summarise the conversation so far for yourself, to continue the task from the summary "
    "alone: what was asked, what you did and found (tool results that matter, with their "
    "values), what was decided, and what remains to do. Do not call tools."
)
TRUNCATED_CALL: Final = (
    "(not run: the response was cut off by the max_tokens limit before this call was "
    "complete. Call it again if it is still needed)"
)


class Agent:
    """Runs States with a model, tools and, if given, a store that keeps every step.

    Args:
        model: An Anthropic model id (``"claude-sonnet-5"``) or a :class:`Model` object,
            such as the offline models of :mod:`alpineagents.testing`.
        system: The system prompt.
        tools: Plain functions (sync or async) or :class:`Tool` objects.
        output_type: The type of the answer the model gives with ``finish(answer)``:
            ``str``, a pydantic model, a dataclass, a TypedDict, any type pydantic validates.
        store: A :class:`Store`, or a URL for :func:`open_store` (a folder, ``s3://…``).
            Without a store nothing is saved.
        max_steps: The most model requests one run makes before it stops with
            ``"max_steps"``.
        max_tokens: The longest model response.
        compact_at: When a response shows the context has grown past this many tokens,
            older steps are replaced in the context by a summary. ``None`` never compacts.

    With a store, the Agent saves at these save points (:class:`SavePoint`; the user guide's
    table "When the Agent saves", row by row); each writes only what the store lacks:

    * ``run`` starts and ends: ``SavePoint.RUN_STARTS``, ``SavePoint.RUN_ENDS``;
    * before and after each ``think``: ``SavePoint.BEFORE_THINK``, ``SavePoint.AFTER_THINK``;
    * after each tool result: ``SavePoint.AFTER_TOOL_RESULT`` (that result alone, at once);
    * after ``use_tools`` and ``compact``: ``SavePoint.AFTER_USE_TOOLS``,
      ``SavePoint.AFTER_COMPACT``;
    * ``agent.save(state)``: ``SavePoint.AGENT_SAVE``.

    Each save point reached is logged at DEBUG level (logger ``alpineagents.agent``).
    """

    def __init__(
        self,
        model: str | Model = "claude-sonnet-5",
        *,
        system: str = "",
        tools: Iterable[Callable[..., Any] | Tool] = (),
        output_type: Any = str,
        store: Store | str | None = None,
        max_steps: int = 50,
        max_tokens: int = 8192,
        compact_at: int | None = 150_000,
    ):
        if max_steps < 1:
            raise ValueError(f"max_steps must be at least 1, not {max_steps}")
        if isinstance(model, str):
            # The SDK is imported only for a model named by a string: about 2 s of start-up
            # that a process running a Model object of its own does not pay.
            from alpineagents.anthropic import AnthropicModel

            model = AnthropicModel(model)
        self.model: Model = model
        self.system = system
        self.tools: dict[str, Tool] = as_tools(tools)
        self.output_type = output_type
        self._answer = pydantic.TypeAdapter(output_type)
        self.store: Store | None = open_store(store) if isinstance(store, str) else store
        self.max_steps = max_steps
        self.max_tokens = max_tokens
        self.compact_at = compact_at
        self._definitions = [
            *(t.definition() for t in self.tools.values()),
            *builtin_tools.definitions(self._answer.json_schema()),
        ]
        self._fingerprint = {
            "model": self.model.name,
            "system": _digest(system),
            "tools": {d["name"]: _digest(repr(sorted(d.items()))) for d in self._definitions},
        }

    def __repr__(self) -> str:
        return f"Agent(model={self.model.name!r}, tools={list(self.tools)}, store={self.store!r})"

    # Running ---------------------------------------------------------------------------

    def run(self, state: State) -> Any:
        """Run ``state`` until it stops, and return the reply, the answer or the question.

        The State is saved at every save point when the Agent has a store. A State that
        stopped and got nothing new since returns the same result without a model request,
        except one stopped by ``max_steps``: running it again continues it, with up to
        ``max_steps`` more model requests (no user message needed).
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError(
                "Agent.run() was called from a running event loop, where it would block it: "
                "use `await agent.arun(state)` instead"
            )
        _check_state(state)
        if self.store is not None and self.store.is_async_only:
            raise TypeError(f"{self.store!r} is an async-only store: use `await agent.arun(state)`")
        steps = self._steps(state)
        op: Op | None = None
        result: Any = None
        try:
            while True:
                op = None  # an error raised by the loop itself is not a failed save
                op = steps.send(result)
                result = self._do(op, state)
        except StopIteration as stop:
            return stop.value
        except BaseException as error:
            self._close_calls(state, error)
            if self.store is not None and not (
                isinstance(op, SavePoint) and isinstance(error, Exception)
            ):
                # (A save that failed is not tried again at once; one interrupted is.)
                try:
                    self.store.save(state)
                except Exception as save_error:  # noqa: BLE001 - noted on the run's own error
                    _save_points.note_failed_save(error, save_error)
                # Ctrl+C while saving propagates from here instead of the original.
            raise

    async def arun(self, state: State) -> Any:
        """Async ``run``: async tools are awaited, sync tools run on worker threads.

        Cancel the task to stop the run: calls still running are closed with
        ``(aborted: CancelledError)`` and the State is saved.
        """
        _check_state(state)
        steps = self._steps(state)
        op: Op | None = None
        result: Any = None
        try:
            while True:
                op = None
                op = steps.send(result)
                result = await self._ado(op, state)
        except StopIteration as stop:
            return stop.value
        except BaseException as error:
            self._close_calls(state, error)
            if self.store is not None and not (
                isinstance(op, SavePoint) and isinstance(error, Exception)
            ):
                # (A save that failed is not tried again at once; one interrupted is.)
                try:
                    await self.store.asave(state)
                except Exception as save_error:  # noqa: BLE001 - noted on the run's own error
                    _save_points.note_failed_save(error, save_error)
            raise

    def save(self, state: State) -> None:
        """Save everything of ``state`` the store does not have yet (nothing if nothing changed).

        Use it for changes outside the Agent's steps, such as the person's next message.
        """
        _save_points.log_save(state, SavePoint.AGENT_SAVE, self._require_store().save(state))

    async def asave(self, state: State) -> None:
        """Async ``save``."""
        _save_points.log_save(state, SavePoint.AGENT_SAVE, await self._require_store().asave(state))

    def close(self) -> None:
        """Close the model's client (the store is yours to close)."""
        self.model.close()

    async def aclose(self) -> None:
        """Close the model's async client for the running event loop."""
        await self.model.aclose()

    def _do(self, op: Op, state: State) -> Any:
        if isinstance(op, SavePoint):
            if self.store is None:
                return False
            return _save_points.log_save(state, op, self.store.save(state))
        if op == "think":
            return self.think(state)
        if op == "use_tools":
            return self.use_tools(state)
        return self.compact(state)

    async def _ado(self, op: Op, state: State) -> Any:
        if isinstance(op, SavePoint):
            if self.store is None:
                return False
            return _save_points.log_save(state, op, await self.store.asave(state))
        if op == "think":
            return await self.athink(state)
        if op == "use_tools":
            return await self.ause_tools(state)
        return await self.acompact(state)

    # The run, once for both drivers ----------------------------------------------------

    def _steps(self, state: State) -> Generator[Op, Any, Any]:
        _save_points.check_before_run(state, self.store, self._fingerprint)
        if state._unchanged_since_stop() and state.stopped_by != "max_steps":
            # Stopped, and nothing added since: the same answer, without a model request.
            # (A State stopped by max_steps continues instead, with a new budget of steps.)
            yield SavePoint.RUN_STARTS
            yield SavePoint.RUN_ENDS
            return state.answer
        state._restart()
        yield SavePoint.RUN_STARTS
        steps = 0
        force_compaction = False
        while True:
            if state.open_calls():
                yield "use_tools"
                yield SavePoint.AFTER_USE_TOOLS
                if state.stopped_by is not None:
                    break
            if force_compaction or self._needs_compaction(state):
                yield "compact"
                yield SavePoint.AFTER_COMPACT
                force_compaction = False
            if steps >= self.max_steps:
                logger.info("State %s stopped after %d steps (max_steps)", state.id, steps)
                state._stop("max_steps", None)
                break
            yield SavePoint.BEFORE_THINK
            entry: HistoryEntry = yield "think"
            steps += 1
            reason = entry.as_model().stop_reason
            if ends_turn(entry):
                if reason in ("max_tokens", "refusal"):
                    logger.warning("State %s: the model stopped with %s", state.id, reason)
                state._stop("reply", entry.text)
                break
            # Open calls: use_tools runs them next. A pause (a server tool paused the turn):
            # the response goes back as it is. A full context window: compact, ask again.
            if reason == "model_context_window_exceeded":
                if self._compacted_last(state, entry):
                    raise AlpineAgentsError(
                        f"the context of State {state.id!r} exceeds the model's window even "
                        "after compaction"
                    )
                force_compaction = True
            yield SavePoint.AFTER_THINK
        yield SavePoint.RUN_ENDS  # after the last think, or after use_tools: with the stop
        return state.answer

    # think -----------------------------------------------------------------------------

    def think(self, state: State) -> HistoryEntry:
        """Make one model request with the current context and record the response."""
        return self._record_response(state, self.model.request(self._request(state)))

    async def athink(self, state: State) -> HistoryEntry:
        """Async ``think``."""
        return self._record_response(state, await self.model.arequest(self._request(state)))

    def _request(self, state: State) -> ModelRequest:
        return ModelRequest(
            system=self.system,
            messages=build_messages(state),
            tools=self._definitions,
            max_tokens=self.max_tokens,
        )

    def _record_response(self, state: State, response: ModelResponse) -> HistoryEntry:
        """Record a response; a tool call whose input cannot be saved gets an error result.

        Such a call is kept with empty input, and its result tells the model why, as for
        input that does not validate. Lone surrogates in the rest become U+FFFD; a response
        that still cannot be saved raises :class:`NotJSONError` and is not recorded.
        """
        logger.debug("State %s: model stopped with %s", state.id, response.stop_reason)
        content: list[dict[str, Any]] = []
        refused: list[tuple[ToolCall, NotJSONError]] = []
        for block in response.content:
            if isinstance(block, dict) and block.get("type") == "tool_call" and "input" in block:
                call: Any = _without_surrogates({k: v for k, v in block.items() if k != "input"})
                where = f"tool input of {call.get('id')} ({call.get('name')})"
                try:
                    # In the entry's data: ["content"][i]["input"], three levels down.
                    call["input"] = check_json(block["input"], where, depth=3)
                except NotJSONError as e:
                    call["input"] = {}
                    refused.append((call, e))
                content.append(call)
            else:
                content.append(_without_surrogates(block))
        cleaned = ModelResponse(content, response.stop_reason, response.usage, response.model)
        try:
            entry = state.append(
                MODEL,
                cleaned.text,
                ModelData(
                    cleaned.content,
                    _without_surrogates(cleaned.stop_reason),
                    cleaned.usage,
                    _without_surrogates(cleaned.model or self.model.name),
                ).to_data(),
            )
        except ValueError as e:  # a block or usage of no shape alpineagents keeps
            raise ValueError(
                f"State {state.id!r}: the response of the model {self.model.name!r} cannot be "
                f"kept: {e}. A Model returns ModelResponse content blocks of the documented "
                "shapes (text, tool_call, ...) and int usage counts"
            ) from None
        for call, error in refused:
            text = (
                f"Invalid input for tool {call['name']!r}: {error}. Call it again with valid input."
            )
            self._record_result(state, call, ToolOutcome(text, True, error))
        return entry

    # use_tools -------------------------------------------------------------------------

    def use_tools(self, state: State) -> None:
        """Run the open tool calls of the last response and handle ``finish`` and ``ask``.

        Several calls run concurrently on worker threads; each result is saved at once.
        """
        runnable = self._prepare_calls(state)
        if len(runnable) == 1:
            call, tool = runnable[0]
            self._record_result(state, call, tool.call(call["input"]))
            self._save_result(state)
        elif runnable:
            # Daemon threads: a process told to stop (SIGTERM, Ctrl+C) does not wait for them.
            done: queue.SimpleQueue[tuple[ToolCall, ToolOutcome | BaseException]]
            done = queue.SimpleQueue()
            for call, tool in runnable:
                threading.Thread(
                    target=_call_into,
                    args=(tool, call, done),
                    name=f"tool-{tool.name}",
                    daemon=True,
                ).start()
            for _ in runnable:
                call, outcome = done.get()
                if isinstance(outcome, BaseException):
                    raise outcome  # SystemExit or KeyboardInterrupt inside a tool ends the run
                self._record_result(state, call, outcome)
                self._save_result(state)
        self._handle_builtins(state)

    async def ause_tools(self, state: State) -> None:
        """Async ``use_tools``: async tools are awaited, sync tools run on worker threads."""
        runnable = self._prepare_calls(state)
        tasks = {asyncio.ensure_future(_acall_into(tool, call)): call for call, tool in runnable}
        try:
            pending = set(tasks)
            while pending:
                finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in finished:
                    outcome = task.result()
                    if isinstance(outcome, BaseException):
                        raise outcome  # SystemExit or KeyboardInterrupt inside a tool ends the run
                    self._record_result(state, tasks[task], outcome)
                    await self._asave_result(state)
        finally:
            for task in tasks:
                task.cancel()
        self._handle_builtins(state)

    def _prepare_calls(self, state: State) -> list[tuple[ToolCall, Tool]]:
        """Record results that need no run (unknown tool, cut-off call); return the rest."""
        last = state.last_model_entry()
        truncated = last is not None and last.as_model().stop_reason in (
            "max_tokens",
            "model_context_window_exceeded",
        )
        runnable = []
        for call in state.open_calls():
            if call["name"] in builtin_tools.NAMES:
                continue
            tool = self.tools.get(call["name"])
            if truncated:
                self._record_result(state, call, ToolOutcome(TRUNCATED_CALL, True))
            elif tool is None:
                known = ", ".join([*self.tools, *sorted(builtin_tools.NAMES)])
                text = f"There is no tool named {call['name']!r}. The tools are: {known}."
                self._record_result(state, call, ToolOutcome(text, True))
            else:
                runnable.append((call, tool))
        return runnable

    def _record_result(self, state: State, call: ToolCall, outcome: ToolOutcome) -> None:
        try:
            check_text(outcome.text, f"tool result of {call['id']} ({call['name']})")
        except NotJSONError as e:
            # Kept as an error result the model sees, as a failing tool's would be.
            outcome = ToolOutcome(error_text(e), True, e)
        state.append(
            TOOL_RESULT,
            outcome.text,
            ToolResultData(call["id"], call["name"], outcome.is_error).to_data(),
            error=outcome.error,
        )

    def _save_result(self, state: State) -> None:
        if self.store is None:
            return
        try:
            wrote = _saving.save(self.store, state, entries_only=True)
        except Exception:
            # The other tools go on; the save after use_tools writes it or raises.
            logger.warning("State %s: saving a tool result failed", state.id, exc_info=True)
            return
        _save_points.log_save(state, SavePoint.AFTER_TOOL_RESULT, wrote)

    async def _asave_result(self, state: State) -> None:
        if self.store is None:
            return
        try:
            wrote = await _saving.asave(self.store, state, entries_only=True)
        except Exception:
            logger.warning("State %s: saving a tool result failed", state.id, exc_info=True)
            return
        _save_points.log_save(state, SavePoint.AFTER_TOOL_RESULT, wrote)

    def _handle_builtins(self, state: State) -> None:
        """``finish`` with a valid answer stops the run; otherwise ``ask`` stops it."""
        calls = [c for c in state.open_calls() if c["name"] in builtin_tools.NAMES]
        settled = builtin_tools.settle(
            calls, self._accept_answer, (pydantic.ValidationError, KeyError, TypeError)
        )
        for result in settled.results:
            outcome = ToolOutcome(result.text, result.is_error, result.error)
            self._record_result(state, result.call, outcome)
        if settled.stopped_by is not None:
            # After the results of the ignored calls.
            # The State dumps the answer again at each save (it may be changed in place), with
            # the answer's own type adapter, not with the Agent.
            dump = None if settled.answer_json is None else functools.partial(_dump, self._answer)
            state._stop(settled.stopped_by, settled.answer, dump)
        else:
            state._keep_stop()

    def _accept_answer(self, tool_input: dict[str, Any]) -> tuple[Any, Any]:
        answer = self._validate_answer(tool_input)
        return answer, _dump(self._answer, answer, "the finish answer")

    def _validate_answer(self, tool_input: dict[str, Any]) -> Any:
        raw = tool_input["answer"]
        try:
            return self._answer.validate_python(raw)
        except pydantic.ValidationError:
            if isinstance(raw, str) and self.output_type is not str:
                return self._answer.validate_json(raw)  # the model sent the answer as JSON text
            raise

    # compact ---------------------------------------------------------------------------

    def compact(self, state: State) -> HistoryEntry:
        """Replace the older context by a summary the model writes; history keeps all."""
        request, covers = self._compaction_request(state)
        return self._record_compaction(state, self.model.request(request), covers)

    async def acompact(self, state: State) -> HistoryEntry:
        """Async ``compact``."""
        request, covers = self._compaction_request(state)
        return self._record_compaction(state, await self.model.arequest(request), covers)

    def _needs_compaction(self, state: State) -> bool:
        if self.compact_at is None:
            return False
        last = state.last_model_entry()
        if last is None or self._compacted_last(state, last):
            return False
        return sum(last.as_model().usage.values()) >= self.compact_at

    def _compacted_last(self, state: State, entry: HistoryEntry) -> bool:
        """Whether a compaction in the conversation follows ``entry``."""
        return any(e.kind == COMPACTION and e.seq > entry.seq for e in state.live_entries())

    def _compaction_request(self, state: State) -> tuple[ModelRequest, int]:
        live = state.live_entries()
        covers = live[-1].seq
        # The person's latest messages stay as they are, after the summary, and so do the
        # notices that follow them: a State loaded after a kill mid-compaction has its
        # notice after the message that was waiting for an answer.
        for entry in reversed(live):
            if entry.kind == NOTICE:
                continue
            if entry.kind != USER or entry.as_user().answers is not None:
                break
            covers = entry.seq - 1
        messages = build_messages(state)
        prompt = {"type": "text", "text": COMPACTION_PROMPT}
        if messages[-1]["role"] == "user":
            messages[-1]["content"].append(prompt)
        else:
            messages.append({"role": "user", "content": [prompt]})
        request = ModelRequest(
            system=self.system,
            messages=messages,
            tools=self._definitions,
            max_tokens=self.max_tokens,
            tool_choice="none",
            purpose="compaction",
        )
        return request, covers

    def _record_compaction(
        self, state: State, response: ModelResponse, covers: int
    ) -> HistoryEntry:
        logger.info("State %s: compacted the context up to entry %d", state.id, covers)
        return state.append(
            COMPACTION,
            _without_surrogates(response.text),
            CompactionData(covers, response.usage, _without_surrogates(response.model)).to_data(),
        )

    # Ending ----------------------------------------------------------------------------

    def _close_calls(self, state: State, error: BaseException) -> None:
        for call in state.open_calls():
            if call["name"] not in builtin_tools.NAMES:
                text = f"(aborted: {type(error).__name__})"
                self._record_result(state, call, ToolOutcome(text, True))

    def _require_store(self) -> Store:
        if self.store is None:
            raise ValueError("this Agent has no store: give it one with Agent(store=...)")
        return self.store


def _call_into(
    tool: Tool,
    call: ToolCall,
    done: queue.SimpleQueue[tuple[ToolCall, ToolOutcome | BaseException]],
) -> None:
    try:
        done.put((call, tool.call(call["input"])))
    except BaseException as e:  # noqa: BLE001 - Tool.call turns an Exception into an error result; anything else is handed on
        done.put((call, e))


async def _acall_into(tool: Tool, call: ToolCall) -> ToolOutcome | BaseException:
    # asyncio lets SystemExit and KeyboardInterrupt escape a task straight out of the loop;
    # caught here, they reach the run's own task and end the run as they do under `run`.
    try:
        return await tool.acall(call["input"])
    except (SystemExit, KeyboardInterrupt) as e:
        return e


def _check_state(state: object) -> None:
    if not isinstance(state, State):
        raise TypeError(f"Agent.run() takes a State, not {type(state).__name__}")


def _dump(adapter: pydantic.TypeAdapter[Any], answer: Any, path: str) -> Any:
    """``answer`` in the JSON form of its type; :class:`NotJSONError` naming ``path``."""
    try:
        raw = adapter.dump_python(answer, mode="json")
    except (ValueError, TypeError, RecursionError) as e:
        raise NotJSONError(f"{path} cannot be saved as JSON: {e}") from e
    return check_json(raw, path)


def _without_surrogates(value: Any, depth: int = 0) -> Any:
    """``value`` with lone surrogates in its strings replaced by U+FFFD (model output only).

    Below ``MAX_DEPTH`` levels; deeper values are left for ``check_json`` to refuse.
    """
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if depth > MAX_DEPTH:
        return value
    if isinstance(value, dict):
        return {
            _without_surrogates(k, depth): _without_surrogates(v, depth + 1)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_without_surrogates(v, depth + 1) for v in value]
    return value


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]
