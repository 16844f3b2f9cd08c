"""The model interface the Agent talks to, in alpineagents' own JSON.

A model receives a :class:`ModelRequest` (system prompt, messages, tool definitions) and
returns a :class:`ModelResponse` (content blocks, stop reason, token usage). Messages are
``{"role": "user" | "assistant", "content": [blocks]}`` with these blocks:

* ``{"type": "text", "text": ...}``
* ``{"type": "tool_call", "id": ..., "name": ..., "input": {...}}``
* ``{"type": "tool_result", "call_id": ..., "content": str, "is_error": bool}``
* any other block a provider returned (thinking, server tools), kept as the provider wrote it.

Adapters (such as :class:`alpineagents.AnthropicModel`) translate these to an SDK and back.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["Model", "ModelRequest", "ModelResponse"]


@dataclass(frozen=True)
class ModelRequest:
    """One request to a model.

    Attributes:
        system: The system prompt.
        messages: The conversation, alternating user and assistant turns, user first.
        tools: Tool definitions (``name``, ``description``, ``input_schema``).
        max_tokens: The longest response allowed.
        tool_choice: ``"auto"`` (the model decides), ``"any"`` (must call a tool) or
            ``"none"`` (must not; used for compaction summaries).
        purpose: ``"step"`` for a step of the run, ``"compaction"`` for a summary.
    """

    system: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    max_tokens: int
    tool_choice: Literal["auto", "any", "none"] = "auto"
    purpose: Literal["step", "compaction"] = "step"


@dataclass(frozen=True)
class ModelResponse:
    """One response of a model, in alpineagents' own JSON.

    Attributes:
        content: The content blocks (see the module docstring).
        stop_reason: Why the model stopped: ``"end_turn"``, ``"tool_use"``,
            ``"max_tokens"``, ``"pause_turn"``, ``"refusal"``, ….
        usage: Token counts (``input_tokens``, ``output_tokens``, and cache counts).
        model: The model that answered.
    """

    content: list[dict[str, Any]]
    stop_reason: str = "end_turn"
    usage: dict[str, int] = field(default_factory=dict)
    model: str = ""

    @property
    def text(self) -> str:
        """The text blocks, joined."""
        return "".join(b["text"] for b in self.content if b.get("type") == "text")


class Model:
    """A model the Agent can run. Implement ``request``, ``arequest`` or both.

    Each side defaults to the other: ``arequest`` runs ``request`` on a worker thread, and
    ``request`` runs ``arequest`` in an event loop of its own.
    """

    #: The model's name, recorded with the State to notice a changed Agent on resume.
    name: str = "model"

    def request(self, request: ModelRequest) -> ModelResponse:
        """Send one request and wait for the response."""
        if type(self).arequest is Model.arequest:
            raise NotImplementedError(
                f"{type(self).__name__} implements neither request() nor arequest()"
            )
        return asyncio.run(self.arequest(request))

    async def arequest(self, request: ModelRequest) -> ModelResponse:
        """Async ``request``."""
        if type(self).request is Model.request:
            raise NotImplementedError(
                f"{type(self).__name__} implements neither request() nor arequest()"
            )
        return await asyncio.to_thread(self.request, request)

    def close(self) -> None:
        """Release the model's connections (sync side). The base model holds none."""

    async def aclose(self) -> None:
        """Release the model's connections in the running event loop. The base holds none."""
