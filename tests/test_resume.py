"""Loading a State whose process stopped: replay, gaps, stops saved late, and notices."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from alpineagents import Agent, CorruptStateError, FileStore, State
from alpineagents._serialize import entry_to_dict
from alpineagents.history import COMPACTION, MODEL, NOTICE, TASK, TOOL_RESULT, USER
from alpineagents.model import ModelRequest, ModelResponse
from alpineagents.testing import FunctionModel
from tests.helpers import MemoryStore, entries_beyond_snapshot, kinds, script


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
    saved = store._states["hole"][0]
    del saved[1]
    with pytest.raises(CorruptStateError, match=r"accounts for 3 history entries.*1 in a row"):
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


def _compacting_model() -> FunctionModel:
    """Replies once past ``compact_at`` (500), summarises, then answers."""

    def decide(request: ModelRequest) -> ModelResponse:
        if request.purpose == "compaction":
            return ModelResponse([{"type": "text", "text": "SUMMARY"}], usage={"input_tokens": 9})
        if request.messages == [{"role": "user", "content": [{"type": "text", "text": "t"}]}]:
            reply = [{"type": "text", "text": "Noted."}]
            return ModelResponse(reply, "end_turn", usage={"input_tokens": 1000})
        return ModelResponse([{"type": "text", "text": "ANSWER"}], "end_turn")

    return FunctionModel(decide)


def _blocks(request: ModelRequest) -> list[Any]:
    return [block for message in request.messages for block in message["content"]]


def test_a_message_pending_when_a_compaction_was_torn_stays_after_the_next_summary(
    tmp_path: Path,
) -> None:
    store = FileStore(tmp_path)
    # Without a kill: the compaction leaves the person's message after the summary.
    calm_model = _compacting_model()
    calm = State("t", id="calm")
    agent = Agent(calm_model, store=store, compact_at=500)
    agent.run(calm)
    calm.add_user_message("PENDING")
    assert agent.run(calm) == "ANSWER"
    calm_step = calm_model.requests[-1]
    assert [b["text"] for b in _blocks(calm_step)][1:] == ["PENDING"]

    # Killed after the compaction entry was stored, before the snapshot.
    torn = State("t", id="torn")
    agent.run(torn)
    torn.add_user_message("PENDING")
    agent.save(torn)
    torn.append(COMPACTION, "SUMMARY-lost", {"covers": 1, "usage": {}, "model": None})
    entries_beyond_snapshot(store, torn, entry_to_dict(torn.history[3]))

    loaded = store.load("torn")
    assert kinds(loaded) == [TASK, MODEL, USER, COMPACTION, NOTICE]
    assert [e.kind for e in loaded.live_entries()] == [TASK, MODEL, USER, NOTICE]
    notice = loaded.history[4]
    assert loaded.open_calls() == []

    model = _compacting_model()
    assert Agent(model, store=store, compact_at=500).run(loaded) == "ANSWER"
    assert [r.purpose for r in model.requests] == ["compaction", "step"]
    compaction = [e for e in loaded.live_entries() if e.kind == COMPACTION]
    assert [e.as_compaction().covers for e in compaction] == [1]  # the reply, not the message
    # As without a kill, then the notice about the steps that were not saved in full.
    assert _blocks(model.requests[1]) == [
        *_blocks(calm_step),
        {"type": "text", "text": notice.text},
    ]
