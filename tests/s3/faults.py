"""Injected S3 answers for the paths neither emulator produces (409 under contention, 403, 501,
throttling), and a way to run a store in sync or async mode from a test.

The injections are botocore event hooks on the store's own clients: ``before-call`` answers in
place of S3 (below botocore's retries), ``before-send`` answers in place of the HTTP request
(so botocore's retry modes see it), ``needs-retry`` makes botocore send a request again after S3
applied it, as when an answer is lost on the way back.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from botocore.awsrequest import AWSResponse

from alpineagents.store import Store
from alpineagents.testing import StoreIO
from alpineagents_s3 import S3Store, StoredObject


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


def play(store: Store, mode: str, scenario: Callable[[StoreIO], Awaitable[None]]) -> None:
    """Run ``scenario(io)`` in a new event loop with the store in ``mode``, then close it."""

    async def main() -> None:
        io = StoreIO(store, mode)
        try:
            await scenario(io)
        finally:
            await io.close()

    asyncio.run(main())


async def objects(io: StoreIO, state_id: str) -> list[StoredObject]:
    """``S3Store.objects`` or ``aobjects``, by mode."""
    store = io.store
    assert isinstance(store, S3Store)
    if io.mode == "async":
        return await store.aobjects(state_id)
    return await asyncio.to_thread(store.objects, state_id)
