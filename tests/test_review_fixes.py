"""Edge cases of loading and stopping: half-finished saves, typed answers, interrupted saves."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from alpineagents import Agent, CorruptStateError, FileStore, State, StoreError
from alpineagents._serialize import entry_to_dict
from alpineagents.model import ModelRequest
from alpineagents.state import COMPACTION, MODEL, NOTICE, TOOL_RESULT
from alpineagents.testing import FunctionModel, call
from tests.memory_store import MemoryStore
from tests.test_agent import script


def entries_beyond_snapshot(store: FileStore, state: State, *entries: dict[str, Any]) -> None:
    """Store entries without a snapshot, as a save that stopped halfway leaves them."""
    store.write(state.id, list(entries), None)


def test_entries_after_a_gap_beyond_the_snapshot_are_left_out() -> None:
    store = MemoryStore()
    state = State("t", id="gap")
    store.save(state)
    later = State("t")
    for n in range(3):
        later.add_user_message(f"m{n}")
    # A store that writes a save's entries in parallel was stopped: seq 3 stored, 1-2 not.
    store.write("gap", [entry_to_dict(later.history[3])], None)
    loaded = store.load("gap")
    assert [e.seq for e in loaded.history] == [0]
    loaded.add_user_message("after")
    assert loaded.history[-1].seq == 1


def test_a_snapshot_naming_a_missing_entry_is_corrupt() -> None:
    store = MemoryStore()
    state = State("t", id="hole")
    state.add_user_message("a")
    state.add_user_message("b")
    store.save(state)
    saved, snapshot = store._states["hole"]
    del saved[1]
    with pytest.raises(CorruptStateError, match="accounts for 3 history entries.*1 in a row"):
        store.load("hole")


def test_a_reply_saved_without_its_stop_is_a_stopped_state(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    model = script("the reply")
    state = State("question", id="r")
    store.save(state)
    # The save after the reply wrote its entry, then the process died before the snapshot.
    state.append(
        MODEL,
        "the reply",
        {"content": [{"type": "text", "text": "the reply"}], "stop_reason": "end_turn"},
    )
    entries_beyond_snapshot(store, state, entry_to_dict(state.history[1]))
    loaded = store.load("r")
    assert (loaded.stopped_by, loaded.answer) == ("reply", "the reply")
    assert Agent(model, store=store).run(loaded) == "the reply"
    assert model.requests == []  # no new request for a conversation that ended


class Item(BaseModel):
    name: str
    when: dt.date


@dataclasses.dataclass
class Trip:
    start: dt.date
    stops: list[Item]


@pytest.mark.parametrize(
    ("output_type", "raw", "saved"),
    [
        (list[Item], [{"name": "a", "when": "2026-12-12"}], [{"name": "a", "when": "2026-12-12"}]),
        (dt.date, "2026-12-12", "2026-12-12"),
        (
            Trip,
            {"start": "2026-12-01", "stops": [{"name": "b", "when": "2026-12-02"}]},
            {"start": "2026-12-01", "stops": [{"name": "b", "when": "2026-12-02"}]},
        ),
    ],
)
def test_an_accepted_typed_answer_is_always_saved(
    tmp_path: Path, output_type: Any, raw: Any, saved: Any
) -> None:
    store = FileStore(tmp_path)
    state = State("t", id="typed")
    answer = Agent(script([call("finish", answer=raw)]), output_type=output_type, store=store).run(
        state
    )
    assert not isinstance(answer, dict | str) or output_type is dt.date
    assert store.load("typed").answer == saved
    assert Agent(script(), output_type=output_type, store=store).run(state) == answer


def test_finish_with_ask_in_one_response_stays_stopped() -> None:
    model = script(
        [
            call("finish", answer="done"),
            call("ask", question="why?"),
            call("finish", answer="again"),
        ]
    )
    agent = Agent(model)
    state = State("t")
    assert agent.run(state) == "done"
    assert agent.run(state) == "done"
    assert len(model.requests) == 1
    assert [e.text for e in state.history if e.kind == TOOL_RESULT] == [
        "Answer accepted.",
        "(ignored: the run already finished)",
        "(not asked: the run finished)",
    ]


def test_ctrl_c_during_a_save_still_closes_the_calls_and_saves() -> None:
    class InterruptedOnce(MemoryStore):
        interrupted = False

        def write(self, state_id, entries, snapshot, *, create=False):  # type: ignore[no-untyped-def]
            if not self.interrupted and any(e["kind"] == MODEL for e in entries):
                self.interrupted = True
                raise KeyboardInterrupt  # Ctrl+C while saving the response with its calls
            super().write(state_id, entries, snapshot, create=create)

    def send_email(to: str) -> str:
        """Send an email."""
        raise AssertionError("never runs")

    store = InterruptedOnce()
    agent = Agent(script([call("send_email", to="a@b.c")]), tools=[send_email], store=store)
    with pytest.raises(KeyboardInterrupt):
        agent.run(State("t", id="ctrl-c"))
    saved = store.load("ctrl-c")
    assert [e.text for e in saved.history if e.kind == TOOL_RESULT] == [
        "(aborted: KeyboardInterrupt)"
    ]


def test_the_notice_tells_calls_that_ran_from_calls_that_may_not_have(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    state = State("t", id="n")
    store.save(state)
    state.append(COMPACTION, "summary", {"covers": 0})
    state.append(
        MODEL,
        "",
        {
            "content": [
                {"type": "tool_call", "id": "c1", "name": "charge", "input": {"eur": 5}},
                {"type": "tool_call", "id": "c2", "name": "send_email", "input": {"to": "x"}},
            ],
            "stop_reason": "tool_use",
        },
    )
    state.append(
        TOOL_RESULT, "charged 5 EUR", {"call_id": "c1", "name": "charge", "is_error": False}
    )
    entries_beyond_snapshot(store, state, *(entry_to_dict(e) for e in state.history[1:]))
    notice = store.load("n").history[-1]
    assert notice.kind == NOTICE
    assert 'may or may not have run: send_email({"to": "x"})' in notice.text
    assert 'These tool calls ran, with these results: charge({"eur": 5}) -> charged 5 EUR' in (
        notice.text
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"v": 1}, "not an alpineagents snapshot"),
        ({"v": 9, "task": "t", "updated_at": "2026-01-01T00:00:00+00:00"}, "schema version 9"),
        ({"v": 1, "task": "t", "updated_at": "2026-01-01T00:00:00"}, "not an alpineagents"),
    ],
)
def test_list_names_a_snapshot_it_cannot_read(
    tmp_path: Path, content: dict[str, Any], message: str
) -> None:
    store = FileStore(tmp_path)
    store.save(State("t", id="bad"))
    (tmp_path / "bad" / "snapshot.json").write_text(json.dumps(content))
    with pytest.raises(StoreError, match=message) as caught:
        store.list()
    assert "snapshot.json" in str(caught.value)


def test_unknown_entry_kinds_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown history entry kind 'note'"):
        State("t").append("note", "x")


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


def test_model_function_may_be_async_under_run() -> None:
    async def reply(request: ModelRequest) -> str:
        await asyncio.sleep(0)
        return "async model"

    assert Agent(FunctionModel(reply)).run(State("x")) == "async model"
