"""Second review of layout 3 (saves committed by their entry alone) on moto's HTTP server.

This repository's core saves a State whose run goes on (one entry a save: committed alone,
the change of ``data`` in the entry's metadata), while other store objects pack it (``pack``,
``remove_entries``, ``auto_pack``), delete it, sweep the bucket, list it, copy or move it
(``alpineagents.transfer`` and ``alpineagents cp``/``mv``). Each test checks the promises: what
a save that returned saved is what a new store object loads (unless that writer is told since),
``list()`` summarises what a load returns, and a pack never changes what a load returns.
The same scenarios, batch by batch and under published cores, are in
``tests/plugin/test_layout3_review2.py``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from alpineagents import ConcurrentWriteError, State, StateNotFoundError
from alpineagents import cli as core_cli
from alpineagents.history import USER
from alpineagents.store import SavedState
from alpineagents.transfer import copy_states, move_states
from alpineagents_s3 import S3Store
from alpineagents_s3._layout import ALONE_META, ENTRIES_META, OPEN_META
from tests.helpers import Mode
from tests.s3.helpers import Stores, load, objects, pack, raw_client, save


def step(state: State, n: int, count: int = 1) -> None:
    """``count`` new messages, and a change of ``data`` (nested too)."""
    for k in range(count):
        state.append(USER, f"message {n}.{k}", {})
    state.data["n"] = n
    state.data.setdefault("deep", {})["k"] = n


async def running(stores: Stores, mode: Mode, state_id: str = "run", alone: int = 4) -> Any:
    """A store object and its State: created, a checkpoint, then ``alone`` saves committed
    alone (the test checks they were)."""
    io = stores.io(mode)
    state = State("a running task", id=state_id)
    await io.save(state)
    for n in range(1, alone + 2):
        step(state, n)
        await io.save(state)
    meta = snapshot_meta(stores, state_id)
    assert int(meta[ENTRIES_META]) < len(state.history) and meta.get(OPEN_META) == "1"
    assert alone_count(stores, state_id) >= alone
    return io, state


def snapshot_meta(stores: Stores, state_id: str, prefix: str = "runs") -> dict[str, str]:
    key = f"{prefix}/{state_id}/snapshot.json"
    meta: dict[str, str] = raw_client(stores.url).head_object(Bucket=stores.bucket, Key=key)[
        "Metadata"
    ]
    return meta


def raw_keys(stores: Stores, prefix: str) -> list[str]:
    client = raw_client(stores.url)
    listed = client.list_objects_v2(Bucket=stores.bucket, Prefix=prefix)
    return [item["Key"] for item in listed.get("Contents", ())]


def alone_count(stores: Stores, state_id: str, prefix: str = "runs") -> int:
    client = raw_client(stores.url)
    n = 0
    for key in raw_keys(stores, f"{prefix}/{state_id}/entries/"):
        n += ALONE_META in client.head_object(Bucket=stores.bucket, Key=key)["Metadata"]
    return n


async def same(store: S3Store, mode: Mode, state: State) -> None:
    """A load through ``store`` returns ``state``; its ``list()`` summarises that."""
    got = await load(store, mode, state.id)
    assert got.history == state.history
    assert got.data == state.data and got.updated_at == state.updated_at
    listed = await asyncio.to_thread(store.list) if mode == "sync" else await store.alist()
    (summary,) = [s for s in listed if s.id == state.id]
    assert summary == SavedState(state.id, got.task, got.updated_at, got.stopped_by)


# 1. Packing ----------------------------------------------------------------------------------


async def test_pack_remove_entries_during_a_run_then_a_checkpoint_then_pack_again(
    mode: Mode, stores: Stores
) -> None:
    io, state = await running(stores, mode)
    packed = await pack(stores.new(), mode, "run", remove_entries=True)
    assert packed.covered == int(snapshot_meta(stores, "run")[ENTRIES_META])
    await same(stores.new(), mode, state)
    step(state, 10)
    await io.save(state)  # still alone
    await same(stores.new(), mode, state)
    step(state, 11, count=2)
    await io.save(state)  # a checkpoint
    step(state, 12)
    await io.save(state)
    await pack(stores.new(), mode, "run", remove_entries=True)
    await same(stores.new(), mode, state)
    assert alone_count(stores, "run") >= 1  # the one after the checkpoint stays an object


async def test_auto_pack_loads_of_a_running_state_return_what_the_run_saved(
    mode: Mode, stores: Stores
) -> None:
    io, state = await running(stores, mode, alone=6)
    packer = stores.new(auto_pack=2)
    for n in range(20, 26):
        await same(packer, mode, state)
        step(state, n, count=1 + n % 2)  # alone, checkpoint, alone, ...
        await io.save(state)
    await same(stores.new(), mode, state)
    assert raw_keys(stores, "runs/run/packed/")


async def test_a_damaged_segment_and_entries_committed_alone_after_it(
    mode: Mode, stores: Stores
) -> None:
    io, state = await running(stores, mode)
    await pack(stores.new(), mode, "run")
    step(state, 30)
    await io.save(state)
    (key,) = raw_keys(stores, "runs/run/packed/")
    client = raw_client(stores.url)
    whole = client.get_object(Bucket=stores.bucket, Key=key)["Body"].read()
    client.put_object(Bucket=stores.bucket, Key=key, Body=whole[: len(whole) // 2])
    await same(stores.new(), mode, state)
    await pack(stores.new(), mode, "run")
    await same(stores.new(), mode, state)


# 2. delete, sweep, objects, transfer -----------------------------------------------------


async def test_a_delete_during_alone_commits_the_next_checkpoint_raises_and_leaves_nothing(
    mode: Mode, stores: Stores
) -> None:
    io, state = await running(stores, mode)
    await stores.io(mode).delete("run")
    step(state, 40)
    await io.save(state)  # committed alone, under a generation no snapshot names
    assert raw_keys(stores, "runs/run/")
    step(state, 41, count=2)
    with pytest.raises(StateNotFoundError):
        await io.save(state)  # a checkpoint: If-Match on a snapshot that is gone
    assert raw_keys(stores, "runs/run/") == []
    assert await objects(stores.io(mode), "run") == []


async def test_sweep_keeps_the_entries_committed_alone_of_a_live_state(
    mode: Mode, stores: Stores
) -> None:
    io, state = await running(stores, mode)
    store = stores.new()
    swept = store.sweep(0.0) if mode == "sync" else await store.asweep(0.0)
    assert swept == []
    step(state, 50)
    await io.save(state)
    await same(stores.new(), mode, state)


async def test_objects_lists_entries_committed_alone_as_entries(mode: Mode, stores: Stores) -> None:
    _, state = await running(stores, mode)
    kinds = [o.kind for o in await objects(stores.io(mode), "run")]
    assert kinds.count("entry") == len(state.history) and kinds.count("snapshot") == 1


def transfer_sync(name: str, src: S3Store, dst: S3Store) -> Any:
    return (copy_states if name == "copy" else move_states)(src, dst, ["run"])


@pytest.mark.parametrize("how", ["copy", "move"])
async def test_a_copy_or_move_of_a_running_state_carries_what_was_committed_alone(
    mode: Mode, stores: Stores, how: str
) -> None:
    io, state = await running(stores, mode)
    src = stores.new()
    dst = S3Store(stores.bucket, "archive", endpoint_url=stores.url, session=stores.session)
    stores.made.append(dst)
    await asyncio.to_thread(transfer_sync, how, src, dst)
    await same(dst, mode, state)
    if how == "copy":
        await same(stores.new(), mode, state)
        return
    assert raw_keys(stores, "runs/run/") == []
    step(state, 60)
    await io.save(state)  # committed alone: returns, and is no one's
    step(state, 61, count=2)
    with pytest.raises(StateNotFoundError):
        await io.save(state)
    assert raw_keys(stores, "runs/run/") == []


@pytest.mark.parametrize("command", ["cp", "mv"])
async def test_alpineagents_cp_and_mv_of_a_running_state(
    stores: Stores, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    _, state = await running(stores, "sync")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", stores.url)
    argv = [command, f"s3://{stores.bucket}/runs", f"s3://{stores.bucket}/copied", "-q"]
    assert await asyncio.to_thread(core_cli.main, argv) == 0
    copied = S3Store(stores.bucket, "copied", endpoint_url=stores.url, session=stores.session)
    stores.made.append(copied)
    await same(copied, "sync", state)
    assert (raw_keys(stores, "runs/run/") == []) == (command == "mv")


# 4. list() ---------------------------------------------------------------------------------


async def test_list_of_many_states_open_and_closed_is_what_loads_return(
    mode: Mode, stores: Stores
) -> None:
    states = []
    for k in range(5):
        io, state = await running(stores, mode, f"s{k}", alone=1 + k)
        if k % 2:
            state.data["stopped"] = True
            step(state, 70, count=2)  # a checkpoint
            await io.save(state)
        states.append(state)
    reader = stores.new()
    listed = {s.id: s for s in await asyncio.to_thread(reader.list)}
    for state in states:
        got = await load(stores.new(), mode, state.id)
        assert got.history == state.history and got.data == state.data
        assert listed[state.id] == SavedState(state.id, got.task, got.updated_at, got.stopped_by)


async def test_a_save_through_an_equal_store_object_then_the_runs_next_save(
    mode: Mode, stores: Stores
) -> None:
    """An equal store object (one per request, say) saves the running copy; the run's own
    store object is refused at its next save (equal stores share States, not versions), and
    loads read what the equal one saved, nothing of the refused save."""
    io, state = await running(stores, mode)
    step(state, 80)
    await save(stores.new(), mode, state)  # that store object's first save: a checkpoint
    history, data = list(state.history), dict(state.data, deep=dict(state.data["deep"]))
    step(state, 81)
    with pytest.raises(ConcurrentWriteError):
        await io.save(state)
    got = await load(stores.new(), mode, "run")
    assert got.history == history and got.data == data
