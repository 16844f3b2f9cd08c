"""The S3Store object: opening by URL, identity, boto configuration, event loops, clients,
large listings and deletes, the demo helpers, and the install hint."""

from __future__ import annotations

import asyncio
import gc
import os
import warnings
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import boto3
import pytest
from moto.core.models import DEFAULT_ACCOUNT_ID
from moto.s3.models import s3_backends

from alpineagents import State, open_store
from alpineagents_s3 import S3Store, StoreClosedError
from alpineagents_s3._keys import Layout
from alpineagents_s3.testing import RequestLog, embedded_moto
from tests.helpers import MakeBucket, Mode, entry_dicts, snapshot_dict
from tests.s3.helpers import ClientsSeen, Stores, body

if TYPE_CHECKING:
    from types_boto3_s3 import S3Client

# Opening and identity -----------------------------------------------------------------------


def test_open_store_finds_s3store_by_scheme(moto_url: str, moto_bucket: MakeBucket) -> None:
    bucket = moto_bucket()
    store = open_store(f"s3://{bucket}/team/runs", endpoint_url=moto_url, max_concurrency=4)
    assert isinstance(store, S3Store)
    assert (store.bucket, store.prefix, store.max_concurrency) == (bucket, "team/runs/", 4)
    assert store == S3Store(bucket, "/team/runs/", endpoint_url=moto_url)
    store.save(State("via url", id="u"))
    assert S3Store(bucket, "team/runs", endpoint_url=moto_url).load("u").task == "via url"
    store.close()
    bare = S3Store.from_url(f"s3://{bucket}")
    assert bare.prefix == "" and bare.bucket == bucket


@pytest.mark.parametrize(
    "url", ["s3://", "s3:///prefix", "file:///tmp/x", "s3://bucket/p?endpoint_url=x"]
)
def test_from_url_refuses_what_is_not_an_s3_url(url: str) -> None:
    with pytest.raises(ValueError, match="s3://bucket/prefix"):
        S3Store.from_url(url)


