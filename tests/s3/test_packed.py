"""Packed segments (``S3Store.pack``): a packed State loads the same, in at most 3 rounds.

On moto's server, sync and async. What could break, and is tried here: a load that reads a
segment and the entries saved after it; packing again (merging, sizes); a segment damaged,
removed, foreign, or claiming more than the snapshot counts; packing while the State is run by
another store object, while it is deleted, and while another store object loads it and the
pack removes the entries that load listed; killed saves (orphans) next to segments; sweep and
``objects``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
from collections import Counter
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from alpineagents import State
from alpineagents._serialize import entry_to_dict
from alpineagents.history import TOOL_RESULT
from alpineagents_s3 import CorruptStateError, Packed, S3Store, StateNotFoundError
from alpineagents_s3._packing import SEGMENT_MAX, SEGMENT_MIN
from alpineagents_s3._steps import Batch, Step
from alpineagents_s3.errors import SchemaVersionError
from alpineagents_s3.testing import RequestLog
from tests.helpers import Mode
from tests.s3.helpers import (
    Stores,
    body,
    killed_save,
    load,
    objects,
    pack,
    raw_client,
    run,
    save,
)

pytestmark = pytest.mark.slow

MODES: tuple[Mode, ...] = ("sync", "async")


def same(a: State, b: State) -> None:
    assert a.history == b.history
    assert a.data == b.data and a.task == b.task


class Rounds:
    """Counts the batches of requests (sequential rounds) of a store's operations."""

    def __init__(self, store: S3Store):
        self.batches: list[int] = []
        original = store._steps

        def counted(operation: Any, *args: Any) -> Any:
            return self._count(original(operation, *args))

        setattr(store, "_steps", counted)  # noqa: B010 - an instance attribute on purpose

    def _count(self, steps: Generator[Step, Any, Any]) -> Generator[Step, Any, Any]:
        try:
            step = next(steps)
            while True:
                if isinstance(step, Batch):
                    self.batches.append(len(step.calls))
                outcomes = yield step
                if isinstance(step, Batch):
                    self.answered(len(self.batches))
                step = steps.send(outcomes)
        except StopIteration as done:
            return done.value

    def answered(self, batch: int) -> None:
        """Batch number ``batch`` (from 1) was answered; its steps have not seen it yet."""


def kinds(found: list[Any]) -> Counter[str]:
    return Counter(item.kind for item in found)


async def test_a_packed_state_loads_the_same_in_two_rounds(stores: Stores) -> None:
    """One State of 1,021 entries (more than a listing page), packed with its entries kept by
    the sync API, then packed again removing them by the async one: each packed form loads
    the same, in both modes, in two rounds, and in one when the store object loaded it before
    (it knows the segments: a State this large is slow to make)."""
    state = State("pack me", id="packed")
    state.data["nested"] = {"deep": [1, 2, {"x": None}], "text": "\u00e9\ud7ff"}
    run(state, 510)  # 1,021 entries: more than a listing page
    writer = stores.new()
    writer.save(state)
    variants: list[tuple[Mode, bool]] = [("sync", False), ("async", True)]
    for mode, remove_entries in variants:
        packed = await pack(stores.new(), mode, state.id, remove_entries=remove_entries)
        assert packed.covered == len(state.history)
        found = await objects(stores.io(mode), state.id)
        segments = [o for o in found if o.kind == "segment"]
        # ~1.6 MB of entries: cut into segments of about SEGMENT_MAX, each at least
        # SEGMENT_MIN; packing again (to remove the entries) keeps those segments.
        assert len(segments) == 2, segments
        assert all(SEGMENT_MIN <= o.size < SEGMENT_MAX + 4096 for o in segments), segments
        if not remove_entries:
            assert [o.key for o in segments] == sorted(packed.written)
        assert kinds(found)["entry"] == (0 if remove_entries else len(state.history))

        log = RequestLog()
        reader = stores.new(event_hooks=log.hooks)
        rounds = Rounds(reader)
        same(await load(reader, mode, state.id), state)
        assert len(rounds.batches) == 2, (mode, rounds.batches)
        # The snapshot and the segments; the segments and the entries listed, and with the
        # entry objects kept (more than a page of them), the entries after the segments too.
        assert log.counts() == {"GET": 3, "LIST": 2 if remove_entries else 3}, log.counts()
        # Again by the same store object: the segments with the snapshot, and the entries
        # listed from their end, in one round.
        rounds.batches.clear()
        log.clear()
        same(await load(reader, mode, state.id), state)
        assert rounds.batches == [5], (mode, rounds.batches)
        assert log.counts() == {"GET": 3, "LIST": 2}, log.counts()

    # The run goes on from the packed State: its saves are not refused, and a load reads the
    # segments and the entries saved since, still in two rounds, in either mode: the snapshot
    # counts those entries, so they are fetched by key with the segments.
    continued = await load(writer, "async", state.id)
    run(continued, 5, first=510)
    await save(writer, "async", continued)
    for mode in MODES:
        fresh = stores.new(event_hooks=log.hooks)
        rounds = Rounds(fresh)
        log.clear()
        same(await load(fresh, mode, state.id), continued)
        assert len(rounds.batches) == 2, (mode, rounds.batches)
        assert log.counts() == {"GET": 3 + 10, "LIST": 2}, log.counts()  # each entry GET once
    # The reader of the packed State knows the segments, not the entries saved since: the
    # listing from the segments' end names them, and round 2 fetches them; then it knows
    # them too, and loads the State in one round.
    for batches in ([5, 10], [15]):
        rounds = Rounds(reader)
        log.clear()
        same(await load(reader, "sync", state.id), continued)
        assert rounds.batches == batches, rounds.batches
        assert log.counts() == {"GET": 3 + 10, "LIST": 2}, log.counts()


