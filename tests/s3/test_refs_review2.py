"""Second adversarial review of the context texts kept in history entries (layout 2).

Reviewed: 38522de..29c0fe9 (``Texts.final``, ``_keep_final_texts``, ``whole_texts`` and
``find_texts``, seeding in ``_first_write``, trimming after a snapshot write, the LRU of
``Ledger.know_texts``, gzip bodies and their claims, ``_refs.decompress``).

The first tests are findings, which failed on 29c0fe9 and are mended since: a store object
that does not know a State's texts when a save begins (a State created without a snapshot, a
first save of entries alone by a store object that did not read the State, a State whose texts
the LRU forgot), or that read entries saved alone beyond the snapshot's count, never learned
those texts, so every later snapshot it PUT carried them whole. One finding older than the
references (a State made unloadable by the first save of a copy of it deleted and created
again) is mended too. The rest document what was tried and holds, with a check of the
invariant every landed snapshot relies on: each text a store object may refer to is held, at
that seq and path, by the history stored now.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import time
from typing import Any

import pytest

from alpineagents.transfer import copy_states, move_states
from alpineagents_s3 import ConcurrentWriteError, CorruptStateError, S3Store, _refs, _versions
from alpineagents_s3._layout import GENERATION_META, LAYOUT_META, claim_body
from alpineagents_s3._refs import Texts
from tests.helpers import Mode
from tests.s3.helpers import LoseAnswers, Refuse, Stores, killed_save, pack, raw_client
from tests.s3.test_refs import LONG_JSON, entries, snapshot_of, stored
from tests.s3.test_refs_review import ledger, load_equal

ERROR_500 = "InternalError|500"


async def texts_hold(stores: Stores, io: Any, state_id: str) -> None:
    """Every text the store object may refer to is where it says in the stored history (the
    texts of entries below ``final`` at least, which it keeps after a failure)."""
    texts = ledger(io).texts.get(state_id)
    if texts is None:
        return
    record = await stores.io("async").read(state_id)
    assert record is not None
    head = raw_client(stores.url).head_object(
        Bucket=stores.bucket, Key=f"runs/{state_id}/snapshot.json"
    )
    if texts.generation != head["Metadata"][GENERATION_META]:
        return  # never used: a save checks the generation
    for key, (seq, path) in texts.where.items():
        assert seq < len(record.entries), (seq, len(record.entries))
        text = _refs._at(record.entries[seq], path)
        assert isinstance(text, str) and _refs.digest(text) == key, (seq, path)


# ------------------------------------------------------------------------------------------
# Findings (these fail on 29c0fe9)
# ------------------------------------------------------------------------------------------


async def test_a_state_created_without_a_snapshot_keeps_its_first_texts_out_of_every_snapshot(
    mode: Mode, stores: Stores
) -> None:
    """alpineagents 0.2-0.4 create a State without a snapshot when its first save comes in
    the middle of a turn (a call pending): ``write(id, entries, None, create=True)``. ``write``
    makes no ``Texts`` when the snapshot is ``None`` and it knows none (``known`` is forced to
    ``None`` by ``create``), and the tool results saved alone next are not indexed either. The
    first snapshot carries every one of those texts whole, and the index after it holds only
    that save's entries: every later snapshot of the process carries them whole again."""
    io = stores.io(mode)
    history = entries(0, 2)
    await io.write("nosnap", history, None, create=True)
    history += entries(2, 3)
    await io.write("nosnap", history[2:], None)  # a tool result saved alone
    await io.write("nosnap", [], snapshot_of(history))  # the end of the turn
    for stop in (5, 7):  # two more turns of the same process
        more = history + entries(len(history), stop)
        await io.write("nosnap", more[len(history) :], snapshot_of(more))
        history = more
    await load_equal(stores, mode, "nosnap", history)
    _, body = stored(stores, "nosnap")
    assert body.count(LONG_JSON) == 0, f"{body.count(LONG_JSON)} long texts copied (3 on 29c0fe9)"


