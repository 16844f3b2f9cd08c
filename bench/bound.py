"""What a load of a history costs at the least on this machine: the bound rows of the table.

A load that gives a State back fetches every byte of its history, parses it and builds one
``HistoryEntry`` per entry. The rows of ``bench/table.py`` that this module measures do that
and nothing else a store does: no check of any field, no snapshot to apply, no listing of
single entries, and Python's cyclic garbage collector off from the first request to the last
entry built. Each object is parsed by pydantic_core (the parser S3Store uses for segments)
in the thread that fetched it, once its body has arrived.

- ``bound: 2 rounds, no checks``: S3Store's layout at its least. A small head object (as the
  snapshot) and the entries' JSON in parts cut as ``S3Store.pack`` cuts segments; the head
  GET and the LIST of the parts at once, then the parts. A State's segment keys hold a random
  generation and the ranges its packs chose, so no reader knows them before a listing (or a
  snapshot) names them: this is the least a *first* load of that layout can do.
- ``bound: 1 round, no checks``: the same objects, keys known, all at once: the least a load
  by a store object that read the State before can do in that layout.
- ``bound: 1 GET, no checks``: one object of all the entries (the floor's object), parsed and
  built: the least a load of any layout can do, one that keeps the whole history in one object
  at a key known beforehand.

A store's ratio to the floor (one GET of all the bytes, unparsed) can then be read against
what its layout could do at best on the same machine in the same run: the gap between a bound
and the floor is the cost of parsing the bytes and building the entries there, and the gap
between a store and the bound of its layout is the store's own.
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
from alpineagents.history import plain_model_text
from alpineagents_s3._packing import cut as cut_segments

FIRST_LOAD = "bound: 2 rounds, no checks"
KNOWN_KEYS = "bound: 1 round, no checks"
ONE_OBJECT = "bound: 1 GET, no checks"


def cut(bodies: Sequence[bytes]) -> list[list[bytes]]:
    """The entries' JSON ``bodies`` in parts, as ``S3Store.pack`` cuts a first pack's segments."""
    return [list(bodies[start:end]) for start, end in cut_segments(0, list(map(len, bodies)))]


class Bound:
    """A history's objects in a bucket (a head and parts, or one object), and its loads."""

    def __init__(
        self, client: Any, bucket: str, head: str | None, folder: str, keys: Sequence[str]
    ) -> None:
        self.client = client
        self.bucket = bucket
        self.head = head
        self.folder = folder
        self.keys = list(keys)
        self.pool = ThreadPoolExecutor(max_workers=min(32, len(self.keys) + 1))

    @classmethod
    def put(
        cls,
        client: Any,
        bucket: str,
        prefix: str,
        entries: Sequence[dict[str, Any]],
        one_object: bool = False,
    ) -> Bound:
        """Store ``entries`` (entry dicts, as a store is given them) under ``prefix``: a head
        and parts cut as segments, or (``one_object``) one object of them all."""
        bodies = [json.dumps(e, separators=(",", ":")).encode() for e in entries]
        parts = [bodies] if one_object else cut(bodies)
        folder = f"{prefix}parts/"
        bound = cls(
            client,
            bucket,
            None if one_object else f"{prefix}head.json",
            folder,
            [f"{folder}{i:04d}.json" for i in range(len(parts))],
        )
        if bound.head is not None:
            head = json.dumps({"entries": len(entries), "parts": len(parts)}).encode()
            client.put_object(Bucket=bucket, Key=bound.head, Body=head)
        for key, part in zip(bound.keys, parts, strict=True):
            client.put_object(Bucket=bucket, Key=key, Body=b"[" + b",".join(part) + b"]")
        return bound

    def through(self, client: Any) -> Bound:
        """The same objects, read through ``client`` (another endpoint, counted requests)."""
        return Bound(client, self.bucket, self.head, self.folder, self.keys)

    def first_load(self) -> list[HistoryEntry]:
        """Round 1: the head and the listing of the parts, at once; round 2: the parts."""
        with paused():
            head = self.pool.submit(self._get, self.head) if self.head else None
            listed = self.client.list_objects_v2(Bucket=self.bucket, Prefix=self.folder)
            keys = sorted(item["Key"] for item in listed.get("Contents", ()))
            if head is not None:
                head.result()
            return _built(list(self.pool.map(self._get_parsed, keys)))

    def known_load(self) -> list[HistoryEntry]:
        """One round: the head and the parts, whose keys are known, at once."""
        with paused():
            head = self.pool.submit(self._get, self.head) if self.head else None
            if len(self.keys) == 1:  # one object: fetched and parsed in this thread
                parts = [self._get_parsed(self.keys[0])]
            else:
                parts = list(self.pool.map(self._get_parsed, self.keys))
            if head is not None:
                head.result()
            return _built(parts)

    def close(self) -> None:
        self.pool.shutdown()

    def _get(self, key: str) -> bytes:
        body: bytes = self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        return body

    def _get_parsed(self, key: str) -> list[dict[str, Any]]:
        parsed: list[dict[str, Any]] = from_json(self._get(key), cache_strings=True)
        return parsed


def _built(parts: Sequence[Sequence[dict[str, Any]]]) -> list[HistoryEntry]:
    """One HistoryEntry per entry dict, with none of the checks a load makes (a model entry
    stored without its text gets that of its text blocks, by the core's own function)."""
    when: Callable[[str], datetime] = datetime.fromisoformat
    return [
        HistoryEntry(
            d["seq"],
            d["kind"],
            d["text"] if "text" in d else plain_model_text(d["data"]) or "",
            d["data"],
            None,
            when(d["at"]),
        )
        for part in parts
        for d in part
    ]
