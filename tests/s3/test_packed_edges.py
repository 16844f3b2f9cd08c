"""Packed segments at the edges of the listings that find them, on moto and on LocalStack.

A load lists a State's ``packed/`` prefix (every page of it) and the first page of its entries
(``FIRST_PAGE`` keys), then lists the entries after the segments with ``StartAfter``, page after
page. Here the pages are made small, so that a few dozen objects take every path a State of
thousands does: the segments span several pages of ``packed/``; the segments end just before,
at or just after the last key of the first page of entries; the entries after them end at a page
boundary; the entries a segment covers are kept or removed; entries were saved after the pack.
Each load must return the State as saved, with the requests counted.

Pages are made small two ways: ``FIRST_PAGE`` (a module constant of ``_reading``) is set, and a
``before-parameter-build`` hook lowers ``MaxKeys`` of the reader's other listings, as S3 does
when it answers with fewer keys. The pack cuts where a test says (``_packing.cut`` is replaced),
so segment boundaries fall exactly where each case needs them.
"""

from __future__ import annotations

import math
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

from alpineagents import State
from alpineagents.testing import StoreIO
from alpineagents_s3 import S3Store, _packing, _reading
from alpineagents_s3.testing import RequestLog
from tests.helpers import Mode, entry_dicts, snapshot_dict
from tests.s3.helpers import Stores, load, objects, pack, raw_client, run, save

if TYPE_CHECKING:
    from types_boto3_s3 import S3Client


# Tools ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Listing:
    """One ListObjectsV2 call as the store made it (after the page size was lowered)."""

    prefix: str
    start_after: str | None
    continued: bool
    max_keys: int

    @property
    def packed(self) -> bool:
        """Whether it lists a State's packed segments."""
        return self.prefix.endswith("/packed/")


class Listings:
    """A ``before-parameter-build.s3.ListObjectsV2`` hook: records every listing, and lowers
    ``MaxKeys`` to ``packed`` for listings of ``packed/`` and to ``entries`` for the others."""

    def __init__(self, *, packed: int | None = None, entries: int | None = None) -> None:
        self.packed, self.entries = packed, entries
        self.made: list[Listing] = []
        self._lock = threading.Lock()

    def __call__(self, params: dict[str, Any], **kwargs: Any) -> None:
        prefix = params["Prefix"]
        cap = self.packed if prefix.endswith("/packed/") else self.entries
        if cap is not None:
            params["MaxKeys"] = min(params.get("MaxKeys", 1000), cap)
        listing = Listing(
            prefix,
            params.get("StartAfter"),
            "ContinuationToken" in params,
            params.get("MaxKeys", 1000),
        )
        with self._lock:
            self.made.append(listing)

    @property
    def hooks(self) -> dict[str, Callable[..., Any]]:
        """The hook, for ``S3Store(event_hooks=...)``."""
        return {"before-parameter-build.s3.ListObjectsV2": self}

    def of_packed(self) -> list[Listing]:
        """The listings of ``packed/``."""
        return [listing for listing in self.made if listing.packed]

    def of_entries(self) -> list[Listing]:
        """The listings of entries."""
        return [listing for listing in self.made if not listing.packed]


def cut_at(*bounds: int) -> Callable[[int, Sequence[int]], list[tuple[int, int]]]:
    """A replacement of ``_packing.cut`` that starts a new segment at each of ``bounds``."""

    def cut(first: int, sizes: Sequence[int]) -> list[tuple[int, int]]:
        end = first + len(sizes)
        points = [first, *sorted(b for b in bounds if first < b < end), end]
        return list(zip(points, points[1:], strict=False))

    return cut


def seq_of(key: str) -> int:
    """The seq an entry key names."""
    return int(key.rsplit("/", 1)[1].removesuffix(".json"))


def span(key: str) -> tuple[int, int]:
    """The entries a segment key names: ``(start, end)``."""
    start, end = key.rsplit("/", 1)[1].removesuffix(".json").split("-")
    return int(start), int(end)


@dataclass
class Server:
    """Store objects on one S3 implementation, and a plain client on it."""

    name: str
    stores: Stores
    client: S3Client


