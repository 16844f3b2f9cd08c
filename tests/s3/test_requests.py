"""What S3Store writes and reads, request by request: the layout, the conditions, immutable
entries, bounded concurrency, leftovers of a dead create, and server-side encryption."""

from __future__ import annotations

import asyncio
import re
import uuid
from typing import TYPE_CHECKING, Any

import boto3
import pytest
from botocore.config import Config

from alpineagents import Agent, State
from alpineagents.history import MODEL
from alpineagents.testing import TestModel
from alpineagents_s3 import S3Store
from alpineagents_s3.testing import RequestLog
from tests.helpers import Mode, entry_dicts, snapshot_dict, tool_turn
from tests.s3.helpers import InFlight, Refuse, Stores, objects

if TYPE_CHECKING:
    from types_boto3_s3 import S3Client

ENTRY_KEY = re.compile(
    r"runs/states/(?P<id>[\w-]+)/(?P<inc>[0-9a-f]{16})/e(?P<seq>\d{10})\.[0-9a-f]{16}\.json"
)
# No engine check: its requests are left out below.
TRUST: dict[str, Any] = {"trust_conditional_writes": True}


def lookup(what: str) -> str:
    """Look something up."""
    return f"found {what}"


def shape(log: RequestLog) -> list[tuple[str, str]]:
    """Each request's kind and condition header (``If-Match``, ``If-None-Match`` or ``-``)."""
    return [(r.kind, (r.condition or "-").split(":")[0]) for r in log.requests]


async def test_a_save_puts_its_entries_then_the_head_conditionally(
    mode: Mode, stores: Stores
) -> None:
    log = RequestLog()
    io = stores.io(mode, event_hooks=log.hooks, **TRUST)
    state = State("layout", id="layout")

    await io.save(state)  # create: entry 0, then the head
    assert shape(log) == [("PUT", "If-None-Match"), ("PUT", "If-None-Match")]
    assert ENTRY_KEY.fullmatch(log.requests[0].path.split("/", 2)[2])
    assert log.requests[1].path.endswith("/runs/heads/layout.json")

    log.clear()
    tool_turn(state, 1)
    await io.save(state)  # two new entries at once, then the head with If-Match
    assert sorted(shape(log)[:2]) == [("PUT", "If-None-Match")] * 2
    assert shape(log)[2] == ("PUT", "If-Match")
    assert log.requests[2].path.endswith("/runs/heads/layout.json")

    # A tool result is saved alone, as the Agent does while other tools still run: its entry,
    # then the head, which commits it. No GET, HEAD or LIST on the way.
    call = {"type": "tool_call", "id": "c", "name": "lookup", "input": {"what": "it"}}
    state.append(MODEL, "", {"content": [call], "stop_reason": "tool_use"})
    await io.save(state)
    log.clear()
    agent = Agent(TestModel(), tools=[lookup], store=io.store)
    if mode == "async":
        await agent.ause_tools(state)
    else:
        await asyncio.to_thread(agent.use_tools, state)
    assert shape(log) == [("PUT", "If-None-Match"), ("PUT", "If-Match")]

    log.clear()
    assert await io.save(state) is False  # nothing new: nothing sent
    assert log.counts() == {}

    found = await objects(io, "layout")
    assert [o.role for o in found] == ["head"] + ["entry"] * 5
    assert all(o.size > 0 for o in found)


async def test_the_first_save_of_a_process_checks_the_engine_once(
    mode: Mode, stores: Stores
) -> None:
    log = RequestLog()
    io = stores.io(mode, event_hooks=log.hooks)
    state = State("checked", id="checked")
    await io.save(state)
    probe = [
        (r.kind, (r.condition or "-").split(":")[0])
        for r in log.requests
        if "/runs/probes/" in r.path
    ]
    assert len(probe) == 4 and probe[0] == ("PUT", "If-None-Match")  # the probe, created
    assert sorted(probe[1:3]) == [  # sent at once: in either order
        ("PUT", "If-Match"),  # a stale If-Match: 412
        ("PUT", "If-None-Match"),  # a second create: 412
    ]
    assert probe[3] == ("DELETE", "-")  # sent with the head PUT
    assert log.counts() == {"PUT": 5, "DELETE": 1}
    log.clear()
    state.add_user_message("more")
    await io.save(state)  # checked already: the save's own requests only
    assert log.counts() == {"PUT": 2}
    assert [k for k in await stores.keys() if "/probes/" in k] == []


