"""Saves that commit by their entry alone (layout 3), on moto's server, sync and async.

During a run, a save of one entry whose change leaves the core's summary of the State as it was
(but for ``updated_at``) is the entry's ``If-None-Match: *`` PUT and nothing else; the change of
the snapshot rides in the entry's metadata, and a load (and ``list()``, for a running State)
applies it. Everything else still ends with a snapshot PUT. These tests pin what that costs and
what it keeps: the budget of a tool-using turn, what loads and listings read, odd and large
changes, the first save after a load, a second writer, lost and failed answers, and States
written by the layout before.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

import pytest

from alpineagents import Agent, ConcurrentWriteError, ModelRequest, State, _saving
from alpineagents._serialize import entry_to_dict
from alpineagents.history import MODEL, USER
from alpineagents.testing import FunctionModel, StoreIO, call
from alpineagents_s3 import SchemaVersionError, StateNotFoundError
from alpineagents_s3 import _layout as layout_module
from alpineagents_s3._layout import (
    ALONE_META,
    BASE_META,
    LAYOUT_META,
    OPEN_META,
    WRITER_META,
)
from alpineagents_s3._patches import PATCH_LIMIT
from alpineagents_s3.testing import RequestLog
from tests.helpers import Mode, tool_turn
from tests.s3.helpers import LoseAnswers, Refuse, Stores, load, raw_client, save

if TYPE_CHECKING:
    from types_boto3_s3 import S3Client

REPLY = "Let me look that up. " * 20
RESULT = "row,value\n" + "alpha,1\nbeta,2\ngamma,3\n" * 60


def query(q: int) -> str:
    """Look a number up."""
    return RESULT


def turn_model() -> FunctionModel:
    """A model that calls ``query`` once a turn, then replies."""
    calls = [False]

    def respond(request: ModelRequest) -> str | list[dict[str, Any]]:
        calls[0] = not calls[0]
        if calls[0]:
            return [{"type": "text", "text": REPLY}, call("query", q=1)]
        return REPLY

    return FunctionModel(respond)


async def run(agent: Agent, state: State, mode: Mode) -> Any:
    if mode == "async":
        return await agent.arun(state)
    return await asyncio.to_thread(agent.run, state)


async def alone(io: StoreIO, state: State) -> None:
    """Save ``state``'s new entries without the snapshot, as the Agent saves a tool result."""
    if io.mode == "async":
        await _saving.asave(io.store, state, entries_only=True)
    else:
        await asyncio.to_thread(_saving.save, io.store, state, entries_only=True)


def entry_metadata(client: S3Client, bucket: str, state_id: str, seq: int) -> dict[str, str]:
    head = client.head_object(Bucket=bucket, Key=f"runs/{state_id}/snapshot.json")
    generation = head["Metadata"]["alpineagents-generation"]
    key = f"runs/{state_id}/entries/{generation}/{seq:010d}.json"
    return client.head_object(Bucket=bucket, Key=key)["Metadata"]


# The budget of a turn ---------------------------------------------------------------------


async def test_a_tool_using_turn_is_six_puts_two_of_the_snapshot_and_nothing_else(
    mode: Mode, stores: Stores
) -> None:
    log = RequestLog()
    store = stores.new(event_hooks=log.hooks)
    agent = Agent(model=turn_model(), tools=[query], store=store)
    state = State("Summarise the quarterly numbers", id="turns")
    await run(agent, state, mode)
    log.clear()
    first = len(state.history)
    for k in range(3):
        state.add_user_message(f"And quarter {k}?")
        assert await run(agent, state, mode) == REPLY
    # Per turn: the message as the run starts (its entry, then the snapshot: the stop is
    # cleared), the response calling the tool and the result (one PUT each), the reply that
    # stops the run (its entry, then the snapshot).
    assert log.counts() == {"PUT": 18}
    snapshots = [r for r in log.requests if r.path.endswith("/snapshot.json")]
    assert len(snapshots) == 6 and all(
        (r.condition or "").startswith("If-Match") for r in snapshots
    )
    added = sum(
        len(json.dumps(entry_to_dict(e), separators=(",", ":")).encode())
        for e in state.history[first:]
    )
    assert log.sent_bytes() <= 1.2 * added, (log.sent_bytes(), added)
    loaded = await load(stores.new(), mode, "turns")
    assert loaded.history == state.history and loaded.answer == REPLY


