"""Packed segments at the edges of the listings that find them, on moto and on LocalStack.

A load lists a State's ``packed/`` prefix (every page of it) and the first page of its entries
(``FIRST_PAGE`` keys), then lists the entries after the segments with ``StartAfter``, page after
page. Here the pages are made small, so that a few dozen objects take every path a State of
thousands does: the segments span several pages of ``packed/``; the segments end just before,
at or just after the last key of the first page of entries; the entries after them end at a page
boundary; the entries a segment covers are kept or removed; entries were saved after the pack.
Each load must return the State as saved, with the requests counted. These run on moto's server
and on LocalStack (the second S3 implementation, marked ``integration``), where a pack, a second
pack that merges, and a damaged segment are tried too. Last, adversarial layouts: State ids that
look like key names or prefix one another, stores nested inside a State's prefix, segments and
entries of other generations among the pages, segments merged by another pack while a load reads
them. (Deleting a State removes a store nested inside its folder: docs/s3.md, Limits.)

Pages are made small two ways: ``FIRST_PAGE`` (a module constant of ``_reading``) is set, and a
``before-parameter-build`` hook lowers ``MaxKeys`` of the reader's other listings, as S3 does
when it answers with fewer keys. The pack cuts where a test says (``_packing.cut`` is replaced),
so segment boundaries fall exactly where each case needs them.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import re
import threading
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import pytest

from alpineagents import State
from alpineagents.testing import StoreIO
from alpineagents_s3 import CorruptStateError, Packed, S3Store, _packing, _reading
from alpineagents_s3.testing import Request, RequestLog
from tests.helpers import Mode, entry_dicts, snapshot_dict
from tests.s3.helpers import Stores, load, objects, pack, raw_client, run, save

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


# Where the pack under way in this task or thread cuts (``None``: as S3Store does).
BOUNDS: ContextVar[tuple[int, ...] | None] = ContextVar("BOUNDS", default=None)


def cut_where_told(first: int, sizes: Sequence[int], at_least: int = 0) -> list[tuple[int, int]]:
    """``_packing.cut``, but a new segment starts at each seq of ``BOUNDS`` when it is set.

    A context variable, so that packs of several States at once (tasks, or threads started by
    ``asyncio.to_thread``, which copies the context) each cut where their case says."""
    bounds = BOUNDS.get()
    if bounds is None:
        return ORIGINAL_CUT(first, sizes, at_least)
    end = first + len(sizes)
    points = [first, *sorted(b for b in bounds if first < b < end), end]
    return list(itertools.pairwise(points))


ORIGINAL_CUT = _packing.cut


@pytest.fixture(autouse=True)
def _cuts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_packing, "cut", cut_where_told)


ENTRY_NAME = re.compile(r"[0-9a-f]+/([0-9]{10})\.json")
SEGMENT_NAME = re.compile(r"[0-9a-f]+/([0-9]{10})-([0-9]{10})\.json")


def seq_of(key: str) -> int:
    """The seq an entry key names."""
    match = ENTRY_NAME.search(key)
    assert match, key
    return int(match[1])


def span(key: str) -> tuple[int, int]:
    """The entries a segment key names: ``(start, end)``."""
    match = SEGMENT_NAME.search(key)
    assert match, key
    return int(match[1]), int(match[2])


def fetched(requests: Sequence[Request]) -> tuple[list[tuple[int, int]], list[int]]:
    """The segments and the entries GET, by their key's name, sorted."""
    got = [r.path.rsplit("/", 2) for r in requests if r.kind == "GET"]
    names = ["/".join(parts[-2:]) for parts in got]
    segments = sorted(span(n) for n in names if SEGMENT_NAME.fullmatch(n))
    entries = sorted(seq_of(n) for n in names if ENTRY_NAME.fullmatch(n))
    return segments, entries


