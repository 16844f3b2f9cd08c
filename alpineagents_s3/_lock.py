"""A lock that threads and event loops can wait on together, and a registry of them by name.

One S3Store object may serve boto3 calls from several threads and aioboto3 calls from several
event loops at once. A ``threading.Lock`` would block an event loop while it waits, and an
``asyncio.Lock`` belongs to one loop; :class:`HandoffLock` serves both. It is held or free; a
release hands it straight to the oldest waiter (a thread woken through an event, or a task whose
future is resolved in its own loop), so waiters are served in order and none polls.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections import deque

# How a waiter is woken: a thread's event, or a task's future resolved in its own loop.
_Wake = threading.Event | tuple[asyncio.AbstractEventLoop, "asyncio.Future[None]"]


class HandoffLock:
    """A fair lock, acquired with :meth:`acquire` by threads and :meth:`aacquire` by tasks.

    Each holder is named by an ``owner`` (any object: the async driver makes one per operation,
    the sync driver names its thread), and
    :meth:`release` by anyone else does nothing. So a driver can always release in its
    ``finally`` whatever it may hold: an exception that lands anywhere (a cancellation, or a
    signal handler's ``KeyboardInterrupt``/``SystemExit`` between two bytecodes) never leaves
    the lock held, nor a waiter queued. The sync driver's owner is its thread, which runs one
    operation at a time: a hold of its own that it meets again is left by an operation that an
    exception ended before its ``finally`` released it (a signal can land there too), and it
    takes it over instead of waiting for itself.
    """

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._owner: object | None = None
        self._waiters: deque[tuple[object, _Wake]] = deque()

    @property
    def locked(self) -> bool:
        """Whether the lock is held."""
        return self._owner is not None

    def acquire(self, owner: object) -> None:
        """Wait until the lock is free (or handed to ``owner``), and hold it as ``owner``."""
        with self._guard:
            if self._owner is None or self._owner is owner:  # an owner never waits for itself
                self._owner = owner
                return
            waiter = (owner, threading.Event())
            self._waiters.append(waiter)
        try:
            waiter[1].wait()  # set by release, which made owner the holder
        except BaseException:
            self._leave(waiter)
            raise

    async def aacquire(self, owner: object) -> None:
        """Wait, without blocking the event loop, until the lock is free, and hold it."""
        loop = asyncio.get_running_loop()
        with self._guard:
            if self._owner is None:
                self._owner = owner
                return
            future: asyncio.Future[None] = loop.create_future()
            waiter: tuple[object, _Wake] = (owner, (loop, future))
            self._waiters.append(waiter)
        try:
            await future
        except BaseException:
            self._leave(waiter)
            raise

    def release(self, owner: object) -> None:
        """Hand the lock to the oldest waiter, or free it, if ``owner`` holds it."""
        with self._guard:
            if self._owner is not owner:
                return
            while self._waiters:
                heir, wake = self._waiters.popleft()
                if isinstance(wake, threading.Event):
                    self._owner = heir
                    wake.set()
                    return
                loop, future = wake
                try:
                    loop.call_soon_threadsafe(_resolve, future)
                except RuntimeError:  # its loop was closed: that waiter is gone
                    continue
                self._owner = heir
                return
            self._owner = None

    def _leave(self, waiter: tuple[object, _Wake]) -> None:
        """A waiter that stops waiting leaves the queue, or hands on the lock handed to it."""
        with self._guard:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
                return
        self.release(waiter[0])


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class LockRegistry:
    """One :class:`HandoffLock` per name, kept while anyone holds or waits for it."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: weakref.WeakValueDictionary[str, HandoffLock] = weakref.WeakValueDictionary()

    def get(self, name: str) -> HandoffLock:
        """The lock of ``name``: the same object for every caller while it is referenced."""
        with self._guard:
            lock = self._locks.get(name)
            if lock is None:
                lock = self._locks[name] = HandoffLock()
            return lock