async def test_no_object_is_ever_written_twice(mode: Mode, stores: Stores, moto: S3Client) -> None:
    """Head PUTs that fail (503 after botocore's retries) and saves sent again: every entry
    object's key holds one version, whatever was sent again."""
    bucket = stores.make_bucket(versioned=True)
    fail_head = Refuse(
        503,
        "ServiceUnavailable",
        times=2,
        when=lambda url, headers: "/heads/" in url and "If-Match" in headers,
    )
    io = stores.io(mode, bucket=bucket, event_hooks={"before-call.s3.PutObject": fail_head})
    state = State("versions", id="versions")

    await io.save(state)
    for n in range(3):
        tool_turn(state, n)
        try:
            await io.save(state)
        except Exception:  # noqa: BLE001 - the next save sends the same entries again
            pass
    await io.save(state)
    record = await io.read("versions")
    assert record is not None
    for _ in range(2):  # the whole history sent again by hand: nothing is written
        await io.write("versions", list(record.entries), None)

    assert fail_head.refused == 2
    versions = moto.list_object_versions(Bucket=bucket, Prefix="runs/states/versions/")
    keys = [v["Key"] for v in versions.get("Versions", [])]
    assert len(keys) == len(set(keys)) >= 7, keys
    assert (await io.load("versions")).history == state.history


async def test_leftovers_of_a_create_that_died_do_not_block_the_id(
    mode: Mode, stores: Stores, moto: S3Client
) -> None:
    io = stores.io(mode)
    dead = uuid.uuid4().hex[:16]
    for seq in range(3):  # what a process killed before its head PUT leaves
        key = f"runs/states/reused/{dead}/e{seq:010d}.{dead}.json"
        moto.put_object(
            Bucket=stores.bucket,
            Key=key,
            Body=b'{"v":1,"seq":%d}' % seq,
            Metadata={"alpineagents-s3": "entry"},
        )

    assert await io.read("reused") is None
    assert await io.list() == []
    with pytest.raises(KeyError):
        await io.load("reused")
    state = State("reused id", id="reused")
    await io.save(state)
    assert (await io.load("reused")).history == state.history
    roles = [o.role for o in await objects(io, "reused")]
    assert sorted(roles) == ["entry", "head"] + ["unnamed"] * 3
    await io.delete("reused")
    # The leftovers are of no incarnation a delete killed: a create may still be writing
    # them, as far as the store can tell. sweep removes them once old.
    assert [o.role for o in await objects(io, "reused")] == ["tombstone"] + ["unnamed"] * 3
    store = io.store
    assert isinstance(store, S3Store)
    removed = await asyncio.to_thread(store.sweep, 0)
    assert len(removed) == 3 and [o.role for o in await objects(io, "reused")] == ["tombstone"]


async def test_a_load_fetches_the_parts_at_once_within_the_limit(
    mode: Mode, stores: Stores
) -> None:
    await stores.io(mode).write("wide", entry_dicts(0, 40), snapshot_dict("wide", 40), create=True)
    log, flight = RequestLog(), InFlight()
    hooks = {f"{event}.GetObject": hook for event, hook in flight.hooks.items()}
    io = stores.io(mode, max_concurrency=4, event_hooks={**log.hooks, **hooks})

    loaded = await io.load("wide")
    assert len(loaded.history) == 40
    # The head, then its parts: two segments of 16 and 8 entry objects; no LIST.
    assert log.counts() == {"GET": 1 + 2 + 8}
    assert log.requests[0].path.endswith("/runs/heads/wide.json")
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
    await io.save(state)  # an update: entry PUT and If-Match head PUT

    keys = [o["Key"] for o in moto.list_objects_v2(Bucket=stores.bucket)["Contents"]]
    assert len(keys) == 3  # the head and two entries (the probe was deleted)
    for key in keys:
        head = moto.head_object(Bucket=stores.bucket, Key=key)
        assert (head.get("ServerSideEncryption"), head.get("SSEKMSKeyId")) == expected, key


