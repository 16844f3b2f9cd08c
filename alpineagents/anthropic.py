"""The Anthropic model adapter: alpineagents' JSON to the ``anthropic`` SDK and back.

This is the one place that knows the SDK's messages. The client is made the standard way
(``anthropic.Anthropic()``), so ``ANTHROPIC_API_KEY`` and ``ANTHROPIC_BASE_URL`` work as
they do for the SDK, and the SDK's own retries handle 429 and 5xx answers; when they are
exhausted its ``RateLimitError`` and friends reach the caller unchanged.
"""

from __future__ import annotations

import asyncio
from typing import Any

import anthropic

from alpineagents.model import Model, ModelRequest, ModelResponse

__all__ = ["AnthropicModel"]

_USAGE_KEYS = (
    "input_tokens",
    "output_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
)


class AnthropicModel(Model):
    """A Claude model through the official ``anthropic`` SDK.

    Args:
        model: The model id, e.g. ``"claude-sonnet-5"``.
        client: An ``anthropic.Anthropic`` client for ``run``; made on first use if omitted.
        async_client: An ``anthropic.AsyncAnthropic`` client for ``arun``; made on first use
            in each event loop if omitted.
        cache: Cache the growing prompt prefix (system, tools, earlier turns) between steps.
    """

    def __init__(
        self,
        model: str,
        *,
        client: anthropic.Anthropic | None = None,
        async_client: anthropic.AsyncAnthropic | None = None,
        cache: bool = True,
    ):
        self.name = model
        self.cache = cache
        self._client = client
        self._async_client = async_client
        self._own_async: tuple[asyncio.AbstractEventLoop, anthropic.AsyncAnthropic] | None = None

    def __repr__(self) -> str:
        return f"AnthropicModel({self.name!r})"

    def request(self, request: ModelRequest) -> ModelResponse:
        """Send one Messages API request."""
        if self._client is None:
            self._client = anthropic.Anthropic()
        message = self._client.messages.create(**self.params(request))
        return self.response(message)

    async def arequest(self, request: ModelRequest) -> ModelResponse:
        """Send one Messages API request with the async client."""
        message = await self._async().messages.create(**self.params(request))
        return self.response(message)

    def _async(self) -> anthropic.AsyncAnthropic:
        if self._async_client is not None:
            return self._async_client
        loop = asyncio.get_running_loop()
        # A client's connections belong to the loop that opened them: one client per loop.
        if self._own_async is None or self._own_async[0] is not loop:
            self._own_async = (loop, anthropic.AsyncAnthropic())
        return self._own_async[1]

    # Translation -----------------------------------------------------------------------

    def params(self, request: ModelRequest) -> dict[str, Any]:
        """The keyword arguments of ``messages.create`` for a request."""
        params: dict[str, Any] = {
            "model": self.name,
            "max_tokens": request.max_tokens,
            "messages": [
                {"role": m["role"], "content": [to_sdk_block(b) for b in m["content"]]}
                for m in request.messages
            ],
        }
        if request.system:
            params["system"] = request.system
        if request.tools:
            params["tools"] = request.tools
            params["tool_choice"] = {"type": request.tool_choice}
        if self.cache:
            params["cache_control"] = {"type": "ephemeral"}
        return params

    def response(self, message: Any) -> ModelResponse:
        """A ``Message`` of the SDK as a ModelResponse."""
        usage = message.usage
        return ModelResponse(
            content=[from_sdk_block(block) for block in message.content],
            stop_reason=str(message.stop_reason or "end_turn"),
            usage={key: int(getattr(usage, key, 0) or 0) for key in _USAGE_KEYS},
            model=str(message.model),
        )


def to_sdk_block(block: dict[str, Any]) -> dict[str, Any]:
    """One of our content blocks as a Messages API block."""
    kind = block["type"]
    if kind == "text":
        return {"type": "text", "text": block["text"]}
    if kind == "tool_call":
        return {
            "type": "tool_use",
            "id": block["id"],
            "name": block["name"],
            "input": block["input"],
        }
    if kind == "tool_result":
        return {
            "type": "tool_result",
            "tool_use_id": block["call_id"],
            "content": block["content"],
            "is_error": block["is_error"],
        }
    return block  # thinking, server tools, …: sent back as the API wrote them


def from_sdk_block(block: Any) -> dict[str, Any]:
    """A Messages API content block as one of ours."""
    if block.type == "text":
        return {"type": "text", "text": block.text}
    if block.type == "tool_use":
        return {"type": "tool_call", "id": block.id, "name": block.name, "input": block.input}
    raw: dict[str, Any] = block.to_dict(mode="json")
    return raw