async def test_a_tool_result_saved_alone_first_by_a_store_object_that_did_not_read_is_kept(
    mode: Mode, stores: Stores
) -> None:
    """The Agent's own store object saves a State loaded through an equal one, and its first
    save is a tool result alone (a resumed turn whose call was pending). ``known`` is ``None``
    at the start of that write (``_first_write`` seeds the index inside it), so ``texts`` is
    ``None`` and the entry's text is never indexed: the snapshot after it and every later one
    carry it whole. (The published 0.4.0 Agent, loaded through one store object and run with
    another, begins each turn with a save holding a snapshot: no copy was seen there.)"""
    loader, agents = stores.io(mode), stores.io(mode)
    history = entries(0, 4)
    await loader.write("alone1", history, snapshot_of(history), create=True)
    assert (await loader.read("alone1")) is not None
    more = history + entries(4, 6)
    await agents.write("alone1", [more[4]], None)
    await agents.write("alone1", more[5:], snapshot_of(more))
    again = more + entries(6, 8)
    await agents.write("alone1", again[6:], snapshot_of(again))
    await load_equal(stores, mode, "alone1", again)
    _, body = stored(stores, "alone1")
    assert body.count(LONG_JSON) == 0, f"{body.count(LONG_JSON)} long texts copied (1 on 29c0fe9)"