def test_encryption_options_are_checked() -> None:
    with pytest.raises(ValueError, match="server_side_encryption"):
        S3Store("bucket", server_side_encryption="rot13")
    with pytest.raises(ValueError, match="aws:kms"):
        S3Store("bucket", server_side_encryption="AES256", sse_kms_key_id="k")


class PutHeaders:
    """A ``before-call`` hook on PutObject: each PUT's key and encryption headers."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str | None, str | None]] = []

    def __call__(self, params: dict[str, Any], **kwargs: Any) -> None:
        headers = params["headers"]
        key = params["url"].split("?")[0].split("/runs/", 1)[-1]
        self.seen.append(
            (
                key,
                headers.get("x-amz-server-side-encryption"),
                headers.get("x-amz-server-side-encryption-aws-kms-key-id"),
            )
        )


async def test_encryption_reaches_segments_tombstones_and_the_engine_check(
    mode: Mode, stores: Stores, moto: S3Client
) -> None:
    """Every PUT: the probes, the entries, a segment a save packs, the heads, a tombstone."""
    key_id = "arn:aws:kms:us-east-1:123456789012:key/demo"
    puts = PutHeaders()
    io = stores.io(mode, sse_kms_key_id=key_id, event_hooks={"before-call.s3.PutObject": puts})
    await io.write("packed", entry_dicts(0, 20), snapshot_dict("packed", 20), create=True)
    segments = [o.key for o in await objects(io, "packed") if o.role == "segment"]
    assert len(segments) == 1
    head = moto.head_object(Bucket=stores.bucket, Key=segments[0])
    assert (head["ServerSideEncryption"], head["SSEKMSKeyId"]) == ("aws:kms", key_id)
    await io.delete("packed")
    kinds = {key.split("/")[0] for key, _, _ in puts.seen}
    assert kinds == {"probes", "states", "heads"}
    assert segments[0].removeprefix("runs/") in [key for key, _, _ in puts.seen]
    assert len([k for k, _, _ in puts.seen if k.startswith("heads/")]) == 2  # create, tombstone
    assert all((sse, kms) == ("aws:kms", key_id) for _, sse, kms in puts.seen), puts.seen


async def test_a_save_and_a_list_send_at_once_within_the_limit(mode: Mode, stores: Stores) -> None:
    puts, gets = InFlight(), InFlight()
    hooks = {f"{event}.PutObject": hook for event, hook in puts.hooks.items()}
    hooks |= {f"{event}.GetObject": hook for event, hook in gets.hooks.items()}
    io = stores.io(mode, max_concurrency=3, trust_conditional_writes=True, event_hooks=hooks)
    await io.write("wide", entry_dicts(0, 40), snapshot_dict("wide", 40), create=True)
    assert 1 < puts.most <= 3
    for n in range(12):
        await stores.io(mode).write(
            f"s{n}", entry_dicts(0, 1), snapshot_dict(f"s{n}", 1), create=True
        )
    assert len(await stores.io(mode, max_concurrency=3, event_hooks=hooks).list()) == 13
    assert 1 < gets.most <= 3


def test_a_given_clients_pool_bounds_the_requests_at_once(stores: Stores, moto_url: str) -> None:
    """No more requests at once than the client given has connections (urllib3 would open
    and drop more, warning that its pool is full)."""
    stores.new().write("wide", entry_dicts(0, 40), snapshot_dict("wide", 40), create=True)
    client = boto3.client(
        "s3",
        endpoint_url=moto_url,
        region_name="us-east-1",
        config=Config(max_pool_connections=2),
    )
    flight = InFlight()
    for event, hook in flight.hooks.items():
        client.meta.events.register(f"{event}.GetObject", hook)
    try:
        store = stores.new(client=client, max_concurrency=32)
        assert len(store.load("wide").history) == 40
        assert flight.most == 2
    finally:
        client.close()
