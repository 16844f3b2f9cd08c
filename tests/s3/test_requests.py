"""What S3Store writes and reads, request by request: the layout, the conditions, immutable
entries, bounded concurrency, leftovers of a dead create, and server-side encryption."""

from __future__ import annotations

import asyncio
import re
import uuid
from typing import TYPE_CHECKING, Any

import pytest

from alpineagents import Agent, State
from alpineagents.history import MODEL
from alpineagents.testing import TestModel
from alpineagents_s3 import S3Store
from alpineagents_s3.testing import RequestLog
from tests.helpers import Mode, entry_dicts, snapshot_dict, tool_turn
from tests.s3.helpers import InFlight, Refuse, Stores, objects

if TYPE_CHECKING:
    from types_boto3_s3 import S3Client

ENTRY_KEY = re.compile(r"runs/(?P<id>[\w-]+)/entries/(?P<gen>[0-9a-f]{16})/(?P<seq>\d{10})\.json")


def lookup(what: str) -> str:
    """Look something up."""
    return f"found {what}"


async def test_saves_write_immutable_entries_then_a_conditional_snapshot(
    mode: Mode, stores: Stores
) -> None:
    log = RequestLog()
    io = stores.io(mode, event_hooks=log.hooks)
    state = State("layout", id="layout")

    await io.save(state)  # create: entry 0, then the snapshot
    created = list(log.requests)
    assert [(r.kind, r.condition) for r in created] == [
        ("PUT", "If-None-Match: *"),
        ("PUT", "If-None-Match: *"),
    ]
    assert ENTRY_KEY.fullmatch(created[0].path.split("/", 2)[2])
    assert created[1].path.endswith("/runs/layout/snapshot.json")

    log.clear()
    tool_turn(state, 1)
    await io.save(state)  # two new entries in parallel, then the snapshot with If-Match
    kinds = [(r.kind, (r.condition or "").split(":")[0]) for r in log.requests]
    assert sorted(kinds[:2]) == [("PUT", "If-None-Match")] * 2
    assert kinds[2] == ("PUT", "If-Match")
    assert log.requests[2].path.endswith("/snapshot.json")

    # A tool result is saved alone, as the Agent does while other tools still run.
    call = {"type": "tool_call", "id": "c", "name": "lookup", "input": {"what": "it"}}
    state.append(MODEL, "", {"content": [call], "stop_reason": "tool_use"})
    await io.save(state)
    log.clear()
    agent = Agent(TestModel(), tools=[lookup], store=io.store)
    if mode == "async":
        await agent.ause_tools(state)
    else:
        await asyncio.to_thread(agent.use_tools, state)
    # The result's PUT commits it (layout 3): no check follows.
    assert [(r.kind, (r.condition or "").split(":")[0]) for r in log.requests] == [
        ("PUT", "If-None-Match"),
    ]

    log.clear()
    # The snapshot is not written again only to count the result: a load replays it.
    assert await io.save(state) is False
    assert log.counts() == {}

    found = await objects(io, "layout")
    assert [(o.kind, o.seq) for o in found] == [("entry", n) for n in range(5)] + [
        ("snapshot", None)
    ]
    assert all(o.size > 0 for o in found)


async def test_no_entry_object_ever_gets_a_second_version(
    mode: Mode, stores: Stores, moto: S3Client
) -> None:
    bucket = stores.make_bucket(versioned=True)
    # Every snapshot PUT with If-Match fails once, like a save that failed after retries.
    fail_snapshot = Refuse(
        503,
        "ServiceUnavailable",
        times=2,
        when=lambda url, headers: url.endswith("snapshot.json") and "If-Match" in headers,
    )
    io = stores.io(mode, bucket=bucket, event_hooks={"before-call.s3.PutObject": fail_snapshot})
    state = State("versions", id="versions")

    await io.save(state)
    for n in range(3):
        tool_turn(state, n)
        try:
            await io.save(state)
        except Exception:  # noqa: BLE001 - the next save sends the same entries again
            pass
    await io.save(state)
    # Resent by hand too: whole history, several times.
    record = await io.read("versions")
    assert record is not None
    for _ in range(2):
        await io.write("versions", list(record.entries), None)

    assert fail_snapshot.refused == 2
    versions = moto.list_object_versions(Bucket=bucket, Prefix="runs/versions/entries/")
    keys = [v["Key"] for v in versions.get("Versions", [])]
    assert len(keys) == 7 and len(set(keys)) == 7, keys
    assert not versions.get("DeleteMarkers")


