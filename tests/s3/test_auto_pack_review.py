"""Adversarial review of ``S3Store(auto_pack=N)``: a load that packs what it read.

On moto's server over HTTP, sync and async. Tried here: the Record a packing load returns
against a plain read's; the run's own store object loading with ``auto_pack`` after a snapshot
PUT whose answer was lost, or over orphans, then saving on; States whose snapshot records no
count, created without a snapshot, with a damaged segment, or packed with ``remove_entries``
and saved since; two packing loads at once; a packing load beside a writer saving in a loop;
an ``aload`` cancelled in the middle of its pack; the threshold's boundaries; and the requests
of a load under the threshold. It found three bugs, fixed since: a save after a failed one and
a load through the same store object counted removed entries (the State no longer loaded); a
load took a landed snapshot PUT of its own store object for another writer's; a damaged
segment was never written again (a foreign object under its key still never is).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import re
import threading
from itertools import pairwise
from typing import Any

import pytest

from alpineagents import State
from alpineagents._serialize import entry_to_dict
from alpineagents.history import TOOL_RESULT
from alpineagents_s3 import S3Store
from alpineagents_s3._codec import loads_segment
from alpineagents_s3._layout import ENTRIES_META, LAYOUT_META
from alpineagents_s3.errors import S3StoreError
from alpineagents_s3.testing import RequestLog
from tests.helpers import Mode, entry_dicts, snapshot_dict
from tests.s3.helpers import (
    Refuse,
    Stores,
    killed_save,
    load,
    objects,
    pack,
    raw_client,
    run,
    save,
)
from tests.s3.test_packed import Rounds, same

pytestmark = pytest.mark.slow


async def segments_of(stores: Stores, mode: Mode, state_id: str) -> list[tuple[int, int]]:
    """The ranges ``(start, end)`` of the State's segments, in key order."""
    found = [o.key for o in await objects(stores.io(mode), state_id) if o.kind == "segment"]
    ranges = [re.fullmatch(r".*/(\d+)-(\d+)\.json", key) for key in found]
    return [(int(m[1]), int(m[2])) for m in ranges if m]


def one_chain(segments: list[tuple[int, int]], end: int) -> bool:
    """Whether the segments are one chain, seq 0 to ``end``, without overlaps."""
    ordered = sorted(segments)
    return (
        bool(ordered)
        and ordered[0][0] == 0
        and ordered[-1][1] == end
        and all(a[1] == b[0] for a, b in pairwise(ordered))
    )


async def sweep(store: S3Store, mode: Mode) -> list[str]:
    """``sweep(0)`` or ``asweep(0)``: every abandoned generation, however young."""
    if mode == "async":
        return await store.asweep(0)
    return await asyncio.to_thread(store.sweep, 0)


# The Record returned and the pack ----------------------------------------------------------


async def test_the_record_of_a_packing_read_is_a_plain_reads_and_the_segment_holds_it(
    mode: Mode, stores: Stores
) -> None:
    """The entries handed to the core are the dicts the pack serialised (before it returns):
    the Record is a plain read's, the segment holds exactly those entries, and what the core
    does to the dicts afterwards reaches nothing stored."""
    state = State("record", id="record")
    state.data["nested"] = {"list": [1, {"deep": "\u00e9"}]}
    run(state, 20)
    stores.new().save(state)
    plain = await stores.io(mode).read(state.id)
    assert plain is not None
    packing = stores.io(mode, auto_pack=1)
    record = await packing.read(state.id)
    assert record is not None
    assert list(record.entries) == list(plain.entries)
    assert record.snapshot == plain.snapshot
    assert await segments_of(stores, mode, state.id) == [(0, 41)]

    (key,) = [o.key for o in await objects(stores.io(mode), state.id) if o.kind == "segment"]
    body = raw_client(stores.url).get_object(Bucket=stores.bucket, Key=key)["Body"].read()
    assert loads_segment(body, key, 0, 41) == list(plain.entries)

    # The core may change what it was handed: nothing kept by the store object follows.
    kept = copy.deepcopy(list(record.entries))
    for entry in record.entries:
        entry.clear()
    again = await packing.read(state.id)
    assert again is not None and list(again.entries) == kept
    assert isinstance(packing.store, S3Store)
    same(await load(packing.store, mode, state.id), state)


# The run's own store object ----------------------------------------------------------------


