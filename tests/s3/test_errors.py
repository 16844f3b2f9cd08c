"""Errors that name the bucket and key and say what to do; retries; server-side encryption."""

from __future__ import annotations

import json
import re
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest
from botocore.config import Config

from alpineagents import _saving
from alpineagents.errors import (
    ConcurrentWriteError,
    CorruptStateError,
    SchemaVersionError,
    StoreError,
)
from alpineagents.state import State
from alpineagents.testing import StoreIO
from alpineagents.testing._store_suite import make_entries, make_snapshot
from alpineagents_s3 import (
    BucketNotFoundError,
    ConditionalWritesUnsupportedError,
    S3AccessDeniedError,
    S3Store,
    S3StoreError,
    _steps,
)
from alpineagents_s3.testing import RequestLog
from tests.s3.conftest import MakeBucket
from tests.s3.faults import Refuse, Throttle, play

if TYPE_CHECKING:
    from types_boto3_s3 import S3Client

both_modes = pytest.mark.parametrize("mode", ["sync", "async"])


def saved_state(url: str, bucket: str, state_id: str = "s") -> S3Store:
    store = S3Store(bucket, "runs", endpoint_url=url)
    state = State("task", id=state_id)
    state.add_user_message("hello")
    _saving.save(store, state)
    store.close()
    return S3Store(bucket, "runs", endpoint_url=url)


# Missing bucket, access denied, no credentials ------------------------------------------


@both_modes
def test_a_missing_bucket_is_named_with_what_to_do(mode: str, moto_url: str) -> None:
    store = S3Store("no-such-bucket-here", "runs", endpoint_url=moto_url)

    async def scenario(io: StoreIO) -> None:
        for call in (io.read("x"), io.list(), io.save(State("t", id="x")), io.delete("x")):
            with pytest.raises(BucketNotFoundError) as raised:
                await call
            message = str(raised.value)
            assert "s3://no-such-bucket-here/runs/" in message
            assert "does not exist" in message and "Create it" in message
            assert moto_url in message
            assert isinstance(raised.value, FileNotFoundError | StoreError)

    play(store, mode, scenario)


@both_modes
def test_access_denied_is_a_permission_error_naming_the_key(
    mode: str, moto_url: str, moto_bucket: MakeBucket
) -> None:
    bucket = moto_bucket()
    saved_state(moto_url, bucket).close()
    deny = Refuse(403, "AccessDenied")
    store = S3Store(
        bucket, "runs", endpoint_url=moto_url, event_hooks={"before-call.s3.GetObject": deny}
    )

    async def scenario(io: StoreIO) -> None:
        with pytest.raises(S3AccessDeniedError) as raised:
            await io.load("s")
        assert isinstance(raised.value, PermissionError) and isinstance(raised.value, StoreError)
        assert f"s3://{bucket}/runs/s/snapshot.json" in str(raised.value)
        assert "s3:GetObject" in str(raised.value)

    play(store, mode, scenario)


