"""What S3Store writes and reads, request by request: layout, conditions, immutability,
two-writer detection, lost answers, concurrency and leftovers."""

from __future__ import annotations

import asyncio
import re
import threading
import uuid
from typing import TYPE_CHECKING, Any

import pytest

from alpineagents import _saving
from alpineagents.errors import ConcurrentWriteError, StateExistsError
from alpineagents.state import MODEL, TOOL_RESULT, State
from alpineagents.testing import StoreIO
from alpineagents.testing._store_suite import make_entries, make_snapshot
from alpineagents_s3 import S3Store, S3StoreError
from alpineagents_s3.testing import RequestLog
from tests.s3.conftest import MakeBucket
from tests.s3.faults import InFlight, LoseAnswers, Refuse, objects, play

if TYPE_CHECKING:
    from types_boto3_s3 import S3Client

both_modes = pytest.mark.parametrize("mode", ["sync", "async"])

ENTRY_KEY = re.compile(r"runs/(?P<id>[\w-]+)/entries/(?P<gen>[0-9a-f]{16})/(?P<seq>\d{10})\.json")


def new_store(url: str, bucket: str, **options: Any) -> S3Store:
    return S3Store(bucket, "runs", endpoint_url=url, **options)


def tool_turn(state: State, n: int) -> None:
    """A model response calling a tool, and the tool's result."""
    call = {"type": "tool_call", "id": f"call-{n}", "name": "lookup", "input": {"n": n}}
    state.append(MODEL, "", {"content": [call], "stop_reason": "tool_use"})
    state.append(TOOL_RESULT, f"result {n}", {"call_id": f"call-{n}", "name": "lookup"})


@both_modes
def test_saves_write_immutable_entries_then_a_conditional_snapshot(
    mode: str, moto_url: str, moto_bucket: MakeBucket
) -> None:
    log = RequestLog()
    store = new_store(moto_url, moto_bucket(), event_hooks=log.hooks)
    state = State("layout", id="layout")

    async def scenario(io: StoreIO) -> None:
        await io.save(state)  # create: entry 0, then the snapshot
        created = list(log.requests)
        assert [(r.kind, r.condition) for r in created] == [
            ("PUT", "If-None-Match: *"),
            ("PUT", "If-None-Match: *"),
        ]
        assert ENTRY_KEY.fullmatch(created[0].path.split("/", 2)[2])
        assert created[1].path.endswith("/runs/layout/snapshot.json")

        log.clear()
        tool_turn(state, 1)
        await io.save(state)  # two new entries in parallel, then the snapshot with If-Match
        kinds = [(r.kind, (r.condition or "").split(":")[0]) for r in log.requests]
        assert sorted(kinds[:2]) == [("PUT", "If-None-Match")] * 2
        assert kinds[2] == ("PUT", "If-Match")
        assert log.requests[2].path.endswith("/snapshot.json")

        log.clear()
        state.append(TOOL_RESULT, "saved alone", {"call_id": "c", "name": "t"})
        if io.mode == "async":
            await _saving.asave(store, state, entries_only=True)
        else:
            await asyncio.to_thread(_saving.save, store, state, entries_only=True)
        assert [(r.kind, r.condition) for r in log.requests] == [("PUT", "If-None-Match: *")]

        log.clear()
        assert await io.save(state) is True  # the snapshot catches up
        assert [r.kind for r in log.requests] == ["PUT"]
        assert await io.save(state) is False
        assert log.counts() == {"PUT": 1}

        found = await objects(io, "layout")
        assert [(o.kind, o.seq) for o in found] == [("entry", n) for n in range(4)] + [
            ("snapshot", None)
        ]
        assert all(o.size > 0 for o in found)

    play(store, mode, scenario)


@both_modes
def test_no_entry_object_ever_gets_a_second_version(
    mode: str, moto_url: str, moto_bucket: MakeBucket, moto: S3Client
) -> None:
    bucket = moto_bucket(versioned=True)
    # Every snapshot PUT with If-Match fails once, like a save that failed after retries.
    fail_snapshot = Refuse(
        503,
        "ServiceUnavailable",
        times=2,
        when=lambda url, headers: url.endswith("snapshot.json") and "If-Match" in headers,
    )
    store = new_store(moto_url, bucket, event_hooks={"before-call.s3.PutObject": fail_snapshot})
    state = State("versions", id="versions")

    async def scenario(io: StoreIO) -> None:
        await io.save(state)
        for n in range(3):
            tool_turn(state, n)
            try:
                await io.save(state)
            except Exception:
                pass  # the next save sends the same entries again
        await io.save(state)
        # Resent by hand too: whole history, several times.
        entries = [e for e in (await io.read("versions")).entries]  # type: ignore[union-attr]
        for _ in range(2):
            await io.write("versions", entries, None)

    play(store, mode, scenario)
    assert fail_snapshot.refused == 2
    versions = moto.list_object_versions(Bucket=bucket, Prefix="runs/versions/entries/")
    keys = [v["Key"] for v in versions.get("Versions", [])]
    assert len(keys) == 7 and len(set(keys)) == 7, keys
    assert not versions.get("DeleteMarkers")