class LoseSnapshotAnswer:
    """Hooks raising after S3 applied a snapshot PUT with ``If-Match`` (a save's), ``left``
    times: the save fails, its token is unsure, and the snapshot landed."""

    def __init__(self) -> None:
        self.left = 0
        self._replacing = threading.local()

    def _mark(self, params: dict[str, Any], **kwargs: Any) -> None:
        url, headers = params["url"], params["headers"]
        self._replacing.on = url.endswith("/snapshot.json") and "If-Match" in headers

    def _lose(self, **kwargs: Any) -> None:
        if getattr(self._replacing, "on", False) and self.left:
            self.left -= 1
            raise ConnectionResetError("the answer was lost after S3 applied the PUT")

    @property
    def hooks(self) -> dict[str, Any]:
        return {"before-call.s3.PutObject": self._mark, "after-call.s3.PutObject": self._lose}


@pytest.mark.parametrize("auto_pack", [None, 1])
@pytest.mark.parametrize("landed", [True, False], ids=["landed", "not-landed"])
async def test_the_writer_loads_with_auto_pack_after_a_failed_save_and_saves_on(
    mode: Mode, stores: Stores, landed: bool, auto_pack: int | None
) -> None:
    """A save whose snapshot PUT landed with its answer lost, or failed with a 500 (its token
    unsure either way); the writer's own packing load, then saves of the copy it loaded."""
    lose = LoseSnapshotAnswer()
    refuse = Refuse(500, "InternalError", times=0, when=_replacing_snapshot)
    hooks = lose.hooks if landed else {"before-call.s3.PutObject": refuse}
    writer = stores.new(auto_pack=auto_pack, event_hooks=hooks)
    state = State("lost", id="lost")
    run(state, 5)  # 11 entries
    await save(writer, mode, state)
    run(state, 5, first=5)
    if landed:
        lose.left = 1
    else:
        refuse.left = 1
    with pytest.raises(S3StoreError):
        await save(writer, mode, state)
    assert lose.left == 0 and refuse.left == 0

    loaded = await load(writer, mode, state.id)
    assert len(loaded.history) == (21 if landed else 11)
    assert loaded.history == state.history[: len(loaded.history)]
    packed = [(0, len(loaded.history))] if auto_pack else []
    assert await segments_of(stores, mode, state.id) == packed
    run(loaded, 3, first=len(loaded.history) // 2)
    await save(writer, mode, loaded)
    same(await load(writer, mode, state.id), loaded)
    run(loaded, 2, first=len(loaded.history) // 2)
    await save(writer, mode, loaded)
    same(await load(stores.new(), mode, state.id), loaded)
    segments = await segments_of(stores, mode, state.id)
    assert one_chain(segments, len(loaded.history) - 4) if auto_pack else segments == []
    assert await sweep(stores.new(), mode) == []


def _replacing_snapshot(url: str, headers: dict[str, Any]) -> bool:
    return url.endswith("/snapshot.json") and "If-Match" in headers


@pytest.mark.parametrize("auto_pack", [None, 1])
async def test_the_failed_save_sent_again_after_the_writers_own_load(
    mode: Mode, stores: Stores, auto_pack: int | None
) -> None:
    """The snapshot PUT landed, its answer was lost; the writer loads the State (a monitor
    sharing its store object), then sends the failed save again, as a run does. Without the
    load in between it succeeds (tests/s3/test_packed_review.py); with it, it is refused as
    another writer's, though the stored snapshot holds this PUT's own token."""
    lose = LoseSnapshotAnswer()
    writer = stores.new(auto_pack=auto_pack, event_hooks=lose.hooks)
    state = State("lost", id="lost-again")
    run(state, 5)
    await save(writer, mode, state)
    run(state, 5, first=5)
    lose.left = 1
    with pytest.raises(S3StoreError, match="ConnectionResetError"):
        await save(writer, mode, state)
    same(await load(writer, mode, state.id), state)
    await save(writer, mode, state)
    run(state, 1, first=10)
    await save(writer, mode, state)
    same(await load(stores.new(), mode, state.id), state)


async def test_the_writer_loads_with_auto_pack_over_orphans_and_saves_on(
    mode: Mode, stores: Stores
) -> None:
    """Entries of a killed save beyond a gap: the packing load leaves them out, and packs only
    what the snapshot counts; the writer's next save replaces them."""
    writer = stores.new(auto_pack=1)
    state = State("orphans", id="orphans")
    run(state, 4)  # 9 entries
    await save(writer, mode, state)
    client = raw_client(stores.url)
    killed_save(client, stores.bucket, state.id, 10, 11, 13)
    loaded = await load(writer, mode, state.id)
    same(loaded, state)
    assert await segments_of(stores, mode, state.id) == [(0, 9)]
    run(loaded, 4, first=4)  # seqs 9 to 16, over the orphans
    await save(writer, mode, loaded)
    fresh = await load(stores.new(auto_pack=1), mode, state.id)
    same(fresh, loaded)
    assert one_chain(await segments_of(stores, mode, state.id), 17)
    same(await load(stores.new(), mode, state.id), loaded)


# Unusual States ----------------------------------------------------------------------------


async def test_a_snapshot_without_a_count_is_loaded_and_not_packed(
    mode: Mode, stores: Stores
) -> None:
    """A snapshot written before counts were recorded: nothing is known to be final."""
    state = State("uncounted", id="uncounted")
    run(state, 10)
    stores.new().save(state)
    client = raw_client(stores.url)
    key = f"runs/{state.id}/snapshot.json"
    head = client.head_object(Bucket=stores.bucket, Key=key)
    # As written then: no count, and layout 1 (the layout mark came later).
    metadata = {k: v for k, v in head["Metadata"].items() if k not in (ENTRIES_META, LAYOUT_META)}
    assert len(metadata) == len(head["Metadata"]) - 2
    client.copy_object(
        Bucket=stores.bucket,
        Key=key,
        CopySource={"Bucket": stores.bucket, "Key": key},
        Metadata=metadata,
        MetadataDirective="REPLACE",
    )
    for item in client.list_objects_v2(Bucket=stores.bucket, Prefix=f"runs/{state.id}/entries/")[
        "Contents"
    ]:  # entries written before their base and writer were recorded, too
        client.copy_object(
            Bucket=stores.bucket,
            Key=item["Key"],
            CopySource={"Bucket": stores.bucket, "Key": item["Key"]},
            Metadata={},
            MetadataDirective="REPLACE",
        )
    same(await load(stores.new(), mode, state.id), state)
    log = RequestLog()
    same(await load(stores.new(auto_pack=1, event_hooks=log.hooks), mode, state.id), state)
    assert "PUT" not in log.counts() and "HEAD" not in log.counts(), log.counts()
    assert await segments_of(stores, mode, state.id) == []


async def test_a_state_created_without_a_snapshot_is_packed_and_saved_on(
    mode: Mode, stores: Stores
) -> None:
    """``write(id, entries, None, create=True)`` records a count: those entries are packed,
    and the State's next write (with a snapshot) reads back whole."""
    io = stores.io(mode, auto_pack=1)
    await io.write("bare", entry_dicts(0, 4), None, create=True)
    record = await io.read("bare")
    assert record is not None and record.snapshot is None
    assert list(record.entries) == entry_dicts(0, 4)
    assert await segments_of(stores, mode, "bare") == [(0, 4)]
    await io.write("bare", entry_dicts(4, 7), snapshot_dict("bare", 7))
    again = await stores.io(mode, auto_pack=1).read("bare")
    assert again is not None
    assert list(again.entries) == entry_dicts(0, 7)
    assert again.snapshot == snapshot_dict("bare", 7)
    assert one_chain(await segments_of(stores, mode, "bare"), 7)


async def test_a_damaged_segment_is_replaced_by_a_packing_load_once_entries_were_added(
    mode: Mode, stores: Stores, caplog: pytest.LogCaptureFixture
) -> None:
    state = State("damaged", id="damaged-grown")
    run(state, 10)  # 21 entries
    writer = stores.new()
    writer.save(state)
    (key,) = (await pack(stores.new(), mode, state.id)).written
    raw_client(stores.url).put_object(Bucket=stores.bucket, Key=key, Body=b"[]")
    run(state, 2, first=10)
    writer.save(state)  # 25 entries
    with caplog.at_level(logging.WARNING, "alpineagents_s3"):
        same(await load(stores.new(auto_pack=1), mode, state.id), state)
    assert "own objects instead" in caplog.text
    assert await segments_of(stores, mode, state.id) == [(0, 25)]
    caplog.clear()
    with caplog.at_level(logging.WARNING, "alpineagents_s3"):
        same(await load(stores.new(), mode, state.id), state)
    assert caplog.text == ""


async def test_a_damaged_segment_is_replaced_by_a_packing_load(
    mode: Mode, stores: Stores, caplog: pytest.LogCaptureFixture
) -> None:
    """Entries kept, nothing saved since the pack: the packing load reads the damaged
    segment's entries one by one, and the pack's docstring says a damaged one is written
    again. The next load should find a sound segment, with no warning."""
    state = State("damaged", id="damaged")
    run(state, 10)
    stores.new().save(state)
    (key,) = (await pack(stores.new(), mode, state.id)).written
    client = raw_client(stores.url)
    stored = client.get_object(Bucket=stores.bucket, Key=key)["Body"].read()
    client.put_object(Bucket=stores.bucket, Key=key, Body=stored[:-40])  # cut short
    with caplog.at_level(logging.WARNING, "alpineagents_s3"):
        same(await load(stores.new(auto_pack=1), mode, state.id), state)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("was damaged: packed again" in m for m in warned), warned
    assert client.get_object(Bucket=stores.bucket, Key=key)["Body"].read() == stored
    caplog.clear()
    log = RequestLog()
    with caplog.at_level(logging.WARNING, "alpineagents_s3"):
        same(await load(stores.new(auto_pack=1, event_hooks=log.hooks), mode, state.id), state)
    assert log.counts() == {"GET": 2, "LIST": 2}, (log.counts(), warned)
    assert caplog.text == ""


async def test_a_state_archived_with_remove_entries_and_saved_since_is_packed_whole(
    mode: Mode, stores: Stores
) -> None:
    state = State("archived", id="archived")
    run(state, 10)  # 21 entries
    writer = stores.new()
    writer.save(state)
    await pack(stores.new(), mode, state.id, remove_entries=True)
    loaded = writer.load(state.id)
    run(loaded, 5, first=10)
    writer.save(loaded)  # 31 entries: 21 in a segment only, 10 entry objects
    same(await load(stores.new(auto_pack=10), mode, state.id), loaded)
    assert await segments_of(stores, mode, state.id) == [(0, 31)]  # the small one merged
    found = await objects(stores.io(mode), state.id)
    assert [o.seq for o in found if o.kind == "entry"] == list(range(21, 31))  # key order
    log = RequestLog()
    same(await load(stores.new(auto_pack=1, event_hooks=log.hooks), mode, state.id), loaded)
    assert log.counts() == {"GET": 2, "LIST": 2}, log.counts()


# Concurrency -------------------------------------------------------------------------------


async def test_two_packing_loads_at_once_leave_one_chain(mode: Mode, stores: Stores) -> None:
    """Two store objects (or one, twice) load a State with a small segment and entries since,
    on threads or with ``asyncio.gather``: both pack the same range and merge the same
    segment."""
    state = State("twice", id="twice")
    run(state, 3)
    writer = stores.new()
    writer.save(state)
    await pack(stores.new(), mode, state.id)  # (0, 7), small
    run(state, 40, first=3)
    writer.save(state)  # 87 entries
    for shared in (False, False, True):  # last, one store object loads it twice at once
        a = stores.new(auto_pack=1)
        b = a if shared else stores.new(auto_pack=1)
        first, second = await asyncio.gather(load(a, mode, state.id), load(b, mode, state.id))
        same(first, state)
        same(second, state)
        assert await segments_of(stores, mode, state.id) == [(0, len(state.history))]
        run(state, 2, first=len(state.history) // 2)
        writer.save(state)
    same(await load(stores.new(), mode, state.id), state)
    assert await sweep(stores.new(), mode) == []


def test_packing_loads_beside_a_writer_saving_in_a_loop(stores: Stores) -> None:
    """Threads: every save succeeds, and the State loads as the writer has it at the end."""
    state = State("busy", id="busy")
    writer = stores.new()
    writer.save(state)
    done = threading.Event()
    failures: list[BaseException] = []
    loads = [0]

    def reader() -> None:
        store = stores.new(auto_pack=1)
        try:
            while not done.is_set():
                loaded = store.load(state.id)
                assert len(loaded.history) >= 1
                loads[0] += 1
        except BaseException as e:  # noqa: BLE001 - reported by the test below
            failures.append(e)

    readers = [threading.Thread(target=reader) for _ in range(2)]
    for thread in readers:
        thread.start()
    try:
        for step in range(12):
            run(state, 2, first=2 * step)
            writer.save(state)
    finally:
        done.set()
        for thread in readers:
            thread.join()
    assert failures == [] and loads[0] >= 2, (failures, loads)
    same(stores.new(auto_pack=1).load(state.id), state)
    same(stores.new().load(state.id), state)
    same(writer.load(state.id), state)
    assert stores.new().sweep(0) == []
    # Packs from snapshots of different counts may leave segments that overlap (all of final
    # entries); the next pack leaves one chain.
    packed = stores.new().pack(state.id)
    assert packed.covered == len(state.history)
    found = [o.key for o in stores.new().objects(state.id) if o.kind == "segment"]
    ranges = [re.fullmatch(r".*/(\d+)-(\d+)\.json", key) for key in found]
    assert one_chain([(int(m[1]), int(m[2])) for m in ranges if m], len(state.history)), found


def test_packing_loads_through_the_writers_own_store_object_while_it_saves(
    stores: Stores,
) -> None:
    """A monitor thread loads through the run's own store object (``auto_pack=1``) while the
    run saves: no save is refused, and the State loads as the run has it."""
    state = State("own", id="own")
    writer = stores.new(auto_pack=1)
    writer.save(state)
    done = threading.Event()
    failures: list[BaseException] = []
    loads = [0]

    def monitor() -> None:
        try:
            while not done.is_set():
                assert len(writer.load(state.id).history) >= 1
                loads[0] += 1
        except BaseException as e:  # noqa: BLE001 - reported by the test below
            failures.append(e)

    thread = threading.Thread(target=monitor)
    thread.start()
    try:
        for step in range(12):
            run(state, 2, first=2 * step)
            writer.save(state)
    finally:
        done.set()
        thread.join()
    assert failures == [] and loads[0] >= 2, (failures, loads)
    same(writer.load(state.id), state)
    run(state, 1, first=24)
    writer.save(state)
    same(stores.new().load(state.id), state)


# Cancellation ------------------------------------------------------------------------------


@pytest.mark.parametrize("at", ["PutObject", "HeadObject"])
async def test_an_aload_cancelled_in_its_pack_leaves_the_state_as_it_was(
    stores: Stores, at: str
) -> None:
    """The task is cancelled once the pack's merged segment PUT (or the HEAD after it) was
    sent: the small segment it takes in is not removed yet."""
    state = State("cancelled", id="cancelled")
    run(state, 3)  # 7 entries
    writer = stores.new()
    writer.save(state)
    await stores.new().apack(state.id)
    run(state, 17, first=3)
    writer.save(state)  # 41 entries
    sent = asyncio.Event()

    def packing(request: Any, **kwargs: Any) -> None:
        if at != "PutObject" or "/packed/" in request.url:
            sent.set()

    store = stores.new(auto_pack=1, event_hooks={f"before-send.s3.{at}": packing})
    task = asyncio.create_task(store.aload(state.id))
    await sent.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    left = await segments_of(stores, "async", state.id)
    if at == "HeadObject":
        assert left == [(0, 7), (0, 41)]
    else:
        assert left in ([(0, 7)], [(0, 7), (0, 41)])
    same(await stores.new().aload(state.id), state)
    packed = await stores.new().apack(state.id)
    assert packed.covered == 41
    assert await segments_of(stores, "async", state.id) == [(0, 41)]
    log = RequestLog()
    same(await stores.new(auto_pack=1, event_hooks=log.hooks).aload(state.id), state)
    assert log.counts() == {"GET": 2, "LIST": 2}, log.counts()
    same(await store.aload(state.id), state)  # the cancelled store object goes on
    assert await stores.new().asweep(0) == []


async def test_get_of_an_unknown_id_with_auto_pack_writes_nothing(
    mode: Mode, stores: Stores
) -> None:
    log = RequestLog()
    io = stores.io(mode, auto_pack=1, event_hooks=log.hooks)
    assert await io.get("nobody") is None
    assert await io.read("nobody") is None
    assert set(log.counts()) == {"GET", "LIST"}, log.counts()


# Threshold and requests --------------------------------------------------------------------


async def test_the_threshold_counts_the_entries_read_one_by_one(mode: Mode, stores: Stores) -> None:
    """A segment covers 21 entries, 10 were saved since: 10 packs, 11 does not."""
    state = State("edge", id="edge")
    run(state, 10)
    writer = stores.new()
    writer.save(state)
    await pack(stores.new(), mode, state.id)
    run(state, 5, first=10)
    writer.save(state)  # 31 entries
    log = RequestLog()
    same(await load(stores.new(auto_pack=11, event_hooks=log.hooks), mode, state.id), state)
    assert "PUT" not in log.counts(), log.counts()
    assert await segments_of(stores, mode, state.id) == [(0, 21)]
    log = RequestLog()
    same(await load(stores.new(auto_pack=10, event_hooks=log.hooks), mode, state.id), state)
    assert log.counts()["PUT"] == 1, log.counts()
    assert await segments_of(stores, mode, state.id) == [(0, 31)]


async def test_auto_pack_1_packs_a_state_of_one_entry(mode: Mode, stores: Stores) -> None:
    state = State("one", id="one")
    assert len(state.history) == 1
    stores.new().save(state)
    log = RequestLog()
    same(await load(stores.new(auto_pack=2, event_hooks=log.hooks), mode, state.id), state)
    assert "PUT" not in log.counts(), log.counts()
    same(await load(stores.new(auto_pack=1), mode, state.id), state)
    assert await segments_of(stores, mode, state.id) == [(0, 1)]
    log = RequestLog()
    same(await load(stores.new(auto_pack=1, event_hooks=log.hooks), mode, state.id), state)
    assert log.counts() == {"GET": 2, "LIST": 2}, log.counts()


async def test_a_load_under_the_threshold_sends_what_a_plain_load_sends(
    mode: Mode, stores: Stores
) -> None:
    """A State with a segment, entries since, entries saved alone and orphans: the same
    requests, in the same rounds, with and without ``auto_pack``."""
    state = State("same", id="same-requests")
    run(state, 10)
    writer = stores.new()
    writer.save(state)
    await pack(stores.new(), mode, state.id)
    run(state, 4, first=10)
    writer.save(state)  # 29 entries, 8 since the segment
    state.append(TOOL_RESULT, "alone", {"call_id": "c", "name": "lookup"})
    writer.write(state.id, [entry_to_dict(state.history[-1])], None)
    killed_save(raw_client(stores.url), stores.bucket, state.id, 32, 33)

    def requests(log: RequestLog) -> list[tuple[str, str, str | None]]:
        return sorted((r.kind, r.path, r.condition) for r in log.requests)

    plain_log, packing_log = RequestLog(), RequestLog()
    plain = stores.new(event_hooks=plain_log.hooks)
    packing = stores.new(auto_pack=9, event_hooks=packing_log.hooks)
    plain_rounds, packing_rounds = Rounds(plain), Rounds(packing)
    same(await load(plain, mode, state.id), state)
    same(await load(packing, mode, state.id), state)
    assert requests(packing_log) == requests(plain_log)
    assert packing_rounds.batches == plain_rounds.batches
    assert await segments_of(stores, mode, state.id) == [(0, 21)]


async def test_a_foreign_object_under_a_segments_key_is_left_by_a_packing_load(
    mode: Mode, stores: Stores, caplog: pytest.LogCaptureFixture
) -> None:
    """An object S3Store did not write (it does not begin as a segment) is never replaced: the
    load returns the State and warns, and the object stays as it is."""
    state = State("foreign", id="foreign")
    run(state, 10)
    stores.new().save(state)
    (key,) = (await pack(stores.new(), mode, state.id)).written
    client = raw_client(stores.url)
    client.put_object(Bucket=stores.bucket, Key=key, Body=b"[]")
    with caplog.at_level(logging.WARNING, "alpineagents_s3"):
        same(await load(stores.new(auto_pack=1), mode, state.id), state)
    assert "S3Store did not write it" in caplog.text
    assert client.get_object(Bucket=stores.bucket, Key=key)["Body"].read() == b"[]"


async def test_two_packing_loads_repair_one_damaged_segment_at_once(
    mode: Mode, stores: Stores
) -> None:
    """Both write the damaged segment again (``If-Match`` on the damaged object's ETag): one
    lands, the other meets the repaired segment, which holds the same entries. Both loads
    return the State; one sound segment remains."""
    state = State("repair", id="repair")
    run(state, 10)
    stores.new().save(state)
    (key,) = (await pack(stores.new(), mode, state.id)).written
    client = raw_client(stores.url)
    stored = client.get_object(Bucket=stores.bucket, Key=key)["Body"].read()
    for _ in range(2):
        client.put_object(Bucket=stores.bucket, Key=key, Body=stored[:-40])
        a, b = stores.new(auto_pack=1), stores.new(auto_pack=1)
        first, second = await asyncio.gather(load(a, mode, state.id), load(b, mode, state.id))
        same(first, state)
        same(second, state)
        assert client.get_object(Bucket=stores.bucket, Key=key)["Body"].read() == stored
        assert await segments_of(stores, mode, state.id) == [(0, 21)]
