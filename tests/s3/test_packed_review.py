"""An adversarial review of packed segments (``S3Store.pack``, issue 10), on moto's server.

Each test tries one way a pack could break a promise of docs/s3.md, through the sync and the
async API. Five tests prove a hole of the packing as first written (bbb14be): each failed on
it, and passes since its fix:

1. two packs at once leave overlapping segments, which a load cannot chain;
2. ``remove_entries`` removes the entry objects whose conditional create refuses a copy behind;
3. a load holds the bytes of every segment at once;
4. the archiving flow of the docs (pack, then move with examples/archive.py) left one object
   per entry in the archive (``archive.py --pack`` packs what it moves);
5. a load that read the snapshot before a save and a pack with ``remove_entries`` fails.

The others pin promises that hold. Races run in a ``before-call`` hook of the store object under
test, so the interleaving is exact. ``SEGMENT_MIN`` is made small where sizes matter, so States
of a few dozen entries take the paths large States take.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from alpineagents import Agent, State
from alpineagents.testing import FunctionModel
from alpineagents_s3 import (
    ConcurrentWriteError,
    Packed,
    S3AccessDeniedError,
    S3Store,
    S3StoreError,
    StateNotFoundError,
    _packing,
    _segments,
    _steps,
)
from alpineagents_s3._codec import loads_segment
from tests.helpers import Mode, entry_dicts, snapshot_dict
from tests.s3.helpers import LoseAnswers, Refuse, Stores, load, objects, pack, run, save

# About 2.2 KB a tool-using turn (a model response and a tool result).
# With this SEGMENT_MIN, 8 turns are a segment of their own and 2 turns are taken in.
SMALL_MIN = 16 * 1024


class Before:
    """A ``before-call`` hook that runs ``action`` once, before the first request whose URL
    holds ``part``, and lets every request through."""

    def __init__(self, part: str, action: Callable[[], None]) -> None:
        self.part, self.action = part, action
        self.done = False
        self._lock = threading.Lock()

    def __call__(self, params: dict[str, Any], **kwargs: Any) -> None:
        with self._lock:
            if self.done or self.part not in params["url"]:
                return
            self.done = True
            self.action()


# Hole 1 -------------------------------------------------------------------------------------


async def test_two_packs_at_once_that_cut_differently_keep_the_state_loadable(
    mode: Mode, stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slow pack merges a segment that a faster, later pack kept and built on.

    The slow pack read the State at 45 entries: what it has to pack (2 turns) is under
    SEGMENT_MIN, so it takes the segment 0-41 in and writes 0-45. The fast pack read it at 65
    entries: 12 turns are enough on their own, so it keeps 0-41, writes 41-65 and removes the
    entry objects below 65. The slow pack then removes 0-41. Left: 0-45 and 41-65, which
    cover every entry, but no chain of segments joined end to start reaches 65.
    """
    monkeypatch.setattr(_packing, "SEGMENT_MIN", SMALL_MIN)
    state = State("two packs", id="two-packs")
    run(state, 20)
    writer = stores.new()
    await save(writer, mode, state)
    first = await pack(stores.new(), mode, state.id)  # 0-41: one segment of ~44 KB
    k = len(state.history)
    assert first.covered == k
    run(state, 2, first=20)
    await save(writer, mode, state)  # 45 entries
    m = len(state.history)

    fast: list[Packed] = []

    def save_and_pack_fast() -> None:
        run(state, 10, first=22)
        writer.save(state)  # 65 entries
        fast.append(stores.new().pack(state.id, remove_entries=True))

    # The fast pack runs, whole, when the slow one (mode's API) sends its segment PUT.
    meanwhile = Before("/packed/", save_and_pack_fast)
    slow = stores.new(event_hooks={"before-call.s3.PutObject": meanwhile})
    slow_done = await pack(slow, mode, state.id)
    assert [_range(key) for key in fast[0].written] == [(k, len(state.history))]
    assert [_range(key) for key in slow_done.written] == [(0, m)]

    found = await objects(stores.io(mode), state.id)
    segments = sorted(_range(o.key) for o in found if o.kind == "segment")
    assert segments == [(0, m), (k, len(state.history))]
    assert not [o for o in found if o.kind == "entry"]
    loaded = await load(stores.new(), mode, state.id)  # the hole: CorruptStateError here
    assert loaded.history == state.history