def test_missing_credentials_say_how_to_configure_them(
    moto_url: str, moto_bucket: MakeBucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = moto_bucket()
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with S3Store(bucket, endpoint_url=moto_url) as store:
        with pytest.raises(S3AccessDeniedError, match=r"no AWS credentials.*AWS_PROFILE"):
            store.list()


# Objects the store cannot read ----------------------------------------------------------


def _key(moto: S3Client, bucket: str, part: str) -> str:
    keys = [o["Key"] for o in moto.list_objects_v2(Bucket=bucket)["Contents"]]
    return next(k for k in keys if part in k)


@both_modes
@pytest.mark.parametrize(
    ("target", "body", "error", "words"),
    [
        ("snapshot.json", b"{not json", CorruptStateError, "not valid JSON"),
        ("0000000001.json", b"\xff\xfe", CorruptStateError, "not valid JSON"),
        ("0000000001.json", b"[1, 2]", CorruptStateError, "not a JSON object"),
        ("0000000001.json", b'{"seq": 2}', CorruptStateError, "holds history entry 2, not 1"),
        # What is inside an entry or snapshot is the core's to judge, at load; the message
        # names the State, a note names where it is stored.
        ("0000000001.json", b'{"seq": 1}', CorruptStateError, "no schema version"),
        ("snapshot.json", b'{"v": 99, "id": "s"}', SchemaVersionError, "upgrade alpineagents"),
        ("0000000000.json", b'{"v": 99, "seq": 0}', SchemaVersionError, "schema version 99"),
    ],
)
def test_a_damaged_or_future_object_is_named(
    mode: str,
    target: str,
    body: bytes,
    error: type[Exception],
    words: str,
    moto_url: str,
    moto_bucket: MakeBucket,
    moto: S3Client,
) -> None:
    bucket = moto_bucket()
    store = saved_state(moto_url, bucket)
    key = _key(moto, bucket, target)
    metadata = moto.head_object(Bucket=bucket, Key=key)["Metadata"]
    moto.put_object(Bucket=bucket, Key=key, Body=body, Metadata=metadata)

    async def scenario(io: StoreIO) -> None:
        with pytest.raises(error, match=words) as raised:
            await io.load("s")
        told = "\n".join([str(raised.value), *getattr(raised.value, "__notes__", [])])
        assert f"s3://{bucket}/{key}" in told or f"s3://{bucket}/runs/s/" in told

    play(store, mode, scenario)


@both_modes
def test_an_object_of_a_newer_layout_is_refused_naming_it(
    mode: str, moto_url: str, moto_bucket: MakeBucket, moto: S3Client
) -> None:
    bucket = moto_bucket()
    store = saved_state(moto_url, bucket)
    key = _key(moto, bucket, "snapshot.json")
    metadata = moto.head_object(Bucket=bucket, Key=key)["Metadata"]
    body = moto.get_object(Bucket=bucket, Key=key)["Body"].read()
    moto.put_object(
        Bucket=bucket, Key=key, Body=body, Metadata={**metadata, "alpineagents-layout": "2"}
    )

    async def scenario(io: StoreIO) -> None:
        for attempt in (io.load("s"), io.list()):
            with pytest.raises(SchemaVersionError, match="upgrade alpineagents-s3") as raised:
                await attempt
            assert f"s3://{bucket}/{key}" in str(raised.value)

    play(store, mode, scenario)


@both_modes
@pytest.mark.parametrize(
    ("changes", "error", "words"),
    [
        ({"task": 5}, CorruptStateError, "not an alpineagents snapshot"),
        ({"updated_at": "2026-01-01T00:00:00"}, CorruptStateError, "not an alpineagents snapshot"),
        ({"updated_at": None}, CorruptStateError, "not an alpineagents snapshot"),
        ({"v": 99}, SchemaVersionError, "upgrade alpineagents"),
    ],
)
def test_list_refuses_a_snapshot_it_cannot_summarise_naming_it(
    mode: str,
    changes: dict[str, Any],
    error: type[Exception],
    words: str,
    moto_url: str,
    moto_bucket: MakeBucket,
    moto: S3Client,
) -> None:
    bucket = moto_bucket()
    store = saved_state(moto_url, bucket)
    key = "runs/s/snapshot.json"
    head = moto.head_object(Bucket=bucket, Key=key)
    snapshot = json.loads(moto.get_object(Bucket=bucket, Key=key)["Body"].read())
    body = json.dumps(dict(snapshot, **changes)).encode()
    moto.put_object(Bucket=bucket, Key=key, Body=body, Metadata=head["Metadata"])

    async def scenario(io: StoreIO) -> None:
        with pytest.raises(error, match=words) as raised:
            await io.list()
        assert f"s3://{bucket}/{key}" in str(raised.value)

    play(store, mode, scenario)


@both_modes
def test_a_snapshot_not_written_by_s3store_is_refused(
    mode: str, moto_url: str, moto_bucket: MakeBucket, moto: S3Client
) -> None:
    bucket = moto_bucket()
    store = saved_state(moto_url, bucket)
    snapshot = moto.get_object(Bucket=bucket, Key="runs/s/snapshot.json")["Body"].read()
    moto.put_object(Bucket=bucket, Key="runs/s/snapshot.json", Body=snapshot)  # no metadata

    async def scenario(io: StoreIO) -> None:
        with pytest.raises(CorruptStateError, match=r"s3://.*/runs/s/snapshot\.json.*metadata"):
            await io.load("s")

    play(store, mode, scenario)


@both_modes
def test_an_entry_under_the_wrong_key_is_refused(
    mode: str, moto_url: str, moto_bucket: MakeBucket, moto: S3Client
) -> None:
    bucket = moto_bucket()
    store = saved_state(moto_url, bucket)
    key = _key(moto, bucket, "0000000001.json")
    entry = json.loads(moto.get_object(Bucket=bucket, Key=key)["Body"].read())
    moto.put_object(Bucket=bucket, Key=key, Body=json.dumps(dict(entry, seq=7)).encode())

    async def scenario(io: StoreIO) -> None:
        with pytest.raises(CorruptStateError, match=r"holds history entry 7, not 1"):
            await io.load("s")

    play(store, mode, scenario)


# Endpoints and retries -------------------------------------------------------------------


@both_modes
def test_an_endpoint_without_conditional_writes_is_named(
    mode: str, moto_url: str, moto_bucket: MakeBucket
) -> None:
    unsupported = Refuse(
        501, "NotImplemented", when=lambda url, headers: "If-None-Match" in headers
    )
    store = S3Store(
        moto_bucket(),
        "runs",
        endpoint_url=moto_url,
        event_hooks={"before-call.s3.PutObject": unsupported},
    )

    async def scenario(io: StoreIO) -> None:
        with pytest.raises(ConditionalWritesUnsupportedError) as raised:
            await io.save(State("t", id="s"))
        message = str(raised.value)
        assert "If-None-Match: *" in message and "/runs/s/entries/" in message
        assert "does not support conditional writes" in message

    play(store, mode, scenario)


@both_modes
def test_409_conditional_request_conflict_is_retried(
    mode: str, moto_url: str, moto_bucket: MakeBucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_steps, "CONFLICT_BACKOFF", 0.001)
    conflict = Refuse(409, "ConditionalRequestConflict", times=4)
    store = S3Store(
        moto_bucket(),
        "runs",
        endpoint_url=moto_url,
        event_hooks={"before-call.s3.PutObject": conflict},
    )
    state = State("contended", id="s")

    async def scenario(io: StoreIO) -> None:
        await io.save(state)  # entry, then snapshot create: 409, 409, ... then through
        state.add_user_message("more")
        conflict.left = 2
        await io.save(state)
        assert (await io.load("s")).history == state.history
        # A conflict that does not end: the save fails, naming the object.
        conflict.left = None
        state.data = {"x": 1}
        with pytest.raises(ConcurrentWriteError, match=r"s3://.*/runs/s/snapshot\.json.*409"):
            await io.save(state)

    play(store, mode, scenario)
    assert conflict.refused == 4 + 2 + _steps.CONFLICT_ATTEMPTS


class Breaks:
    """A ``before-send`` hook raising ``error`` in place of sending, for requests ``when``
    accepts: what a failing network, socket or TLS layer raises below botocore."""

    def __init__(self, error: Exception, when: Callable[[Any], bool] = lambda r: True):
        self.error, self.when = error, when
        self.raised = 0

    def __call__(self, request: Any, **kwargs: Any) -> None:
        if self.when(request):
            self.raised += 1
            raise self.error


@both_modes
@pytest.mark.parametrize(
    "error", [OSError(113, "No route to host"), TimeoutError("read timed out"), ssl.SSLError()]
)
def test_any_failure_of_a_call_is_the_stores_error_naming_the_key(
    mode: str, error: Exception, moto_url: str, moto_bucket: MakeBucket
) -> None:
    """Not the bare exception (sync), nor an ExceptionGroup naming nothing (async)."""
    bucket = moto_bucket()
    name = type(error).__name__
    entries = Breaks(error, lambda request: "/entries/" in request.url and request.method == "PUT")
    snapshot = Breaks(error, lambda request: request.url.endswith("/snapshot.json"))
    store = S3Store(
        bucket,
        "runs",
        endpoint_url=moto_url,
        event_hooks={
            "before-send.s3.PutObject": entries,
            "before-send.s3.GetObject": snapshot,
        },
    )

    async def scenario(io: StoreIO) -> None:
        # Three entry PUTs at once, each failing.
        with pytest.raises(S3StoreError) as raised:
            await io.write("s", make_entries(0, 3), make_snapshot("s", 3), create=True)
        message = str(raised.value)
        assert re.search(rf"PutObject s3://{bucket}/runs/s/entries/\w+/\d{{10}}\.json", message)
        assert f"failed: {name}" in message
        assert raised.value.__cause__ is error
        assert not isinstance(raised.value, BaseExceptionGroup)

        # One call alone: the snapshot GET of a load.
        with pytest.raises(S3StoreError, match=rf"s3://{bucket}/runs/x/snapshot\.json.*{name}"):
            await io.load("x")

    play(store, mode, scenario)
    assert entries.raised >= 3 and snapshot.raised >= 1


def test_throttling_and_5xx_are_retried_by_botocore(moto_url: str, moto_bucket: MakeBucket) -> None:
    bucket = moto_bucket()
    log, slow = RequestLog(), Throttle(times=1)
    hooks: dict[str, Callable[..., Any]] = {**log.hooks, "before-send.s3.PutObject": slow}
    with S3Store(bucket, "runs", endpoint_url=moto_url, event_hooks=hooks) as store:
        store.write("s", make_entries(0, 1), make_snapshot("s", 1), create=True)
        assert log.counts() == {"PUT": 3}  # a 503 SlowDown, then the entry and the snapshot
        assert store.read("s") is not None

    # After the retries run out: the store's exception, naming the key.
    hooks = {"before-send.s3.PutObject": Throttle(times=10)}
    config = Config(retries={"mode": "standard", "total_max_attempts": 2})
    with S3Store(bucket, "runs", endpoint_url=moto_url, event_hooks=hooks, config=config) as store:
        with pytest.raises(S3StoreError, match=r"s3://.*/runs/t/entries/.*SlowDown.*HTTP 503"):
            store.write("t", make_entries(0, 1), make_snapshot("t", 1), create=True)


def test_retry_mode_defaults_to_standard_and_follows_the_configuration(
    moto_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def retries(store: S3Store) -> Any:
        with store:
            config: Any = store.client.meta.config
            return config.retries

    assert retries(S3Store("b-b-b", endpoint_url=moto_url)) == {
        "mode": "standard",
        "total_max_attempts": 5,
    }
    adaptive = Config(retries={"mode": "adaptive"})
    with_config = S3Store("b-b-b", endpoint_url=moto_url, config=adaptive)
    assert retries(with_config)["mode"] == "adaptive"
    monkeypatch.setenv("AWS_RETRY_MODE", "adaptive")  # the standard boto configuration wins
    assert retries(S3Store("b-b-b", endpoint_url=moto_url)) == {"mode": "adaptive"}


@both_modes
def test_async_clients_get_the_same_configuration(
    mode: str, moto_url: str, moto_bucket: MakeBucket
) -> None:
    store = S3Store(moto_bucket(), endpoint_url=moto_url, max_concurrency=32)

    async def scenario(io: StoreIO) -> None:
        if io.mode == "async":
            client = await store._async.client()
        else:
            client = store.client
        assert client.meta.config.retries == {"mode": "standard", "total_max_attempts": 5}
        assert client.meta.config.max_pool_connections == 32
        assert client.meta.endpoint_url == moto_url

    play(store, mode, scenario)


# Server-side encryption -----------------------------------------------------------------


@both_modes
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
def test_server_side_encryption_reaches_every_put(
    mode: str,
    options: dict[str, Any],
    expected: tuple[str, str | None],
    moto_url: str,
    moto_bucket: MakeBucket,
    moto: S3Client,
) -> None:
    bucket = moto_bucket()
    store = S3Store(bucket, "runs", endpoint_url=moto_url, **options)
    state = State("secret", id="s")

    async def scenario(io: StoreIO) -> None:
        await io.save(state)
        state.add_user_message("more")
        await io.save(state)  # an update: entry PUT and If-Match snapshot PUT

    play(store, mode, scenario)
    keys = [o["Key"] for o in moto.list_objects_v2(Bucket=bucket)["Contents"]]
    assert len(keys) == 3
    for key in keys:
        head = moto.head_object(Bucket=bucket, Key=key)
        assert (head.get("ServerSideEncryption"), head.get("SSEKMSKeyId")) == expected, key


def test_encryption_options_are_checked() -> None:
    with pytest.raises(ValueError, match="server_side_encryption"):
        S3Store("bucket", server_side_encryption="rot13")
    with pytest.raises(ValueError, match="aws:kms"):
        S3Store("bucket", server_side_encryption="AES256", sse_kms_key_id="k")


@both_modes
def test_a_missing_entry_object_is_named(
    mode: str, moto_url: str, moto_bucket: MakeBucket, moto: S3Client
) -> None:
    bucket = moto_bucket()
    store = saved_state(moto_url, bucket)
    moto.delete_object(Bucket=bucket, Key=_key(moto, bucket, "0000000001.json"))

    async def scenario(io: StoreIO) -> None:
        with pytest.raises(CorruptStateError, match=r"snapshot\.json accounts for 2 .* holds 1"):
            await io.load("s")

    play(store, mode, scenario)
