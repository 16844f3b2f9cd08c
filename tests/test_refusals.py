"""What the Agent refuses before a run, as the user guide's rules say: a new State with an id
the store has, a State saved in another store, ``state.data`` that is not JSON, a sync call
inside an event loop, an async-only store under ``run``; and the ``ResumeWarning`` of an Agent
that differs from the one that saved the State."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from alpineagents import Agent, FileStore, ResumeWarning, State
from alpineagents.testing import TestModel
from tests.helpers import (
    AsyncMemoryStore,
    script,
)


def test_new_state_with_a_saved_id_is_refused_before_the_first_request(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    Agent(script("one"), store=store).run(State("first", id="review-pr-42"))
    model = script()
    with pytest.raises(ValueError, match=r"review-pr-42.*store\.load"):
        Agent(model, store=store).run(State("second", id="review-pr-42"))
    assert model.requests == []
    assert store.load("review-pr-42").task == "first"


def test_state_run_with_an_agent_on_another_store_is_refused(tmp_path: Path) -> None:
    state = State("x")
    Agent(script("a"), store=FileStore(tmp_path / "a")).run(state)
    state.add_user_message("more")
    model = script()
    with pytest.raises(ValueError, match="is saved in FileStore"):
        Agent(model, store=FileStore(tmp_path / "b")).run(state)
    with pytest.raises(ValueError, match="this Agent has no store"):
        Agent(model).run(state)
    assert model.requests == []
    # Another FileStore object on the same folder is the same store.
    assert Agent(script("b"), store=FileStore(tmp_path / "a")).run(state) == "b"


def test_non_json_data_is_refused_before_the_next_model_request(tmp_path: Path) -> None:
    model = script("one")
    agent = Agent(model, store=FileStore(tmp_path))
    state = State("x", data={"when": object()})
    with pytest.raises(TypeError, match=r"state\.data\['when'\]"):
        agent.run(state)
    assert model.requests == []


def test_resume_warning_when_the_agent_differs(tmp_path: Path) -> None:
    store = FileStore(tmp_path)

    def a() -> None:
        """A."""

    Agent(script("x"), system="be brief", tools=[a], store=store).run(State("t", id="w"))
    state = store.load("w")
    state.add_user_message("more")

    def b() -> None:
        """B."""

    other = Agent(script("y", "z"), system="be verbose", tools=[b], store=store)
    with pytest.warns(
        ResumeWarning, match=r"system prompt changed; tools removed: a; tools added: b"
    ):
        other.run(state)
    state.add_user_message("again")
    other.run(state)  # only the first run warns (filterwarnings=error would fail otherwise)


def test_no_resume_warning_for_the_same_agent(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    Agent(TestModel(), store=store).run(State("t", id="same"))
    state = store.load("same")
    state.add_user_message("more")
    Agent(TestModel(), store=store).run(state)  # warnings are errors in this suite


def test_run_inside_an_event_loop_is_refused() -> None:
    async def main() -> None:
        with pytest.raises(RuntimeError, match=r"await agent\.arun\(state\)"):
            Agent(script()).run(State("x"))

    asyncio.run(main())


def test_async_only_store_needs_arun() -> None:
    store = AsyncMemoryStore()
    agent = Agent(script("async ok"), store=store)
    with pytest.raises(TypeError, match=r"async-only store: use `await agent\.arun"):
        agent.run(State("x"))
    state = State("y", id="async-store")
    assert asyncio.run(agent.arun(state)) == "async ok"
    assert asyncio.run(store.aload("async-store")).answer == "async ok"


async def test_sync_store_works_under_arun(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    assert await Agent(script("sync store"), store=store).arun(State("x", id="s")) == "sync store"
    assert (await store.aload("s")).answer == "sync store"
