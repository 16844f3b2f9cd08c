"""The least a load of a history can cost on this machine, whatever the store: the bound rows.

A load that gives a State back fetches every byte of its history, parses it and builds one
``HistoryEntry`` per entry. The two rows of ``bench/table.py`` that this module measures do
that and nothing else a store does: no check of any field, no snapshot to apply, no listing
of single entries, and Python's cyclic garbage collector off from the first request to the
last entry built. The history is stored as a small head object (as a snapshot would be) and
the entries' JSON cut into a few parts as ``S3Store.pack`` cuts segments (one part per MiB,
four when there are more than 4 MiB), each part parsed by pydantic_core (the parser S3Store
uses for segments) in the thread that fetched it, as its body arrives.

- ``bound: 2 rounds, no checks``: the head GET and the LIST of the parts at once, then the
  parts. The keys of a State's segments cannot be known before a read names them (their
  generation is random, their ranges depend on the packs), so this is the least a *first*
  load can do.
- ``bound: 1 round, no checks``: the head and the parts, keys known beforehand, at once: the
  least a load by a store object that read the State before can do.

So a store's row over the floor (one GET of all the bytes) can be read against what no store
can beat here: the gap between the bound and the floor is this machine's cost of parsing the
bytes and building the entries, the gap between the store and the bound is the store's.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

from pydantic_core import from_json

from alpineagents import HistoryEntry
from alpineagents._gc import paused  # the collector off (the core's pause of a load)

PART_BYTES = 1 << 20  # as S3Store.pack: about 1 MiB a segment ...
PARTS_AT_MOST = 4  # ... and four when there are more than 4 MiB

FIRST_LOAD = "bound: 2 rounds, no checks"
KNOWN_KEYS = "bound: 1 round, no checks"


def cut(bodies: Sequence[bytes]) -> list[list[bytes]]:
    """The entries' JSON ``bodies`` in parts: of about 1 MiB, or four when over 4 MiB."""
    total = sum(map(len, bodies))
    parts = max(1, -(-total // PART_BYTES))
    if parts > PARTS_AT_MOST:
        parts = PARTS_AT_MOST
    share = -(-total // parts)
    out: list[list[bytes]] = [[]]
    size = 0
    for body in bodies:
        if size >= share and len(out) < parts:
            out.append([])
            size = 0
        out[-1].append(body)
        size += len(body)
    return out


class Bound:
    """A history stored as a head and a few parts under ``prefix``, and its two loads."""

    def __init__(self, client: Any, bucket: str, prefix: str, parts: int) -> None:
        self.client = client
        self.bucket = bucket
        self.head = f"{prefix}head.json"
        self.folder = f"{prefix}parts/"
        self.keys = [f"{self.folder}{i:04d}.json" for i in range(parts)]
        self.pool = ThreadPoolExecutor(max_workers=min(32, parts + 1))
        self.read = 0  # the bytes of one load: set by put()

    @classmethod
    def put(cls, client: Any, bucket: str, prefix: str, entries: Sequence[dict[str, Any]]) -> Bound:
        """Store ``entries`` (entry dicts, as a store is given them) under ``prefix``."""
        bodies = [json.dumps(e, separators=(",", ":")).encode() for e in entries]
        parts = cut(bodies)
        bound = cls(client, bucket, prefix, len(parts))
        head = json.dumps({"entries": len(entries), "parts": len(parts)}).encode()
        client.put_object(Bucket=bucket, Key=bound.head, Body=head)
        bound.read = len(head)
        for key, part in zip(bound.keys, parts, strict=True):
            body = b"[" + b",".join(part) + b"]"
            client.put_object(Bucket=bucket, Key=key, Body=body)
            bound.read += len(body)
        return bound

    def first_load(self) -> list[HistoryEntry]:
        """Round 1: the head and the listing of the parts; round 2: the parts."""
        with paused():
            head = self.pool.submit(self._get, self.head)
            listed = self.client.list_objects_v2(Bucket=self.bucket, Prefix=self.folder)
            keys = sorted(item["Key"] for item in listed.get("Contents", ()))
            head.result()
            return _built(list(self.pool.map(self._get_parsed, keys)))

    def known_load(self) -> list[HistoryEntry]:
        """One round: the head and the parts, whose keys are known, at once."""
        with paused():
            head = self.pool.submit(self._get, self.head)
            parts = list(self.pool.map(self._get_parsed, self.keys))
            head.result()
            return _built(parts)

    def requests(self, first: bool) -> dict[str, int]:
        """The requests of one load, by kind, as the table counts them."""
        return {"GET": 1 + len(self.keys), **({"LIST": 1} if first else {})}

    def close(self) -> None:
        self.pool.shutdown()

    def _get(self, key: str) -> bytes:
        body: bytes = self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        return body

    def _get_parsed(self, key: str) -> list[dict[str, Any]]:
        parsed: list[dict[str, Any]] = from_json(self._get(key), cache_strings=True)
        return parsed


def _built(parts: Sequence[Sequence[dict[str, Any]]]) -> list[HistoryEntry]:
    """One HistoryEntry per entry dict, with none of the checks a load makes."""
    when: Callable[[str], datetime] = datetime.fromisoformat
    return [
        HistoryEntry(d["seq"], d["kind"], d["text"], d["data"], None, when(d["at"]))
        for part in parts
        for d in part
    ]
