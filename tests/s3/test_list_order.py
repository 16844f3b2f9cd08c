"""No correctness from LIST order (docs/protocol.md, invariant 10), on moto's server listing as
an S3 Express directory bucket does: keys in no order, pages of a few keys, ``StartAfter`` and
prefixes that do not end in ``/`` refused.

The listing hooks act on the store's own clients: ``provide-client-params`` checks each
ListObjectsV2 request and asks for pages of 3 keys, ``after-call`` shuffles each page it gets
back. Saves that pack, loads in another process, ``list`` (with and without ``limit``),
``objects``, ``delete``, ``sweep`` and ``doctor`` all go through them. The model checker
(tests/protocol) lists unsorted too, request by request.
"""

from __future__ import annotations

import asyncio
import random
import threading
from typing import Any

from alpineagents import State
from alpineagents_s3 import S3Store
from tests.helpers import Mode, tool_turn
from tests.s3.helpers import Stores, objects


class DirectoryListing:
    """Lists as a directory bucket: refuses what one refuses, shuffles what it returns."""

    def __init__(self, seed: int = 7, page: int = 3):
        self.rng = random.Random(seed)
        self.page = page
        self.refused: list[dict[str, Any]] = []
        self.pages = 0
        self.shuffled = 0
        self._lock = threading.Lock()

    def request(self, params: dict[str, Any], **kwargs: Any) -> None:
        if "StartAfter" in params or not str(params.get("Prefix", "")).endswith("/"):
            with self._lock:
                self.refused.append(dict(params))
            raise ValueError(f"a directory bucket refuses this ListObjectsV2: {params}")
        params.setdefault("MaxKeys", self.page)

    def response(self, parsed: dict[str, Any], **kwargs: Any) -> None:
        contents = parsed.get("Contents")
        with self._lock:
            self.pages += 1
            if contents and len(contents) > 1:
                before = [c["Key"] for c in contents]
                while [c["Key"] for c in contents] == before:
                    self.rng.shuffle(contents)
                self.shuffled += 1

    @property
    def hooks(self) -> dict[str, Any]:
        return {
            "provide-client-params.s3.ListObjectsV2": self.request,
            "after-call.s3.ListObjectsV2": self.response,
        }


async def call(store: S3Store, mode: Mode, name: str, *args: Any, **kwargs: Any) -> Any:
    """``store.name(...)`` on a worker thread, or ``store.aname(...)``, by mode."""
    if mode == "async":
        return await getattr(store, "a" + name)(*args, **kwargs)
    return await asyncio.to_thread(getattr(store, name), *args, **kwargs)


async def test_every_operation_is_correct_on_unsorted_pages_without_start_after(
    mode: Mode, stores: Stores
) -> None:
    listing = DirectoryListing()
    writer = stores.io(mode, event_hooks=listing.hooks)
    # Several States, one long enough to pack (16 entries a segment) over many saves.
    states = [State(f"task {n}", id=f"dir-{n}") for n in range(5)]
    for turn in range(12):
        for state in states[: 1 + (turn % 5)]:
            tool_turn(state, turn)
            await writer.save(state)
    long = states[0]
    assert len(long.history) > 16

    reader = stores.io(mode, event_hooks=listing.hooks)  # another process
    for state in states:
        loaded = await reader.load(state.id)
        assert loaded.history == state.history

    listed = await reader.list()
    assert sorted(s.id for s in listed) == sorted(s.id for s in states)
    newest = [s.updated_at for s in listed]
    assert newest == sorted(newest, reverse=True)
    limited = await reader.list(limit=2)
    assert [s.id for s in limited] == [s.id for s in listed[:2]]

    store = reader.store
    assert isinstance(store, S3Store)
    found = await objects(reader, long.id)
    assert [o.key for o in found] == sorted(o.key for o in found)
    assert {o.role for o in found} == {"head", "segment", "entry"}

    # A leftover no head names, marked as the store's (a save that died): swept.
    part = next(o.key for o in found if o.role == "entry")
    leftover = part.replace(part.rsplit(".", 2)[1], "0123456789abcdef")
    client = store.client
    await asyncio.to_thread(
        client.put_object,
        Bucket=stores.bucket,
        Key=leftover,
        Body=b"{}",
        Metadata={"alpineagents-s3": "entry"},
    )
    assert await call(store, mode, "sweep", 0) == [leftover]

    deleted = await call(store, mode, "delete", long.id)
    assert deleted is not None and deleted.kept == ()
    assert not [k for k in await stores.keys() if k.startswith(f"runs/states/{long.id}/")]
    assert await reader.read(long.id) is None

    checks = await call(store, mode, "doctor")
    assert all(c.ok for c in checks), checks

    assert listing.refused == []
    assert listing.pages > 10 and listing.shuffled > 5  # the hooks did list, and shuffle
