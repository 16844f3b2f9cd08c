"""S3Store against the Store contract alone, on moto's server, with whichever alpineagents is
installed: this repository's core (snapshot contract), published 0.4.0 (snapshot contract) or
published 0.7.1 (info contract). Every test runs in sync and in async mode.

The small dict (``snapshot`` or ``info``) is opaque to the store, so most tests use dicts of
their own; the ones about ``list`` use States the installed core made and saved itself.
"""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from importlib import metadata
from typing import Any

import pytest

import alpineagents
import alpineagents.store
import alpineagents.testing
from alpineagents_s3 import (
    BucketNotFoundError,
    ConcurrentWriteError,
    CorruptStateError,
    S3Store,
    S3StoreError,
    StateExistsError,
    StateNotFoundError,
)
from alpineagents_s3.testing import separate_process

# (conftest.py cannot be imported under --import-mode=importlib: these two lines stand twice.)
CORE_VERSION = metadata.version("alpineagents")
GENERATION = "info" if hasattr(alpineagents.store, "StateInfo") else "snapshot"
THIS_REPO = CORE_VERSION.endswith("+seed")
MakeStore = Callable[..., S3Store]


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


NESTED = _nested(100_000)  # deeper than json.dumps can recurse


class IO:
    """A store driven through its sync methods, or its async twins (one event loop per call,
    as a serverless handler makes them)."""

    def __init__(self, store: S3Store, mode: str):
        self.store, self.mode = store, mode

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if self.mode == "sync":
            return getattr(self.store, name)  # type: ignore[no-any-return]
        twin = getattr(self.store, "a" + name)
        return lambda *args, **kwargs: asyncio.run(twin(*args, **kwargs))


