"""Adversarial review of the gap check of 01cc22f (``_writing._check_follows``), by a helper.

A write beginning past the entries its store object knows is checked with a LIST of the seqs
between (and a HEAD of the snapshot when some are not listed). These tests try to make that
check refuse a legitimate save, accept a hole that later loses data, cost requests on the
steady-state path, or fail unclearly when its own requests fail. The first three found
problems, fixed since: a hole past entries a pack removed, or more than a page past the known
count, was accepted; and an entry committed alone after entries saved through another store
object was not loaded. The rest document sequences that hold.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from alpineagents import Agent, ModelRequest, State, _saving
from alpineagents.history import TOOL_RESULT
from alpineagents.testing import FunctionModel, StoreIO, call
from alpineagents_s3 import ConcurrentWriteError, S3StoreError, StateNotFoundError, _layout
from alpineagents_s3.testing import RequestLog
from tests.helpers import Mode, entry_dicts, snapshot_dict
from tests.s3.helpers import LoseAnswers, Refuse, Stores, load, objects, pack, save

ERROR_500 = "InternalError|500"


async def loaded(stores: Stores, mode: Mode, state_id: str) -> list[Any]:
    """The entries a fresh store object loads."""
    record = await stores.io(mode).read(state_id)
    assert record is not None
    return list(record.entries)


async def keys(io: StoreIO, state_id: str) -> list[str]:
    return sorted(o.key for o in await objects(io, state_id))


# ------------------------------------------------------------------------------------------
# Findings
# ------------------------------------------------------------------------------------------


async def test_a_hole_past_packed_entries_is_refused(mode: Mode, stores: Stores) -> None:
    """This store object committed entry 4 alone (it knows 5 entries); another store object
    saved 5 with a snapshot (count 6) and a pack removed entries 0-5. A caller then sends 7
    alone, skipping 6. The LIST from 5 finds nothing (5 was packed and removed, 6 was never
    saved); the first seq missing, 5, is below the snapshot's count, so the check returns,
    and 6 is never checked. 7 is committed alone (nothing else checks a save continuing
    this store object's own run), the write returns, and 7 is not in any load: the next save
    from 6 clears it as an orphan. Every seq between is now checked against the count."""
    io, other = stores.io(mode), stores.io(mode)
    full = entry_dicts(0, 8)
    await io.write("hole", full[:4], snapshot_dict("hole", 4), create=True)
    await io.write("hole", full[4:5], None)  # committed alone: this store object's run
    await other.read("hole")
    await other.write("hole", full[5:6], snapshot_dict("hole", 6))
    await pack(stores.new(), mode, "hole", remove_entries=True)
    with pytest.raises(ValueError, match="entry 6 is not stored"):
        await io.write("hole", full[7:8], None)
    assert await loaded(stores, mode, "hole") == full[:6]


async def test_a_hole_more_than_a_page_past_the_known_count_is_refused(
    mode: Mode, stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """This store object committed entry 4 alone; another store object saved 5 to 13 with a
    snapshot. A caller sends 19 alone, skipping 14-18. With a page of 8 keys (``PAGE`` is
    1,000: the same with 1,005 entries between, ~8 s on moto, which this file does not
    spend), the LIST from 5 ended at 12, every seq the check looked at was listed, and 19 was
    committed alone beyond a hole no load reads past. The check now lists page after page."""
    monkeypatch.setattr(_layout, "PAGE", 8)
    io, other = stores.io(mode), stores.io(mode)
    full = entry_dicts(0, 20)
    await io.write("page", full[:4], snapshot_dict("page", 4), create=True)
    await io.write("page", full[4:5], None)
    await other.read("page")
    await other.write("page", full[5:14], snapshot_dict("page", 14))
    with pytest.raises(ValueError, match="entry 14 is not stored"):
        await io.write("page", full[19:20], None)
    assert len(await loaded(stores, mode, "page")) == 14


async def test_an_alone_save_after_entries_saved_through_another_store_object_is_loaded(
    mode: Mode, stores: Stores
) -> None:
    """The accepted path of the check (test_refs_review's *another_store_object*, which only
    loads after a later save with a snapshot): entries 4 and 5 committed alone through
    another store object of the same bucket, then 6 alone through this one. The write of 6
    returns; a load right then (the process could stop here) must have it. It does not, on
    01cc22f^ either (older than the check, on the path the check accepts). What follows: a
    copy loaded then (0-5) saves its own 6 with a snapshot, replacing this store object's 6
    as "left by a refused writer"; this store object's next save (7, with a snapshot) is
    not refused, and the State reads 0-5, the other copy's 6, this copy's 7. The check now
    counts the entries it found, and the save replaces the snapshot counting them first."""
    io, other = stores.io(mode), stores.io(mode)
    full = entry_dicts(0, 7)
    await io.write("via", full[:4], snapshot_dict("via", 4), create=True)
    await other.write("via", full[4:6], None)
    await io.write("via", full[6:7], None)
    assert await loaded(stores, mode, "via") == full


# ------------------------------------------------------------------------------------------
# What holds
# ------------------------------------------------------------------------------------------


def tools_model(width: int) -> FunctionModel:
    """``width`` tool calls at once in a turn's first response, then a reply."""
    turn = [0]

    def respond(request: ModelRequest) -> str | list[dict[str, Any]]:
        turn[0] += 1
        if turn[0] % 2:
            return [call("look", q=k) for k in range(width)]
        return "done"

    return FunctionModel(respond)


def look(q: int) -> str:
    """Look a number up."""
    return f"result {q}"


async def run(agent: Agent, state: State, mode: Mode) -> Any:
    if mode == "async":
        return await agent.arun(state)
    return await asyncio.to_thread(agent.run, state)


async def test_holds_a_run_with_parallel_tools_and_a_monitor_costs_no_list_or_head(
    mode: Mode, stores: Stores
) -> None:
    """One store object running a State (three tool calls at once a turn), loaded through
    the same store object between turns as a monitor does: no save LISTs or HEADs."""
    log = RequestLog()
    store = stores.new(event_hooks=log.hooks)
    agent = Agent(model=tools_model(3), tools=[look], store=store)
    state = State("Look things up", id="steady")
    await run(agent, state, mode)
    for k in range(3):
        await load(store, mode, "steady")
        log.clear()
        state.add_user_message(f"Again {k}")
        assert await run(agent, state, mode) == "done"
        assert set(log.counts()) == {"PUT"}, log.counts()
    assert (await load(stores.new(), mode, "steady")).history == state.history


async def alone(store: Any, mode: Mode, state: State) -> bool:
    if mode == "async":
        return await _saving.asave(store, state, entries_only=True)
    return await asyncio.to_thread(_saving.save, store, state, entries_only=True)


async def test_holds_tool_results_saved_at_once_from_threads_or_tasks(
    mode: Mode, stores: Stores
) -> None:
    """Results appended and saved alone concurrently (threads in sync, tasks in async), as a
    caller running tools in parallel does, one of the saves failing: the core sends each save
    from its saved count, so none begins past what the store object stored; no LIST."""
    log = RequestLog()
    flag = {"on": True}
    refuse = Refuse(500, "InternalError", when=lambda u, h: flag["on"] and u.endswith("3.json"))
    store = stores.new(event_hooks={**log.hooks, "before-call.s3.PutObject": refuse})
    state = State("task", id="par")
    await save(store, mode, state)
    log.clear()

    async def one(k: int) -> None:
        state.append(TOOL_RESULT, f"result {k}", {"call_id": f"c{k}", "name": "t"})
        try:
            await alone(store, mode, state)
        except S3StoreError:
            pass

    await asyncio.gather(*(one(k) for k in range(6)))
    flag["on"] = False
    assert refuse.refused >= 1
    assert "LIST" not in log.counts()
    await save(store, mode, state)
    assert (await load(stores.new(), mode, "par")).history == state.history


async def test_holds_a_retry_after_a_save_whose_answer_was_lost(mode: Mode, stores: Stores) -> None:
    """Every PUT's answer lost once (botocore sends it again after S3 applied it), then a save
    that fails half way and is sent again from the saved count: no ValueError, no LIST."""
    lose = LoseAnswers()
    log = RequestLog()
    refuse = Refuse(500, "InternalError", times=1, when=lambda u, h: u.endswith("6.json"))
    hooks = {"needs-retry.s3.PutObject": lose, "before-call.s3.PutObject": refuse, **log.hooks}
    io = stores.io(mode, event_hooks=hooks)
    full = entry_dicts(0, 9)
    await io.write("lost", full[:4], snapshot_dict("lost", 4), create=True)
    await io.write("lost", full[4:5], None)
    with pytest.raises(S3StoreError):
        await io.write("lost", full[5:8], None)  # 5 committed alone, 6 refused
    await io.write("lost", full[5:8], snapshot_dict("lost", 8))
    await io.write("lost", full[8:9], None)
    assert lose.repeated and refuse.refused == 1 and "LIST" not in log.counts()
    assert await loaded(stores, mode, "lost") == full


async def test_holds_a_save_after_a_pack_by_another_store_object(
    mode: Mode, stores: Stores
) -> None:
    """A pack with remove_entries by another store object while this one runs the State,
    entries committed alone after the packed snapshot: the next saves begin at the count
    this store object knows, no check, nothing refused."""
    log = RequestLog()
    io = stores.io(mode, event_hooks=log.hooks)
    full = entry_dicts(0, 10)
    await io.write("packed", full[:4], snapshot_dict("packed", 4), create=True)
    await io.write("packed", full[4:6], snapshot_dict("packed", 6))
    await io.write("packed", full[6:7], None)
    await pack(stores.new(), mode, "packed", remove_entries=True)
    log.clear()
    await io.write("packed", full[7:8], None)
    await io.write("packed", full[8:10], snapshot_dict("packed", 10))
    assert "LIST" not in log.counts() and "HEAD" not in log.counts()
    assert await loaded(stores, mode, "packed") == full


async def test_holds_a_save_after_a_load_through_the_same_store_object(
    mode: Mode, stores: Stores
) -> None:
    """Another store object saved 4 and 5 with a snapshot and a pack removed them; a load
    through this store object, then the loaded copy's save from 6: no check, no refusal."""
    io, other = stores.io(mode), stores.io(mode)
    full = entry_dicts(0, 8)
    await io.write("reload", full[:4], snapshot_dict("reload", 4), create=True)
    await other.write("reload", full[4:6], snapshot_dict("reload", 6))
    await pack(stores.new(), mode, "reload", remove_entries=True)
    assert (await io.read("reload")).entries == full[:6]  # type: ignore[union-attr]
    await io.write("reload", full[6:7], None)
    await io.write("reload", full[7:8], snapshot_dict("reload", 8))
    assert await loaded(stores, mode, "reload") == full


async def test_holds_entries_committed_alone_elsewhere_then_packed(
    mode: Mode, stores: Stores
) -> None:
    """Another store object committed 4 and 5 alone, and a pack with remove_entries (which
    packs only what the snapshot counts, 0-3) ran: this store object's save from 6 LISTs
    4 and 5 and is not refused as skipping them."""
    io, other = stores.io(mode), stores.io(mode)
    full = entry_dicts(0, 7)
    await io.write("alone", full[:4], snapshot_dict("alone", 4), create=True)
    await other.write("alone", full[4:6], None)
    await pack(stores.new(), mode, "alone", remove_entries=True)
    await io.write("alone", full[6:7], snapshot_dict("alone", 7))
    assert await loaded(stores, mode, "alone") == full


@pytest.mark.parametrize("operation", ["ListObjectsV2", "HeadObject"])
async def test_holds_the_checks_own_requests_failing(
    mode: Mode, stores: Stores, operation: str
) -> None:
    """A 500 on the check's LIST (or its HEAD, after a pack removed the entries between): a
    clear S3StoreError naming the call, nothing written; the same save then goes through."""
    flag = {"on": False}
    refuse = Refuse(500, "InternalError", when=lambda u, h: flag["on"])
    io = stores.io(mode, event_hooks={f"before-call.s3.{operation}": refuse})
    other = stores.io(mode)
    full = entry_dicts(0, 8)
    await io.write("fails", full[:4], snapshot_dict("fails", 4), create=True)
    await other.write("fails", full[4:6], None)
    if operation == "HeadObject":
        await other.write("fails", [], snapshot_dict("fails", 6))
        await pack(stores.new(), mode, "fails", remove_entries=True)
    before = await keys(other, "fails")
    flag["on"] = True
    with pytest.raises(S3StoreError, match=f"(?s){ERROR_500}.*before a save's first"):
        await io.write("fails", full[6:7], None)
    assert refuse.refused == 1
    assert await keys(other, "fails") == before
    flag["on"] = False
    if operation == "HeadObject":  # the other writer's snapshot: a copy behind it
        with pytest.raises(ConcurrentWriteError):
            await io.write("fails", full[6:7], None)
    else:
        await io.write("fails", full[6:8], snapshot_dict("fails", 8))
        assert await loaded(stores, mode, "fails") == full


async def test_holds_the_checks_answers_lost(mode: Mode, stores: Stores) -> None:
    """The LIST's and HEAD's answers lost once (sent again): the check's verdict is the same."""
    lose = LoseAnswers()
    hooks = {"needs-retry.s3.ListObjectsV2": lose, "needs-retry.s3.HeadObject": lose}
    io, other = stores.io(mode, event_hooks=hooks), stores.io(mode)
    full = entry_dicts(0, 8)
    await io.write("again", full[:4], snapshot_dict("again", 4), create=True)
    await other.write("again", full[4:6], snapshot_dict("again", 6))
    with pytest.raises(ValueError, match="entry 6 is not stored"):
        await io.write("again", full[7:8], None)
    assert lose.repeated >= 2


async def test_holds_a_state_deleted_before_the_checks_head(mode: Mode, stores: Stores) -> None:
    """The State deleted by another store object since this one saved 4 entries: the LIST
    of its generation finds nothing, the HEAD a 404: StateNotFoundError, nothing written."""
    io, other = stores.io(mode), stores.io(mode)
    full = entry_dicts(0, 8)
    await io.write("gone", full[:4], snapshot_dict("gone", 4), create=True)
    await other.delete("gone")
    with pytest.raises(StateNotFoundError, match="was deleted"):
        await io.write("gone", full[6:7], None)
    assert await keys(other, "gone") == []
