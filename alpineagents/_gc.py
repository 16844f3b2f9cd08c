"""A pause of Python's cyclic garbage collector while a load builds many objects at once.

A load of a long history makes hundreds of thousands of dicts, lists and entries in a few
tens of milliseconds. The collector counts them as they are made and, on its thresholds, walks
the young objects and, whenever the long-lived ones have grown by a quarter, every object of
the process. What a load makes is not garbage, so those walks find nothing; at 10,000 entries
they took about a third of a load's CPU, more the larger the program's heap
(docs/performance.md, "Garbage collection").

The pause covers only work of the CPU (parsing the bytes read, rebuilding the entries); the
collector runs again after it and finds the new objects then, once. It is turned on again only
if it was on: a program that turned it off keeps it off.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["paused"]


@contextmanager
def paused() -> Iterator[None]:
    """Keep the cyclic garbage collector from running in the block (see the module).

    Two pauses at once in two threads are safe: the one that turned the collector off turns
    it on again, the other leaves it as it is (its block may then see a collection).
    """
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