@both_modes
def test_a_second_writer_is_refused_and_what_is_saved_is_kept(
    mode: str, moto_url: str, moto_bucket: MakeBucket
) -> None:
    bucket = moto_bucket()
    # Three store objects share nothing but the bucket: three processes.
    first, second, third = (new_store(moto_url, bucket) for _ in range(3))

    async def scenario(io: StoreIO) -> None:
        state = State("shared", id="shared")
        await io.save(state)
        second_io, third_io = StoreIO(second, io.mode), StoreIO(third, io.mode)
        try:
            theirs = await second_io.load("shared")  # another process resumes it
            stale = await third_io.load("shared")  # and a third one
            theirs.add_user_message("from the second process")
            await second_io.save(theirs)

            # Same seq, different entry: refused while writing the entries.
            state.add_user_message("from the first process")
            with pytest.raises(ConcurrentWriteError, match=r"s3://.*entries.*State 'shared'"):
                await io.save(state)
            # A snapshot-only change from a stale copy: refused by If-Match.
            # (Rebound, not mutated: after load, state.data is the same dict as the core's
            # record of the saved snapshot, so a mutation looks like no change at all.)
            stale.data = {"stale": True}
            with pytest.raises(ConcurrentWriteError, match="'shared'") as refused:
                await third_io.save(stale)
            assert "store.load('shared')" in str(refused.value)
            with pytest.raises(ConcurrentWriteError):
                await third_io.save(stale)  # and again: never a silent overwrite
        finally:
            await second_io.close()
            await third_io.close()

        saved = await io.load("shared")
        assert [e.text for e in saved.history] == ["shared", "from the second process"]
        assert saved.data == {}
        # Loading again is how to continue: the new copy saves.
        saved.add_user_message("continued")
        assert await io.save(saved) is True

    play(first, mode, scenario)


@both_modes
def test_a_state_deleted_by_another_process_is_key_error_on_write(
    mode: str, moto_url: str, moto_bucket: MakeBucket
) -> None:
    bucket = moto_bucket()
    ours, theirs = new_store(moto_url, bucket), new_store(moto_url, bucket)
    ours_state = State("gone", id="gone")

    async def scenario(io: StoreIO) -> None:
        await io.save(ours_state)
        await asyncio.to_thread(theirs.delete, "gone")
        ours_state.data["x"] = 1
        with pytest.raises(KeyError, match="gone"):
            await io.save(ours_state)

    play(ours, mode, scenario)
    theirs.close()


@both_modes
def test_answers_lost_after_s3_applied_the_write_are_recognised(
    mode: str, moto_url: str, moto_bucket: MakeBucket
) -> None:
    lose = LoseAnswers()
    store = new_store(moto_url, moto_bucket(), event_hooks={"needs-retry.s3.PutObject": lose})
    state = State("lost answers", id="lost")

    async def scenario(io: StoreIO) -> None:
        await io.save(state)  # entry and create: each repeated, each 412, each recognised
        tool_turn(state, 1)
        await io.save(state)  # entries, and the If-Match snapshot repeated after it applied
        state.data["more"] = True
        await io.save(state)
        loaded = await io.load("lost")
        assert loaded.history == state.history and loaded.data == {"more": True}
        assert {o.kind for o in await objects(io, "lost")} == {"entry", "snapshot"}

    play(store, mode, scenario)
    assert lose.repeated == 6


@both_modes
def test_a_create_retried_by_a_new_attempt_finds_its_own_state(
    mode: str, moto_url: str, moto_bucket: MakeBucket
) -> None:
    """A create that S3 applied but whose answer was lost (the call raised), retried by the
    Agent's next save with a newer snapshot, is recognised by its write token."""
    bucket = moto_bucket()
    lost = {"left": 1}
    creating = threading.local()

    def mark(params: dict[str, Any], **kwargs: Any) -> None:
        creating.snapshot = params["url"].endswith("/snapshot.json") and (
            "If-None-Match" in params["headers"]
        )

    def lose_create_answer(**kwargs: Any) -> None:
        if getattr(creating, "snapshot", False) and lost["left"]:
            lost["left"] -= 1
            raise ConnectionResetError("the answer was lost after S3 applied the PUT")

    store = new_store(
        moto_url,
        bucket,
        event_hooks={
            "before-call.s3.PutObject": mark,
            "after-call.s3.PutObject": lose_create_answer,
        },
    )
    entries, snapshot = make_entries(0, 3), make_snapshot("again", 3)

    async def scenario(io: StoreIO) -> None:
        with pytest.raises(S3StoreError, match="ConnectionResetError"):
            await io.write("again", entries, snapshot, create=True)
        assert lost["left"] == 0
        later = dict(snapshot, updated_at="2026-01-01T00:00:09+00:00")
        await io.write("again", entries, later, create=True)  # not "id taken"
        await io.write("again", make_entries(3, 4), make_snapshot("again", 4))
        found = await objects(io, "again")
        assert [o.kind for o in found] == ["entry"] * 4 + ["snapshot"]
        assert (await io.read("again")).snapshot == make_snapshot("again", 4)

    play(store, mode, scenario)


