"""The boto3 path: makes the calls of each batch on a thread pool, and holds the steps' locks."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from alpineagents_s3._lock import HandoffLock
from alpineagents_s3._steps import Call, Hold, Outcome, Steps

T = TypeVar("T")


class SyncDriver:
    """Runs protocol steps with a boto3 client, at most ``max_concurrency`` calls at once.

    The client and the thread pool are made at first use and released by :meth:`close`;
    a client passed in by the user is never closed here.
    """

    def __init__(
        self,
        make_client: Callable[[], Any],
        max_concurrency: int,
        client: Any | None = None,
    ):
        self._make_client = make_client
        self._max_concurrency = max_concurrency
        self._given = client
        self._client: Any | None = client
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    @property
    def client(self) -> Any:
        """The boto3 S3 client, made at first use."""
        client = self._client
        if client is None:
            with self._lock:
                if self._client is None:
                    self._client = self._make_client()
                client = self._client
        return client

    def _executor(self) -> ThreadPoolExecutor:
        pool = self._pool
        if pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(
                        self._max_concurrency, thread_name_prefix="alpineagents-s3"
                    )
                pool = self._pool
        return pool

    def run(self, steps: Steps[T]) -> T:
        """Drive ``steps`` to its result; locks it still holds are released when it ends."""
        owner = threading.current_thread()  # the holder of the locks it takes (_lock.py)
        held: list[HandoffLock] = []
        try:
            step = next(steps)
            while True:
                outcomes: list[Outcome] = []
                if isinstance(step, Hold):
                    held.append(step.lock)  # first: released (if held) whatever comes next
                    step.lock.acquire(owner)
                else:
                    if step.delay:
                        time.sleep(step.delay)
                    outcomes = self._call_all(step.calls)
                step = steps.send(outcomes)
        except StopIteration as done:
            result: T = done.value
            return result
        finally:
            steps.close()
            for lock in reversed(held):
                lock.release(owner)

    def _call_all(self, calls: Any) -> list[Outcome]:
        client = self.client
        if len(calls) == 1:
            return [_call(client, calls[0])]
        futures = [self._executor().submit(_call, client, call) for call in calls]
        try:
            return [future.result() for future in futures]
        finally:
            for future in futures:
                future.cancel()

    def close(self) -> None:
        """Close the client (unless it was given) and the thread pool."""
        with self._lock:
            client, self._client = self._client, self._given
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        if client is not None and client is not self._given:
            client.close()


def _call(client: Any, call: Call) -> Outcome:
    """Make one call; what it raises is its outcome, for the protocol to name bucket and key."""
    try:
        response: dict[str, Any] = getattr(client, call.method)(**call.params)
        if call.method == "get_object":
            body = response["Body"]
            try:
                response["Body"] = body.read()
            finally:
                body.close()
            if call.then is not None:
                response["Body"] = call.then(response["Body"])
    except Exception as e:  # noqa: BLE001 - any failure of a call is an outcome
        return e
    return response