def test_same_endpoint_bucket_and_prefix_is_the_same_store(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    local = "http://127.0.0.1:9000"
    a = S3Store("bucket", "runs", endpoint_url=local)
    assert a == S3Store("bucket", "runs/", endpoint_url=local + "/")
    assert hash(a) == hash(S3Store("bucket", "/runs", endpoint_url=local))
    assert a != S3Store("bucket", "other", endpoint_url=local)
    assert a != S3Store("bucket2", "runs", endpoint_url=local)
    assert a != S3Store("bucket", "runs", endpoint_url="http://127.0.0.1:9001")
    assert a != S3Store("bucket", "runs")  # AWS
    # AWS endpoints are one S3: bucket names are global.
    assert S3Store("bucket") == S3Store("bucket", endpoint_url="https://s3.eu-west-1.amazonaws.com")
    # The endpoint from the standard configuration counts as given.
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", local)
    assert S3Store("bucket", "runs") == a
    assert "127.0.0.1:9000" in repr(S3Store("bucket", "runs"))
    assert repr(S3Store("bucket", "runs", endpoint_url="https://s3.amazonaws.com")) == (
        "S3Store('s3://bucket/runs/')"
    )


def test_invalid_names_are_refused() -> None:
    with pytest.raises(ValueError, match="bucket"):
        S3Store("")
    with pytest.raises(ValueError, match="bucket"):
        S3Store("a/b")
    with pytest.raises(ValueError, match="prefix"):
        S3Store("bucket", "a//b")
    with pytest.raises(ValueError, match="max_concurrency"):
        S3Store("bucket", max_concurrency=0)
    with pytest.raises(ValueError, match="invalid State id"):
        S3Store("bucket").write("../x", [], None)


def test_standard_boto_configuration_works_unchanged(
    moto_url: str, moto_bucket: MakeBucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = moto_bucket()
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_url)
    with S3Store(bucket, "runs") as store:  # no endpoint_url: the environment's
        store.save(State("configured", id="c"))
        assert store.client.meta.endpoint_url == moto_url
        assert [s.id for s in store.list()] == ["c"]


def test_a_state_saved_through_one_store_object_continues_through_an_equal_one(
    moto_url: str, moto_bucket: MakeBucket
) -> None:
    bucket = moto_bucket()
    state = State("moves between store objects", id="m")
    with S3Store(bucket, endpoint_url=moto_url) as first:
        first.save(state)
    state.add_user_message("later")
    with S3Store(bucket, endpoint_url=moto_url) as second:
        assert second.save(state) is True
        assert len(second.load("m").history) == 2


def test_a_given_client_is_used_and_not_closed(moto_url: str, moto_bucket: MakeBucket) -> None:
    bucket = moto_bucket()
    client = boto3.client("s3", endpoint_url=moto_url)
    try:
        store = S3Store(bucket, client=client)
        assert store.client is client
        assert store == S3Store(bucket, endpoint_url=moto_url)
        store.save(State("given client", id="g"))
        store.close()
        assert client.head_object(Bucket=bucket, Key="heads/g.json")["ContentLength"] > 0
    finally:
        client.close()


# Event loops ---------------------------------------------------------------------------------


def test_one_store_serves_one_event_loop_after_another(
    moto_url: str, moto_bucket: MakeBucket
) -> None:
    """A serverless handler calls asyncio.run per event: one module-level store serves them."""
    seen = ClientsSeen()
    bucket = moto_bucket()
    store = S3Store(bucket, "runs", endpoint_url=moto_url, event_hooks={"before-call.s3": seen})

    async def handle(event: int) -> None:
        if event == 0:
            await store.asave(State("per event", id="e"))
        state = await store.aload("e")
        state.add_user_message(f"event {event}")
        await store.asave(state)

    for event in range(4):
        asyncio.run(handle(event))
    assert seen.clients == 4  # a client per loop, each closed with its loop
    assert [e.text for e in store.load("e").history][-4:] == [f"event {n}" for n in range(4)]
    store.close()
    gc.collect()  # an unclosed aiohttp session would warn here, and warnings are errors

    async def with_a_store_per_event(event: int) -> None:
        async with S3Store(bucket, "runs", endpoint_url=moto_url) as own:
            state = await own.aload("e")
            state.add_user_message(f"closed event {event}")
            await own.asave(state)

    for event in range(2):
        asyncio.run(with_a_store_per_event(event))
    texts = [e.text for e in S3Store(bucket, "runs", endpoint_url=moto_url).load("e").history]
    assert texts[-2:] == ["closed event 0", "closed event 1"]
    gc.collect()


async def test_async_with_closes_the_client_and_the_store(
    moto_url: str, moto_bucket: MakeBucket
) -> None:
    """Leaving ``async with`` closes the client at once, not when the loop ends, and the store
    refuses any later use; nothing is left unclosed."""
    seen = ClientsSeen()
    store = S3Store(moto_bucket(), endpoint_url=moto_url, event_hooks={"before-call.s3": seen})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        async with store:
            await store.awrite("w", entry_dicts(0, 1), snapshot_dict("w", 1), create=True)
            assert await store.aread("w") is not None
        assert seen.clients == 1 and store.closed
        with pytest.raises(StoreClosedError, match=r"S3Store\('s3://.*'.* is closed"):
            await store.aread("w")
        with pytest.raises(StoreClosedError):
            async with store:
                pass
        assert seen.clients == 1
        gc.collect()
    assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []


def test_a_closed_store_refuses_use(moto_url: str, moto_bucket: MakeBucket) -> None:
    store = S3Store(moto_bucket(), "runs", endpoint_url=moto_url)
    store.write("c", entry_dicts(0, 1), snapshot_dict("c", 1), create=True)
    store.close()
    store.close()  # closing again is harmless
    assert store.closed
    calls: list[Callable[[], object]] = [
        lambda: store.read("c"),
        lambda: store.load("c"),
        store.list,
        lambda: store.delete("c"),
        lambda: store.objects("c"),
        lambda: store.write("c", [], snapshot_dict("c", 1)),
        lambda: store.client,
        store.__enter__,
    ]
    for call in calls:
        with pytest.raises(StoreClosedError, match=r"S3Store\('s3://.*/runs/'.* is closed"):
            call()
    assert issubclass(StoreClosedError, RuntimeError)
    # Another store object of the same bucket and prefix is not affected.
    assert S3Store(store.bucket, "runs", endpoint_url=moto_url).read("c") is not None


async def test_a_closed_store_refuses_its_async_methods_too(
    moto_url: str, moto_bucket: MakeBucket
) -> None:
    store = S3Store(moto_bucket(), "runs", endpoint_url=moto_url)
    await store.awrite("c", entry_dicts(0, 1), snapshot_dict("c", 1), create=True)
    await store.aclose()
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: store.aread("c"),
        lambda: store.aload("c"),
        store.alist,
        lambda: store.adelete("c"),
        lambda: store.aobjects("c"),
        lambda: store.awrite("c", [], snapshot_dict("c", 1)),
        lambda: store.asweep(0),
        store.adoctor,
        store.__aenter__,
    ]
    for call in calls:
        with pytest.raises(StoreClosedError, match=r"S3Store\('s3://.*/runs/'.* is closed"):
            await call()
    for sync_call in (lambda: store.sweep(0), store.doctor):
        with pytest.raises(StoreClosedError):
            sync_call()
    async with S3Store(store.bucket, "runs", endpoint_url=moto_url) as other:
        assert await other.aread("c") is not None


