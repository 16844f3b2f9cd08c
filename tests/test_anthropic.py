"""The Anthropic adapter through the real anthropic SDK (httpx2 mock transport, loopback)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import pytest

from alpineagents import Agent, AnthropicModel, FileStore, State
from alpineagents.anthropic import MissingAPIKeyError
from tests.helpers import Mode, run
from tests.loopback_anthropic import loopback, message, text, tool_use

Handler = Callable[[dict[str, Any]], httpx2.Response]


class Recorder:
    """A Messages API behind httpx2.MockTransport that records request bodies and headers."""

    def __init__(self, *responses: dict[str, Any] | httpx2.Response):
        self.responses = list(responses)
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.bodies.append(json.loads(request.content))
        self.headers.append(dict(request.headers))
        reply = self.responses.pop(0)
        return reply if isinstance(reply, httpx2.Response) else httpx2.Response(200, json=reply)

    def model(self, max_retries: int = 0) -> AnthropicModel:
        return AnthropicModel(
            "claude-sonnet-5",
            client=anthropic.Anthropic(
                api_key="test",
                max_retries=max_retries,
                http_client=httpx2.Client(transport=httpx2.MockTransport(self)),
            ),
            async_client=anthropic.AsyncAnthropic(
                api_key="test",
                max_retries=max_retries,
                http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(self)),
            ),
        )


def lookup(city: str) -> str:
    """Weather of a city."""
    return f"sunny in {city}"


THINKING = {"type": "thinking", "thinking": "Let me look.", "signature": "sig-1"}


async def test_a_run_through_the_sdk(mode: Mode) -> None:
    api = Recorder(
        message(THINKING, text("Checking."), tool_use("toolu_1", "lookup", city="Oslo")),
        message(text("It is sunny in Oslo.")),
    )
    agent = Agent(api.model(), system="Be brief.", tools=[lookup])
    state = State("Weather in Oslo?")
    answer = await run(mode, agent, state)
    assert answer == "It is sunny in Oslo."

    first, second = api.bodies
    assert first["model"] == "claude-sonnet-5"
    assert first["system"] == "Be brief."
    assert first["cache_control"] == {"type": "ephemeral"}
    assert first["tool_choice"] == {"type": "auto"}
    assert [t["name"] for t in first["tools"]] == ["lookup", "finish", "ask"]
    assert first["tools"][0]["input_schema"]["required"] == ["city"]
    assert first["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Oslo?"}]}
    ]
    # The tools and system prompt are byte-stable across steps, so the prefix caches.
    assert (first["tools"], first["system"]) == (second["tools"], second["system"])
    assert second["messages"][1:] == [
        {
            "role": "assistant",
            "content": [
                THINKING,
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"city": "Oslo"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": "sunny in Oslo",
                    "is_error": False,
                }
            ],
        },
    ]
    model_entry = state.history[1]
    assert model_entry.data["usage"]["input_tokens"] == 10
    assert model_entry.data["content"][2] == {
        "type": "tool_call",
        "id": "toolu_1",
        "name": "lookup",
        "input": {"city": "Oslo"},
    }


def test_rate_limit_error_reaches_the_caller_unchanged_after_retries() -> None:
    def limited() -> httpx2.Response:
        return httpx2.Response(
            429,
            headers={"retry-after": "0"},
            json={"type": "error", "error": {"type": "rate_limit_error", "message": "slow"}},
        )

    api = Recorder(limited(), limited())
    with pytest.raises(anthropic.RateLimitError):
        Agent(api.model(max_retries=1)).run(State("x"))
    assert len(api.bodies) == 2  # the SDK retried once, then gave up


def test_overloaded_is_retried_by_the_sdk() -> None:
    overloaded = httpx2.Response(
        529,
        headers={"retry-after": "0"},
        json={"type": "error", "error": {"type": "overloaded_error", "message": "busy"}},
    )
    api = Recorder(overloaded, message(text("fine now")))
    assert Agent(api.model(max_retries=2)).run(State("x")) == "fine now"
    assert len(api.bodies) == 2


def test_pause_turn_is_sent_back_as_it_is() -> None:
    server_use = {
        "type": "server_tool_use",
        "id": "srvtoolu_1",
        "name": "web_search",
        "input": {"query": "x"},
    }
    api = Recorder(
        message(server_use, stop_reason="pause_turn"),
        message(text("Found it.")),
    )
    assert Agent(api.model()).run(State("search")) == "Found it."
    assert api.bodies[1]["messages"][-1] == {"role": "assistant", "content": [server_use]}


def test_error_results_and_ask_answers_reach_the_api() -> None:
    def broken() -> str:
        """Fails."""
        raise ValueError("no data")

    api = Recorder(
        message(tool_use("toolu_1", "broken")),
        message(tool_use("toolu_2", "ask", question="Which file?")),
        message(text("Thanks.")),
    )
    agent = Agent(api.model(), tools=[broken])
    state = State("x")
    assert agent.run(state) == "Which file?"
    state.add_user_message("notes.txt")
    assert agent.run(state) == "Thanks."
    results = [
        block
        for body in api.bodies[1:]
        for block in body["messages"][-1]["content"]
        if block["type"] == "tool_result"
    ]
    assert results == [
        {
            "type": "tool_result",
            "tool_use_id": "toolu_1",
            "content": "ValueError: no data",
            "is_error": True,
        },
        {
            "type": "tool_result",
            "tool_use_id": "toolu_2",
            "content": "notes.txt",
            "is_error": False,
        },
    ]


def test_standard_environment_variables_reach_the_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    with loopback(
        lambda body: message(text(f"you said {body['messages'][0]['content'][0]['text']}"))
    ) as server:
        for key, value in server.env().items():
            monkeypatch.setenv(key, value)
        agent = Agent("claude-sonnet-5")
        assert agent.run(State("hello")) == "you said hello"
        assert asyncio.run(agent.arun(State("again"))) == "you said again"
        assert len(server.requests) == 2


async def test_a_missing_api_key_is_named_before_any_request(
    mode: Mode, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    with loopback(lambda body: message(text("never asked"))) as api:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.env()["ANTHROPIC_BASE_URL"])
        store = FileStore(tmp_path)
        with pytest.raises(MissingAPIKeyError, match="ANTHROPIC_API_KEY") as raised:
            await run(mode, Agent("claude-sonnet-5", store=store), State("hi", id="no-key"))
        assert isinstance(raised.value, TypeError)  # as the SDK's own error is
        assert api.requests == []
    # The State was created as the run started; it continues once the key is there.
    assert store.load("no-key").stopped_by is None


def test_model_object_is_made_from_the_id() -> None:
    agent = Agent("claude-opus-5")
    assert isinstance(agent.model, AnthropicModel) and agent.model.name == "claude-opus-5"


def test_async_clients_are_closed_when_each_event_loop_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from alpineagents import AnthropicModel
    from tests.loopback_anthropic import loopback, message, text

    with loopback(lambda body: message(text("hi"))) as api:
        for key, value in api.env().items():
            monkeypatch.setenv(key, value)
        model = AnthropicModel("claude-sonnet-5")
        agent = Agent(model)
        clients = []
        for _ in range(3):  # a serverless handler: asyncio.run per event

            async def handle() -> None:
                await agent.arun(State("x"))
                clients.append(await model._async())

            asyncio.run(handle())
        assert len({id(c) for c in clients}) == 3
        assert all(c.is_closed() for c in clients)
        assert agent.run(State("sync")) == "hi"
        agent.close()
        assert model._client is None
