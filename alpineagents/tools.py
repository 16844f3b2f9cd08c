"""Tools from plain functions.

A tool's name is the function's name, its description the docstring, and its input schema
comes from the type hints through pydantic. A return value becomes the tool result (a str as
it is, anything else as JSON); an exception becomes an error result and the run goes on.
"""

from __future__ import annotations

import asyncio
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import pydantic
import pydantic_core

from alpineagents import _builtin_tools as builtin_tools

__all__ = ["Tool", "ToolOutcome", "as_tools", "error_text"]

RESERVED_NAMES: Final = builtin_tools.NAMES


@dataclass(frozen=True)
class ToolOutcome:
    """What one tool call produced: the result text, whether it is an error, and the error."""

    text: str
    is_error: bool = False
    error: BaseException | None = None


def error_text(error: BaseException) -> str:
    """``"ExceptionType: message"``, the text an error result keeps.

    An exception whose ``str()`` raises gives its type name and a word on why.
    """
    name = type(error).__name__
    try:
        message = str(error)
    except Exception as e:  # noqa: BLE001 - any failure of str() is reported, not raised
        return f"{name} (its message could not be read: {type(e).__name__})"
    return f"{name}: {message}" if message else name


def result_text(value: Any) -> str:
    """A tool's return value as result text: a str as it is, anything else as JSON."""
    if isinstance(value, str):
        return value
    return pydantic_core.to_json(value).decode()


class Tool:
    """A function the model can call.

    Args:
        function: A sync or async function. Its parameters need type hints (unannotated ones
            accept any JSON value); ``*args`` and ``**kwargs`` are not allowed.
        name: The tool's name; the function's name by default.
        description: What the tool does; the function's docstring by default.
    """

    def __init__(
        self,
        function: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
    ):
        self.function = function
        self.name = name or function.__name__
        self.description = (
            description if description is not None else (inspect.getdoc(function) or "")
        )
        self.is_async = inspect.iscoroutinefunction(function)
        self.input_model = _input_model(function, self.name)
        schema = self.input_model.model_json_schema()
        schema.pop("title", None)
        self.input_schema: dict[str, Any] = schema

    def __repr__(self) -> str:
        return f"Tool({self.name!r})"

    def definition(self) -> dict[str, Any]:
        """The tool as the model sees it: name, description and JSON schema of its input."""
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": self.input_schema,
        }

    def arguments(self, tool_input: Any) -> dict[str, Any]:
        """Validate the model's input; raises ``pydantic.ValidationError``."""
        validated = self.input_model.model_validate(tool_input)
        return {name: getattr(validated, name) for name in type(validated).model_fields}

    def call(self, tool_input: Any) -> ToolOutcome:
        """Run the tool in this thread (an async tool in an event loop of its own)."""
        try:
            kwargs = self.arguments(tool_input)
        except pydantic.ValidationError as e:
            return self._invalid(e)
        try:
            if self.is_async:
                value = asyncio.run(self.function(**kwargs))
            else:
                value = self.function(**kwargs)
            return ToolOutcome(result_text(value))
        except Exception as e:  # noqa: BLE001 - a tool that fails gives an error result
            return ToolOutcome(error_text(e), True, e)

    async def acall(self, tool_input: Any) -> ToolOutcome:
        """Run the tool: awaited if async, on a worker thread if sync."""
        try:
            kwargs = self.arguments(tool_input)
        except pydantic.ValidationError as e:
            return self._invalid(e)
        try:
            if self.is_async:
                value = await self.function(**kwargs)
            else:
                value = await asyncio.to_thread(self.function, **kwargs)
            return ToolOutcome(result_text(value))
        except Exception as e:  # noqa: BLE001 - a tool that fails gives an error result
            return ToolOutcome(error_text(e), True, e)

    def _invalid(self, error: pydantic.ValidationError) -> ToolOutcome:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in item['loc']) or 'input'}: {item['msg']}"
            for item in error.errors(include_url=False)
        )
        return ToolOutcome(
            f"Invalid input for tool {self.name!r}: {problems}. Call it again with valid input.",
            True,
            error,
        )


def as_tools(tools: typing.Iterable[Callable[..., Any] | Tool]) -> dict[str, Tool]:
    """Tools by name; refuses reserved and duplicate names."""
    found: dict[str, Tool] = {}
    for item in tools:
        tool = item if isinstance(item, Tool) else Tool(item)
        if tool.name in RESERVED_NAMES:
            raise ValueError(
                f"a tool cannot be named {tool.name!r}: finish and ask are the Agent's own tools"
            )
        if tool.name in found:
            raise ValueError(f"two tools are named {tool.name!r}")
        found[tool.name] = tool
    return found


def _input_model(function: Callable[..., Any], name: str) -> type[pydantic.BaseModel]:
    signature = inspect.signature(function)
    try:
        hints = typing.get_type_hints(function, include_extras=True)
    except Exception as e:
        raise TypeError(f"cannot read the type hints of tool {name!r}: {e}") from e
    fields: dict[str, Any] = {}
    for param in signature.parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"tool {name!r} cannot take *{param.name}: name every parameter")
        annotation = hints.get(param.name, Any)
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (annotation, default)
    try:
        return pydantic.create_model(
            f"{name}_input",
            __config__=pydantic.ConfigDict(extra="forbid", arbitrary_types_allowed=False),
            **fields,
        )
    except (pydantic.PydanticSchemaGenerationError, TypeError) as e:
        raise TypeError(f"tool {name!r} has a parameter pydantic cannot describe: {e}") from e
