"""The Agent on S3Store, end to end, with an offline model: run and arun, then resume."""

from __future__ import annotations

import asyncio

import pytest

from alpineagents import Agent, State
from alpineagents.history import TOOL_RESULT
from alpineagents.testing import TestModel
from alpineagents_s3 import S3Store
from alpineagents_s3.testing import RequestLog
from tests.helpers import MakeBucket


def lookup(city: str) -> str:
    """Look up the weather of a city."""
    return f"sunny in {city}"


async def forecast(city: str, days: int) -> str:
    """The forecast for a city."""
    await asyncio.sleep(0)
    return f"{days} days of sun in {city}"


def test_agent_run_saves_to_s3_without_reading_and_resumes_elsewhere(
    moto_url: str, moto_bucket: MakeBucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = moto_bucket()
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_url)  # the standard boto configuration
    log = RequestLog()
    agent = Agent(
        TestModel(answer="done"),
        tools=[lookup, forecast],
        output_type=str,
        store=S3Store(bucket, "runs", event_hooks=log.hooks),
    )
    state = State("Weather for the trip", id="trip")
    assert agent.run(state) == "done"
    # Saving never reads an object: PUTs, and the engine check's probe deleted again.
    assert set(log.counts()) == {"PUT", "DELETE"}
    assert agent.store is not None
    agent.store.close()

    other = Agent(TestModel(answer="done"), tools=[lookup, forecast], store=f"s3://{bucket}/runs")
    assert other.store is not None
    loaded = other.store.load("trip")
    assert loaded.history == state.history and loaded.stopped_by == "finish"
    results = [e.text for e in loaded.history if e.kind == TOOL_RESULT]
    # The two tools ran at once, their results in the order they finished; then `finish`'s.
    tools = sorted(results[:2], key=lambda text: "sunny" in text)
    assert " days of sun in " in tools[0] and "sunny in " in tools[1]
    assert len(results) == 3
    loaded.add_user_message("And next week?")
    other.save(loaded)
    assert other.store.load("trip").history[-1].text == "And next week?"
    other.store.close()


async def test_agent_arun_saves_with_aioboto3(moto_url: str, moto_bucket: MakeBucket) -> None:
    bucket = moto_bucket()
    log = RequestLog()
    store = S3Store(bucket, "runs", endpoint_url=moto_url, event_hooks=log.hooks)
    agent = Agent(TestModel(answer="done"), tools=[lookup, forecast], store=store)

    async with store:
        state = State("Weather, async", id="trip")
        assert await agent.arun(state) == "done"
        loaded = await store.aload("trip")
        assert loaded.history == state.history
    assert any(r.condition == "If-None-Match: *" for r in log.requests)
    assert any((r.condition or "").startswith("If-Match") for r in log.requests)