# Large listings and deletes --------------------------------------------------------------------


def _seed(bucket: str, objects: dict[str, tuple[bytes, dict[str, str]]]) -> None:
    """Put objects straight into moto's backend (this process runs the server): fast set-up
    for tests about a thousand objects and more. The store reads them over HTTP."""
    backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
    for key, (data, metadata) in objects.items():
        stored = backend.put_object(bucket, key, data)
        if metadata:
            stored.set_metadata(metadata)


def test_list_pages_past_a_thousand_states(moto_url: str, moto_bucket: MakeBucket) -> None:
    bucket = moto_bucket()
    start = datetime(2026, 1, 1, tzinfo=UTC)
    objects: dict[str, tuple[bytes, dict[str, str]]] = {}
    for n in range(1005):
        snapshot = snapshot_dict(
            f"s{n:04d}", 1, updated_at=(start + timedelta(minutes=n)).isoformat()
        )
        head = {
            "alpineagents-s3": 1,
            "id": f"s{n:04d}",
            "inc": f"{n:016x}",
            "write": f"{n:016x}",
            "after": None,
            "rev": 0,
            "count": 0,
            "parts": [],
            "snapshot": snapshot,
        }
        objects[f"runs/heads/s{n:04d}.json"] = (body(head).ljust(512), {"alpineagents-s3": "head"})
    _seed(bucket, objects)
    log = RequestLog()
    with S3Store(bucket, "runs", endpoint_url=moto_url, event_hooks=log.hooks) as store:
        listed = store.list()
    assert len(listed) == 1005
    assert [s.id for s in listed[:2]] == ["s1004", "s1003"] and listed[-1].id == "s0000"
    assert log.counts() == {"LIST": 2, "GET": 1005}


def test_delete_removes_every_object(
    moto_url: str, moto_bucket: MakeBucket, moto: S3Client
) -> None:
    bucket = moto_bucket()
    with S3Store(bucket, "runs", endpoint_url=moto_url) as store:
        store.write("big", entry_dicts(0, 300), snapshot_dict("big", 300), create=True)
    log = RequestLog()
    with S3Store(bucket, "runs", endpoint_url=moto_url, event_hooks=log.hooks) as store:
        found = store.objects("big")
        assert len(found) == 1 + 3 + 12  # the head; 256 + 2 x 16 entries in segments; 12 more
        log.clear()
        deleted = store.delete("big")
        assert deleted is not None and deleted.objects == 16 and not deleted.kept
        with pytest.raises(KeyError, match="big"):
            store.delete("big")
    kinds = [(r.operation, r.kind) for r in log.requests]
    # The head read, the tombstone head put over it (the commit), the dead incarnation's
    # folder listed, its objects deleted (1,000 a request); the second delete finds the
    # tombstone and an empty folder.
    assert [op for op, _ in kinds] == [
        "GetObject",
        "PutObject",
        "ListObjectsV2",
        "DeleteObjects",
        "GetObject",
        "ListObjectsV2",
    ]
    listed = moto.list_objects_v2(Bucket=bucket).get("Contents", [])
    assert [o["Key"] for o in listed] == ["runs/heads/big.json"]


def test_deletes_go_1000_keys_a_request() -> None:
    layout = Layout("b", "runs/", "http://x", {})
    calls = layout.delete_many([(f"k{n}", None) for n in range(2500)])
    assert [len(c.params["Delete"]["Objects"]) for c in calls] == [1000, 1000, 500]


# Helpers for demos ----------------------------------------------------------------------------


def test_embedded_moto_serves_a_demo_and_cleans_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    with embedded_moto("demo-bucket", versioned=True) as url:
        assert url.startswith("http://127.0.0.1:")
        assert os.environ["AWS_ACCESS_KEY_ID"] == "testing"
        with S3Store("demo-bucket", "runs", endpoint_url=url) as store:
            state = State("demo", id="demo")
            store.save(state)
            layout = [(o.key, o.role) for o in store.objects("demo")]
        assert layout[0] == ("runs/heads/demo.json", "head")
        assert layout[1][1] == "entry" and "/e0000000000." in layout[1][0]
    assert "AWS_ACCESS_KEY_ID" not in os.environ


