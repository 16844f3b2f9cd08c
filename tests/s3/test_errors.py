"""Errors that name the bucket and key and say what to do: a missing bucket, access denied, no
credentials, an endpoint without conditional writes, a failing network."""

from __future__ import annotations

import re
import socket
import ssl

import pytest
from botocore.config import Config

from alpineagents import State
from alpineagents.errors import StoreError
from alpineagents.testing import StoreIO
from alpineagents_s3 import (
    BucketNotFoundError,
    ConditionalWritesUnsupportedError,
    S3AccessDeniedError,
    S3Store,
    S3StoreError,
)
from tests.helpers import MakeBucket, Mode, entry_dicts, snapshot_dict
from tests.s3.helpers import Breaks, Refuse, Stores, objects


async def test_a_missing_bucket_is_named_with_what_to_do(mode: Mode, stores: Stores) -> None:
    io = stores.io(mode, bucket="no-such-bucket-here")
    for call in (io.read("x"), io.list(), io.save(State("t", id="x")), io.delete("x")):
        with pytest.raises(BucketNotFoundError) as raised:
            await call
        message = str(raised.value)
        assert "s3://no-such-bucket-here/runs/" in message
        assert "does not exist" in message and "Create it" in message
        assert stores.url in message
        assert isinstance(raised.value, FileNotFoundError | StoreError)


async def test_access_denied_is_a_permission_error_naming_the_key(
    mode: Mode, stores: Stores
) -> None:
    await stores.io(mode).save(State("task", id="s"))
    deny = Refuse(403, "AccessDenied")
    io = stores.io(mode, event_hooks={"before-call.s3.GetObject": deny})
    with pytest.raises(S3AccessDeniedError) as raised:
        await io.load("s")
    assert isinstance(raised.value, PermissionError) and isinstance(raised.value, StoreError)
    assert f"s3://{stores.bucket}/runs/heads/s.json" in str(raised.value)
    assert "s3:GetObject" in str(raised.value)


def test_missing_credentials_say_how_to_configure_them(
    moto_url: str, moto_bucket: MakeBucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = moto_bucket()
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with S3Store(bucket, endpoint_url=moto_url) as store:
        with pytest.raises(S3AccessDeniedError, match=r"no AWS credentials.*AWS_PROFILE"):
            store.list()


async def test_an_endpoint_without_conditional_writes_is_named(mode: Mode, stores: Stores) -> None:
    unsupported = Refuse(
        501, "NotImplemented", when=lambda url, headers: "If-None-Match" in headers
    )
    io = stores.io(mode, event_hooks={"before-call.s3.PutObject": unsupported})
    with pytest.raises(ConditionalWritesUnsupportedError) as raised:
        await io.save(State("t", id="s"))
    message = str(raised.value)
    assert "If-None-Match: *" in message and f"s3://{stores.bucket}/runs/" in message
    assert "does not support conditional writes" in message


@pytest.mark.parametrize(
    "error",
    [
        OSError(113, "No route to host"),
        TimeoutError("read timed out"),
        ssl.SSLError(),
        RuntimeError("an event hook failed"),  # not an OSError: what a user's hook may raise
    ],
)
async def test_any_failure_of_a_call_is_the_stores_error_naming_the_key(
    mode: Mode, error: Exception, stores: Stores
) -> None:
    """Not the bare exception (sync), nor an ExceptionGroup naming nothing (async)."""
    name = type(error).__name__
    entries = Breaks(error, lambda request: "/states/" in request.url and request.method == "PUT")
    snapshot = Breaks(error, lambda request: "/heads/" in request.url)
    io = stores.io(
        mode,
        event_hooks={
            "before-send.s3.PutObject": entries,
            "before-send.s3.GetObject": snapshot,
        },
    )
    # Three entry PUTs at once, each failing.
    with pytest.raises(S3StoreError) as raised:
        await io.write("s", entry_dicts(0, 3), snapshot_dict("s", 3), create=True)
    message = str(raised.value)
    bucket = stores.bucket
    assert re.search(rf"PutObject s3://{bucket}/runs/states/s/\w+/e\d{{10}}\.\w+\.json", message)
    assert f"failed: {name}" in message
    assert raised.value.__cause__ is error
    assert not isinstance(raised.value, BaseExceptionGroup)

    # One call alone: the snapshot GET of a load.
    with pytest.raises(S3StoreError, match=rf"s3://{bucket}/runs/heads/x\.json.*{name}"):
        await io.load("x")
    assert entries.raised >= 3 and snapshot.raised >= 1


async def test_a_password_in_the_endpoint_url_is_never_shown(mode: Mode, stores: Stores) -> None:
    """``https://user:secret@host`` is shown as ``***@host``: in the store's repr and in the
    errors of every request (docs/s3.md, "Errors")."""
    with socket.socket() as free:  # a port nothing listens on
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    endpoint = f"http://someone:s3cr3t-word@127.0.0.1:{port}"
    config = Config(retries={"total_max_attempts": 1}, connect_timeout=2)
    store = S3Store("bucket", "runs", endpoint_url=endpoint, config=config)
    stores.made.append(store)
    assert "s3cr3t" not in repr(store) and "someone" not in repr(store)
    io = StoreIO(store, mode)
    messages = []
    for attempt in (io.read("x"), io.list(), io.save(State("t", id="x")), io.delete("x")):
        with pytest.raises(S3StoreError) as raised:
            await attempt
        messages.append("".join([str(raised.value), *getattr(raised.value, "__notes__", [])]))
    assert not [m for m in messages if "s3cr3t" in m or "someone" in m], messages
    if mode == "sync":  # botocore names the endpoint it could not reach (aiohttp does not)
        assert all(f"***@127.0.0.1:{port}" in m for m in messages), messages


async def test_a_process_allowed_only_to_read_and_list_reads_and_lists(
    mode: Mode, stores: Stores
) -> None:
    """s3:GetObject and s3:ListBucket serve a reader (docs/s3.md, "Permissions"): a monitor
    loads, lists and inspects; its first write is refused, naming the permission."""
    await stores.io(mode).write("r", entry_dicts(0, 20), snapshot_dict("r", 20), create=True)
    deny = Refuse(403, "AccessDenied")
    refused = {
        f"before-call.s3.{op}": deny for op in ("PutObject", "DeleteObject", "DeleteObjects")
    }
    reader = stores.io(mode, event_hooks=refused)
    record = await reader.read("r")
    assert record is not None and len(record.entries) == 20
    assert [s.id for s in await reader.list()] == ["r"]
    assert {o.role for o in await objects(reader, "r")} == {"head", "segment", "entry"}
    assert deny.refused == 0
    with pytest.raises(S3AccessDeniedError, match=r"s3:PutObject"):
        await reader.write("r", entry_dicts(0, 21), snapshot_dict("r", 21))
