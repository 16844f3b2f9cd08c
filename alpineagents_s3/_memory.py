"""What this process knows of the States it read or wrote, shared by every equal store object.

A save is conditional on the head this *process* last read or wrote (docs/protocol.md, save step
2): two S3Store objects on the same endpoint, bucket and prefix are the same store, so what one
of them saw is what the other saves on. Also kept here: the lock each State's saves and deletes
hold, the bodies of parts read or written (parts never change, so a body kept is never stale),
the summaries of each store's last list (by their heads' ETags), and the endpoints whose
conditional writes were checked.

A process forked from this one starts with a copy: it is another process, and a save of one of
them is refused to the other as a second writer's, as it must be.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

from alpineagents_s3._head import Head
from alpineagents_s3._keys import Layout
from alpineagents_s3._lock import HandoffLock, LockRegistry

__all__ = ["MEMORY", "Bodies", "Ctx", "Memory", "Seen"]

# The bodies kept, in bytes: enough for a long State's segments, little for a small function.
BODIES_LIMIT: Final = 64 * 1024 * 1024
# The stores whose last list is kept, the most recently listed (each: a summary a State).
LISTS_LIMIT: Final = 64

Scope = tuple[str, str, str]  # (endpoint, bucket, prefix): one store


@dataclass(frozen=True)
class Seen:
    """What the process knows of one State.

    Attributes:
        head: The head it last read or wrote, a tombstone head too (``None``: none yet).
        etag: That head's ETag.
        unsure: The wids of head PUTs whose answer never came: a head holding one is its own.
        at: When the process learned ``head``, on :meth:`Memory.tick`'s clock.

    A tombstone head read or written is kept as any head: a save on it is refused before it
    sends anything, and a create of the id replaces it with ``If-Match``.
    """

    head: Head | None = None
    etag: str | None = None
    unsure: frozenset[str] = frozenset()
    at: int = 0


class Bodies:
    """The bodies of parts, least recently used dropped first beyond a size in bytes."""

    def __init__(self, limit: int = BODIES_LIMIT) -> None:
        self._limit = limit
        self._size = 0
        self._kept: OrderedDict[tuple[str, str], bytes] = OrderedDict()
        self._guard = threading.Lock()

    def after_fork(self) -> None:
        """In a forked child: a thread of the parent may have held the lock."""
        self._guard = threading.Lock()

    def get(self, bucket: str, key: str) -> bytes | None:
        """The body kept for ``key``, or ``None``."""
        with self._guard:
            body = self._kept.get((bucket, key))
            if body is not None:
                self._kept.move_to_end((bucket, key))
            return body

    def put(self, bucket: str, key: str, body: bytes) -> None:
        """Keep ``body`` (a body larger than the limit is not kept)."""
        if len(body) > self._limit:
            return
        with self._guard:
            old = self._kept.pop((bucket, key), None)
            self._size += len(body) - (len(old) if old is not None else 0)
            self._kept[(bucket, key)] = body
            while self._size > self._limit:
                _, dropped = self._kept.popitem(last=False)
                self._size -= len(dropped)

    def drop(self, bucket: str, keys: list[str]) -> None:
        """Forget the bodies of ``keys`` (deleted objects)."""
        with self._guard:
            for key in keys:
                old = self._kept.pop((bucket, key), None)
                if old is not None:
                    self._size -= len(old)


@dataclass
class Memory:
    """One process's knowledge of States (see the module); :data:`MEMORY` is the process's."""

    bodies: Bodies = field(default_factory=Bodies)
    checked: set[tuple[str, str]] = field(default_factory=set)  # (endpoint, bucket) checked
    _seen: dict[tuple[Scope, str], Seen] = field(default_factory=dict)
    _lists: OrderedDict[Scope, dict[str, tuple[str, Any]]] = field(default_factory=OrderedDict)
    _locks: LockRegistry = field(default_factory=LockRegistry)
    _guard: threading.Lock = field(default_factory=threading.Lock)
    _clock: int = 0

    def __post_init__(self) -> None:
        # A child forked while a thread held a lock would wait for it forever.
        if hasattr(os, "register_at_fork"):  # not on Windows, which does not fork
            os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        self._locks = LockRegistry()
        self._guard = threading.Lock()
        self.bodies.after_fork()

    def lock(self, scope: Scope, state_id: str) -> HandoffLock:
        """The lock the saves and deletes of one State hold in this process."""
        return self._locks.get(f"{scope}\0{state_id}")

    def tick(self) -> int:
        """The process's clock: a number larger than any it gave before."""
        with self._guard:
            self._clock += 1
            return self._clock

    def seen(self, scope: Scope, state_id: str) -> Seen:
        """What the process knows of a State."""
        with self._guard:
            return self._seen.get((scope, state_id), Seen())

    def wrote(self, scope: Scope, state_id: str, head: Head, etag: str) -> None:
        """A save committed ``head``: it is the base from now on, and nothing is unsure."""
        at = self.tick()
        with self._guard:
            self._seen[(scope, state_id)] = Seen(head, etag, frozenset(), at)

    def read(self, scope: Scope, state_id: str, head: Head, etag: str, sent: int) -> None:
        """A GET sent at ``sent`` (:meth:`tick`) read ``head``: the base, unless it is older.

        It is newer than the base if it is a later revision of the base's incarnation, or if it
        was sent after the process learned the base. Otherwise (a load that ran beside a save
        or another load of this process) it may be older, and the base stays: the base never
        goes back.
        """
        with self._guard:
            seen = self._seen.get((scope, state_id), Seen())
            known = seen.head
            later = known is not None and known.inc == head.inc and head.rev >= known.rev
            if known is None or later or sent > seen.at:
                at = max(sent, seen.at)
                self._seen[(scope, state_id)] = Seen(head, etag, seen.unsure, at)

    def last_list(self, scope: Scope) -> Mapping[str, tuple[str, Any]]:
        """What the last list of a store read: by State id, its head's ETag and its summary."""
        with self._guard:
            return self._lists.get(scope, {})

    def listed(self, scope: Scope, summaries: dict[str, tuple[str, Any]]) -> None:
        """A list's summaries, by id with their heads' ETags; they replace the last list's.

        Never a base: a list's GETs move no save's base. Kept for the :data:`LISTS_LIMIT`
        stores listed last.
        """
        with self._guard:
            self._lists[scope] = summaries
            self._lists.move_to_end(scope)
            while len(self._lists) > LISTS_LIMIT:
                self._lists.popitem(last=False)

    def unsure(self, scope: Scope, state_id: str, wid: str) -> None:
        """A head PUT of the save ``wid`` ended without a clear answer."""
        with self._guard:
            seen = self._seen.get((scope, state_id), Seen())
            self._seen[(scope, state_id)] = replace(seen, unsure=seen.unsure | {wid})

    def settled(self, scope: Scope, state_id: str, *, forget: bool = False) -> None:
        """The head was read after unsure PUTs: whether they landed is known now.

        With ``forget``, the base is dropped too (a create found to have landed under heads
        it never read): the next save reads the head as a fresh process's does.
        """
        with self._guard:
            seen = self._seen.get((scope, state_id))
            if seen is not None:
                head, etag = (None, None) if forget else (seen.head, seen.etag)
                self._seen[(scope, state_id)] = replace(
                    seen, head=head, etag=etag, unsure=frozenset()
                )


@dataclass(frozen=True)
class Ctx:
    """What an operation of one store needs: its keys, the memory and its scope in it.

    Attributes:
        layout: The store's keys and calls.
        memory: The process's memory (:data:`MEMORY`).
        scope: The store's identity: (endpoint, bucket, prefix).
        trust: Skip the engine check (``trust_conditional_writes=True``).
    """

    layout: Layout
    memory: Memory
    scope: Scope
    trust: bool = False

    def seen(self, state_id: str) -> Seen:
        """What the process knows of a State of this store."""
        return self.memory.seen(self.scope, state_id)

    @property
    def engine_checked(self) -> bool:
        """Whether the engine check is done for this store's bucket, or skipped (invariant 11)."""
        return self.trust or (self.layout.endpoint, self.layout.bucket) in self.memory.checked

    def engine_passed(self) -> None:
        """The engine check passed for this store's bucket: not made again in this process."""
        self.memory.checked.add((self.layout.endpoint, self.layout.bucket))


#: The process's memory: every S3Store object uses it (``testing.separate_process`` aside).
MEMORY: Final = Memory()
