"""What one S3Store object knows of the States it wrote or read: versions, orphans, pending creates.

A later snapshot is written with ``If-Match`` on the ETag this store object last wrote or read
(its :class:`Version`), so a second writer is refused instead of overwritten. A read keeps the
ETag it finds only if it is not the one held already (:meth:`Ledger.remember`).

An *orphan* is an entry object beyond a gap in the seqs: a save whose entries are PUT in parallel
was stopped halfway (the process was killed), so seq 3 may be stored and seqs 1-2 not. A read
returns only the unbroken run from seq 0; the orphans are never part of the State, and the next
write that fills the gap first replaces them (``If-Match`` on their ETags) or removes them.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from alpineagents_s3._lock import HandoffLock, LockRegistry
from alpineagents_s3._refs import Texts
from alpineagents_s3._segments import Known

T = TypeVar("T")


@dataclass(frozen=True)
class Version:
    """What this store object knows of one State.

    Attributes:
        etag: The ETag of the snapshot this store object last wrote or read: the next snapshot
            is written with ``If-Match`` on it.
        generation: That snapshot's generation.
        gap: The length of the unbroken run of entries from seq 0, as the last read found it.
        orphans: Entries beyond ``gap`` the last read listed: seq -> ETag.
        floor: The history length of the State as this store object last read it after another
            writer changed it. A copy loaded by that read saves from seq ``floor`` on; a save
            from a lower seq comes from a copy older than the other writer's save, and is
            refused like a stale ``If-Match``.
        count: How many entries from seq 0 on are stored, as far as this store object knows;
            written into the snapshot's metadata, so a reader can tell a listing that missed
            some.
        unsure: Tokens of snapshot PUTs that failed without an answer since the last one that
            landed: S3 may have applied them, so finding one of them stored means "our own".
        refused: The first write of this store object came from a copy behind the stored
            snapshot: every later write is refused until it reads the State again.
        landed: The count of the snapshot this store object last wrote or read: the entries
            below it are final, and may be packed and their objects removed, so a save that
            sends one of them again is checked against what is stored, not by its PUT.
        layout: The layout of that snapshot (3: entries may be committed alone after it).
        open: Whether that snapshot is open (layout 3: saves committed by their entry alone
            may carry changes of it).
        own: Whether that snapshot is this store object's own write (a create, a save, a
            claim), not one it read: only then may a save commit by its entry alone.
        tail: Entries this store object committed alone after that snapshot: seq -> digest of
            the body (layout 3).
        tail_writer: The writer of the entries committed alone after that snapshot, as this
            store object knows them (``None``: none).
    """

    etag: str
    generation: str
    gap: int | None = None
    orphans: Mapping[int, str] = field(default_factory=dict)
    floor: int = 0
    count: int | None = None
    unsure: frozenset[str] = frozenset()
    refused: bool = False
    landed: int = 0
    layout: int = 1
    open: bool = False
    own: bool = False
    tail: Mapping[int, str] = field(default_factory=dict)
    tail_writer: str | None = None

    def wrote(self, generation: str, token: str | None) -> bool:
        """Whether a stored snapshot of ``generation`` and ``token`` is a PUT of this store object.

        One of its PUTs whose answer was lost: the State is still this store object's own.
        """
        return generation == self.generation and token in self.unsure

    def landed_as(self, etag: str, count: int | None) -> Version:
        """The Version after a snapshot PUT of this store object landed as ``etag``.

        Nothing is unsure any more, and the ``count`` entries that snapshot counts are final.
        """
        return replace(self, etag=etag, unsure=frozenset(), landed=max(self.landed, count or 0))

    def checkpoint(self, etag: str, count: int | None, open: bool) -> Version:
        """The Version after a snapshot PUT of this store object (layout 3) landed as ``etag``.

        It counts every entry stored so far: nothing is committed alone after it yet.
        """
        landed = self.landed_as(etag, count)
        return replace(landed, layout=3, open=open, own=True, tail={}, tail_writer=None)


@dataclass(frozen=True)
class Effective:
    """The snapshot a load would give after the entries a store object knows of (layout 3).

    The stored snapshot with the changes of the entries committed alone after it applied:
    what a save committing by its entry alone diffs its snapshot against. Valid for the
    Version with the same ``etag``, ``generation`` and ``count``.
    """

    etag: str
    generation: str
    count: int | None
    snapshot: dict[str, Any]

    def of(self, version: Version) -> bool:
        """Whether this is the effective snapshot of ``version``."""
        return (self.etag, self.generation, self.count) == (
            version.etag,
            version.generation,
            version.count,
        )


@dataclass(frozen=True)
class PendingCreate:
    """A create of this store object whose snapshot PUT failed without a clear answer.

    A later create of the same id recognises its tokens, so a create that S3 applied but whose
    answer was lost is not taken for a taken id. (Each attempt writes its entries under a
    generation of its own, ``generation`` being the latest.)
    """

    generation: str
    tokens: frozenset[str]


# How many States' texts a store object keeps (``Ledger.know_texts``): each costs about 200 B
# a long text of its snapshot's context; a save of one it forgot GETs the snapshot first.
TEXT_STATES = 128
# How many States' chains of segments a store object keeps (``Ledger.know_chain``): a few
# hundred bytes each; a read of one it forgot lists the segments before it GETs them.
CHAIN_STATES = 256
# How many States' effective snapshots a store object keeps (``Ledger.know_effective``); a
# save of one it forgot replaces the snapshot instead of committing by its entry alone.
EFFECTIVE_STATES = 128


@dataclass
class Ledger:
    """The Versions and pending creates of one store object, its per-State locks, its token."""

    versions: dict[str, Version] = field(default_factory=dict)
    pending_creates: dict[str, PendingCreate] = field(default_factory=dict)
    locks: LockRegistry = field(default_factory=LockRegistry)
    # The long texts of each State's history its snapshots may refer to (``_refs``), for the
    # States this store object saved or read last (at most ``TEXT_STATES``).
    texts: dict[str, Texts] = field(default_factory=dict)
    # The effective snapshot of each State (layout 3) for the States saved or read last.
    effective: dict[str, Effective] = field(default_factory=dict)
    # One lock per State: the saves of one State by this store object go one at a time, so
    # the entries it commits alone are stored in seq order.
    appends: LockRegistry = field(default_factory=LockRegistry)
    # The chain of segments the last read of each State read, for the States read last.
    chains: dict[str, Known] = field(default_factory=dict)
    # Names this store object as the writer of the entries it stores.
    writer: str = field(default_factory=lambda: uuid.uuid4().hex[:16])

    def forget(self, state_id: str) -> None:
        """Forget what this store object knew of a State (it is being deleted).

        Its Version, effective snapshot, texts and chain of segments: a State created again
        under the id is another generation, read afresh.
        """
        self.versions.pop(state_id, None)
        self.effective.pop(state_id, None)
        self.texts.pop(state_id, None)
        self.chains.pop(state_id, None)

    def know_effective(self, state_id: str, effective: Effective | None) -> None:
        """Keep (or with ``None`` forget) a State's effective snapshot, a bounded number."""
        _keep(self.effective, state_id, effective, EFFECTIVE_STATES)

    def know_chain(self, state_id: str, known: Known | None) -> None:
        """Keep (or with ``None`` forget) the chain of segments a read of the State read."""
        _keep(self.chains, state_id, known, CHAIN_STATES)

    def effective_of(self, state_id: str, version: Version) -> Effective | None:
        """The State's effective snapshot if this store object knows it for ``version``."""
        found = self.effective.get(state_id)
        return found if found is not None and found.of(version) else None

    def know_texts(self, state_id: str, texts: Texts) -> None:
        """Keep ``texts`` for the State, forgetting those of the State least recently kept."""
        _keep(self.texts, state_id, texts, TEXT_STATES)

    def lock(self, state_id: str) -> HandoffLock:
        """The lock that keeps this store object's orphan clearing of one State exclusive."""
        return self.locks.get(state_id)

    def remember(
        self, state_id: str, held: Version | None, read: Version, gap: int, orphans: dict[int, str]
    ) -> None:
        """Record what a read found as the Version of the State.

        ``held`` is the Version when the read began. A write or read of this store object that
        finished meanwhile wins: its knowledge is newer. The same snapshot as ``held`` keeps
        the baseline and floor (a monitor's ``load`` of a running State changes nothing) and
        only updates the orphans. A different snapshot (another writer saved the State, or this
        store object meets it first) becomes the baseline, for the copy this read loads, with
        ``floor`` at its history length: the save of an older copy is refused.
        """
        if self.versions.get(state_id) is not held:
            return
        same = held is not None and (held.etag, held.generation) == (read.etag, read.generation)
        if held is not None and same and not held.refused:
            # A save of ours may be under way: its pending entries are not read, but stored.
            count = max(held.count or 0, gap)
            landed = max(held.landed, read.landed)
            # Entries another writer committed alone after it (layout 3): the run is theirs.
            tail_writer = held.tail_writer if read.tail_writer is None else read.tail_writer
            self.versions[state_id] = replace(
                held,
                gap=gap,
                orphans=orphans,
                count=count,
                landed=landed,
                tail_writer=tail_writer,
            )
            if count != held.count:  # entries no save of ours made: their changes unknown
                self.know_effective(state_id, None)
        else:
            self.versions[state_id] = replace(read, gap=gap, orphans=orphans, floor=gap, count=gap)

    def stored(self, state_id: str, seqs: set[int]) -> None:
        """Record that the entries ``seqs`` are stored: no longer orphans, counted.

        A new Version object: a read that began before these PUTs landed does not record what
        it listed (it could take them for orphans).
        """
        current = self.versions.get(state_id)
        if current is None or not seqs:
            return
        self.versions[state_id] = replace(
            current,
            orphans={k: v for k, v in current.orphans.items() if k not in seqs},
            count=max(current.count or 0, max(seqs) + 1),
        )


def _keep(kept: dict[str, T], state_id: str, value: T | None, limit: int) -> None:
    """Keep ``value`` for the State as the newest (``None``: forget it), at most ``limit``."""
    kept.pop(state_id, None)
    if value is None:
        return
    kept[state_id] = value
    while len(kept) > limit:
        del kept[next(iter(kept))]


def first_seq(entries: Sequence[dict[str, Any]]) -> int:
    """The lowest seq of a non-empty list of entries."""
    return min(int(entry["seq"]) for entry in entries)


def unbroken_run(seqs: Mapping[int, Any]) -> int:
    """How many seqs from 0 on ``seqs`` has without a hole."""
    seq = 0
    while seq in seqs:
        seq += 1
    return seq
