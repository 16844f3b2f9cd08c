"""The aioboto3 path: makes the calls of each batch as concurrent tasks, and holds the locks.

An aiobotocore client belongs to the event loop it was opened in. The driver opens one per
loop, lazily, inside that loop, and closes it in :meth:`AsyncDriver.aclose`. It also closes it
when the loop shuts down without ``aclose``: the client is held by an async generator, and
``asyncio.run`` finalises every async generator of its loop before closing it. So a process
that calls ``asyncio.run`` once per event (a serverless handler) gets a fresh client each time
and leaks none.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from alpineagents_s3._lock import HandoffLock
from alpineagents_s3._steps import Call, Hold, Outcome, Steps

T = TypeVar("T")

logger = logging.getLogger("alpineagents_s3")


@dataclass
class _Opened:
    loop: asyncio.AbstractEventLoop
    holder: AsyncGenerator[Any, None]
    client: Any


async def _hold(context: Any, on_open: Callable[[Any], None]) -> AsyncGenerator[Any, None]:
    """Open a client, hand it out, and close it when finalised (``aclose`` or loop shutdown)."""
    client = await context.__aenter__()
    try:
        on_open(client)
        yield client
    finally:
        await context.__aexit__(None, None, None)


class AsyncDriver:
    """Runs protocol steps with an aiobotocore client, at most ``max_concurrency`` at once."""

    def __init__(
        self,
        open_client: Callable[[], Any],
        max_concurrency: int,
        on_open: Callable[[Any], None],
    ):
        self._open_client = open_client  # returns aioboto3's client context manager
        self._on_open = on_open
        self._max_concurrency = max_concurrency
        self._opened: dict[asyncio.AbstractEventLoop, _Opened] = {}
        self._locks: dict[asyncio.AbstractEventLoop, asyncio.Lock] = {}
        self._guard = threading.Lock()

    async def client(self) -> Any:
        """The aiobotocore S3 client of the running event loop, opened at first use."""
        loop = asyncio.get_running_loop()
        opened = self._opened.get(loop)
        if opened is not None:
            return opened.client
        with self._guard:
            self._forget_ended_loops()
            lock = self._locks.setdefault(loop, asyncio.Lock())
        async with lock:
            opened = self._opened.get(loop)
            if opened is None:
                holder = _hold(self._open_client(), self._on_open)
                client = await anext(holder)
                opened = self._opened[loop] = _Opened(loop, holder, client)
                logger.debug("opened an aioboto3 S3 client in event loop %x", id(loop))
            return opened.client

    def _forget_ended_loops(self) -> None:
        for loop in [loop for loop in self._opened if loop.is_closed()]:
            # Its client was closed when the loop shut down its async generators; a loop
            # closed without that leaves nothing we could still close.
            del self._opened[loop]
            self._locks.pop(loop, None)
        for loop in [loop for loop in self._locks if loop.is_closed()]:
            del self._locks[loop]

    async def run(self, steps: Steps[T]) -> T:
        """Drive ``steps`` to its result; locks it still holds are released when it ends."""
        owner = object()  # this operation, as the holder of the locks it takes
        held: list[HandoffLock] = []
        try:
            step = next(steps)
            while True:
                outcomes: list[Outcome] = []
                if isinstance(step, Hold):
                    held.append(step.lock)  # first: released (if held) whatever comes next
                    await step.lock.aacquire(owner)
                else:
                    if step.delay:
                        await asyncio.sleep(step.delay)
                    outcomes = await self._call_all(step.calls)
                step = steps.send(outcomes)
        except StopIteration as done:
            result: T = done.value
            return result
        finally:
            steps.close()
            for lock in reversed(held):
                lock.release(owner)

    async def _call_all(self, calls: Any) -> list[Outcome]:
        client = await self.client()
        if len(calls) == 1:
            return [await _call(client, calls[0])]
        limit = asyncio.Semaphore(self._max_concurrency)

        async def bounded(call: Call) -> Outcome:
            async with limit:
                return await _call(client, call)

        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(bounded(call)) for call in calls]
        return [task.result() for task in tasks]

    async def aclose(self) -> None:
        """Close the client of the running loop (clients of ended loops are forgotten)."""
        loop = asyncio.get_running_loop()
        with self._guard:
            opened = self._opened.pop(loop, None)
            self._locks.pop(loop, None)
            self._forget_ended_loops()
        if opened is not None:
            await opened.holder.aclose()
            logger.debug("closed the aioboto3 S3 client of event loop %x", id(loop))

    def forget_ended_loops(self) -> None:
        """Drop clients of event loops that have ended (for ``close`` outside any loop)."""
        with self._guard:
            self._forget_ended_loops()


async def _call(client: Any, call: Call) -> Outcome:
    """Make one call; what it raises is its outcome, for the protocol to name bucket and key.

    So no call's failure escapes the TaskGroup of a batch as an ExceptionGroup.
    """
    try:
        response: dict[str, Any] = await getattr(client, call.method)(**call.params)
        if call.method == "get_object":
            body = response["Body"]
            try:
                response["Body"] = await body.read()
            finally:
                body.close()
            if call.then is not None:
                response["Body"] = call.then(response["Body"])
    except Exception as e:  # noqa: BLE001 - any failure of a call is an outcome
        return e
    return response