@pytest.fixture(params=["sync", "async"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def io(make_store: MakeStore, mode: str) -> IO:
    return IO(make_store(), mode)


def entries(start: int, stop: int, tag: str = "") -> list[dict[str, Any]]:
    return [{"seq": seq, "kind": "note", "text": f"entry {seq}{tag}"} for seq in range(start, stop)]


def small(n: int, **extra: Any) -> dict[str, Any]:
    return {"v": 1, "history_len": n, "note": "opaque to the store", **extra}


def small_of(record: Any) -> Any:
    return getattr(record, "info" if GENERATION == "info" else "snapshot")


def keys(s3: Any, bucket: str, prefix: str = "") -> list[str]:
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix)
    return [item["Key"] for item in listed.get("Contents", ())]


def state_keys(s3: Any, bucket: str, state_id: str) -> list[str]:
    """The keys of a State: its head and what is under its folder."""
    return keys(s3, bucket, f"runs/heads/{state_id}.json") + keys(
        s3, bucket, f"runs/states/{state_id}/"
    )


def entry_objects(s3: Any, bucket: str, state_id: str) -> list[str]:
    return [
        k
        for k in keys(s3, bucket, f"runs/states/{state_id}/")
        if k.rsplit("/", 1)[1].startswith("e")
    ]


# Write and read --------------------------------------------------------------------------


def test_a_created_state_reads_back_as_the_cores_record(io: IO) -> None:
    io.write("r1", entries(0, 3), small(3), create=True)
    record = io.read("r1")
    assert isinstance(record, alpineagents.store.Record)
    assert list(record.entries) == entries(0, 3)
    assert small_of(record) == small(3)


def test_an_unknown_id_reads_as_none(io: IO) -> None:
    assert io.read("never-saved") is None


def test_later_writes_add_entries_and_replace_the_small_dict(io: IO) -> None:
    io.write("r2", entries(0, 2), small(2), create=True)
    io.write("r2", entries(2, 5), small(5, data={"k": [1, 2]}))
    record = io.read("r2")
    assert list(record.entries) == entries(0, 5)
    assert small_of(record) == small(5, data={"k": [1, 2]})


def test_a_small_dict_changed_by_its_caller_is_saved_when_written_again(io: IO) -> None:
    # The store keeps what it read and wrote, to compare the next save with; a caller that
    # changes a dict it was given (or sent) must not change that copy too, or the change
    # would look saved already, and be dropped.
    sent = small(1, data={"cart": ["apple"]})
    io.write("edited", entries(0, 1), sent, create=True)
    sent["data"]["cart"].append("pear")
    io.write("edited", [], sent)
    record = small_of(io.read("edited"))
    assert record["data"]["cart"] == ["apple", "pear"]

    record["data"]["cart"].append("plum")  # the dict read, changed in place and sent back
    record["note"] = "changed"
    io.write("edited", [], record)
    stored = small_of(IO(separate_process(io.store), io.mode).read("edited"))
    assert stored["data"]["cart"] == ["apple", "pear", "plum"] and stored["note"] == "changed"
    again = small_of(io.read("edited"))
    again["note"] = "changed only here"
    assert small_of(io.read("edited"))["note"] == "changed"


def test_a_deeply_nested_small_dict_reads_back_in_the_process_that_wrote_it(io: IO) -> None:
    # Read back from the process's memory, it is copied for the caller: deeper than Python's
    # recursion goes in a copy of its own, but not deeper than JSON's.
    deep: dict[str, Any] = {}
    for _ in range(900):
        deep = {"k": deep}
    io.write("deep", entries(0, 1), small(1, data=deep), create=True)
    assert small_of(io.read("deep"))["data"] == deep


def test_entries_the_store_has_are_skipped_when_sent_again(io: IO, s3: Any, bucket: str) -> None:
    io.write("again", entries(0, 3), small(3), create=True)
    io.write("again", entries(1, 5), small(5))  # 1 and 2 again, as after a failed write
    assert list(io.read("again").entries) == entries(0, 5)
    assert len(entry_objects(s3, bucket, "again")) == 5


def test_an_identical_resend_through_another_process_is_skipped(
    make_store: MakeStore, mode: str, s3: Any, bucket: str
) -> None:
    IO(make_store(), mode).write("resent", entries(0, 3), small(3), create=True)
    fresh = IO(separate_process(make_store()), mode)  # has never read or written it
    fresh.write("resent", entries(0, 4), small(4))
    assert list(fresh.read("resent").entries) == entries(0, 4)
    assert len(entry_objects(s3, bucket, "resent")) == 4


def test_an_entry_sent_again_with_other_content_is_refused(io: IO) -> None:
    io.write("differs", entries(0, 2), small(2), create=True)
    with pytest.raises(ConcurrentWriteError, match=r"another writer .*entry 1 is not the one"):
        io.write("differs", entries(1, 3, tag=" (other)"), small(3))
    assert list(io.read("differs").entries)[:2] == entries(0, 2)


def test_a_refused_saves_entries_are_never_read_back(make_store: MakeStore, mode: str) -> None:
    # The second writer's entry 2 object is written before its head PUT is refused: no head
    # names it, so no reader sees it.
    first, second = IO(make_store(), mode), IO(separate_process(make_store()), mode)
    first.write("differs", entries(0, 2), small(2), create=True)
    second.read("differs")
    first.write("differs", entries(2, 3), small(3))
    with pytest.raises(ConcurrentWriteError):
        second.write("differs", entries(2, 4, tag=" (other)"), small(4))
    assert list(first.read("differs").entries) == entries(0, 3)


def test_a_large_small_dict_round_trips(io: IO) -> None:
    """alpineagents 0.4 keeps the model context in its snapshot: it can be megabytes."""
    context = [{"role": "user", "content": "x" * 1000 + str(i)} for i in range(2000)]
    io.write("big", entries(0, 1), small(1, context=context), create=True)
    io.write("big", entries(1, 2), small(2, context=context * 2))
    assert small_of(io.read("big")) == small(2, context=context * 2)


# Refusals ---------------------------------------------------------------------------------


def test_a_taken_id_is_a_value_error_and_changes_nothing(io: IO) -> None:
    io.write("taken", entries(0, 2), small(2), create=True)
    with pytest.raises(ValueError, match="'taken'") as raised:
        io.write("taken", entries(0, 3, tag=" (new)"), small(3, other=True), create=True)
    assert isinstance(raised.value, StateExistsError)
    record = io.read("taken")
    assert list(record.entries) == entries(0, 2) and small_of(record) == small(2)


def test_a_write_to_an_unknown_id_is_a_lookup_error_and_leaves_nothing(
    io: IO, s3: Any, bucket: str
) -> None:
    with pytest.raises(LookupError, match="'ghost'"):
        io.write("ghost", entries(0, 2), small(2))
    assert keys(s3, bucket, "runs/states/") == keys(s3, bucket, "runs/heads/") == []


@pytest.mark.parametrize("bad", ["", "a/b", "a b", "x" * 129, "../up", "é"])
def test_an_invalid_id_is_refused_before_any_request(io: IO, bad: str) -> None:
    with pytest.raises(ValueError, match="invalid State id"):
        io.write(bad, entries(0, 1), small(1), create=True)
    with pytest.raises(ValueError, match="invalid State id"):
        io.read(bad)


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (math.nan, "Out of range float"),
        ("caf\udce9", "lone surrogate"),
        (object(), "cannot be saved as JSON"),
        (NESTED, "cannot be saved as JSON"),
    ],
)
def test_a_value_json_cannot_hold_is_refused_and_nothing_is_written(
    io: IO, s3: Any, bucket: str, value: Any, words: str
) -> None:
    with pytest.raises((ValueError, TypeError), match=words):
        io.write("bad-input", entries(0, 1), small(1, value=value), create=True)
    with pytest.raises((ValueError, TypeError), match=words):
        io.write("bad-input", [{"seq": 0, "text": value}], small(1), create=True)
    assert keys(s3, bucket, "runs/states/") == keys(s3, bucket, "runs/heads/") == []
    io.write("bad-input", entries(0, 1), small(1), create=True)  # the id is still free
    assert list(io.read("bad-input").entries) == entries(0, 1)


