"""Loading a State whose process stopped: replay, gaps, stops saved late, and notices."""

from __future__ import annotations

from pathlib import Path

import pytest

from alpineagents import Agent, CorruptStateError, FileStore, State
from alpineagents._serialize import entry_to_dict
from alpineagents.history import COMPACTION, MODEL, NOTICE, TOOL_RESULT
from tests.helpers import MemoryStore, entries_beyond_snapshot, script


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