async def test_a_long_reply_is_not_sent_again_in_the_snapshot(mode: Mode, stores: Stores) -> None:
    log = RequestLog()
    agent = Agent(model=turn_model(), tools=[query], store=stores.new(event_hooks=log.hooks))
    state = State("Summarise", id="answer")
    await run(agent, state, mode)
    stop = [r for r in log.requests if r.path.endswith("/snapshot.json")][-1]
    assert stop.size < len(REPLY.encode()), stop.size  # the answer refers to the reply's entry
    loaded = await load(stores.new(), mode, "answer")
    assert loaded.answer == REPLY and loaded.stopped_by == "reply"


# What loads and listings read -----------------------------------------------------------


async def test_changes_committed_alone_are_what_a_load_and_a_listing_read(
    mode: Mode, stores: Stores
) -> None:
    io = stores.io(mode)
    state = State("running", id="running")
    await io.save(state)
    later = State("later", id="later")
    await io.save(later)
    state.data["seen"] = 1
    tool_turn(state, 1)
    result = state.history.pop()
    log = RequestLog()
    counted = stores.io(mode, event_hooks=log.hooks)
    await io.save(state)  # committed alone: the entry's metadata carries the change
    meta = entry_metadata(raw_client(stores.url), stores.bucket, "running", 1)
    assert [["data", "seen"], 1] in json.loads(meta[ALONE_META])["s"]
    state.history.append(result)
    await alone(io, state)
    assert [s.id for s in await counted.list()] == ["running", "later"]
    # The folders, both snapshots (open: the States run), the entries after each snapshot's
    # count, and a HEAD of each of them (their metadata carries the changes).
    assert log.counts() == {"LIST": 3, "GET": 2, "HEAD": 2}
    listed = {s.id: s for s in await counted.list()}
    assert listed["running"].updated_at == state.updated_at
    loaded = await load(stores.new(), mode, "running")
    assert loaded.history == state.history and loaded.data == {"seen": 1}
    assert loaded.updated_at == state.updated_at


async def test_odd_values_in_a_change_come_back_the_same(mode: Mode, stores: Stores) -> None:
    io = stores.io(mode)
    state = State("odd", id="odd")
    await io.save(state)
    odd: dict[str, Any] = {
        "quotes": 'say "hi" \\ \\" \\\\',
        "spaces": "  two  spaces, ends too  ",
        "unicode": "é 中 \U0001f600 \u2028 \u0000 \x1f",
        "looks like a change": {"s": {"x": 1}, "d": ["y"]},
        "dash": "-",
        "nested": [[[[{"deep": [1.5, -0.0, 10**30, None, True]}]]]],
        "": "an empty key",
    }
    for n, (key, value) in enumerate(odd.items()):
        state.data[key] = value
        state.append(USER, f"message {n}", {})
        await io.save(state)
    client = raw_client(stores.url)
    for seq in range(1, len(odd) + 1):
        meta = entry_metadata(client, stores.bucket, "odd", seq)
        change = meta[ALONE_META]
        assert change.isascii() and " " not in change, change
    loaded = await load(stores.new(), mode, "odd")
    assert loaded.data == state.data and loaded.history == state.history


async def test_a_change_too_large_for_metadata_replaces_the_snapshot(
    mode: Mode, stores: Stores
) -> None:
    log = RequestLog()
    io = stores.io(mode, event_hooks=log.hooks)
    state = State("large", id="large")
    await io.save(state)
    state.data["big"] = "x" * PATCH_LIMIT
    state.append(USER, "one", {})
    log.clear()
    await io.save(state)
    assert log.counts() == {"PUT": 2}  # the entry, then the snapshot
    state.data["small"] = 1
    state.append(USER, "two", {})
    log.clear()
    await io.save(state)
    assert log.counts() == {"PUT": 1}  # a small change rides with the entry again
    loaded = await load(stores.new(), mode, "large")
    assert loaded.data == state.data and loaded.history == state.history