async def test_leftovers_of_a_create_that_died_do_not_block_the_id(
    mode: Mode, stores: Stores, moto: S3Client
) -> None:
    io = stores.io(mode)
    dead = uuid.uuid4().hex[:16]
    for seq in range(3):  # what a process killed before its snapshot PUT leaves
        key = f"runs/reused/entries/{dead}/{seq:010d}.json"
        moto.put_object(Bucket=stores.bucket, Key=key, Body=b'{"v":1,"seq":%d}' % seq)

    assert await io.read("reused") is None
    assert await io.list() == []
    with pytest.raises(KeyError):
        await io.load("reused")
    state = State("reused id", id="reused")
    await io.save(state)
    assert (await io.load("reused")).history == state.history
    kinds = [o.kind for o in await objects(io, "reused")]
    assert sorted(kinds) == ["abandoned"] * 3 + ["entry", "snapshot"]
    await io.delete("reused")
    assert await objects(io, "reused") == []


async def test_load_fetches_concurrently_within_the_limit(mode: Mode, stores: Stores) -> None:
    await stores.io(mode).write("wide", entry_dicts(0, 40), snapshot_dict("wide", 40), create=True)
    log, flight = RequestLog(), InFlight()
    hooks = {f"{event}.GetObject": hook for event, hook in flight.hooks.items()}
    io = stores.io(mode, max_concurrency=4, event_hooks={**log.hooks, **hooks})

    loaded = await io.load("wide")
    assert len(loaded.history) == 40

    assert log.counts() == {"GET": 41, "LIST": 2}  # the segments, the entries
    first_two = sorted(r.operation for r in log.requests[:2])
    assert first_two == ["GetObject", "ListObjectsV2"]  # the snapshot and the listing at once
    assert 1 < flight.most <= 4


async def test_a_deleted_id_is_free_again_on_a_versioned_bucket(mode: Mode, stores: Stores) -> None:
    io = stores.io(mode, bucket=stores.make_bucket(versioned=True))
    await io.save(State("first life", id="again"))
    await io.delete("again")  # delete markers over every object
    assert await io.read("again") is None and await io.list() == []
    second = State("second life", id="again")
    await io.save(second)
    assert (await io.load("again")).history == second.history


# Server-side encryption -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"server_side_encryption": "AES256"}, ("AES256", None)),
        (
            {"sse_kms_key_id": "arn:aws:kms:us-east-1:123456789012:key/demo"},
            ("aws:kms", "arn:aws:kms:us-east-1:123456789012:key/demo"),
        ),
    ],
)
async def test_server_side_encryption_reaches_every_put(
    mode: Mode,
    options: dict[str, Any],
    expected: tuple[str, str | None],
    stores: Stores,
    moto: S3Client,
) -> None:
    io = stores.io(mode, **options)
    state = State("secret", id="s")
    await io.save(state)
    state.add_user_message("more")
    await io.save(state)  # an update: entry PUT and If-Match snapshot PUT

    keys = [o["Key"] for o in moto.list_objects_v2(Bucket=stores.bucket)["Contents"]]
    assert len(keys) == 3
    for key in keys:
        head = moto.head_object(Bucket=stores.bucket, Key=key)
        assert (head.get("ServerSideEncryption"), head.get("SSEKMSKeyId")) == expected, key


def test_encryption_options_are_checked() -> None:
    with pytest.raises(ValueError, match="server_side_encryption"):
        S3Store("bucket", server_side_encryption="rot13")
    with pytest.raises(ValueError, match="aws:kms"):
        S3Store("bucket", server_side_encryption="AES256", sse_kms_key_id="k")