def _range(key: str) -> tuple[int, int]:
    """The entries a segment's key names: ``(start, end)``."""
    start, end = key.rsplit("/", 1)[1].removesuffix(".json").split("-")
    return int(start), int(end)


# Hole 2 -------------------------------------------------------------------------------------


async def test_a_copy_behind_is_refused_when_entries_are_kept(mode: Mode, stores: Stores) -> None:
    """Without ``remove_entries``: a stale copy's save meets the stored entries and is refused."""
    store = stores.new()
    state = State("behind", id="behind-kept")
    run(state, 5)
    await save(store, mode, state)
    behind = await load(store, mode, state.id)
    run(state, 3, first=5)
    await save(store, mode, state)
    await pack(stores.new(), mode, state.id)
    run(behind, 1, first=100)
    with pytest.raises(ConcurrentWriteError):
        await save(store, mode, behind)
    assert (await load(stores.new(), mode, state.id)).history == state.history


async def test_a_copy_behind_is_refused_after_remove_entries(mode: Mode, stores: Stores) -> None:
    """One store object, two copies of a State (two requests of one web process).

    The newer copy saves 17 entries; the State is packed with ``remove_entries``; the older
    copy (11 entries) saves 2 more. Without the pack, its entry PUTs meet entries 11 and 12
    (``If-None-Match: *``: 412) and the save is refused. With them removed, its PUTs land, its
    snapshot PUT (``If-Match`` on the ETag this store object wrote last) lands too: the save is
    acknowledged, yet its two entries are in no load, and its snapshot now sits on the newer
    copy's history (a State neither copy had).
    """
    store = stores.new()
    state = State("behind", id="behind-removed")
    run(state, 5)
    await save(store, mode, state)
    behind = await load(store, mode, state.id)
    run(state, 3, first=5)
    await save(store, mode, state)
    await pack(stores.new(), mode, state.id, remove_entries=True)
    run(behind, 1, first=100)
    behind.data["copy"] = "behind"
    try:
        with pytest.raises(ConcurrentWriteError):
            await save(store, mode, behind)
    finally:
        # What was saved before must load as it was; on bbb14be the save above is acknowledged
        # and a load returns the newer copy's history under the stale copy's data.
        loaded = await load(stores.new(), mode, state.id)
        assert loaded.history == state.history
        assert loaded.data == state.data


# Hole 3 -------------------------------------------------------------------------------------


class HeldAtParse:
    """Wraps ``_segments.loads_segment``: how many other segments' bytes a load holds while
    it parses one (the GetObject bodies still in the batch's outcomes)."""

    def __init__(self, original: Any) -> None:
        self.original = original
        self.held: list[int] = []

    def __call__(self, body: bytes, where: str, start: int, end: int) -> Any:
        outcomes = sys._getframe(1).f_locals.get("outcomes", [])
        others = sum(
            1 for o in outcomes if isinstance(o, dict) and isinstance(o.get("Body"), bytes)
        )
        self.held.append(others)
        return self.original(body, where, start, end)