async def test_a_state_whose_texts_the_lru_forgot_is_not_copied_whole_for_the_rest_of_the_run(
    mode: Mode, stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server holding one store object for more than ``TEXT_STATES`` (128) conversations at
    once: a State's texts are forgotten, and its next save is a snapshot save (a user message
    and the snapshot). ``known`` is ``None``, so that snapshot carries the whole context; the
    index kept after it is only what it referred to and this save's entries (``seeded`` is
    empty: no GET was made). Nothing brings the older texts back until the process reads the
    State again: every later snapshot of the run carries all of them (the size the feature
    exists to save). A GET of the stored snapshot when ``known`` is ``None`` for a held
    Version (its references are this store object's own index) would bring them back."""
    monkeypatch.setattr(_versions, "TEXT_STATES", 2)
    io = stores.io(mode)
    history = entries(0, 8)
    await io.write("lru", history, snapshot_of(history), create=True)
    for other in ("o1", "o2"):  # two other conversations: "lru" is forgotten
        await io.write(other, entries(0, 1), snapshot_of(entries(0, 1)), create=True)
    assert "lru" not in ledger(io).texts
    for stop in (10, 12, 14):  # three more turns of "lru"
        more = history + entries(len(history), stop)
        await io.write("lru", more[len(history) :], snapshot_of(more))
        history = more
    await load_equal(stores, mode, "lru", history)
    _, body = stored(stores, "lru")
    assert body.count(LONG_JSON) == 0, f"{body.count(LONG_JSON)} long texts copied (8 on 29c0fe9)"


async def test_a_tool_result_saved_alone_that_a_load_replays_is_referred_to_by_the_next_save(
    mode: Mode, stores: Stores
) -> None:
    """A process saved a tool result alone (entry 4, beyond the snapshot's count) and was
    killed; a new process loads the State (the load replays entry 4) and finishes the turn.
    ``read_gathered`` indexes the texts the snapshot refers to and those it keeps whole, but
    not those of the entries it vouched for beyond the snapshot's count: no snapshot holds
    them yet. The next snapshot carries entry 4's text whole, and so does every later one of
    the run (the trim keeps only what a snapshot referred to). The resume after a crash in
    the middle of a tool-using turn is this path. Fix: in ``read_gathered``, also
    ``texts.add(history[count:gap])`` (only the entries beyond the count: cheap)."""
    killed = stores.io(mode)
    history = entries(0, 4)
    await killed.write("resume", history, snapshot_of(history), create=True)
    history += entries(4, 5)
    await killed.write("resume", [history[4]], None)  # then the process is killed
    resumed = stores.io(mode)
    record = await resumed.read("resume")
    assert record is not None and record.entries == history
    for stop in (6, 8):
        more = history + entries(len(history), stop)
        await resumed.write("resume", more[len(history) :], snapshot_of(more))
        history = more
    await load_equal(stores, mode, "resume", history)
    _, body = stored(stores, "resume")
    assert body.count(LONG_JSON) == 0, f"{body.count(LONG_JSON)} long texts copied (1 on 29c0fe9)"


async def test_a_first_write_of_a_copy_of_a_deleted_state_does_not_break_the_new_one(
    mode: Mode, stores: Stores
) -> None:
    """A process loads a State (6 entries); another deletes it and creates it again with 2.
    The first process's Agent store object (equal, never touched the State) saves entries 6-7
    and a snapshot: ``_first_write`` GETs the new generation's snapshot (count 2), takes
    ``first`` (6) as the count of the copy without checking that seqs 2-5 exist there, PUTs 6
    and 7 into the new generation and a snapshot counting 8 (If-Match passes). The new State
    now fails every load (CorruptStateError: accounts for 8, holds 2), and the old copy's save
    was accepted. It should be refused (ConcurrentWriteError) and the new State left as it is.
    Fix: in ``_first_write``, when ``first`` exceeds the stored count, require the seqs from
    the count to ``first - 1`` in the listing (list from the count, not after ``first - 1``)."""
    loader, other = stores.io(mode), stores.io(mode)
    history = entries(0, 6)
    await loader.write("xgen", history, snapshot_of(history), create=True)
    assert (await loader.read("xgen")) is not None
    await other.delete("xgen")
    fresh = entries(0, 2, text="fresh ")
    await other.write("xgen", fresh, snapshot_of(fresh), create=True)
    agents = stores.io(mode)
    more = history + entries(6, 8)
    with pytest.raises(ConcurrentWriteError):
        await agents.write("xgen", more[6:], snapshot_of(more))
    record = await stores.io(mode).read("xgen")
    assert record is not None and record.entries == fresh


# ------------------------------------------------------------------------------------------
# What holds on 29c0fe9
# ------------------------------------------------------------------------------------------


async def test_holds_final_after_create_alone_saves_settle_and_a_foreign_read(
    mode: Mode, stores: Stores
) -> None:
    """``final`` is the count of the snapshot last written or read: after a create, after
    entries saved alone (confirmed by HEAD: the mark stays), after a snapshot PUT whose answer
    was lost and which the next save settles, and after a read of another writer's snapshot
    (the entries it vouches for beyond its count included). The index holds at each step."""
    flag = {"lose": False}
    lose = LoseAnswers()

    def needs_retry(**kwargs: Any) -> Any:
        return lose(**kwargs) if flag["lose"] else None

    io = stores.io(mode, event_hooks={"needs-retry.s3.PutObject": needs_retry})
    history = entries(0, 4)
    await io.write("fin", history, snapshot_of(history), create=True)
    assert ledger(io).texts["fin"].final == 4
    history += entries(4, 6)
    await io.write("fin", [history[4]], None)
    await io.write("fin", [history[5]], None)
    assert ledger(io).texts["fin"].final == 4
    assert {seq for seq, _ in ledger(io).texts["fin"].where.values()} == set(range(6))
    await texts_hold(stores, io, "fin")
    history += entries(6, 8)
    flag["lose"] = True
    await io.write("fin", history[6:], snapshot_of(history))
    flag["lose"] = False
    assert lose.repeated and ledger(io).texts["fin"].final == 8
    await texts_hold(stores, io, "fin")
    # Another process saves a tool result alone; this one reads it: final is the read's run.
    other = stores.io(mode)
    assert (await other.read("fin")) is not None
    history += entries(8, 9)
    await other.write("fin", [history[8]], None)
    assert (await io.read("fin")) is not None
    assert ledger(io).texts["fin"].final == 9
    await texts_hold(stores, io, "fin")
    history += entries(9, 11)
    await io.write("fin", history[9:], snapshot_of(history))
    await load_equal(stores, mode, "fin", history)
    await texts_hold(stores, io, "fin")


async def test_holds_concurrent_loads_and_saves_of_one_state_in_one_store_object(
    stores: Stores,
) -> None:
    """Several tasks of one store object: loads running while saves of the same State go on
    (each save a tool result alone, then the snapshot), one snapshot PUT failing. Whatever
    order they end in, the index names only what the history holds and the State loads."""
    flag = {"on": False}
    refuse = Refuse(500, "InternalError", when=lambda url, h: flag["on"] and "snapshot" in url)
    io = stores.io("async", event_hooks={"before-call.s3.PutObject": refuse})
    history = entries(0, 4)
    await io.write("conc2", history, snapshot_of(history), create=True)
    for turn in range(3):
        more = history + entries(len(history), len(history) + 2)
        seq = len(history)
        flag["on"] = turn == 1

        async def save(more: list[Any] = more, seq: int = seq) -> None:
            await io.write("conc2", [more[seq]], None)
            await io.write("conc2", [more[seq + 1]], snapshot_of(more))

        results = await asyncio.gather(
            io.read("conc2"), save(), io.read("conc2"), return_exceptions=True
        )
        await texts_hold(stores, io, "conc2")
        if turn == 1:
            assert isinstance(results[1], Exception)
            flag["on"] = False
            await io.write("conc2", [], snapshot_of(more))  # the same snapshot, again
            await texts_hold(stores, io, "conc2")
        else:
            assert not any(isinstance(r, Exception) for r in results), results
        history = more
    await load_equal(stores, "async", "conc2", history)


async def test_holds_a_failed_save_after_a_claim_keeps_what_the_claimed_snapshot_counts(
    mode: Mode, stores: Stores
) -> None:
    """A killed save left an orphan; a store object that did not read the State saves entries
    alone into the gap (``_first_write`` seeds the index from the stored references, then a
    claim of the gzip body), and its next snapshot PUT fails. What it keeps holds, and its
    next save lands without copying the texts the claimed snapshot referred to."""
    io = stores.io(mode)
    history = entries(0, 4)
    await io.write("clm", history, snapshot_of(history), create=True)
    killed_save(raw_client(stores.url), stores.bucket, "clm", 6)
    flag = {"on": False}
    refuse = Refuse(500, "InternalError", when=lambda url, h: flag["on"] and "snapshot" in url)
    agents = stores.io(mode, event_hooks={"before-call.s3.PutObject": refuse})
    more = history + entries(4, 8)
    await agents.write("clm", more[4:6], None)  # claims (gzip), then fills 4-5, removes 6
    assert stored(stores, "clm")[0][LAYOUT_META] == "3"
    flag["on"] = True
    with pytest.raises(Exception, match=ERROR_500):
        await agents.write("clm", more[6:], snapshot_of(more))
    flag["on"] = False
    await texts_hold(stores, agents, "clm")
    await agents.write("clm", more[6:], snapshot_of(more))
    await load_equal(stores, mode, "clm", more)
    _, body = stored(stores, "clm")
    assert body.count(LONG_JSON) <= 2  # at most the alone entries 4 and 5 (see the findings)


def test_holds_claim_body_of_a_gzip_body_is_new_bytes_with_the_same_snapshot() -> None:
    inner = json.dumps({"alpineagents-refs": 1, "refs": [], "snapshot": {"context": []}})
    body = _refs.compress(inner.encode())
    once, twice = claim_body(body), claim_body(claim_body(body))
    assert len({body, once, twice}) == 3
    for claimed in (once, twice):
        assert _refs.compressed(claimed)
        assert json.loads(_refs.decompress(claimed, "x")) == json.loads(inner)


async def test_holds_odd_compressed_bodies_are_named_and_list_skips_them(
    mode: Mode, stores: Stores, caplog: pytest.LogCaptureFixture
) -> None:
    """Layout 2 bodies inflating to nothing, to ``null``, to a list, to a body with references
    to a snapshot that is not a dict; a gzip body labelled layout 1. Each load names the object;
    ``list()`` leaves it out with a warning and lists the others."""
    from alpineagents import State
    from tests.helpers import _saved
    from tests.s3.test_refs import context

    io = stores.io(mode)
    history = entries(0, 2)
    core = _saved(State("a listed task", id="good")).snapshot
    await io.write("good", history, {**core, "context": context(history)}, create=True)
    await io.write("odd", history, snapshot_of(history), create=True)
    meta, parsed_body = stored(stores, "odd")
    client = raw_client(stores.url)
    key = "runs/odd/snapshot.json"
    not_a_dict = {"alpineagents-refs": 1, "refs": [], "snapshot": []}
    for inside in (b"", b"null", b"[]", json.dumps(not_a_dict).encode()):
        client.put_object(Bucket=stores.bucket, Key=key, Body=gzip.compress(inside), Metadata=meta)
        with pytest.raises(CorruptStateError, match=r"odd/snapshot\.json"):
            await stores.io(mode).read("odd")
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="alpineagents_s3"):
            store = stores.new()
            if mode == "async":
                listed = await store.alist()
            else:
                listed = await asyncio.to_thread(store.list)
        assert [s.id for s in listed] == ["good"]
        assert "not listing State 'odd'" in caplog.text
    compressed_as_1 = gzip.compress(parsed_body)
    client.put_object(
        Bucket=stores.bucket, Key=key, Body=compressed_as_1, Metadata={**meta, LAYOUT_META: "1"}
    )
    with pytest.raises(CorruptStateError, match=r"odd/snapshot\.json"):
        await stores.io(mode).read("odd")


