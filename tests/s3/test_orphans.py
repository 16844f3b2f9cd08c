"""Orphans: entry objects beyond a gap, left by a save killed during its parallel entry PUTs.

The kill is simulated by PUTting, behind the store's back, only later entry objects of a save
(seq 3 stored, seqs 1-2 not). A load leaves them out; the next save replaces each one it has
an entry for (If-Match on the orphan's ETag) and deletes the others before it fills the gap, so
that nothing of the killed save ever joins the history, and nothing is refused.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

from alpineagents import State
from alpineagents.errors import ConcurrentWriteError
from alpineagents_s3.testing import RequestLog
from tests.helpers import Mode, entry_dicts, snapshot_dict, tool_turn
from tests.s3.helpers import Stores, body, entry_key, killed_save, raw_client

if TYPE_CHECKING:
    from types_boto3_s3 import S3Client


@dataclass
class Server:
    stores: Stores
    client: S3Client


@pytest.fixture(params=["moto", pytest.param("localstack", marks=pytest.mark.integration)])
async def server(request: pytest.FixtureRequest) -> AsyncIterator[Server]:
    """Store objects on moto's server, and on LocalStack when it runs."""
    url = request.getfixturevalue(f"{request.param}_url")
    stores = Stores(
        url,
        request.getfixturevalue(f"{request.param}_bucket"),
        request.getfixturevalue("boto_session"),
        request.getfixturevalue("aio_session"),
    )
    client = raw_client(url)
    try:
        yield Server(stores, client)
    finally:
        client.close()
        await stores.close()


def texts(state: State) -> list[str]:
    return [entry.text for entry in state.history]


async def test_a_save_killed_halfway_leaves_orphans_the_next_save_replaces(
    mode: Mode, server: Server
) -> None:
    moto = server.client
    bucket = server.stores.make_bucket(versioned=True)
    await server.stores.io(mode, bucket=bucket).save(State("killed halfway", id="gap"))
    # The next save of seqs 1-5 was killed: only 3 and 5 were stored.
    etags = killed_save(moto, bucket, "gap", 3, 5)
    log = RequestLog()
    io = server.stores.io(mode, bucket=bucket, event_hooks=log.hooks)

    state = await io.load("gap")
    assert texts(state) == ["killed halfway"]  # nothing of the killed save
    tool_turn(state, 1)  # seqs 1, 2
    state.add_user_message("three")  # seq 3: the orphan's seq
    state.add_user_message("four")  # seq 4; the orphan at 5 is beyond this save
    log.clear()
    assert await io.save(state) is True  # no ConcurrentWriteError

    puts = {r.path.rsplit("/", 1)[-1]: r.condition for r in log.requests if r.kind == "PUT"}
    assert puts["0000000003.json"] == f"If-Match: {etags[3]}"
    assert [puts[f"{seq:010d}.json"] for seq in (1, 2, 4)] == ["If-None-Match: *"] * 3
    assert [r.operation for r in log.requests if r.kind == "DELETE"] == ["DeleteObjects"]
    # The claim (the snapshot PUT again), the replacement and the delete come first, then
    # the entries filling the gap.
    order = [r.path.rsplit("/", 1)[-1] for r in log.requests if r.kind in ("PUT", "DELETE")]
    assert order[0] == "snapshot.json"
    assert order.index("0000000001.json") > order.index("0000000003.json")

    # Another process loads it: all of it, and only it.
    other = server.stores.io(mode, bucket=bucket)
    again = await other.load("gap")
    assert texts(again) == texts(state)
    again.add_user_message("five")  # seq 5, where the deleted orphan was
    assert await other.save(again) is True
    assert texts(await other.load("gap")) == [*texts(state), "five"]

    versions = moto.list_object_versions(Bucket=bucket, Prefix="runs/gap/entries/")
    counts = Counter(int(v["Key"][-15:-5]) for v in versions["Versions"])
    markers = [int(m["Key"][-15:-5]) for m in versions.get("DeleteMarkers", [])]
    # Entries of the unbroken run got one version each; the orphans' keys, a second one.
    assert counts == {0: 1, 1: 1, 2: 1, 3: 2, 4: 1, 5: 2}
    assert markers == [5]