def test_a_create_by_another_store_object_with_the_same_content_is_refused(
    moto_url: str, moto_bucket: MakeBucket
) -> None:
    """Only this store object's own PUTs count as "ours": another one is a second writer."""
    bucket = moto_bucket()
    entries, snapshot = make_entries(0, 3), make_snapshot("twice", 3)
    with new_store(moto_url, bucket) as first, new_store(moto_url, bucket) as second:
        first.write("twice", entries, snapshot, create=True)
        with pytest.raises(StateExistsError):
            second.write("twice", entries, snapshot, create=True)


@both_modes
def test_a_refused_create_leaves_nothing_behind(
    mode: str, moto_url: str, moto_bucket: MakeBucket
) -> None:
    store = new_store(moto_url, moto_bucket())

    async def scenario(io: StoreIO) -> None:
        await io.write("taken", make_entries(0, 2, "first"), make_snapshot("taken", 2), create=True)
        before = await objects(io, "taken")
        with pytest.raises(StateExistsError, match=r"'taken'.*store\.load"):
            await io.write(
                "taken", make_entries(0, 5, "second"), make_snapshot("taken", 5), create=True
            )
        assert await objects(io, "taken") == before

    play(store, mode, scenario)


@both_modes
def test_leftovers_of_a_create_that_died_do_not_block_the_id(
    mode: str, moto_url: str, moto_bucket: MakeBucket, moto: S3Client
) -> None:
    bucket = moto_bucket()
    store = new_store(moto_url, bucket)
    dead = uuid.uuid4().hex[:16]
    for seq in range(3):  # what a process killed before its snapshot PUT leaves
        key = f"runs/reused/entries/{dead}/{seq:010d}.json"
        moto.put_object(Bucket=bucket, Key=key, Body=b'{"v":1,"seq":%d}' % seq)

    async def scenario(io: StoreIO) -> None:
        assert await io.read("reused") is None
        assert await io.list() == []
        with pytest.raises(KeyError):
            await io.load("reused")
        state = State("reused id", id="reused")
        await io.save(state)
        assert (await io.load("reused")).history == state.history
        kinds = [o.kind for o in await objects(io, "reused")]
        assert sorted(kinds) == ["abandoned"] * 3 + ["entry", "snapshot"]
        await io.delete("reused")
        assert await objects(io, "reused") == []

    play(store, mode, scenario)


@both_modes
def test_load_fetches_concurrently_within_the_limit(
    mode: str, moto_url: str, moto_bucket: MakeBucket
) -> None:
    bucket = moto_bucket()
    writer = new_store(moto_url, bucket)
    writer.write("wide", make_entries(0, 40), make_snapshot("wide", 40), create=True)
    writer.close()
    log, flight = RequestLog(), InFlight()
    hooks = {f"{event}.GetObject": hook for event, hook in flight.hooks.items()}
    store = new_store(moto_url, bucket, max_concurrency=4, event_hooks={**log.hooks, **hooks})

    async def scenario(io: StoreIO) -> None:
        loaded = await io.load("wide")
        assert len(loaded.history) == 40

    play(store, mode, scenario)
    assert log.counts() == {"GET": 41, "LIST": 1}
    first_two = sorted(r.operation for r in log.requests[:2])
    assert first_two == ["GetObject", "ListObjectsV2"]  # the snapshot and the listing at once
    assert 1 < flight.most <= 4


def test_entries_written_while_loading_are_not_missed(
    moto_url: str, moto_bucket: MakeBucket
) -> None:
    """A writer saves between this reader's listing and its snapshot GET (sync only: the
    injection blocks a botocore hook until the listing has returned)."""
    mode = "sync"
    bucket = moto_bucket()
    writer = new_store(moto_url, bucket)
    state = State("moving", id="moving")
    _saving.save(writer, state)
    listed = threading.Event()
    wrote: list[bool] = []

    def after_list(**kwargs: Any) -> None:
        listed.set()

    def before_snapshot_get(request: Any, **kwargs: Any) -> None:
        if request.url.endswith("snapshot.json") and not wrote:
            assert listed.wait(10)
            tool_turn(state, 1)
            _saving.save(writer, state)
            wrote.append(True)

    store = new_store(
        moto_url,
        bucket,
        event_hooks={
            "after-call.s3.ListObjectsV2": after_list,
            "before-send.s3.GetObject": before_snapshot_get,
        },
    )

    async def scenario(io: StoreIO) -> None:
        loaded = await io.load("moving")
        assert [e.text for e in loaded.history] == ["moving", "", "result 1"]

    play(store, mode, scenario)
    writer.close()


@both_modes
def test_a_deleted_id_is_free_again_on_a_versioned_bucket(
    mode: str, moto_url: str, moto_bucket: MakeBucket
) -> None:
    store = new_store(moto_url, moto_bucket(versioned=True))

    async def scenario(io: StoreIO) -> None:
        await io.save(State("first life", id="again"))
        await io.delete("again")  # delete markers over every object
        assert await io.read("again") is None and await io.list() == []
        second = State("second life", id="again")
        await io.save(second)
        assert (await io.load("again")).history == second.history

    play(store, mode, scenario)