async def test_packing_again_merges_small_segments_and_keeps_few(
    mode: Mode, stores: Stores
) -> None:
    state = State("grow", id="grows")
    store = stores.new()
    store.save(state)
    written = 0
    for step in range(8):
        run(state, 30, first=30 * step)  # ~60 KB a step
        store.save(state)
        packed = await pack(store, mode, state.id, remove_entries=True)
        written += len(packed.written)
        assert packed.covered == len(state.history)
        segments = [o for o in await objects(stores.io(mode), state.id) if o.kind == "segment"]
        # At least 128 KiB each (one object while the State is smaller), and few.
        if len(segments) > 1:
            assert all(o.size >= SEGMENT_MIN for o in segments), segments
        assert 1 <= len(segments) <= 3, [o.key for o in segments]
        same(await load(stores.new(), mode, state.id), state)
    assert written == 8


async def test_a_small_state_packs_into_one_object(mode: Mode, stores: Stores) -> None:
    state = State("small", id="small")
    run(state, 3, result="short")
    stores.new().save(state)
    packed = await pack(stores.new(), mode, state.id, remove_entries=True)
    found = await objects(stores.io(mode), state.id)
    assert kinds(found) == {"snapshot": 1, "segment": 1}
    assert packed.covered == 7 and len(packed.removed) == 7
    again = await pack(stores.new(), mode, state.id, remove_entries=True)
    assert again == Packed(state.id, 7, (), ())  # nothing new: nothing written or removed
    same(await load(stores.new(), mode, state.id), state)


async def test_a_damaged_or_missing_segment_falls_back_to_the_entries(
    mode: Mode, stores: Stores, caplog: pytest.LogCaptureFixture
) -> None:
    state = State("damaged", id="damaged")
    run(state, 80)
    stores.new().save(state)
    packed = await pack(stores.new(), mode, state.id)
    client = raw_client(stores.url)
    (key,) = packed.written
    for damage in (b'{"alpineagents-segment":1,"start":0,"end":3,"entries":[', b"[]"):
        client.put_object(Bucket=stores.bucket, Key=key, Body=damage)
        with caplog.at_level(logging.WARNING, "alpineagents_s3"):
            same(await load(stores.new(), mode, state.id), state)
        assert key in caplog.text and "own objects instead" in caplog.text
        caplog.clear()
    client.delete_object(Bucket=stores.bucket, Key=key)
    same(await load(stores.new(), mode, state.id), state)