async def test_a_key_removed_from_the_snapshot_is_removed_by_the_change(
    mode: Mode, stores: Stores
) -> None:
    io = stores.io(mode)
    state = State("keys", id="keys")
    record = _saving.plan(state)
    assert record is not None and record.snapshot is not None
    with_extra = {**record.snapshot, "extra": [1, 2]}
    entries = record.entries
    await io.write("keys", entries, with_extra, create=True)
    entry = {**entries[0], "seq": 1, "kind": "user", "text": "hi", "data": {}}
    await io.write("keys", [entry], record.snapshot)
    got = await stores.io(mode).read("keys")
    assert got is not None and "extra" not in got.snapshot and got.snapshot == record.snapshot


# The first save after a load, and second writers -----------------------------------------


async def test_the_first_save_after_a_load_replaces_the_snapshot(
    mode: Mode, stores: Stores
) -> None:
    state = State("handed over", id="handover")
    await stores.io(mode).save(state)
    log = RequestLog()
    io = stores.io(mode, event_hooks=log.hooks)
    loaded = await io.load("handover")
    log.clear()
    loaded.append(USER, "one", {})
    await io.save(loaded)
    assert log.counts() == {"PUT": 2}  # the entry, then the snapshot: If-Match on the one read
    loaded.append(USER, "two", {})
    log.clear()
    await io.save(loaded)
    assert log.counts() == {"PUT": 1}  # its own snapshot now: committed alone


async def test_a_second_writer_is_refused_at_the_seq_the_first_committed(
    mode: Mode, stores: Stores
) -> None:
    a, b = stores.io(mode), stores.io(mode)
    state = State("two writers", id="two")
    await a.save(state)
    copy = await b.load("two")
    state.append(USER, "from A", {})
    await a.save(state)  # committed alone
    copy.append(USER, "from B", {})
    with pytest.raises(ConcurrentWriteError):
        await b.save(copy)
    loaded = await load(stores.new(), mode, "two")
    assert [e.text for e in loaded.history] == ["two writers", "from A"]


async def test_a_snapshot_replaced_by_a_save_of_data_alone_keeps_what_was_committed_alone(
    mode: Mode, stores: Stores
) -> None:
    """The limit of layout 3: a save that adds no entry, by another writer, meets no seq.

    The entries committed alone after it are the State's all the same (a tool call that was
    committed is never lost), their changes applied on top of that writer's snapshot, and each
    writer is refused at its next save that contends.
    """
    a, b = stores.io(mode), stores.io(mode)
    state = State("data race", id="race")
    await a.save(state)
    copy = await b.load("race")
    copy.data["by"] = "B"
    await b.save(copy)  # data alone: a snapshot PUT, If-Match on what B read
    state.append(USER, "from A", {})
    await a.save(state)  # committed alone: nothing tells A
    loaded = await load(stores.new(), mode, "race")
    assert [e.text for e in loaded.history] == ["data race", "from A"]
    assert loaded.data == {"by": "B"}
    state._stop("reply", "done")
    with pytest.raises(ConcurrentWriteError):  # A's next snapshot PUT
        await a.save(state)
    copy.append(USER, "from B", {})
    with pytest.raises(ConcurrentWriteError):  # B's next entry: A has that seq
        await b.save(copy)


async def test_a_run_on_a_deleted_state_stops_at_its_next_snapshot_and_leaves_nothing(
    mode: Mode, stores: Stores, moto: S3Client
) -> None:
    io = stores.io(mode)
    state = State("deleted", id="gone")
    await io.save(state)
    await stores.io(mode).delete("gone")
    tool_turn(state, 1)
    result = state.history.pop()
    await io.save(state)  # committed alone: no request tells the store object
    state.history.append(result)
    await alone(io, state)
    state._stop("reply", "done")
    with pytest.raises(StateNotFoundError):
        await io.save(state)
    assert moto.list_objects_v2(Bucket=stores.bucket, Prefix="runs/gone/").get("KeyCount") == 0


# Lost and failed answers --------------------------------------------------------------------


