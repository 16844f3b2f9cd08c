"""Helpers of the S3Store tests: store objects on moto closed after the test, objects put
behind the store's back, and injected S3 answers.

Injected answers cover the paths neither emulator produces (409 under contention, 403, 501,
throttling, a failing network). They are botocore event hooks on the store's own clients:
``before-call`` answers in place of S3 (below botocore's retries), ``before-send`` answers in
place of the HTTP request (so botocore's retry modes see it), ``needs-retry`` makes botocore send
a request again after S3 applied it, as when an answer is lost on the way back.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import boto3
from botocore.awsrequest import AWSResponse

from alpineagents import State
from alpineagents.history import MODEL, TOOL_RESULT
from alpineagents.testing import StoreIO
from alpineagents_s3 import S3Store, StoredObject
from alpineagents_s3.testing import separate_process
from tests.helpers import MakeBucket, Mode

if TYPE_CHECKING:
    import aioboto3
    from types_boto3_s3 import S3Client

# Store objects -----------------------------------------------------------------------------


class Stores:
    """Makes S3Store objects under ``runs/`` in a bucket of moto's server; the ``stores``
    fixture closes each one (async client, then sync client) after the test.

    Their sync clients come from one ``boto3.Session`` (given as ``session``), which loads
    the S3 service model once instead of once per store object, and their async clients from
    one ``aioboto3.Session`` (``aio_session``), unless a test gives a session of its own."""

    def __init__(
        self,
        url: str,
        make_bucket: MakeBucket,
        session: boto3.Session | None = None,
        aio_session: aioboto3.Session | None = None,
    ):
        self.url = url
        self.make_bucket = make_bucket
        self.bucket = make_bucket()
        self.session = session
        self.aio_session = aio_session
        self.made: list[S3Store] = []

    def new(
        self, *, bucket: str | None = None, same_process: bool = False, **options: Any
    ) -> S3Store:
        """A new store object: another process, as far as S3 can tell (a memory of its own,
        ``alpineagents_s3.testing.separate_process``), unless ``same_process``."""
        if "session" not in options and "aio_session" not in options:
            options["aio_session"] = self.aio_session
        options.setdefault("session", self.session)
        store = S3Store(bucket or self.bucket, "runs", endpoint_url=self.url, **options)
        if not same_process:
            separate_process(store)
        self.made.append(store)
        return store

    def io(
        self, mode: Mode, *, bucket: str | None = None, same_process: bool = False, **options: Any
    ) -> StoreIO:
        """A new store object, called through its sync or its async methods."""
        return StoreIO(self.new(bucket=bucket, same_process=same_process, **options), mode)

    async def keys(self) -> list[str]:
        """Every key in the bucket, sorted."""
        client = raw_client(self.url)
        try:
            listed = await asyncio.to_thread(client.list_objects_v2, Bucket=self.bucket)
            return sorted(item["Key"] for item in listed.get("Contents", ()))
        finally:
            client.close()

    async def close(self) -> None:
        """Close every store object made."""
        for store in self.made:
            await store.aclose()
            store.close()


async def objects(io: StoreIO, state_id: str) -> list[StoredObject]:
    """``S3Store.objects`` or ``aobjects``, by mode."""
    store = io.store
    assert isinstance(store, S3Store)
    if io.mode == "async":
        return await store.aobjects(state_id)
    return await asyncio.to_thread(store.objects, state_id)


# About 2 KB a tool result.
RESULT = "row,value\n" + "alpha,1\nbeta,2\ngamma,3\n" * 90


def run(state: State, turns: int, first: int = 0, result: str = RESULT) -> None:
    """Append ``turns`` tool-using turns (a model response and a tool result each)."""
    for n in range(first, first + turns):
        call = {"type": "tool_call", "id": f"call-{n}", "name": "lookup", "input": {"n": n}}
        state.append(MODEL, "", {"content": [call], "stop_reason": "tool_use"})
        state.append(TOOL_RESULT, result, {"call_id": f"call-{n}", "name": "lookup"})


async def load(store: S3Store, mode: Mode, state_id: str) -> State:
    """``aload``, or ``load`` on a thread."""
    if mode == "async":
        loaded: State = await store.aload(state_id)
    else:
        loaded = await asyncio.to_thread(store.load, state_id)
    return loaded


async def save(store: S3Store, mode: Mode, state: State) -> None:
    """``asave``, or ``save`` on a thread."""
    if mode == "async":
        await store.asave(state)
    else:
        await asyncio.to_thread(store.save, state)


def raw_client(endpoint_url: str) -> S3Client:
    """A plain boto3 client, for setting up and inspecting buckets behind the store's back."""
    client: S3Client = boto3.client("s3", endpoint_url=endpoint_url, region_name="us-east-1")
    return client