async def test_a_damaged_segment_whose_entries_were_removed_is_named(
    mode: Mode, stores: Stores
) -> None:
    state = State("archived", id="archived")
    run(state, 10)
    stores.new().save(state)
    (key,) = (await pack(stores.new(), mode, state.id, remove_entries=True)).written
    segment = raw_client(stores.url).get_object(Bucket=stores.bucket, Key=key)["Body"].read()
    raw_client(stores.url).put_object(Bucket=stores.bucket, Key=key, Body=segment[:-40])
    with pytest.raises(CorruptStateError, match="packed segment is damaged") as caught:
        await load(stores.new(), mode, state.id)
    assert key in str(caught.value)


async def test_a_segment_of_a_newer_format_is_refused_not_misread(
    mode: Mode, stores: Stores
) -> None:
    state = State("future", id="future")
    run(state, 2)
    stores.new().save(state)
    (key,) = (await pack(stores.new(), mode, state.id, remove_entries=True)).written
    client = raw_client(stores.url)
    stored = client.get_object(Bucket=stores.bucket, Key=key)["Body"].read()
    client.put_object(
        Bucket=stores.bucket, Key=key, Body=stored.replace(b'segment":1', b'segment":2', 1)
    )
    with pytest.raises(SchemaVersionError, match="upgrade alpineagents-s3"):
        await load(stores.new(), mode, state.id)


async def test_a_segment_beyond_the_snapshots_count_is_never_read(
    mode: Mode, stores: Stores
) -> None:
    state = State("count", id="count")
    run(state, 2)
    stores.new().save(state)
    (key,) = (await pack(stores.new(), mode, state.id)).written
    client = raw_client(stores.url)
    entries = [entry_to_dict(e) for e in state.history] + [{"seq": 5, "kind": "user"}]
    forged = key.replace("0000000005.json", "0000000009.json")
    client.put_object(
        Bucket=stores.bucket,
        Key=forged,
        Body=body({"alpineagents-segment": 1, "start": 0, "end": 9, "entries": entries}),
    )
    same(await load(stores.new(), mode, state.id), state)


async def test_a_foreign_object_under_a_segments_key_stops_the_pack_and_removes_nothing(
    mode: Mode, stores: Stores
) -> None:
    state = State("foreign", id="foreign")
    run(state, 2)
    stores.new().save(state)
    generation = next(o for o in await objects(stores.io(mode), state.id) if o.kind == "entry")
    key = generation.key.replace("entries/", "packed/").replace(
        "0000000000.json", "0000000000-0000000005.json"
    )
    raw_client(stores.url).put_object(Bucket=stores.bucket, Key=key, Body=b"{}")
    with pytest.raises(
        CorruptStateError, match="S3Store did not write it: delete it and pack again"
    ):
        await pack(stores.new(), mode, state.id, remove_entries=True)
    assert kinds(await objects(stores.io(mode), state.id))["entry"] == 5


async def test_two_packs_of_one_state_agree(mode: Mode, stores: Stores) -> None:
    state = State("twice", id="twice")
    run(state, 20)
    stores.new().save(state)
    first, second = await asyncio.gather(
        pack(stores.new(), mode, state.id), pack(stores.new(), mode, state.id)
    )
    assert first.written == second.written
    same(await load(stores.new(), mode, state.id), state)


async def test_pack_of_an_unknown_or_deleted_state(mode: Mode, stores: Stores) -> None:
    with pytest.raises(StateNotFoundError, match="nobody"):
        await pack(stores.new(), mode, "nobody")
    state = State("deleted", id="gone")
    run(state, 3)
    stores.new().save(state)
    deleter = stores.new()
    packer = stores.new()

    def delete_first(**kwargs: Any) -> None:  # the State is deleted between PUT and check
        deleter.delete(state.id)

    packer.client.meta.events.register("before-call.s3.HeadObject", delete_first)
    with pytest.raises(StateNotFoundError, match="deleted while it was being packed"):
        packer.pack(state.id)
    assert await objects(stores.io(mode), state.id) == []


async def test_pack_while_another_store_object_runs_the_state(mode: Mode, stores: Stores) -> None:
    state = State("live", id="live")
    run(state, 30)
    runner = stores.new()
    runner.save(state)
    # Tool results saved alone: beyond the snapshot's count, so not packed.
    run(state, 1, first=30)
    runner.write(state.id, [entry_to_dict(e) for e in state.history[-2:]], None)
    packed = await pack(stores.new(), mode, state.id, remove_entries=True)
    assert packed.covered == len(state.history) - 2
    await save(runner, mode, state)  # the save lands, after the pack
    for n in range(31, 34):
        run(state, 1, first=n)
        await save(runner, mode, state)
    same(await load(stores.new(), mode, state.id), state)