def test_an_entry_without_a_whole_seq_is_refused(io: IO, s3: Any, bucket: str) -> None:
    for bad in ({"text": "no seq"}, {"seq": "1"}, {"seq": -1}, {"seq": True}):
        with pytest.raises(ValueError, match="has the seq"):
            io.write("no-seq", [bad], small(1), create=True)
    assert keys(s3, bucket, "runs/states/") == keys(s3, bucket, "runs/heads/") == []


@pytest.mark.parametrize(
    ("part", "body", "words"),
    [
        ("heads/", b"{not json", "not valid JSON"),
        ("heads/", b"[1, 2]", "not the head of an S3Store State"),
        ("heads/", b'{"alpineagents-s3": 1, "id": "other"}', "the head of State 'other'"),
        ("/e0000000001.", b"\xff\xfe", "not valid JSON"),
        ("/e0000000001.", b'"text"', "holds 'str' where history entry 1 belongs"),
        ("/e0000000001.", b'{"seq": 7}', "holds 7 where history entry 1 belongs"),
        ("/e0000000001.", b"[" * 100_000 + b"]" * 100_000, "not valid JSON"),
    ],
)
def test_a_corrupt_object_is_named_and_nothing_is_changed(
    io: IO, make_store: MakeStore, s3: Any, bucket: str, part: str, body: bytes, words: str
) -> None:
    io.write("corrupt", entries(0, 3), small(3), create=True)
    key = next(k for k in state_keys(s3, bucket, "corrupt") if part in k)
    metadata = s3.head_object(Bucket=bucket, Key=key)["Metadata"]
    s3.put_object(Bucket=bucket, Key=key, Body=body, Metadata=metadata)
    reader = IO(separate_process(make_store()), io.mode)  # holds no body of the parts
    with pytest.raises(CorruptStateError, match=words) as raised:
        reader.read("corrupt")
    assert f"s3://{bucket}/{key}" in str(raised.value)
    assert isinstance(raised.value, ValueError)
    assert len(state_keys(s3, bucket, "corrupt")) == 4  # nothing removed


def test_a_missing_bucket_is_named(make_store: MakeStore, moto_url: str, mode: str) -> None:
    store = IO(S3Store("no-such-bucket-here", endpoint_url=moto_url), mode)
    with pytest.raises(BucketNotFoundError, match="'no-such-bucket-here' does not exist"):
        store.read("x")
    assert isinstance(BucketNotFoundError("x"), FileNotFoundError)


def test_the_errors_are_the_builtins_of_the_contract_and_the_cores_own() -> None:
    assert issubclass(StateExistsError, ValueError)
    assert issubclass(StateNotFoundError, LookupError)
    store_error = getattr(alpineagents, "StoreError", None)
    if THIS_REPO:
        assert store_error is not None
        assert issubclass(S3StoreError, store_error)
        assert issubclass(StateExistsError, alpineagents.StateExistsError)
        assert issubclass(StateNotFoundError, alpineagents.StateNotFoundError)
        assert issubclass(ConcurrentWriteError, alpineagents.ConcurrentWriteError)
    else:
        assert store_error is None  # the published releases have no store error class


# The small dict of the snapshot contract -------------------------------------------------


def test_none_keeps_the_stored_snapshot(io: IO) -> None:
    if GENERATION != "snapshot":
        pytest.skip(f"alpineagents {CORE_VERSION}: the info contract always passes the dict")
    io.write("keep", entries(0, 2), small(2), create=True)
    io.write("keep", entries(2, 3), None)
    record = io.read("keep")
    assert list(record.entries) == entries(0, 3) and small_of(record) == small(2)