def test_the_async_side_follows_the_sync_sessions_profile(
    moto_url: str, moto_bucket: MakeBucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = moto_bucket()
    config = tmp_path / "config"
    config.write_text(
        "[profile elsewhere]\nregion = eu-west-3\n"
        "aws_access_key_id = testing\naws_secret_access_key = testing\n"
    )
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.delenv("AWS_DEFAULT_REGION")  # it would win over the profile's region
    session = boto3.Session(profile_name="elsewhere")
    seen = ClientsSeen()
    store = S3Store(
        bucket, endpoint_url=moto_url, session=session, event_hooks={"before-call.s3": seen}
    )
    store.list()
    assert seen.regions == ["eu-west-3"]  # the sync client's

    async def alist() -> None:
        async with store:
            await store.alist()

    asyncio.run(alist())
    assert seen.clients == 2 and seen.regions == ["eu-west-3", "eu-west-3"]


# What list() costs ---------------------------------------------------------------------------


async def _list_costs(stores: Stores, mode: Mode) -> None:
    """40 States made in a burst, 10 more deleted, then 3 a second apart: list() is a LIST and
    a GET a State, none for a deleted one (its tombstone head is smaller than any head of a
    State); list(limit=2) a LIST and 2 GETs, since S3's dates tell the newest apart (issue 37)."""
    maker = stores.io(mode)
    for n in range(40):
        stamp = datetime.now(UTC).isoformat()
        await maker.write(
            f"burst-{n}", [], snapshot_dict(f"burst-{n}", 0, updated_at=stamp), create=True
        )
    for n in range(10):
        gone = f"gone-{n}"
        await maker.write(gone, entry_dicts(0, 2), snapshot_dict(gone, 2), create=True)
        await maker.delete(gone)
    for n in range(3):
        await asyncio.sleep(1.05)
        stamp = datetime.now(UTC).isoformat()
        await maker.write(
            f"late-{n}", [], snapshot_dict(f"late-{n}", 0, updated_at=stamp), create=True
        )
    log = RequestLog()
    lister = stores.io(mode, event_hooks=log.hooks)
    everything = await lister.list()
    assert len(everything) == 43 and [s.id for s in everything[:3]] == [
        "late-2",
        "late-1",
        "late-0",
    ]
    assert log.counts() == {"LIST": 1, "GET": 43}
    log.requests.clear()
    newest = await stores.io(mode, event_hooks=log.hooks).list(limit=2)  # another process
    assert [s.id for s in newest] == ["late-2", "late-1"]
    assert log.counts() == {"LIST": 1, "GET": 2}
    log.requests.clear()
    assert [s.id for s in await lister.list(limit=2)] == ["late-2", "late-1"]
    assert log.counts() == {"LIST": 1}  # the first lister has read every head unchanged


async def test_list_costs_a_list_and_a_get_a_state_and_limit_k_gets(
    mode: Mode, stores: Stores
) -> None:
    await _list_costs(stores, mode)


@pytest.mark.integration
async def test_list_costs_the_same_on_localstack(mode: Mode, localstack: Stores) -> None:
    await _list_costs(localstack, mode)


async def _list_again(stores: Stores, mode: Mode) -> None:
    """A process lists the States it wrote for a LIST alone, and one changed since for a GET;
    so does a process that only lists, from its second list on."""
    log, looks = RequestLog(), RequestLog()
    mine = stores.io(mode, event_hooks=log.hooks)
    for n in range(3):
        await mine.write(f"s{n}", entry_dicts(0, 1), snapshot_dict(f"s{n}", 1), create=True)
    log.requests.clear()
    assert sorted(s.id for s in await mine.list()) == ["s0", "s1", "s2"]
    assert log.counts() == {"LIST": 1}  # the LIST's ETags are those of the heads it wrote
    lister = stores.io(mode, event_hooks=looks.hooks)  # a process that only lists
    assert len(await lister.list()) == 3 and looks.counts() == {"LIST": 1, "GET": 3}
    looks.requests.clear()
    assert len(await lister.list()) == 3 and looks.counts() == {"LIST": 1}
    other = stores.io(mode)  # another process saves on one of them, and deletes another
    await other.write("s1", entry_dicts(0, 2), snapshot_dict("s1", 2, task="changed"))
    await other.delete("s2")
    log.requests.clear()
    looks.requests.clear()
    listed = {s.id: s for s in await mine.list()}
    assert log.counts() == {"LIST": 1, "GET": 1} and listed["s1"].task == "changed"
    assert sorted(listed) == ["s0", "s1"]
    seen = {s.id: s for s in await lister.list()}
    assert looks.counts() == {"LIST": 1, "GET": 1} and seen["s1"].task == "changed"
    assert sorted(seen) == ["s0", "s1"]


async def test_list_reads_no_head_the_process_holds_or_listed_unchanged(
    mode: Mode, stores: Stores
) -> None:
    await _list_again(stores, mode)


@pytest.mark.integration
async def test_list_reads_no_head_the_process_holds_on_localstack(
    mode: Mode, localstack: Stores
) -> None:
    await _list_again(localstack, mode)