# Objects put behind the store's back -------------------------------------------------------


def body(value: Any) -> bytes:
    """A JSON object body."""
    return json.dumps(value).encode()


def head_of(client: S3Client, bucket: str, state_id: str) -> dict[str, Any]:
    """The State's head, as stored (under ``runs/``)."""
    got = client.get_object(Bucket=bucket, Key=f"runs/heads/{state_id}.json")
    head: dict[str, Any] = json.loads(got["Body"].read())
    return head


def part_keys(client: S3Client, bucket: str, state_id: str) -> list[str]:
    """Every key under the State's folder, sorted."""
    listed = client.list_objects_v2(Bucket=bucket, Prefix=f"runs/states/{state_id}/")
    return sorted(item["Key"] for item in listed.get("Contents", ()))


# Injected answers --------------------------------------------------------------------------


def _error(status: int, code: str) -> dict[str, Any]:
    return {
        "Error": {"Code": code, "Message": f"injected {code}"},
        "ResponseMetadata": {"HTTPStatusCode": status, "HTTPHeaders": {}},
    }


class Refuse:
    """A ``before-call`` hook answering ``status``/``code`` instead of S3, ``times`` times
    (``None``: always), for calls ``when(url, headers)`` accepts."""

    def __init__(
        self,
        status: int,
        code: str,
        *,
        times: int | None = None,
        when: Callable[[str, dict[str, Any]], bool] = lambda url, headers: True,
    ):
        self.status, self.code, self.left, self.when = status, code, times, when
        self.refused = 0
        self._lock = threading.Lock()

    def __call__(self, params: dict[str, Any], **kwargs: Any) -> Any:
        if not self.when(params["url"], params["headers"]):
            return None
        with self._lock:
            if self.left is not None:
                if self.left <= 0:
                    return None
                self.left -= 1
            self.refused += 1
        headers: Any = {}
        return AWSResponse(params["url"], self.status, headers, None), _error(
            self.status, self.code
        )


class _Raw:
    def __init__(self, body: bytes):
        self.body = body

    def stream(self, **kwargs: Any) -> Iterator[bytes]:
        yield self.body


class Throttle:
    """A ``before-send`` hook answering 503 SlowDown to the first ``times`` requests (sync
    clients only: the async client expects an aiohttp response)."""

    def __init__(self, times: int):
        self.left = times

    def __call__(self, request: Any, **kwargs: Any) -> Any:
        if self.left <= 0:
            return None
        self.left -= 1
        body = b"<Error><Code>SlowDown</Code><Message>Reduce your request rate.</Message></Error>"
        headers: Any = {}
        return AWSResponse(request.url, 503, headers, _Raw(body))


class LoseAnswers:
    """A ``needs-retry`` hook: after S3 applied a request, botocore sends it again once, as it
    does when the answer is lost (a timeout, a dropped connection)."""

    def __init__(self) -> None:
        self.repeated = 0
        self._seen: set[int] = set()
        self._lock = threading.Lock()

    def __call__(self, response: Any, attempts: int, **kwargs: Any) -> Any:
        if response is None or attempts > 1:
            return None
        http = response[0]
        if http.status_code >= 300:
            return None
        with self._lock:
            self.repeated += 1
        return 0  # retry now


class InFlight:
    """Counts requests in flight (``before-send`` to ``needs-retry``) and the most at once."""

    def __init__(self) -> None:
        self.now = 0
        self.most = 0
        self._lock = threading.Lock()

    def start(self, **kwargs: Any) -> None:
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def end(self, **kwargs: Any) -> None:
        with self._lock:
            self.now -= 1

    @property
    def hooks(self) -> dict[str, Callable[..., Any]]:
        return {"before-send.s3": self.start, "needs-retry.s3": self.end}


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


class ClientsSeen:
    """A ``before-call`` hook noting, per call, which client made it (its request signer, one
    per client) and that client's region and configuration."""

    def __init__(self) -> None:
        self.signers: list[object] = []
        self.regions: list[str] = []
        self.configs: list[Any] = []
        self.urls: list[str] = []

    def __call__(self, params: dict[str, Any], context: dict[str, Any], **kwargs: Any) -> None:
        self.signers.append(kwargs["request_signer"])
        self.regions.append(context["client_region"])
        self.configs.append(context["client_config"])
        self.urls.append(params["url"])

    @property
    def clients(self) -> int:
        """How many different clients made calls."""
        return len({id(signer) for signer in self.signers})