async def test_a_committed_entry_whose_answer_was_lost_is_recognised(
    mode: Mode, stores: Stores
) -> None:
    lose = LoseAnswers()
    log = RequestLog()
    io = stores.io(mode, event_hooks={**log.hooks, "needs-retry.s3.PutObject": lose})
    state = State("lost", id="lost")
    await io.save(state)
    repeated = lose.repeated
    state.data["n"] = 1
    state.append(USER, "one", {})
    log.clear()
    await io.save(state)  # applied; sent again by botocore: 412, the entry is ours
    # The PUT, sent again, and the GET of what is there: the entry is ours, its change may be
    # an earlier attempt's. So the snapshot is PUT, which says what holds: its answer is lost
    # too, and the GET after its 412 finds it ours.
    assert lose.repeated == repeated + 2
    assert log.counts() == {"PUT": 4, "GET": 2}
    loaded = await load(stores.new(), mode, "lost")
    assert loaded.history == state.history and loaded.data == {"n": 1}


async def test_a_failed_commit_leaves_the_state_as_it_was_and_the_next_save_replaces_it(
    mode: Mode, stores: Stores
) -> None:
    armed = [False]
    fail = Refuse(500, "InternalError", times=1, when=lambda url, h: armed[0] and "/entries" in url)
    log = RequestLog()
    io = stores.io(mode, event_hooks={**log.hooks, "before-call.s3.PutObject": fail})
    state = State("failed", id="failed")
    await io.save(state)
    armed[0] = True
    state.data["n"] = 1
    state.append(USER, "one", {})
    with pytest.raises(Exception, match="InternalError"):
        await io.save(state)
    loaded = await load(stores.new(), mode, "failed")
    assert len(loaded.history) == 1 and loaded.data == {}
    log.clear()
    await io.save(state)  # sent again: the entry, then the snapshot (the failure left it unsure)
    assert log.counts() == {"PUT": 2}
    loaded = await load(stores.new(), mode, "failed")
    assert loaded.history == state.history and loaded.data == {"n": 1}


# Layouts ----------------------------------------------------------------------------------


async def test_an_alpineagents_s3_that_reads_layout_2_refuses_a_layout_3_state(
    mode: Mode, stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    io = stores.io(mode)
    await io.save(State("new", id="new"))
    monkeypatch.setattr(layout_module, "LAYOUT", 2)
    with pytest.raises(SchemaVersionError, match=r"layout 3.*upgrade alpineagents-s3"):
        await stores.io(mode).load("new")


async def test_a_state_of_the_layout_before_loads_by_its_rules_and_its_first_save_upgrades_it(
    mode: Mode, stores: Stores, moto: S3Client
) -> None:
    """Layout 1: a tool result saved alone counts only if saved on the stored snapshot."""
    io = stores.io(mode)
    state = State("old", id="old")
    await io.save(state)
    key = "runs/old/snapshot.json"
    head = moto.head_object(Bucket=stores.bucket, Key=key)
    old = {k: v for k, v in head["Metadata"].items() if k not in (LAYOUT_META, OPEN_META)}
    moto.copy_object(
        Bucket=stores.bucket,
        Key=key,
        CopySource={"Bucket": stores.bucket, "Key": key},
        Metadata=old,
        MetadataDirective="REPLACE",
    )
    etag = moto.head_object(Bucket=stores.bucket, Key=key)["ETag"]
    generation = old["alpineagents-generation"]
    tool_turn(state, 1)
    for entry, base in zip(state.history[1:], [etag, '"an older snapshot"'], strict=True):
        moto.put_object(  # as the layout before saved them alone
            Bucket=stores.bucket,
            Key=f"runs/old/entries/{generation}/{entry.seq:010d}.json",
            Body=json.dumps(entry_to_dict(entry), separators=(",", ":")).encode(),
            Metadata={BASE_META: base, WRITER_META: "an old writer"},
        )
    loaded = await load(stores.new(), mode, "old")
    assert [e.seq for e in loaded.history[:2]] == [0, 1]  # entry 2 is on an older snapshot
    reader = stores.new()
    copy = await load(reader, mode, "old")
    copy.append(MODEL, "", {"content": [], "stop_reason": "end_turn"})
    await save(reader, mode, copy)
    assert moto.head_object(Bucket=stores.bucket, Key=key)["Metadata"][LAYOUT_META] == "3"
    again = await load(stores.new(), mode, "old")
    assert again.history == copy.history