def test_a_state_created_without_a_snapshot_takes_its_id(io: IO) -> None:
    if GENERATION != "snapshot":
        pytest.skip(f"alpineagents {CORE_VERSION}: the info contract always passes the dict")
    io.write("mid-turn", entries(0, 2), None, create=True)
    record = io.read("mid-turn")
    assert list(record.entries) == entries(0, 2) and small_of(record) is None
    assert io.list() == []  # listed once it has a snapshot (its head is not even summarised)
    with pytest.raises(StateExistsError, match="id 'mid-turn'"):
        io.write("mid-turn", entries(0, 1), small(1), create=True)
    io.write("mid-turn", entries(2, 3), small(3))
    assert small_of(io.read("mid-turn")) == small(3)


# Two writers ------------------------------------------------------------------------------


def test_a_second_writer_is_refused_not_overwritten(make_store: MakeStore, mode: str) -> None:
    first, second = IO(make_store(), mode), IO(separate_process(make_store()), mode)
    first.write("shared", entries(0, 2), small(2), create=True)
    assert second.read("shared") is not None  # the second process loads it
    first.write("shared", entries(2, 3), small(3, by="first"))
    with pytest.raises(ConcurrentWriteError, match="another writer"):
        second.write("shared", [], small(2, by="second"))
    assert small_of(first.read("shared")) == small(3, by="first")


def test_the_same_create_from_two_store_objects_has_one_winner(
    make_store: MakeStore, mode: str
) -> None:
    first, second = IO(make_store(), mode), IO(separate_process(make_store()), mode)
    first.write("race", entries(0, 2), small(2), create=True)
    with pytest.raises(StateExistsError, match="id 'race'"):
        second.write("race", entries(0, 2), small(2), create=True)


def test_a_lost_answer_of_the_stores_own_put_is_recognised(
    make_store: MakeStore, mode: str
) -> None:
    """S3 applied a snapshot PUT, the answer never came back (the save raised); the next
    save of the same store object must not take its own write for a second writer."""
    lost = {"left": 0}
    target = threading.local()

    def before(params: dict[str, Any], **kwargs: Any) -> None:
        target.snapshot = "/heads/" in params["url"]

    def after(**kwargs: Any) -> None:
        if getattr(target, "snapshot", False) and lost["left"]:
            lost["left"] -= 1
            raise ConnectionResetError("answer lost after the PUT was applied")

    io = IO(
        make_store(
            event_hooks={"before-call.s3.PutObject": before, "after-call.s3.PutObject": after}
        ),
        mode,
    )
    lost["left"] = 1
    with pytest.raises(S3StoreError, match="ConnectionResetError"):
        io.write("lost", entries(0, 2), small(2), create=True)
    io.write("lost", entries(0, 2), small(2, retry=1), create=True)  # not "id taken"
    lost["left"] = 1
    with pytest.raises(S3StoreError, match="ConnectionResetError"):
        io.write("lost", entries(2, 3), small(3))
    io.write("lost", entries(2, 4), small(4))  # not "another writer"
    record = io.read("lost")
    assert list(record.entries) == entries(0, 4) and small_of(record) == small(4)


def test_entries_no_head_names_are_never_read(io: IO, s3: Any, bucket: str) -> None:
    # As a save killed before its head PUT leaves them: entry objects at the next seqs.
    io.write("orphan", entries(0, 2), small(2), create=True)
    entry_key = next(k for k in entry_objects(s3, bucket, "orphan") if "/e0000000001." in k)
    for seq in (2, 3):
        orphan_key = entry_key.replace("/e0000000001.", f"/e000000000{seq}.")
        s3.put_object(
            Bucket=bucket,
            Key=orphan_key,
            Body=b'{"seq":%d,"text":"from a killed save"}' % seq,
            Metadata={"alpineagents-s3": "entry"},
        )
    assert list(io.read("orphan").entries) == entries(0, 2)
    io.write("orphan", entries(2, 4), small(4))
    assert list(io.read("orphan").entries) == entries(0, 4)


# List and delete --------------------------------------------------------------------------


def _new_state(state_id: str, task: str) -> Any:
    """A State made by the installed core's public API."""
    # Typed as this repository's core, which is the one mypy sees: the 0.5+ calls go through Any.
    core: Any = alpineagents
    try:
        return core.State(task, id=state_id)  # 0.2-0.4 and this repository's core
    except TypeError:
        return core.State(id=state_id, messages=[core.Message.user(task)])  # 0.5+