async def test_a_load_does_not_hold_every_segments_bytes_at_once(
    mode: Mode, stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A State of 7 segments: while one is parsed, at most one other's bytes may wait."""
    monkeypatch.setattr(_packing, "SEGMENT_MIN", SMALL_MIN)
    monkeypatch.setattr(_packing, "SEGMENT_MAX", 2 * SMALL_MIN)
    monkeypatch.setattr(_packing, "SEGMENTS_AT_ONCE", 8)  # cut at SEGMENT_MAX, not in four
    state = State("memory", id="memory")
    run(state, 90)
    await save(stores.new(), mode, state)
    packed = await pack(stores.new(), mode, state.id)
    assert len(packed.written) == 7, packed.written
    held = HeldAtParse(loads_segment)
    monkeypatch.setattr(_segments, "loads_segment", held)
    assert (await load(stores.new(), mode, state.id)).history == state.history
    assert len(held.held) == 7
    assert max(held.held) <= 1, held.held  # bbb14be: [6, 5, 4, 3, 2, 1, 0]


# Hole 5 -------------------------------------------------------------------------------------


async def test_a_load_meets_a_save_and_a_pack_removing_the_entries_it_listed(
    mode: Mode, stores: Stores
) -> None:
    """A monitor loads a running State: it read the snapshot (11 entries) and listed the entry
    objects; before it GETs them, the run saves 10 more and a pack packs all 21 and removes
    them. The one segment (0-21) reaches beyond the count the load read, so the load ignores
    it, finds the entries gone, lists again three times and gives up; the docs promise it
    "lists the segments again and reads them instead". It should return 11 entries (the
    State it read) or 21 (the State now)."""
    state = State("monitored", id="monitored")
    run(state, 5)
    writer = stores.new()
    writer.save(state)
    seen = state.history[:]

    def save_and_pack() -> None:
        run(state, 5, first=5)
        writer.save(state)
        packed = stores.new().pack(state.id, remove_entries=True)
        assert packed.covered == len(state.history)

    # Runs (sync, on the monitor's request thread or event loop) before its first entry GET.
    meanwhile = Before("/entries/", save_and_pack)
    monitor = stores.new(event_hooks={"before-call.s3.GetObject": meanwhile})
    loaded = await load(monitor, mode, state.id)
    assert meanwhile.done
    assert loaded.history in (seen, state.history)
    # The same read through the other API, started now, is fine either way.
    assert (await load(stores.new(), mode, state.id)).history == state.history


# Hole 4 -------------------------------------------------------------------------------------


def test_the_archive_job_leaves_finished_states_packed(
    stores: Stores, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/s3.md, "Lifecycle rules": pack finished States first, move them to an archive prefix
    (``examples/archive.py`` on a schedule), put the transition rule there. The move copies
    through ``load`` and ``save``, which write one object per entry: the rule then finds
    nothing of 128 KiB to move, and the State's entries stay small objects in S3 Standard."""
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", stores.url)
    live = stores.new()
    Agent(FunctionModel(lambda request: "Done."), store=live).run(State("reply", id="replied"))
    live.pack("replied", remove_entries=True)
    assert {o.kind for o in live.objects("replied")} == {"snapshot", "segment"}
    job = _example("archive.py")
    source, target = f"s3://{stores.bucket}/runs", f"s3://{stores.bucket}/archive"
    assert job.main([source, target, "--older-than", "0s", "--pack"]) == 0
    assert "moved 1 State(s)" in capsys.readouterr().out
    archive = S3Store(stores.bucket, "archive", endpoint_url=stores.url, session=stores.session)
    stores.made.append(archive)
    assert archive.load("replied").answer == "Done."
    assert {o.kind for o in archive.objects("replied")} == {"snapshot", "segment"}


def _example(name: str) -> Any:
    """A program of examples/, imported as a module."""
    path = Path(__file__).parents[2] / "examples" / name
    spec = importlib.util.spec_from_file_location(f"example_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Promises that hold -------------------------------------------------------------------------


async def test_a_segment_put_whose_answer_was_lost_is_recognised(
    mode: Mode, stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """botocore sends a segment PUT again after S3 stored it: 412 on its own write, not an error."""
    monkeypatch.setattr(_packing, "SEGMENT_MIN", SMALL_MIN)
    state = State("lost answer", id="lost-answer")
    run(state, 20)
    await save(stores.new(), mode, state)
    lose = LoseAnswers()
    packer = stores.new(event_hooks={"needs-retry.s3.PutObject": lose})
    packed = await pack(packer, mode, state.id, remove_entries=True)
    assert lose.repeated == 1 and len(packed.written) == 1
    assert (await load(stores.new(), mode, state.id)).history == state.history


async def test_a_save_sent_again_after_its_snapshot_answer_was_lost_leaves_packed_entries_packed(
    mode: Mode, stores: Stores
) -> None:
    """A snapshot PUT that S3 applied but whose answer was lost (the save raised); meanwhile the
    State is packed with ``remove_entries``. The save sent again holds entries its lost PUT
    counted: they are final, so they are checked against what is stored and not created again
    under keys the pack removed (a second version on a versioned bucket)."""
    lost = {"left": 0}
    replacing = threading.local()

    def mark(params: dict[str, Any], **kwargs: Any) -> None:
        replacing.snapshot = params["url"].endswith("/snapshot.json") and (
            "If-Match" in params["headers"]
        )

    def lose_answer(**kwargs: Any) -> None:
        if getattr(replacing, "snapshot", False) and lost["left"]:
            lost["left"] -= 1
            raise ConnectionResetError("the answer was lost after S3 applied the PUT")

    hooks = {"before-call.s3.PutObject": mark, "after-call.s3.PutObject": lose_answer}
    io = stores.io(mode, event_hooks=hooks)
    await io.write("lost", entry_dicts(0, 3), snapshot_dict("lost", 3), create=True)
    lost["left"] = 1
    with pytest.raises(S3StoreError, match="ConnectionResetError"):
        await io.write("lost", entry_dicts(3, 6), snapshot_dict("lost", 6))
    assert lost["left"] == 0
    packed = await pack(stores.new(), mode, "lost", remove_entries=True)
    assert packed.covered == 6 and len(packed.removed) == 6

    await io.write("lost", entry_dicts(3, 7), snapshot_dict("lost", 7))
    found = await objects(io, "lost")
    assert sorted(o.kind for o in found) == ["entry", "segment", "snapshot"]
    assert next(o.key for o in found if o.kind == "entry").endswith("/0000000006.json")
    record = await io.read("lost")
    assert record is not None
    assert list(record.entries) == entry_dicts(0, 7)
    assert record.snapshot == snapshot_dict("lost", 7)
    with pytest.raises(ConcurrentWriteError, match="lost"):  # a different entry 4: refused
        await io.write("lost", [*entry_dicts(4, 5, text="other"), *entry_dicts(5, 8)], None)


async def test_a_pack_racing_a_delete_and_a_create_again_keeps_nothing_of_the_old_state(
    mode: Mode, stores: Stores
) -> None:
    """The pack read the old State; before its PUT the id is deleted and created again (a new
    generation). Its segment must not stay, nor the old entries come back."""
    old = State("old", id="again")
    run(old, 6)
    io = stores.io(mode)
    await io.save(old)
    new = State("new", id="again")
    run(new, 2, first=50)

    def delete_and_create() -> None:
        other = stores.new()
        other.delete(old.id)
        other.save(new)

    meanwhile = Before("/packed/", delete_and_create)
    packer = stores.new(event_hooks={"before-call.s3.PutObject": meanwhile})
    with pytest.raises(StateNotFoundError, match="deleted while it was being packed"):
        await pack(packer, mode, old.id, remove_entries=True)
    assert meanwhile.done
    found = await objects(stores.io(mode), new.id)
    assert {o.kind for o in found} == {"snapshot", "entry"}
    loaded = await load(stores.new(), mode, new.id)
    assert loaded.history == new.history and loaded.task == "new"


async def test_409_on_a_segment_put_is_retried(
    mode: Mode, stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S3 answers 409 ConditionalRequestConflict to racing conditional PUTs: sent again."""
    monkeypatch.setattr(_steps, "CONFLICT_BACKOFF", 0.001)
    state = State("contended", id="contended")
    run(state, 6)
    await save(stores.new(), mode, state)
    conflict = Refuse(409, "ConditionalRequestConflict", times=2, when=_packed)
    packer = stores.new(event_hooks={"before-call.s3.PutObject": conflict})
    packed = await pack(packer, mode, state.id, remove_entries=True)
    assert conflict.refused == 2 and len(packed.written) == 1
    assert (await load(stores.new(), mode, state.id)).history == state.history


async def test_a_segment_that_cannot_be_read_is_named(mode: Mode, stores: Stores) -> None:
    """A GetObject of a segment refused (403): the error names the bucket and the segment."""
    state = State("denied", id="denied")
    run(state, 6)
    await save(stores.new(), mode, state)
    packed = await pack(stores.new(), mode, state.id)
    deny = Refuse(403, "AccessDenied", when=_packed)
    with pytest.raises(S3AccessDeniedError) as raised:
        await load(stores.new(event_hooks={"before-call.s3.GetObject": deny}), mode, state.id)
    assert f"s3://{stores.bucket}/{packed.written[0]}" in str(raised.value)
    assert deny.refused == 1


def _packed(url: str, headers: dict[str, Any]) -> bool:
    """Whether a request is on a packed segment."""
    return "/packed/" in url