@pytest.fixture(params=["moto", pytest.param("localstack", marks=pytest.mark.integration)])
async def server(request: pytest.FixtureRequest) -> AsyncIterator[Server]:
    """Store objects on moto's server, and on LocalStack when it runs."""
    url = request.getfixturevalue(f"{request.param}_url")
    stores = Stores(
        url,
        request.getfixturevalue(f"{request.param}_bucket"),
        request.getfixturevalue("boto_session"),
    )
    client = raw_client(url)
    try:
        yield Server(request.param, stores, client)
    finally:
        client.close()
        await stores.close()


async def write_and_pack(
    stores: Stores,
    mode: Mode,
    state_id: str,
    *,
    packed: int,
    bounds: Sequence[int] = (),
    remove: bool = False,
    after: int = 0,
) -> list[tuple[int, int]]:
    """Save ``packed`` entries, pack them cut at ``bounds``, then save ``after`` more.

    Returns the segments written, as ``(start, end)``.
    """
    io = stores.io(mode)
    await io.write(state_id, entry_dicts(0, packed), snapshot_dict(state_id, packed), create=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_packing, "cut", cut_at(*bounds))
        done = await pack(stores.new(), mode, state_id, remove_entries=remove)
    segments = sorted(span(key) for key in done.written)
    assert done.covered == packed and segments[0][0] == 0 and segments[-1][1] == packed
    assert len(done.removed) == (packed if remove else 0)
    if after:
        total = packed + after
        await io.write(state_id, entry_dicts(packed, total), snapshot_dict(state_id, total))
    return segments


async def read_back(
    stores: Stores, mode: Mode, state_id: str, total: int, listings: Listings
) -> RequestLog:
    """Read the State with a new store object: the entries and snapshot must be as saved."""
    log = RequestLog()
    reader = stores.new(event_hooks={**log.hooks, **listings.hooks})
    record = await StoreIO(reader, mode).read(state_id)
    assert record is not None
    assert list(record.entries) == entry_dicts(0, total)
    assert record.snapshot == snapshot_dict(state_id, total)
    return log


# 1. More segments than one page of packed/ -------------------------------------------------


@pytest.mark.parametrize("remove", [False, True], ids=["kept", "removed"])
async def test_segments_over_several_pages_of_the_packed_listing(
    mode: Mode, server: Server, remove: bool
) -> None:
    """7 segments listed 2 a page: every segment is read once, the State is the same.

    A load lists ``packed/`` once with the snapshot GET; the page is truncated, so it lists
    the prefix again from its start, page after page (``_reading.list_all``): the first page
    is listed twice, 1 + 4 listings of ``packed/`` for 4 pages. Then a pack whose own listing
    comes in pages of 2 merges the 7 small segments into one and removes all 7.
    """
    stores = server.stores
    segments = await write_and_pack(
        stores, mode, "paged", packed=14, bounds=range(2, 14, 2), remove=remove, after=3
    )
    assert len(segments) == 7
    listings = Listings(packed=2)
    log = await read_back(stores, mode, "paged", 17, listings)
    pages = math.ceil(len(segments) / 2)
    packed = listings.of_packed()
    assert [(p.max_keys, p.continued) for p in packed] == [(2, False)] * 2 + [(2, True)] * (
        pages - 1
    )
    # The entries: one page of FIRST_PAGE keys holds them all (the 3 saved after the pack).
    assert len(listings.of_entries()) == 1
    got = [r.path for r in log.requests if r.kind == "GET"]
    assert sorted(span(path) for path in got if "/packed/" in path) == segments
    assert sorted(seq_of(path) for path in got if "/entries/" in path) == [14, 15, 16]
    assert log.counts() == {"GET": 1 + 7 + 3, "LIST": pages + 2}

    # A pack that lists packed/ in pages of 2 takes every small segment in.
    packer = stores.new(event_hooks=Listings(packed=2).hooks)
    merged = await pack(packer, mode, "paged", remove_entries=remove)
    assert [span(key) for key in merged.written] == [(0, 17)]
    old = {key for key in merged.removed if "/packed/" in key}
    assert sorted(span(key) for key in old) == segments
    found = await objects(stores.io(mode), "paged")
    assert [span(o.key) for o in found if o.kind == "segment"] == [(0, 17)]
    log = await read_back(stores, mode, "paged", 17, Listings(packed=2))
    assert log.counts()["GET"] == 2


