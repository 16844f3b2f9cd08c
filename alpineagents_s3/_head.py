"""The head: a State's one commit point (docs/protocol.md, invariant 1).

A State is exactly what its head names: ``count`` entries, held in order by the ``parts`` (entry
objects and segments), and the snapshot. :meth:`Head.decode` is the only reader of a head and
checks all of that; :meth:`Head.encode` the only writer. Nothing else is ever read as part of a
State. A delete replaces the head with a tombstone head (:meth:`Head.tombstone`), which names
nothing: the key of a head is never deleted (invariant 12).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any, Final

from alpineagents_s3._codec import dumps, loads
from alpineagents_s3._keys import Layout
from alpineagents_s3.errors import CorruptStateError, SchemaVersionError

__all__ = ["FORMAT", "SMALLEST_HEAD", "Head", "Part"]

# The head's format. A newer one is refused with SchemaVersionError, never misread.
FORMAT: Final = 1
FORMAT_FIELD: Final = "alpineagents-s3"
_WID: Final = re.compile(r"[0-9a-f]{16}")
# Every head of a State is at least this long (padded with spaces), and a tombstone head is
# shorter (about 310 bytes at most): a listing passes over a smaller object without a GET
# (invariant 13).
SMALLEST_HEAD: Final = 512


@dataclass(frozen=True)
class Part:
    """One object that holds entries of a State: an entry (``first == last``) or a segment.

    Attributes:
        first: The seq of its first entry.
        last: The seq of its last entry.
        wid: The save that wrote it (its key holds it).
        kind: ``"e"`` for an entry object, ``"s"`` for a segment.
        size: Its size in bytes. The head records it, so that a save plans its packing
            without reading any body.
    """

    first: int
    last: int
    wid: str
    kind: str
    size: int = 0

    @property
    def count(self) -> int:
        """How many entries it holds."""
        return self.last - self.first + 1

    def key(self, layout: Layout, state_id: str, inc: str) -> str:
        """Its key."""
        if self.kind == "e":
            return layout.entry_key(state_id, inc, self.first, self.wid)
        return layout.segment_key(state_id, inc, self.first, self.last, self.wid)


@dataclass(frozen=True)
class Head:
    """The decoded head of one State.

    Attributes:
        state_id: The State's id.
        inc: Its incarnation: the wid of the save that created it.
        write: The wid of the save that wrote this head.
        after: The wid of the head it replaced (``None`` for the create): the heads of a State
            are one chain.
        rev: How many saves came before it since the State was created (0 for the create).
        parts: The objects that hold entries ``0`` to ``count - 1``, in seq order.
        snapshot: The snapshot (or info) dict, or ``None`` for a State created without one.
        deleted: A tombstone head: the incarnation ``inc`` was deleted, and there is no State.
    """

    state_id: str
    inc: str
    write: str
    after: str | None
    rev: int
    parts: tuple[Part, ...]
    snapshot: dict[str, Any] | None
    deleted: bool = False

    @property
    def count(self) -> int:
        """How many history entries the State has."""
        return self.parts[-1].last + 1 if self.parts else 0

    def keys(self, layout: Layout) -> list[str]:
        """The keys of the parts, in seq order."""
        return [part.key(layout, self.state_id, self.inc) for part in self.parts]

    def covering(self, first: int, last: int) -> list[Part]:
        """The parts that hold any of the entries ``first`` to ``last``."""
        return [part for part in self.parts if part.last >= first and part.first <= last]

    def tombstone(self, wid: str) -> Head:
        """The tombstone head the delete ``wid`` puts over this head."""
        return replace(
            self,
            write=wid,
            after=self.write,
            rev=self.rev + 1,
            parts=(),
            snapshot=None,
            deleted=True,
        )

    # Bytes ------------------------------------------------------------------------------

    def encode(self) -> bytes:
        """The head's body; each part with its size.

        A run of entry objects written by one save is one item, ``[first, last, wid, "e",
        [size, ...]]``; a segment is ``[first, last, wid, "s", size]``.
        """
        items: list[list[Any]] = []
        for part in self.parts:
            last = items[-1] if items else None
            if (
                part.kind == "e"
                and last is not None
                and last[3] == "e"
                and last[2] == part.wid
                and last[1] + 1 == part.first
            ):
                last[1] = part.last
                last[4].append(part.size)
            elif part.kind == "e":
                items.append([part.first, part.last, part.wid, "e", [part.size]])
            else:
                items.append([part.first, part.last, part.wid, "s", part.size])
        doc: dict[str, Any] = {
            FORMAT_FIELD: FORMAT,
            "id": self.state_id,
            "inc": self.inc,
            "write": self.write,
            "after": self.after,
            "rev": self.rev,
            "count": self.count,
            "parts": items,
            "snapshot": self.snapshot,
        }
        if self.deleted:
            doc["deleted"] = True
        body = dumps(doc, f"the snapshot of State {self.state_id!r}")
        if not self.deleted and len(body) < SMALLEST_HEAD:
            body += b" " * (SMALLEST_HEAD - len(body))  # JSON allows trailing spaces
        return body

    @classmethod
    def decode(cls, body: bytes, where: str, state_id: str) -> Head:
        """Read a head, checking all of it; ``where`` names the object in errors."""
        doc = loads(body, where)
        if not isinstance(doc, dict) or FORMAT_FIELD not in doc:
            raise CorruptStateError(f"{where} is not the head of an S3Store State")
        version = doc[FORMAT_FIELD]
        if type(version) is not int or version < 1:
            raise CorruptStateError(f"{where} has the head format {version!r}")
        if version > FORMAT:
            raise SchemaVersionError(
                f"{where} is a head of format {version}, newer than the installed "
                f"alpineagents-s3 reads ({FORMAT}): upgrade alpineagents-s3 to read it"
            )
        if doc.get("id") != state_id:
            raise CorruptStateError(
                f"{where} is the head of State {doc.get('id')!r}, not {state_id!r}: it was "
                "copied or damaged"
            )
        inc, write, rev, after = doc.get("inc"), doc.get("write"), doc.get("rev"), doc.get("after")
        snapshot, deleted = doc.get("snapshot"), doc.get("deleted", False)
        if (
            not (_is_wid(inc) and _is_wid(write) and type(rev) is int and rev >= 0)
            or not (after is None or _is_wid(after))
            or not (snapshot is None or type(snapshot) is dict)
            or type(deleted) is not bool
            or (deleted and (snapshot is not None or doc.get("parts") != []))
        ):
            raise CorruptStateError(
                f"{where} is a damaged head: its inc, write, rev, snapshot or deleted"
            )
        parts = tuple(_parts(doc.get("parts"), where))
        head = cls(state_id, str(inc), str(write), after, rev, parts, snapshot, deleted)
        if doc.get("count") != head.count:
            raise CorruptStateError(
                f"{where} is a damaged head: it counts {doc.get('count')!r} entries, its parts "
                f"hold {head.count}"
            )
        return head


def _is_wid(value: object) -> bool:
    return isinstance(value, str) and bool(_WID.fullmatch(value))


def _parts(items: object, where: str) -> Iterator[Part]:
    """The parts a head lists, runs of entry objects expanded; they must tile 0 to count - 1."""
    if not isinstance(items, list):
        raise CorruptStateError(f"{where} is a damaged head: its parts are not a list")
    expected = 0
    for item in items:
        if not (
            isinstance(item, list)
            and len(item) == 5
            and all(type(n) is int for n in item[:2])
            and _is_wid(item[2])
            and item[0] == expected
            and item[1] >= item[0]
            and _sized(item[3], item[4], item[1] - item[0] + 1)
        ):
            raise CorruptStateError(
                f"{where} is a damaged head: its part {item!r} does not continue at entry "
                f"{expected}"
            )
        first, last, wid, kind, size = item
        if kind == "e":
            yield from (Part(seq, seq, wid, "e", n) for seq, n in enumerate(size, first))
        else:
            yield Part(first, last, wid, "s", size)
        expected = last + 1


def _sized(kind: object, size: object, count: int) -> bool:
    """A segment's size, or the sizes of a run of ``count`` entry objects (2 bytes or more)."""
    if kind == "e":
        sizes = size if isinstance(size, list) and len(size) == count else [None]
    else:
        sizes = [size] if kind == "s" else [None]
    return all(type(n) is int and n >= 2 for n in sizes)