async def test_holds_transfer_copies_and_moves_a_state_with_references(stores: Stores) -> None:
    """alpineagents.transfer between two S3 stores: the copy is written with references of
    its own, a second copy finds it identical, a move checks and removes the source."""
    src = stores.new()
    dst = S3Store(stores.make_bucket(), "runs", endpoint_url=stores.url, session=stores.session)
    stores.made.append(dst)
    history = entries(0, 6)
    answer = history[5]["content"]["message"]["content"][0]["text"]
    snapshot = snapshot_of(history, last_answer=answer)
    await asyncio.to_thread(src.write, "tr", history, snapshot, create=True)
    (done,) = await asyncio.to_thread(copy_states, src, dst, ["tr"])
    assert done.action == "copied"
    (again,) = await asyncio.to_thread(copy_states, src, dst, ["tr"])
    assert again.action == "identical"
    got = raw_client(stores.url).get_object(Bucket=dst.bucket, Key="runs/tr/snapshot.json")
    assert got["Metadata"][LAYOUT_META] == "3"
    assert LONG_JSON not in gzip.decompress(got["Body"].read())
    (moved,) = await asyncio.to_thread(move_states, src, dst, ["tr"])
    assert moved.action == "identical" and moved.removed
    assert await asyncio.to_thread(src.read, "tr") is None
    record = await asyncio.to_thread(dst.read, "tr")
    assert record is not None and record.snapshot == snapshot and record.entries == history