# 2. The entries listed after the segments ------------------------------------------------

# The first listing of entries holds FIRST_PAGE keys; the pages after it ENTRY_PAGE keys.
FIRST = 4
ENTRY_PAGE = 5


@dataclass(frozen=True)
class Edge:
    """A State packed up to ``packed`` (segments cut at ``bounds``), ``after`` entries saved
    after the pack, and the listings and entry GETs a load of it makes."""

    packed: int
    bounds: tuple[int, ...]
    remove: bool
    after: int
    lists: int

    @property
    def total(self) -> int:
        return self.packed + self.after


EDGES = {
    # Entries kept: the first page lists seqs 0-3 and is truncated, so the entries after the
    # segments are listed with StartAfter (the last seq the segments hold), ENTRY_PAGE a page.
    "kept-segments-end-before-the-first-pages-last-key": Edge(3, (1,), False, 9, 2 + 2),
    "kept-segments-end-at-the-first-pages-last-key": Edge(4, (2,), False, 8, 2 + 2),
    "kept-segments-end-one-past-the-first-pages-last-key": Edge(5, (2,), False, 7, 2 + 2),
    "kept-segments-end-well-past-the-first-page": Edge(9, (4,), False, 2, 2 + 1),
    "kept-entries-after-fill-one-page-exactly": Edge(4, (), False, 5, 2 + 1),
    "kept-entries-after-fill-two-pages-exactly": Edge(4, (), False, 10, 2 + 2),
    "kept-all-packed-nothing-after": Edge(12, (4, 8), False, 0, 2 + 1),
    # The whole State in the first page: nothing listed again.
    "kept-all-within-the-first-page": Edge(2, (), False, 2, 2),
    # Entries removed: the first page starts at the segments' end; it is listed again with
    # StartAfter only when it is truncated.
    "removed-nothing-after": Edge(12, (4, 8), True, 0, 2),
    "removed-after-fill-the-first-page-exactly": Edge(4, (), True, 4, 2),
    "removed-after-one-past-the-first-page": Edge(4, (), True, 5, 2 + 1),
    "removed-after-over-three-pages": Edge(6, (3,), True, 11, 2 + 3),
}


@pytest.mark.parametrize("edge", list(EDGES.values()), ids=list(EDGES))
async def test_entries_listed_after_the_segments(
    mode: Mode, server: Server, edge: Edge, monkeypatch: pytest.MonkeyPatch
) -> None:
    stores = server.stores
    segments = await write_and_pack(
        stores,
        mode,
        "edge",
        packed=edge.packed,
        bounds=edge.bounds,
        remove=edge.remove,
        after=edge.after,
    )
    assert len(segments) == len(edge.bounds) + 1
    monkeypatch.setattr(_reading, "FIRST_PAGE", FIRST)
    listings = Listings(entries=ENTRY_PAGE)
    log = await read_back(stores, mode, "edge", edge.total, listings)
    entries = listings.of_entries()
    assert entries[0].max_keys == FIRST and entries[0].start_after is None
    # Every other listing goes on from the last seq the segments hold, or from a page before.
    starts = [seq_of(e.start_after) for e in entries if e.start_after is not None]
    assert starts == ([edge.packed - 1] if len(entries) > 1 else []), entries
    assert all(e.max_keys == ENTRY_PAGE for e in entries[1:])
    got = [r.path for r in log.requests if r.kind == "GET"]
    assert sorted(span(path) for path in got if "/packed/" in path) == segments
    # No entry a segment holds is fetched from its own object.
    assert sorted(seq_of(p) for p in got if "/entries/" in p) == list(
        range(edge.packed, edge.total)
    )
    assert log.counts() == {"GET": 1 + len(segments) + edge.after, "LIST": edge.lists}