def _save(store: S3Store, state: Any, mode: str) -> None:
    """Save a State the way the installed core does: store.save (0.5+), else agent.save."""
    if GENERATION == "info":
        if mode == "sync":
            store.save(state)
        else:
            asyncio.run(store.asave(state))
        return
    core: Any = alpineagents  # as in _new_state: FakeModel and reporter are not this core's
    if hasattr(core.testing, "FakeModel"):  # published
        agent = core.Agent(model=core.testing.FakeModel([]), store=store, reporter=None)
    else:  # this repository's core
        agent = core.Agent(model=core.testing.TestModel(), store=store)
    if mode == "sync":
        agent.save(state)
    else:
        asyncio.run(agent.asave(state))


def test_list_gives_the_cores_own_summaries_newest_first(make_store: MakeStore, mode: str) -> None:
    store = make_store()
    for n in range(3):
        _save(store, _new_state(f"listed-{n}", f"task {n}"), mode)
        time.sleep(0.02)
    listed = IO(store, mode).list()
    core: Any = alpineagents.store  # StateInfo: 0.5+ only
    summary = core.StateInfo if GENERATION == "info" else core.SavedState
    assert all(type(s) is summary for s in listed)
    assert [s.id for s in listed] == ["listed-2", "listed-1", "listed-0"]
    loaded = IO(store, mode).load("listed-1")
    assert loaded.id == "listed-1"


def test_list_of_an_empty_prefix_is_empty(io: IO) -> None:
    assert io.list() == []


def test_delete_removes_every_object(io: IO, make_store: MakeStore, s3: Any, bucket: str) -> None:
    io.write("doomed", entries(0, 3), small(3), create=True)
    io.delete("doomed")
    assert io.read("doomed") is None
    # Only the tombstone head is left: it names nothing, and no create sent before the delete
    # can land on it (docs/protocol.md, invariant 12).
    assert keys(s3, bucket, "runs/") == ["runs/heads/doomed.json"]
    tombstone = json.loads(
        s3.get_object(Bucket=bucket, Key="runs/heads/doomed.json")["Body"].read()
    )
    assert (
        tombstone["deleted"] is True and tombstone["parts"] == [] and tombstone["snapshot"] is None
    )
    io.write("doomed", entries(0, 1), small(1), create=True)  # the id is free again
    assert list(io.read("doomed").entries) == entries(0, 1)


def test_delete_of_an_unknown_id_follows_the_installed_contract(io: IO) -> None:
    if THIS_REPO:  # this repository's Store contract: KeyError
        with pytest.raises(KeyError, match="'nobody'"):
            io.delete("nobody")
    else:  # the published contract: "Does nothing if the id does not exist"
        io.delete("nobody")


def test_a_write_after_a_delete_is_a_lookup_error(make_store: MakeStore, mode: str) -> None:
    run, admin = IO(make_store(), mode), IO(make_store(), mode)
    run.write("gone", entries(0, 2), small(2), create=True)
    admin.delete("gone")
    with pytest.raises(LookupError, match="'gone'"):
        run.write("gone", entries(2, 3), small(3))


# Identity, packaging, imports -------------------------------------------------------------


def test_stores_on_the_same_endpoint_bucket_and_prefix_are_equal(
    make_store: MakeStore,
) -> None:
    assert make_store("runs") == make_store("runs/")
    assert make_store("runs") != make_store("other")


def test_the_store_scheme_entry_point_gives_s3store() -> None:
    (found,) = metadata.entry_points(group="alpineagents.stores", name="s3")
    assert found.load() is S3Store
    assert metadata.version("alpineagents-s3")


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-P", "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_importing_alpineagents_never_imports_boto() -> None:
    done = _python(
        """
        import sys, alpineagents, alpineagents.store
        assert not {"boto3", "botocore", "aioboto3"} & set(sys.modules), sorted(sys.modules)
        """
    )
    assert done.returncode == 0, done.stderr


def test_without_boto3_the_import_says_what_to_install() -> None:
    done = _python(
        """
        import sys
        sys.modules["boto3"] = None  # as if it were not installed
        import alpineagents_s3
        """
    )
    assert done.returncode != 0
    assert "pip install 'boto3>=1.40'" in done.stderr


def test_without_aioboto3_sync_works_and_async_says_what_to_install(moto_url: str) -> None:
    done = _python(
        f"""
        import asyncio, sys
        sys.modules["aioboto3"] = None  # as if it were not installed
        from alpineagents_s3 import S3Store
        store = S3Store("no-bucket", endpoint_url={moto_url!r})
        try:
            store.read("x")
        except FileNotFoundError:
            pass  # the sync side works: it reached the server
        try:
            asyncio.run(store.aread("x"))
        except ImportError as e:
            print(e)
        """
    )
    assert done.returncode == 0, done.stderr
    assert "pip install 'alpineagents-s3[async]'" in done.stdout
