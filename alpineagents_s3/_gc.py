"""A pause of Python's cyclic garbage collector while a packed segment is parsed.

Parsing a segment makes tens of thousands of dicts and lists in a few milliseconds. The
collector counts them as they are made and, on its thresholds, walks the young objects and,
whenever the long-lived ones have grown by a quarter, every object of the process. Nothing a
parse makes is garbage, so those walks find nothing: loads of 10,000 packed entries (14 MB of
JSON) through the bench's proxy spent 52-63 ms each in collections, 37-47 ms of it in full
ones, of a median of 173-183 ms; with the pause, 30-37 ms, of 121-150 ms (commit e677c31,
2026-12-02). A full walk costs more the larger the program's heap.

The pause covers only the parse (CPU work of a few milliseconds a segment, no I/O, no
wait): the collector runs again after it, and finds the new objects then, once. Drivers parse
segments in several threads (or several calls in one event loop), so the pause counts those
under way and the last one to end resumes the collector, and only if it was running when the
first began: a program that turned it off keeps it off. (One that turns it off while a parse
is under way has it turned on again at the parse's end.)
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["paused"]


class _Pause:
    """The parses under way, and whether the collector ran when the first began."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.depth = 0
        self.resume = False
        # A child forked while another thread held the lock or was parsing has neither that
        # thread nor its parse: it starts afresh, with the collector running if it ran then.
        if hasattr(os, "register_at_fork"):  # not on Windows, which does not fork
            os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self.lock = threading.Lock()
        if self.depth and self.resume:
            gc.enable()
        self.depth = 0
        self.resume = False

    def begin(self) -> None:
        with self.lock:
            if self.depth == 0:
                self.resume = gc.isenabled()
                gc.disable()
            self.depth += 1

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
