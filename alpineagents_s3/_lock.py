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


class HandoffLock:
    """A fair lock, acquired with :meth:`acquire` by threads and :meth:`aacquire` by tasks.

    Not reentrant. A task cancelled while it waits leaves the queue, or, if the lock was handed
    to it at that moment, hands it on: a cancellation never leaves the lock held.
    """

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._held = False
        self._waiters: deque[
            threading.Event | tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]
        ] = deque()

    @property
    def locked(self) -> bool:
        """Whether the lock is held."""
        return self._held

    def acquire(self) -> None:
        """Wait until the lock is free (or handed over), and hold it."""
        with self._guard:
            if not self._held:
                self._held = True
                return
            event = threading.Event()
            self._waiters.append(event)
        event.wait()  # set by release: the lock is ours, still marked held

    async def aacquire(self) -> None:
        """Wait, without blocking the event loop, until the lock is free, and hold it."""
        loop = asyncio.get_running_loop()
        with self._guard:
            if not self._held:
                self._held = True
                return
            waiter = (loop, loop.create_future())
            self._waiters.append(waiter)
        try:
            await waiter[1]
        except asyncio.CancelledError:
            with self._guard:
                if waiter in self._waiters:  # still waiting: just leave the queue
                    self._waiters.remove(waiter)
                    raise
            self.release()  # it was handed to us as we were cancelled: hand it on
            raise

    def release(self) -> None:
        """Hand the lock to the oldest waiter, or free it."""
        with self._guard:
            if not self._held:
                raise RuntimeError("release of a HandoffLock that is not held")
            while self._waiters:
                waiter = self._waiters.popleft()
                if isinstance(waiter, threading.Event):
                    waiter.set()
                    return
                loop, future = waiter
                try:
                    loop.call_soon_threadsafe(_resolve, future)
                except RuntimeError:  # its loop was closed: that waiter is gone
                    continue
                return
            self._held = False


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