async def test_orphans_of_a_killed_save_next_to_a_segment(mode: Mode, stores: Stores) -> None:
    state = State("killed", id="killed")
    run(state, 10)
    stores.new().save(state)
    client = raw_client(stores.url)
    killed_save(client, stores.bucket, state.id, 22, 23)  # beyond a gap at 21
    await pack(stores.new(), mode, state.id, remove_entries=True)
    loaded = await load(stores.new(), mode, state.id)
    same(loaded, state)
    loader = stores.new()
    resumed = await load(loader, mode, state.id)
    run(resumed, 2, first=10)  # seqs 21-24: fills the gap, replaces the orphans
    await save(loader, mode, resumed)
    same(await load(stores.new(), mode, state.id), resumed)


def test_a_load_meets_a_pack_removing_the_entries_it_listed(stores: Stores) -> None:
    """Sync only: the hook is on the reader's sync client."""
    state = State("race", id="race")
    run(state, 40)
    stores.new().save(state)
    reader, packer = stores.new(), stores.new()
    packed: list[Packed] = []
    one_pack = threading.Lock()

    def pack_now(**kwargs: Any) -> None:  # after the reader listed, before it GETs entries
        if "/entries/" not in kwargs["params"].get("Key", ""):
            return
        # The reader GETs on several threads at once: one packs, the others wait for it, so
        # that every GET of an entry comes after the pack removed them all.
        with one_pack:
            if not packed:
                packed.append(packer.pack(state.id, remove_entries=True))

    reader.client.meta.events.register("before-parameter-build.s3.GetObject", pack_now)
    same(reader.load(state.id), state)
    assert len(packed) == 1 and packed[0].covered == len(state.history)
    assert kinds(stores.new().objects(state.id))["entry"] == 0


async def test_sweep_removes_segments_of_abandoned_generations(mode: Mode, stores: Stores) -> None:
    state = State("swept", id="swept")
    run(state, 2)
    store = stores.new()
    store.save(state)
    (key,) = (await pack(store, mode, state.id)).written
    client = raw_client(stores.url)
    stray = key.replace(key.split("/")[3], "0123456789abcdef")
    client.copy_object(
        Bucket=stores.bucket, Key=stray, CopySource={"Bucket": stores.bucket, "Key": key}
    )
    found = {o.key: o.kind for o in await objects(stores.io(mode), state.id)}
    assert found[key] == "segment" and found[stray] == "abandoned"
    assert store.sweep(older_than=0) == [stray]
    same(await load(stores.new(), mode, state.id), state)


def test_entries_of_many_sizes_survive_a_pack(stores: Stores) -> None:
    state = State("odd", id="odd")
    for n, text in enumerate(["", "\u0000", "\ud7ff" * 3, '"\\', "x" * 70_000, "\U0001f600"]):
        state.append(TOOL_RESULT, text, {"call_id": f"c{n}", "name": "t"})
    state.data["deep"] = [[[[[[[["down"]]]]]]]]
    stores.new().save(state)
    stores.new().pack(state.id, remove_entries=True)
    same(stores.new().load(state.id), state)


def test_the_lifecycle_rule_in_the_docs_is_one_s3_takes(stores: Stores) -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "s3.md").read_text()
    blocks = re.findall(r"```json\n(.*?)```", doc, re.S)
    (rule,) = [json.loads(b) for b in blocks if "archive-packed-states" in b]
    client = raw_client(stores.url)
    # botocore checks the request's shape against S3's model before sending it.
    client.put_bucket_lifecycle_configuration(Bucket=stores.bucket, LifecycleConfiguration=rule)
    stored = client.get_bucket_lifecycle_configuration(Bucket=stores.bucket)["Rules"][0]
    assert rule["Rules"][0]["Filter"]["And"]["ObjectSizeGreaterThan"] == SEGMENT_MIN - 1
    assert stored["Filter"]["And"]["Prefix"] == "archive/"  # moto keeps no size filter
    assert stored["Transitions"][0]["StorageClass"] == "GLACIER_IR"
