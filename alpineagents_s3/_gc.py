"""A pause of Python's cyclic garbage collector while a packed segment is parsed.

Parsing a segment makes tens of thousands of dicts and lists in a few milliseconds. The
collector counts them as they are made and, on its thresholds, walks the young objects and,
whenever the long-lived ones have grown by a quarter, every object of the process. Nothing a
parse makes is garbage, so those walks find nothing: loads of 10,000 packed entries (14 MB of
JSON) through the bench's proxy spent 52-63 ms each in collections, 37-47 ms of it in full
ones, of a median of 173-183 ms; with the pause, 30-37 ms, of 121-150 ms (docs/performance.md,
"Garbage collection"). A full walk costs more the larger the program's heap.

The pause covers only the parse (CPU work of a few milliseconds a segment, no I/O, no
wait): the collector runs again after it, and finds the new objects then, once. Drivers parse
segments in several threads (or several calls in one event loop), so the pause counts those
under way and the last one to end resumes the collector, and only if it was running when the
first began: a program that turned it off keeps it off. (One that turns it off while a parse
is under way has it turned on again at the parse's end.)

A load (``S3Store.load``, ``aload``) holds the pause longer: from the moment it sends the GETs
of segments until the State is rebuilt and returned (:func:`holding`, :func:`hold`). Between
two segment parses, and between the last one and the core's rebuild, the collector would
otherwise wake up and walk every entry just parsed, and again at each generation, before
the raw entries the rebuild turns into a State are dropped; held to the end, it walks once
what the load keeps. At 10,000 entries through the bench's proxy that took a first load's
collections from ~16 ms to ~5 ms and its client CPU from ~123 ms to ~96 ms (docs/
performance.md, "Garbage collection"). The hold spans the round that fetches the segments
(a few tens of milliseconds on S3): meanwhile no collection runs in any thread of the
process, and one runs after. A load that reads no segment does not hold it.
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["hold", "holding", "paused"]


class _Pause:
    """The parses under way, and whether the collector ran when the first began."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.depth = 0
        self.resume = False
        self.forks = 0  # children forked since: a hold begun before a fork ends in neither
        # A child forked while another thread held the lock or was parsing has neither that
        # thread nor its parse: it starts afresh, with the collector running if it ran then.
        if hasattr(os, "register_at_fork"):  # not on Windows, which does not fork
            os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self.forks += 1
        self.lock = threading.Lock()
        if self.depth and self.resume:
            gc.enable()
        self.depth = 0
        self.resume = False

    def begin(self) -> int:
        """Begin a pause; returns the forks so far (read under the lock)."""
        with self.lock:
            if self.depth == 0:
                self.resume = gc.isenabled()
                gc.disable()
            self.depth += 1
            return self.forks

    def end(self) -> None:
        with self.lock:
            self.depth -= 1
            if self.depth == 0 and self.resume:
                gc.enable()


_PAUSE = _Pause()


@contextmanager
def paused() -> Iterator[None]:
    """Keep the cyclic garbage collector from running in the block (see the module)."""
    _PAUSE.begin()
    try:
        yield
    finally:
        _PAUSE.end()


class _Hold:
    """A load's hold: whether it began a pause, and in which process (see :func:`holding`)."""

    __slots__ = ("forks",)

    def __init__(self) -> None:
        self.forks: int | None = None  # ``_PAUSE.forks`` when the pause began; None: not begun


_HOLD: ContextVar[_Hold | None] = ContextVar("alpineagents_s3_gc_hold", default=None)


@contextmanager
def holding() -> Iterator[None]:
    """The scope of a load: a pause :func:`hold` begins in it lasts until it ends.

    A ``ContextVar`` marks the scope: the read's steps run in the loading thread (sync) or
    task (async), where they call :func:`hold`; the parses in the drivers' threads keep their
    own pauses within it. Nested scopes each end their own hold.
    """
    mine = _Hold()
    token = _HOLD.set(mine)
    try:
        yield
    finally:
        _HOLD.reset(token)
        if mine.forks is not None and mine.forks == _PAUSE.forks:
            _PAUSE.end()


def hold() -> None:
    """Pause the collector until the load under way ends (nothing outside :func:`holding`).

    Called as a read sends the GETs of segments; a second call in the same load does nothing.
    """
    mine = _HOLD.get()
    if mine is not None and mine.forks is None:
        mine.forks = _PAUSE.begin()
