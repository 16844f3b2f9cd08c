"""Adversarial review of the context texts kept in history entries (layout 2), by a helper.

The first tests are what the review found broken in 38522de, fixed since: a State that became
unloadable, a text swapped unseen, an unhelpful error, texts sent whole again after a failure
or by a store object that had not read the State, an index never forgotten. Two (marked
``xfail``) are older than the references and not fixed. The rest document sequences that were
tried and hold.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import time
from typing import Any

import pytest

from alpineagents_s3 import ConcurrentWriteError, S3Store, _refs
from alpineagents_s3._layout import GENERATION_META, LAYOUT_META
from alpineagents_s3._refs import MIN_LENGTH, Texts
from alpineagents_s3.testing import RequestLog
from tests.helpers import Mode
from tests.s3.helpers import (
    Breaks,
    LoseAnswers,
    Refuse,
    Stores,
    killed_save,
    objects,
    pack,
    raw_client,
)
from tests.s3.test_refs import LONG, LONG_JSON, entries, snapshot_of, stored

ERROR_500 = "InternalError|500"
NETWORK = "(?i)connection|injected"


def kept_below(io: Any, state_id: str, count: int) -> bool:
    """Whether the store object refers to no entry at or beyond ``count`` any more."""
    texts = ledger(io).texts.get(state_id)
    return texts is None or all(seq < count for seq, _ in texts.where.values())


def ledger(io: Any) -> Any:
    store = io.store
    assert isinstance(store, S3Store)
    return store._ledger


async def load_equal(stores: Stores, mode: Mode, state_id: str, history: list[Any]) -> None:
    """A fresh store object loads the State as ``history`` and its snapshot."""
    record = await stores.io(mode).read(state_id)
    assert record is not None
    assert record.entries == history
    assert record.snapshot == snapshot_of(history)


# ------------------------------------------------------------------------------------------
# Findings (these failed on 38522de)
# ------------------------------------------------------------------------------------------


async def test_entry_whose_keys_collide_in_json_still_loads(mode: Mode, stores: Stores) -> None:
    """An entry dict holding both "k" and a non-str key that JSON spells "k".

    ``Texts.add`` indexes the in-memory entry (the str key's text); JSON keeps the last of the
    two duplicate keys, so the stored entry holds the other text at that path. The snapshot
    refers to the text the entry object does not hold: the State can never be loaded.
    """
    io = stores.io(mode)
    a, b = "A" * MIN_LENGTH + " first", "B" * MIN_LENGTH + " second"
    history: list[dict[str, Any]] = [
        {"seq": 0, "kind": "tool_result", "content": {"1": a, 1: b}},
    ]
    snapshot = {"v": 3, "task": "t", "context": [{"role": "user", "content": a}]}
    await io.write("keys", history, snapshot, create=True)
    record = await stores.io(mode).read("keys")  # CorruptStateError on 38522de
    assert record is not None
    assert record.snapshot == snapshot


async def test_a_snapshot_that_is_not_a_dict_is_refused_as_a_type_error(
    mode: Mode, stores: Stores
) -> None:
    """The Store contract hands a dict; anything else should be refused by name, before any
    request (like a value JSON cannot hold). 38522de raises ``AttributeError: 'list' object
    has no attribute 'get'`` from ``_refs.has_context``."""
    log = RequestLog()
    io = stores.io(mode, event_hooks=log.hooks)
    with pytest.raises((TypeError, ValueError)):
        await io.write("notdict", entries(0, 1), ["a", "list"], create=True)  # type: ignore[arg-type]
    assert log.requests == []


async def test_delete_forgets_the_texts_of_the_state(mode: Mode, stores: Stores) -> None:
    """``delete`` pops the State's Version but leaves ``ledger.texts[id]``: a long-lived
    store object keeps an index of every long text of every State it ever saved or loaded,
    deleted ones included (the index is never evicted otherwise either)."""
    io = stores.io(mode)
    history = entries(0, 6)
    await io.write("gone", history, snapshot_of(history), create=True)
    assert "gone" in ledger(io).texts
    await io.delete("gone")
    assert "gone" not in ledger(io).versions
    assert "gone" not in ledger(io).texts


async def test_a_stale_writer_cannot_overwrite_a_state_created_again_with_the_same_body(
    mode: Mode, stores: Stores
) -> None:
    """Delete and create again under the same id, with a byte-identical snapshot body.

    S3's ETag is the MD5 of the body, so the new snapshot has the old one's ETag: the old
    store object's ``If-Match`` passes, and its snapshot PUT (naming the old, deleted
    generation) replaces the new State's. Both are lost; the id no longer loads. (Not
    introduced by 38522de, but the "delete and re-create" sequence of the brief: refs make
    no difference, the count already points at a generation with no entries. A core's
    snapshot holds ``updated_at``, so byte-identical bodies need a copy such as
    ``alpineagents.transfer`` writing the same snapshot dict again.)
    """
    old, other = stores.io(mode), stores.io(mode)
    history = entries(0, 4)
    await old.write("again", history, snapshot_of(history), create=True)
    await other.delete("again")
    await other.write("again", history, snapshot_of(history), create=True)
    more = history + entries(4, 6)
    try:
        await old.write("again", more[4:], snapshot_of(more))
    except (ConcurrentWriteError, KeyError):
        pass  # refused: what should happen
    record = await stores.io(mode).read("again")  # CorruptStateError on 38522de
    assert record is not None
    assert record.entries in (history, more)


async def test_a_legacy_body_that_begins_like_references_is_not_misread_after_a_claim(
    mode: Mode, stores: Stores
) -> None:
    """A layout-1 snapshot (an alpineagents-s3 before 38522de wrote every body as it is) whose
    JSON begins ``{"alpineagents-refs":``. Read as layout 1 it loads right. A claim PUTs the
    same body again, and ``Layout.snapshot_put`` works the layout out from the body: 2. If the
    save fails after its claim, the stored snapshot is now read as a body with references, and
    a load silently returns its inner "snapshot" instead of the State's."""
    io = stores.io(mode)
    history = entries(0, 2, text="short ")
    legacy = {"alpineagents-refs": 1, "refs": [], "snapshot": {"task": "inner"}}
    legacy |= snapshot_of(history)
    await io.write("legacy", history, legacy, create=True)
    # As an alpineagents-s3 before 38522de stored it: no leading space, layout 1.
    client = raw_client(stores.url)
    meta, _ = stored(stores, "legacy")
    meta = {**meta, LAYOUT_META: "1"}
    client.put_object(
        Bucket=stores.bucket,
        Key="runs/legacy/snapshot.json",
        Body=json.dumps(legacy, separators=(",", ":")).encode(),
        Metadata=meta,
    )
    record = await stores.io(mode).read("legacy")
    assert record is not None and record.snapshot == legacy  # holds before the claim

    # A killed save left entry 3 (not 2): the next save claims, then fails on an entry PUT.
    killed_save(client, stores.bucket, "legacy", 3)
    failing = Refuse(500, "InternalError", when=lambda url, headers: url.endswith("02.json"))
    resumed = stores.io(mode, event_hooks={"before-call.s3.PutObject": failing})
    assert (await resumed.read("legacy")) is not None
    more = history + entries(2, 4, text="short ")
    with pytest.raises(Exception, match=ERROR_500):
        await resumed.write("legacy", more[2:], {**legacy, "history_len": 4})
    assert failing.refused
    record = await stores.io(mode).read("legacy")
    assert record is not None and record.snapshot == legacy  # {"task": "inner"} on 38522de


async def test_two_texts_are_told_apart_by_a_digest_too_wide_to_collide(
    mode: Mode, stores: Stores
) -> None:
    """A reference is checked by its digest, and the index maps a digest to the first entry
    holding it: two texts with one digest would put one in the other's place unseen. With 64
    bits, a birthday collision costs about 2**32 BLAKE2b calls (minutes, for whoever writes
    two tool results); the digest is 128 bits (2**64 calls). Texts that differ in one
    character are referred to their own entries."""
    assert len(_refs.digest("x")) * 4 >= 128
    other = f"{'Z' * MIN_LENGTH} fetched page, variant 0"
    text = f"{'Z' * MIN_LENGTH} fetched page, variant 1"
    history = [
        {"seq": 0, "kind": "tool_result", "content": other},
        {"seq": 1, "kind": "tool_result", "content": text},
    ]
    snapshot = {"v": 3, "task": "t", "context": [{"content": other}, {"content": text}]}
    io = stores.io(mode)
    await io.write("collide", history, snapshot, create=True)
    _, body = stored(stores, "collide")
    assert [ref[1] for ref in json.loads(body)["refs"]] == [0, 1]
    record = await stores.io(mode).read("collide")
    assert record is not None and record.entries == history
    assert record.snapshot == snapshot


async def test_one_failed_save_does_not_put_the_whole_context_back_for_the_rest_of_the_run(
    mode: Mode, stores: Stores
) -> None:
    """One snapshot PUT fails (a 500 after botocore's retries, a network error, a cancelled
    save): ``write`` dropped the whole index, and only texts of saves after it are indexed
    again. Until the process loads the State again, every later snapshot PUT carries every
    long text saved before the failure -- the size this change exists to save (476 KB instead
    of 127 KB a PUT at 0.4.0's 40th turn). Texts of entries below ``Version.landed`` (the count
    of a snapshot this store object wrote or read) are final and could be kept."""
    flag = {"on": False}
    refuse = Refuse(500, "InternalError", when=lambda url, h: flag["on"] and "snapshot" in url)
    io = stores.io(mode, event_hooks={"before-call.s3.PutObject": refuse})
    history = entries(0, 6)
    await io.write("once", history, snapshot_of(history), create=True)
    more = history + entries(6, 8)
    flag["on"] = True
    with pytest.raises(Exception, match=ERROR_500):
        await io.write("once", more[6:], snapshot_of(more))
    flag["on"] = False
    await io.write("once", more[6:], snapshot_of(more))  # the same save, sent again
    again = more + entries(8, 10)
    await io.write("once", again[8:], snapshot_of(again))
    await load_equal(stores, mode, "once", again)
    _, body = stored(stores, "once")
    assert body.count(LONG_JSON) == 0, f"{body.count(LONG_JSON)} long texts copied"


async def test_texts_kept_whole_once_stay_whole_in_every_later_snapshot(
    mode: Mode, stores: Stores
) -> None:
    """A read indexes only the texts its snapshot referred to (``texts_of(refs)``), though it
    holds the whole history. So a snapshot that kept texts whole (its writer had no index: a
    store object saving a State loaded through another one, or after a failed save) passes
    them on: every later writer, in any process, PUTs them again at every save while they
    stay in the context. Here the Agent's own store object saves a State loaded through an
    equal one; a third process loads it and saves on."""
    loader, agents = stores.io(mode), stores.io(mode)
    history = entries(0, 6)
    await loader.write("whole", history, snapshot_of(history), create=True)
    assert (await loader.read("whole")) is not None
    more = history + entries(6, 8)
    await agents.write("whole", more[6:], snapshot_of(more))
    later = stores.io(mode)
    assert (await later.read("whole")) is not None
    again = more + entries(8, 10)
    await later.write("whole", again[8:], snapshot_of(again))
    await load_equal(stores, mode, "whole", again)
    _, body = stored(stores, "whole")
    assert body.count(LONG_JSON) == 0, f"{body.count(LONG_JSON)} long texts copied"


async def test_a_snapshot_refused_before_any_request_keeps_the_index(
    mode: Mode, stores: Stores
) -> None:
    """Non-JSON ``state.data`` is a documented user error (a ``TypeError`` naming the path,
    raised when saving, before any request): the user fixes it and the run goes on. ``write``
    pops the index before ``encode`` refuses the snapshot, so nothing was sent and nothing
    failed in S3, yet every later snapshot of the process carries the whole context again
    (the previous test's cost)."""
    io = stores.io(mode)
    history = entries(0, 6)
    await io.write("nan", history, snapshot_of(history), create=True)
    more = history + entries(6, 8)
    with pytest.raises(TypeError):
        await io.write("nan", more[6:], snapshot_of(more, data={"x": object()}))
    assert "nan" in ledger(io).texts


async def test_own_entry_saved_alone_beyond_a_gap_is_refused(mode: Mode, stores: Stores) -> None:
    """Two tool results saved alone at once: seq 4's save fails, seq 5's would land. Once
    accepted, a load took 5 for an orphan and the next save (4 and 6 with the snapshot)
    cleared it: the State no longer loaded. A Store-contract caller of its own gets here (this
    repository's core and the published ones send from their saved count). The save of 5 is
    now refused, naming entry 4, before anything is written, as FileStore refuses it; the
    caller's next save, from 4, keeps everything."""
    io = stores.io(mode)
    history = entries(0, 4)
    await io.write("gap", history, snapshot_of(history), create=True)
    before = await objects(io, "gap")
    full = history + entries(4, 7)
    with pytest.raises(ValueError, match=r"'gap' begins at history entry 5, but entry 4 is not"):
        await io.write("gap", [full[5]], None)
    assert await objects(io, "gap") == before  # nothing written
    assert (await io.read("gap")).entries == history  # type: ignore[union-attr]
    with pytest.raises(ValueError, match=r"'gap' skip seq 5 \(seqs 4 to 6\)"):
        await io.write("gap", [full[4], full[6]], snapshot_of(full))
    await io.write("gap", full[4:], snapshot_of(full))
    await load_equal(stores, mode, "gap", full)


async def test_entries_saved_through_another_store_object_are_not_a_gap(
    mode: Mode, stores: Stores
) -> None:
    """A copy of the State saved entries 4 and 5 alone through another store object of the
    same bucket (equal stores: the core takes them for one): this store object knows 4
    entries, and the copy's next save begins at 6. One LIST finds 4 and 5 stored, and the save
    goes on; the next one costs no LIST."""
    log = RequestLog()
    io, other = stores.io(mode, event_hooks=log.hooks), stores.io(mode)
    history = entries(0, 4)
    await io.write("via", history, snapshot_of(history), create=True)
    full = history + entries(4, 8)
    await other.write("via", full[4:6], None)
    log.clear()
    await io.write("via", full[6:7], None)
    assert log.counts()["LIST"] == 1
    log.clear()
    await io.write("via", full[7:], snapshot_of(full))
    assert "LIST" not in log.counts()
    await load_equal(stores, mode, "via", full)


async def test_entries_a_pack_removed_are_not_taken_for_a_gap(mode: Mode, stores: Stores) -> None:
    """Another store object saved entries 4 and 5 with a snapshot and packed them, their
    objects removed: the entries between are final, counted by the stored snapshot, so the
    save is not refused as skipping them; it meets the other writer's snapshot instead, as
    any save of a copy behind another writer does, and what that writer saved is kept."""
    io, other = stores.io(mode), stores.io(mode)
    history = entries(0, 4)
    await io.write("packed-gap", history, snapshot_of(history), create=True)
    full = history + entries(4, 8)
    await other.write("packed-gap", full[4:6], snapshot_of(full[:6]))
    await pack(stores.new(), mode, "packed-gap", remove_entries=True)
    with pytest.raises(ConcurrentWriteError, match="another writer"):
        await io.write("packed-gap", full[6:], snapshot_of(full))
    await load_equal(stores, mode, "packed-gap", full[:6])


async def test_a_save_past_the_known_count_of_a_state_created_again(
    mode: Mode, stores: Stores
) -> None:
    """The State was deleted and created again by another store object since this one saved
    4 entries: a save beginning at 6 is refused as a write to another State, and writes
    nothing."""
    io, other = stores.io(mode), stores.io(mode)
    history = entries(0, 4)
    await io.write("again", history, snapshot_of(history), create=True)
    await other.delete("again")
    again = entries(0, 6)
    await other.write("again", again, snapshot_of(again), create=True)
    before = await objects(other, "again")
    full = history + entries(4, 8)
    with pytest.raises(ConcurrentWriteError, match="another generation"):
        await io.write("again", full[6:], None)
    assert await objects(other, "again") == before
    await load_equal(stores, mode, "again", again)


def test_entries_of_one_write_are_given_once_each() -> None:
    """Two entries with one seq in a write: refused, naming it, before any request (the
    second body silently replaced the first)."""
    store = S3Store("no-such-bucket-for-this-test", endpoint_url="http://127.0.0.1:9")
    twice = entries(0, 2) + entries(1, 2)
    with pytest.raises(ValueError, match="'twice' hold seq 1 twice"):
        store.write("twice", twice, None)


# ------------------------------------------------------------------------------------------
# What holds (these passed on 38522de too)
# ------------------------------------------------------------------------------------------


def test_holds_one_save_copies_the_texts_index_cheaply() -> None:
    """``Texts.with_entries`` copies the whole index (every long text of the history, those
    before the last compaction too) at each save: O(history) per save, but about 0.7 ms at
    100,000 long texts (17 ms at 1,000,000): not a trap next to a request. Adding in place
    would do (``write`` owns the popped index; a failure drops it)."""
    index = Texts("g")
    index.add([{"seq": s, "content": f"{s:07d}" + "r" * MIN_LENGTH} for s in range(100_000)])
    one = [{"seq": 100_000, "content": "n" * MIN_LENGTH}]
    started = time.process_time()
    for _ in range(20):
        index.with_entries(one)
    per_save = (time.process_time() - started) / 20
    assert per_save < 0.02, f"{per_save * 1000:.1f} ms to add one entry"


async def test_holds_lost_answer_of_the_snapshot_put_then_more_saves(
    mode: Mode, stores: Stores
) -> None:
    lose = LoseAnswers()
    io = stores.io(mode, event_hooks={"needs-retry.s3.PutObject": lose})
    history = entries(0, 4)
    await io.write("lost", history, snapshot_of(history), create=True)
    for stop in (6, 8):
        more = history + entries(len(history), stop)
        await io.write("lost", more[len(history) :], snapshot_of(more))
        history = more
    assert lose.repeated
    _, body = stored(stores, "lost")
    assert LONG_JSON not in body
    await load_equal(stores, mode, "lost", history)


async def test_holds_a_snapshot_put_applied_whose_answer_is_an_error(
    mode: Mode, stores: Stores
) -> None:
    """The PUT lands, its answer is lost, and every retry fails on the network: the save
    raises; only the texts of entries below the count it read are kept; the next save (same
    copy, sent again) settles and loads."""
    state = {"on": False}
    lose = LoseAnswers()
    breaks = Breaks(
        ConnectionResetError("injected"),
        when=lambda r: state["on"] and r.url.endswith("snapshot.json") and lose.repeated > 0,
    )

    def needs_retry(**kwargs: Any) -> Any:
        return lose(**kwargs) if state["on"] else None

    io = stores.io(
        mode,
        event_hooks={"needs-retry.s3.PutObject": needs_retry, "before-send.s3.PutObject": breaks},
    )
    history = entries(0, 4)
    await io.write("applied", history, snapshot_of(history), create=True)
    more = history + entries(4, 6)
    state["on"] = True
    with pytest.raises(Exception, match=NETWORK):
        await io.write("applied", more[4:], snapshot_of(more))
    state["on"] = False
    assert breaks.raised
    assert kept_below(io, "applied", 4)
    again = more + entries(6, 8)
    await io.write("applied", again[4:], snapshot_of(again))
    await load_equal(stores, mode, "applied", again)


async def test_holds_refused_and_failed_saves_leave_no_reference(
    mode: Mode, stores: Stores
) -> None:
    """A refused save and a 500 on the snapshot PUT: each keeps only the texts of entries
    below the count last read; later saves after a load refer only to what the history holds."""
    first, second = stores.io(mode), stores.io(mode)
    history = entries(0, 4)
    await first.write("two", history, snapshot_of(history), create=True)
    assert (await second.read("two")) is not None
    won = history + entries(4, 6, text="winner ")
    await first.write("two", won[4:], snapshot_of(won))
    lost = history + entries(4, 6)
    with pytest.raises(ConcurrentWriteError):
        await second.write("two", [lost[4]], None)  # a tool result saved alone: refused
    assert kept_below(second, "two", 4)
    with pytest.raises(ConcurrentWriteError):
        await second.write("two", lost[5:], snapshot_of(lost))
    # The winner's snapshot PUT answered 500 (not applied): texts dropped, the next one lands.
    flag = {"on": True}
    refuse = Refuse(500, "InternalError", when=lambda url, h: flag["on"] and "snapshot" in url)
    third = stores.io(mode, event_hooks={"before-call.s3.PutObject": refuse})
    assert (await third.read("two")) is not None
    more = won + entries(6, 8)
    with pytest.raises(Exception, match=ERROR_500):
        await third.write("two", more[6:], snapshot_of(more))
    flag["on"] = False
    assert kept_below(third, "two", 6)
    await third.write("two", more[6:], snapshot_of(more))
    await load_equal(stores, mode, "two", more)


async def test_holds_killed_save_orphans_claim_and_the_killed_writer_comes_back(
    mode: Mode, stores: Stores
) -> None:
    writer = stores.io(mode)
    history = entries(0, 4)
    await writer.write("orph", history, snapshot_of(history), create=True)
    killed_save(raw_client(stores.url), stores.bucket, "orph", 5, 6)
    resumed = stores.io(mode)
    assert (await resumed.read("orph")) is not None
    more = history + entries(4, 8, text=f"{LONG}resumed ")
    await resumed.write("orph", more[4:6], None)  # alone, fills the gap: claim + replace
    await resumed.write("orph", more[6:], snapshot_of(more))
    # The first writer's copy is behind: its saves, alone or not, are refused.
    stale = history + entries(4, 6)
    with pytest.raises(ConcurrentWriteError):
        await writer.write("orph", [stale[4]], None)
    with pytest.raises(ConcurrentWriteError):
        await writer.write("orph", stale[4:], snapshot_of(stale))
    await load_equal(stores, mode, "orph", more)
    _, body = stored(stores, "orph")
    assert b"resumed " not in body  # every text referred to


async def test_holds_delete_and_create_again_by_another_store_object(
    mode: Mode, stores: Stores
) -> None:
    old, other = stores.io(mode), stores.io(mode)
    history = entries(0, 4)
    await old.write("re", history, snapshot_of(history), create=True)
    await other.delete("re")
    fresh = entries(0, 4, text="fresh ")
    await other.write("re", fresh, snapshot_of(fresh), create=True)
    # Committed alone (layout 3): no request tells the old store object that the State was
    # replaced, so the entry goes under the old generation, which no load reads...
    await old.write("re", entries(4, 5), None)
    more = history + entries(4, 6)
    # ...and its next snapshot PUT is refused.
    with pytest.raises((ConcurrentWriteError, KeyError)):
        await old.write("re", more[4:], snapshot_of(more))
    # The old store object loads the new State and continues: no text of the old one named.
    assert (await old.read("re")) is not None
    more = fresh + entries(4, 6, text="fresh ")
    await old.write("re", more[4:], snapshot_of(more))
    await load_equal(stores, mode, "re", more)
    # The same store object deletes and creates again, with other texts at the same seqs.
    await old.delete("re")
    third = entries(0, 4, text="third ")
    await old.write("re", third, snapshot_of(third, *snapshot_of(more)["context"]), create=True)
    record = await stores.io(mode).read("re")
    assert record is not None and record.entries == third


async def test_holds_pack_remove_entries_and_auto_pack_then_saves_refer_to_packed_entries(
    mode: Mode, stores: Stores
) -> None:
    io = stores.io(mode)
    history = entries(0, 20)
    await io.write("pk", history, snapshot_of(history), create=True)
    await pack(stores.new(), mode, "pk", remove_entries=True)
    more = history + entries(20, 24)
    await io.write("pk", more[20:], snapshot_of(more))  # refers to texts of packed entries
    _, body = stored(stores, "pk")
    assert LONG_JSON not in body
    auto = stores.io(mode, auto_pack=2)
    assert (await auto.read("pk")) is not None  # packs 20-23
    again = more + entries(24, 26)
    await auto.write("pk", again[24:], snapshot_of(again))
    await pack(stores.new(), mode, "pk", remove_entries=True)
    await load_equal(stores, mode, "pk", again)
    kinds = {o.kind for o in await objects(stores.io(mode), "pk")}
    assert "segment" in kinds and "abandoned" not in kinds


async def test_holds_a_state_loaded_through_another_store_object(
    mode: Mode, stores: Stores
) -> None:
    """The Agent's own store saves a State loaded through an equal one (never read by it)."""
    loader, agents = stores.io(mode), stores.io(mode)
    history = entries(0, 4)
    await loader.write("via", history, snapshot_of(history), create=True)
    assert (await loader.read("via")) is not None
    more = history + entries(4, 6)
    await agents.write("via", [more[4]], None)
    await agents.write("via", more[5:], snapshot_of(more))
    again = more + entries(6, 8)
    await agents.write("via", again[6:], snapshot_of(again))
    with pytest.raises(ConcurrentWriteError):  # the loader's copy is behind
        await loader.write("via", more[4:], snapshot_of(more))
    await load_equal(stores, mode, "via", again)


async def test_holds_concurrent_alone_saves_of_one_store_object(stores: Stores) -> None:
    """Tool results saved alone at once (async), one of them failing: the save of the one
    after it would leave a hole, and is refused naming it (nothing of it written); the
    caller's next save, from the failed one, keeps everything."""
    flag = {"on": True}
    refuse = Refuse(500, "InternalError", when=lambda url, h: flag["on"] and url.endswith("5.json"))
    io = stores.io("async", event_hooks={"before-call.s3.PutObject": refuse})
    history = entries(0, 4)
    await io.write("conc", history, snapshot_of(history), create=True)
    full = history + entries(4, 8)
    results = await asyncio.gather(
        *(io.write("conc", [full[seq]], None) for seq in (4, 5, 6)), return_exceptions=True
    )
    assert [isinstance(r, Exception) for r in results] == [False, True, True]
    assert isinstance(results[2], ValueError) and "entry 5 is not stored" in str(results[2])
    flag["on"] = False
    await io.write("conc", full[5:], snapshot_of(full))
    await load_equal(stores, "async", "conc", full)


async def test_holds_list_objects_and_sweep(mode: Mode, stores: Stores) -> None:
    io = stores.io(mode)
    history = entries(0, 4)
    core = {"created_at": "2026-01-01T00:00:00+00:00", "updated_at": "2026-01-01T00:00:00+00:00"}
    await io.write("ls", history, snapshot_of(history), create=True)
    assert stored(stores, "ls")[0][LAYOUT_META] == "3"
    store = stores.new()
    swept = await asyncio.to_thread(store.sweep, 0) if mode == "sync" else await store.asweep(0)
    assert swept == []
    await load_equal(stores, mode, "ls", history)
    kinds = sorted(o.kind for o in await objects(io, "ls"))
    assert kinds == ["entry"] * 4 + ["snapshot"]
    del core


async def test_holds_odd_values(mode: Mode, stores: Stores) -> None:
    io = stores.io(mode)
    # Non-BMP and escapes in entries, the same text twice in the context, a deep entry.
    odd = '\U0001f600\u2028"\\' * 100
    history = entries(0, 4, text=odd)
    deep: Any = f"{odd}deep"
    for _ in range(400):
        deep = {"x": deep}
    history.append({"seq": 4, "kind": "tool_result", "content": deep})
    snapshot = snapshot_of(history[:4], f"{odd}deep", [f"{odd}1", f"{odd}1"])
    await io.write("odd", history, snapshot, create=True)
    record = await stores.io(mode).read("odd")
    assert record is not None and record.snapshot == snapshot
    # A context that is not a list; a State created without a snapshot, then saves on it.
    await io.write("nolist", history[:2], {"v": 3, "context": {"a": f"{odd}1"}}, create=True)
    assert stored(stores, "nolist")[0][LAYOUT_META] == "3"
    await io.write("none", history[:2], None, create=True)
    await io.write("none", history[2:4], None)
    await io.write("none", [], snapshot_of(history[:4]))
    record = await stores.io(mode).read("none")
    assert record is not None and record.snapshot == snapshot_of(history[:4])


def test_holds_huge_contexts_encode_and_resolve_in_linear_time() -> None:
    """20,000 long texts (and one text referred to 2,000 times): no quadratic step. Timed in
    this process's CPU, which other work on the machine does not stretch (the wall time did,
    once, with two other test runs on the same 2 cores)."""
    n = 20_000
    history = [
        {"seq": s, "kind": "tool_result", "content": f"{s:06d}" + "r" * MIN_LENGTH}
        for s in range(n)
    ]
    snapshot = {"v": 3, "context": [{"content": e["content"]} for e in history]}
    texts = Texts("g")
    started = time.process_time()
    texts.add(history)
    body = gzip.decompress(_refs.encode(snapshot, texts, "x"))
    parsed, refs = _refs.unwrap(json.loads(body), "x")
    back = _refs.resolve(parsed, refs, history, "x")
    took = time.process_time() - started
    assert back == snapshot and len(refs) == n
    assert took < 2.0, took
    big = "z" * 200_000
    history = [{"seq": 0, "content": big}]
    snapshot = {"context": [big] * 2_000}
    started = time.process_time()
    body = gzip.decompress(_refs.encode(snapshot, Texts("g").with_entries(history), "x"))
    parsed, refs = _refs.unwrap(json.loads(body), "x")
    assert _refs.resolve(parsed, refs, history, "x") == snapshot
    assert time.process_time() - started < 3.0


async def test_holds_many_saves_keep_the_snapshot_small(stores: Stores) -> None:
    """A run of 30 turns, each a reply and a tool result saved alone then a snapshot: the
    snapshot object stays small and the State loads the same through another store."""
    io = stores.io("async")
    history = entries(0, 2)
    await io.write("long", history, snapshot_of(history), create=True)
    for seq in range(2, 32, 2):
        more = history + entries(seq, seq + 2)
        await io.write("long", [more[seq]], None)
        await io.write("long", [more[seq + 1]], snapshot_of(more))
        history = more
    meta, body = stored(stores, "long")
    assert meta[LAYOUT_META] == "3" and LONG_JSON not in body
    assert GENERATION_META in meta
    await load_equal(stores, "async", "long", history)


async def test_holds_a_claim_of_a_body_with_references_then_a_failed_save(
    mode: Mode, stores: Stores
) -> None:
    """The claimed snapshot (layout 2, references) stays stored when the save fails after its
    claim: it loads the same; the same save sent again lands; the caller's dict is unchanged."""
    io = stores.io(mode)
    history = entries(0, 4)
    snapshot = snapshot_of(history)
    await io.write("cl", history, snapshot, create=True)
    assert snapshot == snapshot_of(history)  # encode changed nothing of the caller's
    killed_save(raw_client(stores.url), stores.bucket, "cl", 5)
    flag = {"on": True}
    failing = Refuse(
        500, "InternalError", when=lambda url, h: flag["on"] and url.endswith("04.json")
    )
    resumed = stores.io(mode, event_hooks={"before-call.s3.PutObject": failing})
    assert (await resumed.read("cl")) is not None
    more = history + entries(4, 6)
    with pytest.raises(Exception, match=ERROR_500):
        await resumed.write("cl", more[4:], snapshot_of(more))
    assert failing.refused
    assert stored(stores, "cl")[0][LAYOUT_META] == "3"
    await load_equal(stores, mode, "cl", history)
    flag["on"] = False
    await resumed.write("cl", more[4:], snapshot_of(more))
    await load_equal(stores, mode, "cl", more)
