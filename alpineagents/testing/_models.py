"""Offline models for tests and demos: no network, no API key, the same Agent loop."""

from __future__ import annotations

import asyncio
import inspect
import itertools
from collections.abc import Awaitable, Callable
from typing import Any

from alpineagents._builtin_tools import FINISH, NAMES
from alpineagents.model import Model, ModelRequest, ModelResponse

__all__ = ["FunctionModel", "TestModel", "call"]

_ids = itertools.count(1)


def call(name: str, /, **tool_input: Any) -> dict[str, Any]:
    """A tool call block for a :class:`FunctionModel` response: ``call("search", q="x")``."""
    return {"type": "tool_call", "id": f"call_{next(_ids)}", "name": name, "input": tool_input}


def as_response(value: ModelResponse | str | list[dict[str, Any]], name: str) -> ModelResponse:
    """A function's return value as a response: text, a list of blocks, or a response."""
    if isinstance(value, ModelResponse):
        return value
    if isinstance(value, str):
        return ModelResponse([{"type": "text", "text": value}], "end_turn", model=name)
    calls = any(block.get("type") == "tool_call" for block in value)
    return ModelResponse(list(value), "tool_use" if calls else "end_turn", model=name)


Reply = ModelResponse | str | list[dict[str, Any]]


class FunctionModel(Model):
    """A model whose every response a function decides.

    The function receives the :class:`ModelRequest` and returns a :class:`ModelResponse`,
    a str (a text reply), or a list of content blocks (use :func:`call` for tool calls). It
    may be async.
    """

    __test__ = False

    def __init__(
        self,
        function: Callable[[ModelRequest], Reply | Awaitable[Reply]],
        *,
        name: str = "function",
    ):
        self.function = function
        self.name = name
        self.requests: list[ModelRequest] = []

    def request(self, request: ModelRequest) -> ModelResponse:
        """Call the function (in an event loop of its own if it is async)."""
        self.requests.append(request)
        value = self.function(request)
        if inspect.isawaitable(value):
            value = asyncio.run(_wait(value))
        return as_response(value, self.name)

    async def arequest(self, request: ModelRequest) -> ModelResponse:
        """Call the function, awaiting it if it is async."""
        self.requests.append(request)
        value = self.function(request)
        if inspect.isawaitable(value):
            value = await value
        return as_response(value, self.name)


async def _wait(value: Awaitable[Reply]) -> Reply:
    return await value


class TestModel(Model):
    """Calls every tool once with schema-valid input, then finishes.

    The answer is ``answer`` if given, else a value made from the finish tool's schema.
    Compaction requests get a short summary.
    """

    __test__ = False

    def __init__(self, *, answer: Any = None, name: str = "test"):
        self.answer = answer
        self.name = name
        self.requests: list[ModelRequest] = []

    def request(self, request: ModelRequest) -> ModelResponse:
        """Respond to one request."""
        self.requests.append(request)
        if request.purpose == "compaction":
            return as_response("Summary: the tools were called.", self.name)
        tools = {t["name"]: t for t in request.tools}
        called = any(
            block.get("type") == "tool_call"
            for message in request.messages
            if message["role"] == "assistant"
            for block in message["content"]
        )
        if not called:
            user_tools = [t for n, t in tools.items() if n not in NAMES]
            if user_tools:
                return as_response(
                    [call(t["name"], **example(t["input_schema"])) for t in user_tools], self.name
                )
        if FINISH in tools:
            schema = tools[FINISH]["input_schema"]
            answer = self.answer if self.answer is not None else example(schema)["answer"]
            return as_response([call(FINISH, answer=answer)], self.name)
        return as_response("done", self.name)


def example(schema: dict[str, Any], root: dict[str, Any] | None = None) -> Any:
    """A value valid against a JSON schema (the subset pydantic writes)."""
    root = root if root is not None else schema
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return example(root.get("$defs", {})[name], root)
    if "default" in schema:
        return schema["default"]
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            return example(schema[key][0], root)
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = kind[0]
    if kind == "object":
        properties = schema.get("properties", {})
        return {
            name: example(properties[name], root)
            for name in schema.get("required", properties)
            if name in properties
        }
    if kind == "array":
        items = schema.get("items")
        return [example(items, root)] * schema.get("minItems", 0) if items else []
    simple: dict[str, Any] = {
        "string": "a" * schema.get("minLength", 1),
        "integer": schema.get("minimum", 0),
        "number": schema.get("minimum", 0.0),
        "boolean": False,
        "null": None,
    }
    return simple.get(kind)