@pytest.fixture(params=["moto", pytest.param("localstack", marks=pytest.mark.integration)])
async def server(request: pytest.FixtureRequest) -> AsyncIterator[Stores]:
    """Store objects on a new bucket of moto's server, and of LocalStack when it runs."""
    stores = Stores(
        request.getfixturevalue(f"{request.param}_url"),
        request.getfixturevalue(f"{request.param}_bucket"),
        request.getfixturevalue("boto_session"),
        request.getfixturevalue("aio_session"),
    )
    try:
        yield stores
    finally:
        await stores.close()


class Team:
    """A writer, a packer and a reader: three store objects, shared by the States of a test.

    Creating a store object's async client loads the S3 service model, so a test that runs a
    dozen States at once shares three. The reader records its listings and requests; ``read``
    returns those of one State."""

    def __init__(self, stores: Stores, mode: Mode, **pages: int) -> None:
        self.mode = mode
        self.io = stores.io(mode)
        self.packer = stores.new()
        self.listings = Listings(**pages)
        self.log = RequestLog()
        self.store = stores.new(event_hooks={**self.log.hooks, **self.listings.hooks})
        self.reader = StoreIO(self.store, mode)

    async def write_and_pack(
        self,
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
        snapshot = snapshot_dict(state_id, packed)
        await self.io.write(state_id, entry_dicts(0, packed), snapshot, create=True)
        BOUNDS.set(tuple(bounds))
        try:
            done = await pack(self.packer, self.mode, state_id, remove_entries=remove)
        finally:
            BOUNDS.set(None)
        segments = sorted(span(key) for key in done.written)
        assert done.covered == packed and segments[0][0] == 0 and segments[-1][1] == packed
        assert len(done.removed) == (packed if remove else 0)
        if after:
            total = packed + after
            await self.io.write(
                state_id, entry_dicts(packed, total), snapshot_dict(state_id, total)
            )
        return segments

    async def read(self, state_id: str, total: int) -> tuple[list[Listing], list[Request]]:
        """Read the State: its entries and snapshot must be as saved. Returns the listings
        (one a ListObjectsV2 request) and the other requests the reader made of this State so
        far (a request log names no listing's prefix)."""
        record = await self.reader.read(state_id)
        assert record is not None
        assert list(record.entries) == entry_dicts(0, total)
        assert record.snapshot == snapshot_dict(state_id, total)
        listings = [x for x in self.listings.made if x.prefix.startswith(f"runs/{state_id}/")]
        requests = [r for r in self.log.requests if f"/runs/{state_id}/" in r.path]
        return listings, requests


async def together(cases: dict[str, Awaitable[object]]) -> None:
    """Run ``cases`` at once; fail naming every case that failed."""
    outcomes = await asyncio.gather(*cases.values(), return_exceptions=True)
    failed = {
        name: outcome
        for name, outcome in zip(cases, outcomes, strict=True)
        if isinstance(outcome, BaseException)
    }
    for name, error in failed.items():
        if not isinstance(error, AssertionError):
            raise AssertionError(f"{name}: {type(error).__name__}: {error}") from error
    assert not failed, "\n\n".join(f"{name}: {error}" for name, error in failed.items())


# 1. More segments than one page of packed/ -------------------------------------------------


async def many_segments(team: Team, state_id: str, remove: bool) -> None:
    """7 segments listed 2 a page: every segment is read once, the State is the same.

    A load lists ``packed/`` once with the snapshot GET; the page is truncated, so it goes on
    from that page's continuation token, page after page (``_reading.list_all``): 4 listings
    of ``packed/`` for 4 pages, none twice. Then a pack whose own listing
    comes in pages of 2 merges the 7 small segments into one and removes all 7.
    """
    segments = await team.write_and_pack(
        state_id, packed=14, bounds=range(2, 14, 2), remove=remove, after=3
    )
    assert len(segments) == 7
    listings, requests = await team.read(state_id, 17)
    pages = math.ceil(len(segments) / 2)
    packed = [(x.max_keys, x.continued) for x in listings if x.packed]
    assert packed == [(2, False)] + [(2, True)] * (pages - 1)
    # The entries: one page of FIRST_PAGE keys holds them all (the 3 saved after the pack).
    assert len([x for x in listings if not x.packed]) == 1
    assert fetched(requests) == (segments, [14, 15, 16])
    assert Counter(r.kind for r in requests) == {"GET": 1 + 7 + 3}
    assert len(listings) == pages + 1

    # A pack that lists packed/ in pages of 2 takes every small segment in.
    merged = await pack(team.store, team.mode, state_id, remove_entries=remove)
    assert [span(key) for key in merged.written] == [(0, 17)]
    old = {key for key in merged.removed if SEGMENT_NAME.search(key)}
    assert sorted(span(key) for key in old) == segments
    found = await objects(team.io, state_id)
    assert [span(o.key) for o in found if o.kind == "segment"] == [(0, 17)]
    before = sum(f"/runs/{state_id}/" in r.path for r in team.log.requests)
    _, requests = await team.read(state_id, 17)
    assert fetched(requests[before:]) == ([(0, 17)], [])


async def test_segments_over_several_pages_of_the_packed_listing(
    mode: Mode, server: Stores
) -> None:
    """Entries kept and removed (two States at once)."""
    team = Team(server, mode, packed=2)
    await together(
        {
            "kept": many_segments(team, "paged-kept", False),
            "removed": many_segments(team, "paged-removed", True),
        }
    )


# 2. The entries listed after the segments ------------------------------------------------

# The first listing of entries holds FIRST keys (FIRST_PAGE); the pages after it ENTRY_PAGE.
FIRST = 2
ENTRY_PAGE = 3


@dataclass(frozen=True)
class Edge:
    """A State packed up to ``packed`` (segments cut at ``bounds``), ``after`` entries saved
    after the pack, and how many listings a load of it makes."""

    packed: int
    bounds: tuple[int, ...]
    remove: bool
    after: int
    lists: int

    @property
    def total(self) -> int:
        return self.packed + self.after


EDGES = {
    # Entries kept: the first page lists seqs 0-1 and is truncated, so the entries after the
    # segments are listed with StartAfter (the last seq the segments hold), ENTRY_PAGE a page.
    "kept-segments-end-before-the-first-pages-last-key": Edge(1, (), False, 5, 2 + 2),
    "kept-segments-end-at-the-first-pages-last-key": Edge(2, (1,), False, 4, 2 + 2),
    "kept-segments-end-one-past-the-first-pages-last-key": Edge(3, (1,), False, 4, 2 + 2),
    "kept-segments-end-well-past-the-first-page": Edge(6, (3,), False, 1, 2 + 1),
    "kept-entries-after-fill-one-page-exactly": Edge(2, (), False, 3, 2 + 1),
    "kept-entries-after-fill-two-pages-exactly": Edge(2, (), False, 6, 2 + 2),
    "kept-all-packed-nothing-after": Edge(6, (2, 4), False, 0, 2 + 1),
    # The whole State in the first page: nothing listed again.
    "kept-all-within-the-first-page": Edge(1, (), False, 1, 2),
    # Entries removed: the first page starts at the segments' end; it is listed again with
    # StartAfter only when it is truncated.
    "removed-nothing-after": Edge(6, (2, 4), True, 0, 2),
    "removed-after-fill-the-first-page-exactly": Edge(2, (), True, 2, 2),
    "removed-after-one-past-the-first-page": Edge(2, (), True, 3, 2 + 1),
    "removed-after-over-three-pages": Edge(3, (1,), True, 7, 2 + 3),
}


async def edge_loads(team: Team, state_id: str, edge: Edge) -> None:
    segments = await team.write_and_pack(
        state_id, packed=edge.packed, bounds=edge.bounds, remove=edge.remove, after=edge.after
    )
    assert len(segments) == len(edge.bounds) + 1
    listings, requests = await team.read(state_id, edge.total)
    entries = [x for x in listings if not x.packed]
    assert entries[0].max_keys == FIRST and entries[0].start_after is None
    # A listing after the first goes on from the last seq the segments hold, then by token.
    starts = [seq_of(e.start_after) for e in entries if e.start_after is not None]
    assert starts == ([edge.packed - 1] if len(entries) > 1 else []), entries
    assert all(e.max_keys == ENTRY_PAGE for e in entries[1:])
    # No entry a segment holds is fetched from its own object.
    assert fetched(requests) == (segments, list(range(edge.packed, edge.total)))
    assert Counter(r.kind for r in requests) == {"GET": 1 + len(segments) + edge.after}
    assert len(listings) == edge.lists, listings


async def test_entries_listed_after_the_segments_at_page_edges(
    mode: Mode, server: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every case of ``EDGES``, each a State of its own, loaded with pages of 2, then 3 keys."""
    monkeypatch.setattr(_reading, "FIRST_PAGE", FIRST)
    team = Team(server, mode, entries=ENTRY_PAGE)
    await together({name: edge_loads(team, name, edge) for name, edge in EDGES.items()})


# 3. On LocalStack --------------------------------------------------------------------------


def same(a: State, b: State) -> None:
    assert a.history == b.history
    assert a.data == b.data and a.task == b.task


async def pack_load_pack_again(stores: Stores, mode: Mode, state_id: str, remove: bool) -> None:
    """20 tool turns packed (one segment, under SEGMENT_MIN), 3 turns more, packed again: the
    second pack merges the first segment into one that holds all 47 entries."""
    writer, packer, log = stores.new(), stores.new(), RequestLog()
    reader = stores.new(event_hooks=log.hooks)
    state = State("on localstack", id=state_id)
    run(state, 20)
    await save(writer, mode, state)
    first = await pack(packer, mode, state_id, remove_entries=remove)
    assert [span(key) for key in first.written] == [(0, 41)]
    assert len(first.removed) == (41 if remove else 0)
    same(await load(reader, mode, state_id), state)

    run(state, 3, first=20)
    await save(writer, mode, state)
    log.clear()
    same(await load(reader, mode, state_id), state)
    assert log.counts()["GET"] == 1 + 1 + 6  # the snapshot, the segment, the 6 new entries

    second = await pack(packer, mode, state_id, remove_entries=remove)
    assert [span(key) for key in second.written] == [(0, 47)]
    assert first.written[0] in second.removed
    assert len(second.removed) == 1 + (6 if remove else 0)
    found = await objects(StoreIO(packer, mode), state_id)
    assert [span(o.key) for o in found if o.kind == "segment"] == [(0, 47)]
    assert sum(o.kind == "entry" for o in found) == (0 if remove else 47)
    fresh_log = RequestLog()
    same(await load(stores.new(event_hooks=fresh_log.hooks), mode, state_id), state)
    assert fresh_log.counts()["GET"] == 2  # the snapshot, the segment
    # The reader knew the first segment and the 6 entries after it, final: it GETs them with
    # the snapshot, the segment is gone (404) and the entries packed, then GETs the new one.
    log.clear()
    same(await load(reader, mode, state_id), state)
    assert log.counts()["GET"] == 1 + 1 + 6 + 1
    log.clear()
    same(await load(reader, mode, state_id), state)
    assert log.counts()["GET"] == 2


@pytest.mark.integration
async def test_pack_load_and_pack_again_on_localstack(mode: Mode, localstack: Stores) -> None:
    await together(
        {
            "kept": pack_load_pack_again(localstack, mode, "again-kept", False),
            "removed": pack_load_pack_again(localstack, mode, "again-removed", True),
        }
    )


@pytest.mark.integration
async def test_a_damaged_segment_on_localstack(
    mode: Mode, localstack: Stores, caplog: pytest.LogCaptureFixture
) -> None:
    """Entries kept: a damaged segment is read from the entry objects instead, and so is a
    segment removed. Entries removed: the load names the damaged segment."""
    kept, removed = State("kept", id="damaged-kept"), State("removed", id="damaged-removed")
    store = localstack.new()
    for state in (kept, removed):
        run(state, 10)
        await save(store, mode, state)
    (kept_key,) = (await pack(store, mode, kept.id)).written
    (removed_key,) = (await pack(store, mode, removed.id, remove_entries=True)).written
    client = raw_client(localstack.url)
    try:
        for key in (kept_key, removed_key):
            stored = client.get_object(Bucket=localstack.bucket, Key=key)["Body"].read()
            client.put_object(Bucket=localstack.bucket, Key=key, Body=stored[:-40])
        with caplog.at_level(logging.WARNING, "alpineagents_s3"):
            same(await load(store, mode, kept.id), kept)
        assert kept_key in caplog.text and "own objects instead" in caplog.text
        with pytest.raises(CorruptStateError, match="packed segment is damaged") as caught:
            await load(store, mode, removed.id)
        assert removed_key in str(caught.value)
        client.delete_object(Bucket=localstack.bucket, Key=kept_key)
        same(await load(store, mode, kept.id), kept)
    finally:
        client.close()


# 4. Adversarial -----------------------------------------------------------------------------
# Through the sync API: keys and listings are the same steps in both modes.

SYNC: Mode = "sync"

# Valid State ids that look like parts of keys, or are prefixes of one another.
ODD_IDS = [
    "0000000000-0000000005",
    "0000000000",
    "packed",
    "-",
    "a",
    "a-b",
    "x" * 128,
]


async def odd_id(team: Team, state_id: str) -> None:
    segments = await team.write_and_pack(
        state_id, packed=4, bounds=(2,), remove=state_id < "b", after=1
    )
    _, requests = await team.read(state_id, 5)
    assert fetched(requests) == (segments, [4])


async def test_state_ids_that_look_like_keys_or_prefix_one_another(stores: Stores) -> None:
    """Seven States side by side in one prefix, in pages of 1 or 2 keys: each reads only its own."""
    team = Team(stores, SYNC, packed=1, entries=2)
    await together({state_id: odd_id(team, state_id) for state_id in ODD_IDS})


async def test_stores_nested_inside_a_states_prefix(stores: Stores) -> None:
    """A store whose prefix is a State's (``runs/a``), and stores under that State's
    ``entries/`` and ``packed/`` prefixes whose State id is the State's generation: their
    objects sit among the State's own segments and entries, in the same listings. Each State
    loads as saved, and a pack with ``remove_entries`` of one removes nothing of the others."""
    team = Team(stores, SYNC, packed=2, entries=2)
    await team.write_and_pack("a", packed=6, bounds=(3,), after=2)
    generation = next(
        o.key.split("/")[3] for o in await objects(stores.io(SYNC), "a") if o.kind == "entry"
    )
    nested = {
        "runs/a": ["packed", "entries"],
        "runs/a/entries": [generation],
        "runs/a/packed": [generation],
    }
    made: dict[tuple[str, str], S3Store] = {}
    for prefix, ids in nested.items():
        for state_id in ids:
            store = S3Store(stores.bucket, prefix, endpoint_url=stores.url, session=stores.session)
            stores.made.append(store)
            made[prefix, state_id] = store
            io = StoreIO(store, SYNC)
            await io.write(state_id, entry_dicts(0, 3), snapshot_dict(state_id, 3), create=True)
            await pack(store, SYNC, state_id)
            await io.write(state_id, entry_dicts(3, 4), snapshot_dict(state_id, 4))
    listings, _ = await team.read("a", 8)
    assert len(listings) > 4  # the nested stores' keys take pages of their own
    packed = await pack(stores.new(), SYNC, "a", remove_entries=True)
    # Its own two segments, merged into one, and its own eight entry objects.
    assert packed.covered == 8 and [span(key) for key in packed.written] == [(0, 8)]
    own = [f"runs/a/packed/{generation}/", f"runs/a/entries/{generation}/"]
    assert (
        sorted(key.rsplit("/", 1)[0] + "/" for key in packed.removed) == [own[1]] * 8 + [own[0]] * 2
    )
    await team.read("a", 8)
    for (prefix, state_id), store in made.items():
        record = await StoreIO(store, SYNC).read(state_id)
        assert record is not None, (prefix, state_id)
        assert list(record.entries) == entry_dicts(0, 4), (prefix, state_id)


async def test_segments_and_entries_of_other_generations_among_the_pages(
    stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Segments and entries of generations before and after the State's own (a create that
    lost a race, a State deleted and created again), more than a page of each: the load reads
    none of them, and the first page of entries holds none of the State's own."""
    team = Team(stores, SYNC, packed=2, entries=ENTRY_PAGE)
    segments = await team.write_and_pack("gens", packed=6, bounds=(3,), after=3)
    client = raw_client(stores.url)
    try:
        found = await objects(stores.io(SYNC), "gens")
        mine = next(o.key.split("/")[3] for o in found if o.kind == "entry")
        segment = next(o.key for o in found if o.kind == "segment")
        data = client.get_object(Bucket=stores.bucket, Key=segment)["Body"].read()
        for other in ("0" * 16, "f" * 16):
            for seq in range(8):
                key = f"runs/gens/entries/{other}/{seq:010d}.json"
                client.put_object(Bucket=stores.bucket, Key=key, Body=b"{}")
            for start in range(0, 6, 2):  # not S3Store's: a reader that took them would fail
                key = f"runs/gens/packed/{other}/{start:010d}-{start + 3:010d}.json"
                client.put_object(Bucket=stores.bucket, Key=key, Body=data[: len(data) // 2])
    finally:
        client.close()
    monkeypatch.setattr(_reading, "FIRST_PAGE", FIRST)
    _, requests = await team.read("gens", 9)
    assert fetched(requests) == (segments, [6, 7, 8])
    got = [r.path for r in requests if r.kind == "GET"]
    assert all(f"/{mine}/" in path for path in got if not path.endswith("/snapshot.json"))


async def test_segments_over_pages_merged_while_a_load_reads_them(
    mode: Mode, stores: Stores
) -> None:
    """A load listed 7 segments (2 a page); as it GETs them, another store object packs the
    State again (one segment of all 17 entries, the 7 and the entry objects removed). The
    load meets 404s, lists ``packed/`` again, page after page, and reads the new segment."""
    team = Team(stores, mode)
    segments = await team.write_and_pack(
        "merged", packed=14, bounds=range(2, 14, 2), remove=True, after=3
    )
    merges: list[Packed] = []
    once = threading.Lock()  # the sync API sends the segment GETs from several threads

    def merge(params: dict[str, Any], **kwargs: Any) -> None:
        with once:
            if SEGMENT_NAME.search(params["url"]) and not merges:
                merges.append(stores.new().pack("merged", remove_entries=True))

    listings = Listings(packed=2)
    log = RequestLog()
    hooks = {**listings.hooks, **log.hooks, "before-call.s3.GetObject": merge}
    record = await StoreIO(stores.new(event_hooks=hooks), mode).read("merged")
    assert record is not None and list(record.entries) == entry_dicts(0, 17)
    (merged,) = merges
    assert [span(key) for key in merged.written] == [(0, 17)]
    assert sorted(span(k) for k in merged.removed if SEGMENT_NAME.search(k)) == segments
    assert (0, 17) in fetched(log.requests)[0]
    pages = [x for x in listings.made if x.packed]
    assert len(pages) >= 4 + 1, pages  # its 4 pages, then the new segment's one page