async def test_a_store_object_that_did_not_read_the_state_meets_the_orphans_too(
    mode: Mode, stores: Stores, moto: S3Client
) -> None:
    """Loaded through one store object, saved through an equal one (an Agent's own store)."""
    await stores.io(mode).save(State("killed halfway", id="gap"))
    etags = killed_save(moto, stores.bucket, "gap", 2, 3)
    log = RequestLog()
    loader, writer = stores.io(mode), stores.io(mode, event_hooks=log.hooks)

    state = await loader.load("gap")
    tool_turn(state, 1)  # seqs 1, 2: the orphan at 2 is replaced, the one at 3 deleted
    assert await writer.save(state) is True
    # The snapshot and the listing; a claim (GET of the snapshot, HEAD of seq 1, PUT); a HEAD
    # of the orphan at 3 (still the one listed) before it is deleted; the orphan at 2
    # replaced, then seq 1.
    assert log.counts() == {"GET": 2, "LIST": 1, "HEAD": 2, "PUT": 4, "DELETE": 1}
    assert f"If-Match: {etags[2]}" in {r.condition for r in log.requests}

    # Without the delete, the stale seq 3 would now follow seq 2 and join the history.
    reader = stores.io(mode)
    assert texts(await reader.load("gap")) == ["killed halfway", "", "result 1"]


async def test_concurrent_writes_of_one_store_object_clear_orphans_one_at_a_time(
    server: Server,
) -> None:
    """Two tool results saved alone at once, right after a load that found orphans: one write
    replaces the orphan at 2 while the other would delete it (not in its range). The slow
    delete must not remove the replacement."""
    moto, bucket = server.client, server.stores.bucket
    ours = entry_dicts(0, 3, "ours")

    def slow_delete(**kwargs: Any) -> None:
        time.sleep(0.3)

    store = server.stores.new(event_hooks={"before-send.s3.DeleteObjects": slow_delete})
    store.write("c", ours[:1], snapshot_dict("c", 1), create=True)
    killed_save(moto, bucket, "c", 2, 4)
    record = store.read("c")
    assert record is not None and [e["seq"] for e in record.entries] == [0]

    failures: list[BaseException] = []

    def write(entries: list[dict[str, Any]]) -> None:
        try:
            store.write("c", entries, None)
        except BaseException as e:  # noqa: BLE001 - reported below
            failures.append(e)

    threads = [
        threading.Thread(target=write, args=(ours[1:2],)),
        threading.Thread(target=write, args=(ours[1:3],)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert not failures
    record = server.stores.new().read("c")
    assert record is not None and list(record.entries) == ours
    keys = [o["Key"] for o in moto.list_objects_v2(Bucket=bucket)["Contents"]]
    assert [int(k[-15:-5]) for k in keys if "/entries/" in k] == [0, 1, 2]  # 4 is deleted


async def test_an_orphan_replaced_by_someone_else_is_a_second_writer(
    mode: Mode, stores: Stores, moto: S3Client
) -> None:
    io = stores.io(mode)
    ours = entry_dicts(0, 3, "ours")
    await io.write("w", ours[:1], snapshot_dict("w", 1), create=True)
    killed_save(moto, stores.bucket, "w", 2)

    await io.read("w")
    # Another process, resumed from the same save, replaced the orphan with its own entry.
    theirs = entry_dicts(0, 3, "theirs")[2]
    key = entry_key(moto, stores.bucket, "w", 2)
    moto.put_object(Bucket=stores.bucket, Key=key, Body=body(theirs))
    with pytest.raises(ConcurrentWriteError, match=r"0000000002\.json.*different.*'w'"):
        await io.write("w", ours[1:3], snapshot_dict("w", 3))

    # Nothing of the unbroken run was touched, and no gap was filled.
    record = await stores.io(mode).read("w")
    assert record is not None and list(record.entries) == ours[:1]