async def test_holds_auto_pack_and_pack_of_a_state_read_with_whole_texts(
    mode: Mode, stores: Stores
) -> None:
    """A snapshot that kept texts whole (its writer had no index), read by an auto_pack store
    object (the read indexes them from the newest entries, then packs), which saves on after
    another pack removed the entry objects: every text referred to, the State loads."""
    loader, agents = stores.io(mode), stores.io(mode)
    history = entries(0, 12)
    await loader.write("apk", history, snapshot_of(history), create=True)
    assert (await loader.read("apk")) is not None
    more = history + entries(12, 14)
    await agents.write("apk", more[12:], snapshot_of(more))  # known None: all whole
    assert stored(stores, "apk")[1].count(LONG_JSON) >= 12
    auto = stores.io(mode, auto_pack=2)
    assert (await auto.read("apk")) is not None
    await pack(stores.new(), mode, "apk", remove_entries=True)
    again = more + entries(14, 16)
    await auto.write("apk", again[14:], snapshot_of(again))
    await texts_hold(stores, auto, "apk")
    await load_equal(stores, mode, "apk", again)
    assert LONG_JSON not in stored(stores, "apk")[1]


def test_holds_a_read_of_5000_entries_spends_little_on_references() -> None:
    """A 0.4-shaped State of 5,000 entries whose context holds every message: what a read does
    beyond the history (unwrap, ``whole_texts``, ``find_texts``, ``resolve``), with every text
    referred to and with every text kept whole (the window then covers the whole history)."""
    n = 5_000
    history = entries(0, n)
    snapshot = snapshot_of(history)
    texts = Texts("g")
    texts.add(history)
    for index in (texts, None):
        body = _refs.decompress(_refs.encode(snapshot, index, "x"), "x")
        started = time.process_time()
        parsed, refs = _refs.unwrap(json.loads(body), "x")
        found = _refs.texts_of("g", refs, n)
        whole = _refs.whole_texts(parsed)
        if whole:
            _refs.find_texts(found, history, whole, 2 * len(parsed["context"]) + 64)
        back = _refs.resolve(parsed, refs, history, "x")
        took = time.process_time() - started
        assert back == snapshot and len(found.where) == n
        assert took < 1.0, f"{took:.2f} s"
