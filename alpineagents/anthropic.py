"""The Anthropic model adapter: alpineagents' JSON to the ``anthropic`` SDK and back.

This is the one place that knows the SDK's messages. The client is made the standard way
(``anthropic.Anthropic()``), so ``ANTHROPIC_API_KEY`` and ``ANTHROPIC_BASE_URL`` work as
they do for the SDK (without a key, the first request raises :class:`MissingAPIKeyError`
naming ``ANTHROPIC_API_KEY``), and the SDK's own retries handle 429 and 5xx answers; when they are
exhausted its ``RateLimitError`` and friends reach the caller unchanged.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncGenerator
from typing import Any, TypeVar

import anthropic

from alpineagents.errors import AlpineAgentsError
from alpineagents.model import Model, ModelRequest, ModelResponse

__all__ = ["AnthropicModel", "MissingAPIKeyError"]

_USAGE_KEYS = (
    "input_tokens",
    "output_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
)


_Client = TypeVar("_Client", anthropic.Anthropic, anthropic.AsyncAnthropic)


class MissingAPIKeyError(AlpineAgentsError, TypeError):
    """No Anthropic API key: ``ANTHROPIC_API_KEY`` is not set and no client was given.

    A ``TypeError`` too, as the SDK's own error for a missing key is, so code that caught
    that still catches this.
    """


def _own_client_checked(client: _Client) -> _Client:
    """``client``, made by this model, if it has credentials; else a clear error."""
    if client.api_key is None and client.auth_token is None:
        raise MissingAPIKeyError(
            "no Anthropic API key: set the ANTHROPIC_API_KEY environment variable (or "
            "ANTHROPIC_AUTH_TOKEN), or give AnthropicModel a client; to run offline, give the "
            "Agent a model from alpineagents.testing instead of a model id"
        )
    return client


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
        self._own_client = False
        self._async_client = async_client
        # Clients this model made, one per event loop: a client's connections belong to the
        # loop that opened them. Each is held by an async generator, so that the loop's
        # shutdown (asyncio.run's end) closes it even without aclose().
        self._own_async: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop,
            tuple[AsyncGenerator[anthropic.AsyncAnthropic, None], anthropic.AsyncAnthropic],
        ] = weakref.WeakKeyDictionary()

    def __repr__(self) -> str:
        return f"AnthropicModel({self.name!r})"

    def request(self, request: ModelRequest) -> ModelResponse:
        """Send one Messages API request."""
        if self._client is None:
            self._client = _own_client_checked(anthropic.Anthropic())
            self._own_client = True
        message = self._client.messages.create(**self.params(request))
        return self.response(message)

    async def arequest(self, request: ModelRequest) -> ModelResponse:
        """Send one Messages API request with the async client."""
        client = await self._async()
        message = await client.messages.create(**self.params(request))
        return self.response(message)

    async def _async(self) -> anthropic.AsyncAnthropic:
        if self._async_client is not None:
            return self._async_client
        loop = asyncio.get_running_loop()
        if loop not in self._own_async:
            holder = _hold(_own_client_checked(anthropic.AsyncAnthropic()))
            self._own_async[loop] = (holder, await anext(holder))
        return self._own_async[loop][1]

    def close(self) -> None:
        """Close the sync client, if this model made it."""
        if self._own_client and self._client is not None:
            self._client.close()
            self._client, self._own_client = None, False

    async def aclose(self) -> None:
        """Close the async client this model made for the running event loop."""
        held = self._own_async.pop(asyncio.get_running_loop(), None)
        if held is not None:
            await held[0].aclose()

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


async def _hold(
    client: anthropic.AsyncAnthropic,
) -> AsyncGenerator[anthropic.AsyncAnthropic, None]:
    try:
        yield client
        await asyncio.Event().wait()  # until the generator is closed
    finally:
        await client.close()


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
