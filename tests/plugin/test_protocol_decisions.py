"""The S3 protocol's decisions, driven step by step against an in-memory bucket, no server.

Each store operation is a generator of steps (``alpineagents_s3._steps``). The scripted driver
here answers its calls from :class:`FakeBucket`, a bucket in a dict that honours the conditional
headers S3Store sends, and lets a test change the answers: an error instead of the response, a
request S3 applied whose answer was lost, a listing taken before another writer's PUTs, another
writer's save between two batches. So 409s, lost answers, orphans and baseline races are checked
in milliseconds. What only a server shows (botocore's retries, real ETags, aiohttp) stays with
the moto and LocalStack tests.

This module is long because the fake bucket lives with the tests that depend on its details.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from botocore.exceptions import (
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
    ReadTimeoutError,
)

from alpineagents_s3 import (
    BucketNotFoundError,
    ConcurrentWriteError,
    ConditionalWritesUnsupportedError,
    CorruptStateError,
    S3AccessDeniedError,
    S3StoreError,
    StateExistsError,
    _contract,
)
from alpineagents_s3 import _steps as steps_module
from alpineagents_s3._deleting import check_deletes, delete
from alpineagents_s3._layout import ENTRIES_META, GENERATION_META, LAYOUT_META, Layout
from alpineagents_s3._lock import HandoffLock
from alpineagents_s3._reading import list_states, read
from alpineagents_s3._steps import Batch, Call, Hold, Outcome, Release, Steps
from alpineagents_s3._sweeping import sweep
from alpineagents_s3._sync import SyncDriver
from alpineagents_s3._translate import Fault, Where, translate, translate_fault
from alpineagents_s3._versions import Ledger
from alpineagents_s3._writing import write

ROOT = "runs/"


def client_error(code: str, status: int, operation: str = "PutObject") -> ClientError:
    response: Any = {
        "Error": {"Code": code, "Message": f"{code} (scripted)"},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    return ClientError(response, operation)


def lost() -> Exception:
    """What the client raises when S3's answer never arrives."""
    return ReadTimeoutError(endpoint_url="http://fake")


@dataclass
class Stored:
    body: bytes
    etag: str
    metadata: dict[str, str]
    modified: datetime


@dataclass
class Rule:
    """Answer calls that match with ``outcome`` (after applying the call, if ``applied``)."""

    matches: Callable[[Call], bool]
    outcome: Callable[[Call], Outcome]
    times: int = 1
    applied: bool = False


@dataclass
class FakeBucket:
    """One bucket in memory, answering S3Store's calls as S3 does, conditional headers included.

    Its methods have the boto3 client's names (a real ``SyncDriver`` can use it as its client);
    :meth:`answer` is the scripted driver's entry: the outcome of one call, rules first.
    """

    objects: dict[str, Stored] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    rules: list[Rule] = field(default_factory=list)
    guard: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, call: Call) -> Outcome:
        with self.guard:
            self.calls.append(call)
            for rule in self.rules:
                if rule.times and rule.matches(call):
                    rule.times -= 1
                    if rule.applied:
                        self._outcome(call)
                    return rule.outcome(call)
            return self._outcome(call)

    def _outcome(self, call: Call) -> Outcome:
        try:
            response: dict[str, Any] = getattr(self, call.method)(**call.params)
        except ClientError as e:
            return e
        if isinstance(response.get("Body"), io.BytesIO):
            response["Body"] = response["Body"].getvalue()
        return response

    # The client's methods ----------------------------------------------------------------

    def put_object(
        self,
        Key: str,
        Body: bytes,
        IfNoneMatch: str | None = None,
        IfMatch: str | None = None,
        Metadata: dict[str, str] | None = None,
        **_: Any,
    ) -> dict[str, Any]:
        current = self.objects.get(Key)
        if IfNoneMatch == "*" and current is not None:
            raise client_error("PreconditionFailed", 412)
        if IfMatch is not None:
            if current is None:
                raise client_error("NoSuchKey", 404)
            if current.etag != IfMatch:
                raise client_error("PreconditionFailed", 412)
        etag = f'"{hashlib.md5(Body).hexdigest()}"'
        self.objects[Key] = Stored(Body, etag, dict(Metadata or {}), datetime.now(UTC))
        return {"ETag": etag}

    def get_object(self, Key: str, **_: Any) -> dict[str, Any]:
        stored = self.objects.get(Key)
        if stored is None:
            raise client_error("NoSuchKey", 404, "GetObject")
        return {
            "Body": io.BytesIO(stored.body),
            "ETag": stored.etag,
            "Metadata": dict(stored.metadata),
        }

    def head_object(self, Key: str, IfMatch: str | None = None, **_: Any) -> dict[str, Any]:
        stored = self.objects.get(Key)
        if stored is None:
            raise client_error("404", 404, "HeadObject")
        if IfMatch is not None and IfMatch != stored.etag:
            raise client_error("412", 412, "HeadObject")  # a HEAD's error has no body
        return {"ETag": stored.etag, "Metadata": dict(stored.metadata)}

    def list_objects_v2(
        self,
        Prefix: str,
        MaxKeys: int = 1000,
        ContinuationToken: str | None = None,
        StartAfter: str | None = None,
        Delimiter: str | None = None,
        **_: Any,
    ) -> dict[str, Any]:
        after = ContinuationToken or StartAfter or ""
        names: list[str] = []
        for key in sorted(k for k in self.objects if k.startswith(Prefix) and k > after):
            if Delimiter and Delimiter in key[len(Prefix) :]:
                key = key[: key.index(Delimiter, len(Prefix)) + 1]
            if key not in names:
                names.append(key)
        page, more = names[:MaxKeys], len(names) > MaxKeys
        response: dict[str, Any] = {
            "Prefix": Prefix,
            "IsTruncated": more,
            "Contents": [
                {
                    "Key": k,
                    "ETag": self.objects[k].etag,
                    "Size": len(self.objects[k].body),
                    "LastModified": self.objects[k].modified,
                }
                for k in page
                if k in self.objects
            ],
            "CommonPrefixes": [{"Prefix": k} for k in page if k not in self.objects],
        }
        if more:
            # The fake's token is the last name of the page (S3's is opaque).
            last = page[-1]
            response["NextContinuationToken"] = last + "\uffff" if last.endswith("/") else last
        return response

    def delete_object(self, Key: str, **_: Any) -> dict[str, Any]:
        self.objects.pop(Key, None)
        return {}

    def delete_objects(self, Delete: dict[str, Any], **_: Any) -> dict[str, Any]:
        for item in Delete["Objects"]:
            self.objects.pop(item["Key"], None)
        return {"Deleted": Delete["Objects"]}

    # For tests -----------------------------------------------------------------------------

    def keys(self, contains: str = "") -> list[str]:
        return sorted(k for k in self.objects if contains in k)

    def made(self, method: str, **params: Any) -> list[Call]:
        """The calls of ``method`` whose parameters include ``params``."""
        return [
            c
            for c in self.calls
            if c.method == method and all(c.params.get(k) == v for k, v in params.items())
        ]


def run(
    steps: Steps[Any],
    bucket: FakeBucket,
    before: Callable[[int, Sequence[Call]], None] | None = None,
) -> Any:
    """The scripted driver: answer each batch from ``bucket``; ``before(n, calls)`` runs first.

    Holds and releases locks like the real drivers (a lock held elsewhere is a test error: this
    driver runs in one thread). Delays are recorded, not slept.
    """
    held: list[HandoffLock] = []
    batches = 0
    try:
        step = next(steps)
        while True:
            outcomes: list[Outcome] = []
            if isinstance(step, Hold):
                assert not step.lock.locked, "the scripted driver would wait forever"
                step.lock.acquire()
                held.append(step.lock)
            elif isinstance(step, Release):
                held.remove(step.lock)
                step.lock.release()
            else:
                if before is not None:
                    before(batches, step.calls)
                batches += 1
                if step.delay:
                    bucket.calls.append(Call("(delay)", {"seconds": step.delay}))
                outcomes = [bucket.answer(call) for call in step.calls]
            step = steps.send(outcomes)
    except StopIteration as done:
        return done.value
    finally:
        steps.close()
        for lock in held:
            lock.release()


def entries(first: int, last: int, tag: str = "") -> list[dict[str, Any]]:
    """History entries ``first`` to ``last - 1``; ``tag`` tells one writer's from another's."""
    return [{"seq": s, "kind": "user", "data": {"text": f"m{s}{tag}"}} for s in range(first, last)]


def snapshot(n: int, tag: str = "") -> dict[str, Any]:
    return {"v": 1, "entries": n, "tag": tag}


@dataclass
class Writer:
    """One store object: the layout every store object shares, and a ledger of its own."""

    bucket: FakeBucket
    ledger: Ledger = field(default_factory=Ledger)
    layout: Layout = field(default_factory=lambda: Layout("b", ROOT, "http://fake"))

    def write(
        self,
        state_id: str,
        new: list[dict[str, Any]],
        small: dict[str, Any] | None,
        create: bool = False,
        before: Callable[[int, Sequence[Call]], None] | None = None,
    ) -> None:
        run(write(self.layout, self.ledger, state_id, new, small, create), self.bucket, before)

    def read(
        self, state_id: str, before: Callable[[int, Sequence[Call]], None] | None = None
    ) -> Any:
        return run(read(self.layout, self.ledger, state_id), self.bucket, before)


@pytest.fixture
def bucket() -> FakeBucket:
    return FakeBucket()


def texts(record: Any) -> list[str]:
    return [entry["data"]["text"] for entry in record.entries]


def stored_small(record: Any) -> Any:
    """A Record's snapshot (0.2-0.4, this repository's core) or info (0.5+)."""
    return getattr(record, "info" if _contract.GENERATION == "info" else "snapshot")


def snapshot_key(state_id: str) -> str:
    return f"{ROOT}{state_id}/snapshot.json"


def is_snapshot_put(call: Call, header: str) -> bool:
    return (
        call.method == "put_object"
        and call.params["Key"].endswith("snapshot.json")
        and header in call.params
    )


# 409 ConditionalRequestConflict ------------------------------------------------------------


def test_a_409_is_sent_again_after_a_backoff_and_the_save_lands(bucket: FakeBucket) -> None:
    bucket.rules.append(
        Rule(
            lambda c: is_snapshot_put(c, "IfNoneMatch"),
            lambda c: client_error("ConditionalRequestConflict", 409),
            times=2,
        )
    )
    Writer(bucket).write("s", entries(0, 2), snapshot(2), create=True)
    delays = [c.params["seconds"] for c in bucket.calls if c.method == "(delay)"]
    assert len(delays) == 2 and all(0 <= d <= steps_module.CONFLICT_BACKOFF * 4 for d in delays)
    assert len(bucket.made("put_object", Key=snapshot_key("s"))) == 3
    assert texts(Writer(bucket).read("s")) == ["m0", "m1"]


def test_409s_that_never_end_are_a_concurrent_write_error(bucket: FakeBucket) -> None:
    writer = Writer(bucket)
    writer.write("s", entries(0, 1), snapshot(1), create=True)
    bucket.rules.append(
        Rule(
            lambda c: is_snapshot_put(c, "IfMatch"),
            lambda c: client_error("ConditionalRequestConflict", 409),
            times=99,
        )
    )
    with pytest.raises(ConcurrentWriteError, match=r"409 .* after 6 attempts"):
        writer.write("s", entries(1, 2), snapshot(2))
    assert len(bucket.made("put_object", Key=snapshot_key("s"))) == 1 + 6


# Lost answers ---------------------------------------------------------------------------------


def test_a_create_applied_but_unanswered_is_recognised_when_tried_again(
    bucket: FakeBucket,
) -> None:
    writer = Writer(bucket)
    bucket.rules.append(
        Rule(lambda c: is_snapshot_put(c, "IfNoneMatch"), lambda c: lost(), applied=True)
    )
    with pytest.raises(S3StoreError, match=r"PutObject s3://b/runs/s/snapshot.json failed"):
        writer.write("s", entries(0, 2), snapshot(2, "first try"), create=True)
    # The same store object tries again: its own snapshot is found, not "the id is taken".
    writer.write("s", entries(0, 2), snapshot(2, "second try"), create=True)
    stored = json.loads(bucket.objects[snapshot_key("s")].body)
    assert stored["tag"] == "second try"
    generations = {k.split("/")[3] for k in bucket.keys("/entries/")}
    assert len(generations) == 1  # the retry reused the first attempt's generation
    # Another store object's create of that id is refused, and leaves nothing behind.
    before = bucket.keys()
    with pytest.raises(StateExistsError, match=r"already has a State with id 's'"):
        Writer(bucket).write("s", entries(0, 1, "other"), snapshot(1), create=True)
    assert bucket.keys() == before


def test_a_create_that_failed_while_taking_over_its_lost_attempt_is_tried_again(
    bucket: FakeBucket,
) -> None:
    """Its first attempt landed unanswered; the second finds it, and fails bringing it up to
    date; the third must still know the State as its own (found by the fault proxy)."""
    writer = Writer(bucket)
    bucket.rules.append(
        Rule(lambda c: is_snapshot_put(c, "IfNoneMatch"), lambda c: lost(), applied=True)
    )
    with pytest.raises(S3StoreError):
        writer.write("s", entries(0, 2), snapshot(2, "first"), create=True)
    bucket.rules.append(
        Rule(lambda c: is_snapshot_put(c, "IfMatch"), lambda c: client_error("InternalError", 500))
    )
    with pytest.raises(S3StoreError):
        writer.write("s", entries(0, 2), snapshot(2, "second"), create=True)
    writer.write("s", entries(0, 2), snapshot(2, "third"), create=True)  # not StateExistsError
    assert texts(Writer(bucket).read("s")) == ["m0", "m1"]
    assert json.loads(bucket.objects[snapshot_key("s")].body)["tag"] == "third"


def test_a_create_whose_retry_got_412_is_taken_as_ours(bucket: FakeBucket) -> None:
    # botocore sent the PUT again after the first answer was lost: S3 says 412 to the retry.
    bucket.rules.append(
        Rule(
            lambda c: is_snapshot_put(c, "IfNoneMatch"),
            lambda c: client_error("PreconditionFailed", 412),
            applied=True,
        )
    )
    writer = Writer(bucket)
    writer.write("s", entries(0, 1), snapshot(1), create=True)
    writer.write("s", entries(1, 2), snapshot(2))  # If-Match on the ETag it recognised
    assert texts(Writer(bucket).read("s")) == ["m0", "m1"]


def test_an_update_applied_but_unanswered_does_not_look_like_a_second_writer(
    bucket: FakeBucket,
) -> None:
    writer = Writer(bucket)
    writer.write("s", entries(0, 1), snapshot(1), create=True)
    bucket.rules.append(
        Rule(lambda c: is_snapshot_put(c, "IfMatch"), lambda c: lost(), applied=True)
    )
    with pytest.raises(S3StoreError, match=r"ReadTimeoutError|timeout"):
        writer.write("s", entries(1, 2), snapshot(2))
    writer.write("s", entries(2, 3), snapshot(3))  # 412, then its own token is found
    assert json.loads(bucket.objects[snapshot_key("s")].body) == snapshot(3)
    assert texts(Writer(bucket).read("s")) == ["m0", "m1", "m2"]


def test_an_update_whose_retry_got_412_lands_in_the_same_save(bucket: FakeBucket) -> None:
    writer = Writer(bucket)
    writer.write("s", entries(0, 1), snapshot(1), create=True)
    bucket.rules.append(
        Rule(
            lambda c: is_snapshot_put(c, "IfMatch"),
            lambda c: client_error("PreconditionFailed", 412),
            applied=True,
        )
    )
    writer.write("s", entries(1, 2), snapshot(2))
    assert json.loads(bucket.objects[snapshot_key("s")].body) == snapshot(2)


def test_a_save_cut_short_while_its_snapshot_put_was_applied_is_recognised(
    bucket: FakeBucket,
) -> None:
    """SIGTERM's SystemExit (or a cancellation) unwinds the save while S3 applies its PUT."""
    writer = Writer(bucket)
    writer.write("s", entries(0, 1), snapshot(1), create=True)
    steps = write(writer.layout, writer.ledger, "s", entries(1, 2), snapshot(2), False)
    batch = until_snapshot_put(steps, bucket)
    for call in batch.calls:
        bucket.answer(call)  # applied...
    steps.close()  # ...and the save never learns of it
    writer.write("s", entries(1, 3), snapshot(3))  # the next save of the same copy
    assert texts(Writer(bucket).read("s")) == ["m0", "m1", "m2"]


def test_an_entry_put_applied_but_unanswered_is_skipped_on_the_next_save(
    bucket: FakeBucket,
) -> None:
    writer = Writer(bucket)
    writer.write("s", entries(0, 1), snapshot(1), create=True)
    bucket.rules.append(
        Rule(
            lambda c: c.method == "put_object" and c.params["Key"].endswith("0000000001.json"),
            lambda c: lost(),
            applied=True,
        )
    )
    with pytest.raises(S3StoreError):
        writer.write("s", entries(1, 2), snapshot(2))
    writer.write("s", entries(1, 3), snapshot(3))  # seq 1 is stored: 412, same body, skipped
    assert texts(Writer(bucket).read("s")) == ["m0", "m1", "m2"]


# Second writers -------------------------------------------------------------------------------


def test_a_second_writer_is_refused_and_nothing_it_saved_is_overwritten(
    bucket: FakeBucket,
) -> None:
    first, second = Writer(bucket), Writer(bucket)
    first.write("s", entries(0, 1), snapshot(1), create=True)
    assert texts(second.read("s")) == ["m0"]
    second.write("s", entries(1, 2, "B"), snapshot(2, "B"))
    with pytest.raises(ConcurrentWriteError, match=r"another writer .* store.load\('s'\)"):
        first.write("s", [], snapshot(1, "A"))  # If-Match on the ETag it wrote: 412
    with pytest.raises(ConcurrentWriteError):  # and every later save of that copy
        first.write("s", entries(1, 2, "A"), snapshot(2, "A"))
    assert json.loads(bucket.objects[snapshot_key("s")].body)["tag"] == "B"
    assert texts(Writer(bucket).read("s")) == ["m0", "m1B"]


def test_an_entry_stored_with_another_body_names_its_key(bucket: FakeBucket) -> None:
    first = Writer(bucket)
    first.write("s", entries(0, 1), snapshot(1), create=True)
    Writer(bucket).read("s")
    second = Writer(bucket)
    second.read("s")
    second.write("s", entries(1, 2, "B"), None)  # entries only: the snapshot stays
    with pytest.raises(ConcurrentWriteError, match=r"runs/s/entries/.*/0000000001.json already"):
        first.write("s", entries(1, 2, "A"), snapshot(2))


def test_an_older_copy_loaded_before_another_writers_save_is_refused(bucket: FakeBucket) -> None:
    monitor, other = Writer(bucket), Writer(bucket)
    other.write("s", entries(0, 2), snapshot(2), create=True)
    monitor.read("s")  # copy 1: two entries
    other.write("s", entries(2, 4, "B"), snapshot(4, "B"))
    monitor.read("s")  # copy 2: four entries, the baseline moves, floor 4
    with pytest.raises(ConcurrentWriteError, match="continues from entry 2"):
        monitor.write("s", entries(2, 3, "old copy"), snapshot(3))
    monitor.write("s", entries(4, 5, "new copy"), snapshot(5))
    assert texts(Writer(bucket).read("s"))[-1] == "m4new copy"


def test_a_read_that_races_its_own_store_objects_write_keeps_the_newer_version(
    bucket: FakeBucket,
) -> None:
    writer = Writer(bucket)
    writer.write("s", entries(0, 2), snapshot(2), create=True)

    def save_meanwhile(batch: int, calls: Sequence[Call]) -> None:
        if batch == 1:  # after the read's snapshot GET and listing, before its entry GETs
            writer.write("s", entries(2, 3), snapshot(3))

    record = writer.read("s", before=save_meanwhile)
    assert len(record.entries) == 2  # what the read saw
    # The read did not take the older snapshot for the baseline: the next save lands.
    writer.write("s", entries(3, 4), snapshot(4))
    assert texts(Writer(bucket).read("s")) == ["m0", "m1", "m2", "m3"]


# Refused writers leave nothing that is read -------------------------------------------------


def test_a_refused_writers_other_entries_are_never_read_and_the_winner_carries_on(
    bucket: FakeBucket,
) -> None:
    Writer(bucket).write("s", entries(0, 1), snapshot(1), create=True)
    a, b = Writer(bucket), Writer(bucket)
    a.read("s")
    b.read("s")
    a.write("s", entries(1, 2, "A"), snapshot(2, "A"))
    with pytest.raises(ConcurrentWriteError):
        b.write("s", entries(1, 3, "B"), snapshot(3, "B"))
    assert bucket.keys("0000000002.json")  # B's entry 2 was PUT in parallel, and landed...
    assert texts(Writer(bucket).read("s")) == ["m0", "m1A"]  # ...but is not read
    a.write("s", entries(2, 3, "A"), snapshot(3, "A"))  # the winner replaces it
    assert texts(Writer(bucket).read("s")) == ["m0", "m1A", "m2A"]


def test_a_save_refused_at_an_entry_disowns_the_entries_it_stored(bucket: FakeBucket) -> None:
    Writer(bucket).write("s", entries(0, 1), snapshot(1), create=True)
    winner, writer = Writer(bucket), Writer(bucket)
    winner.read("s")
    writer.read("s")
    winner.write("s", entries(1, 2), snapshot(2))
    with pytest.raises(ConcurrentWriteError, match=r"0000000001\.json already holds"):
        writer.write("s", entries(1, 3, "other"), snapshot(3))
    # Its entry 2 landed on top of the stored snapshot, like a tool result saved alone; it is
    # marked as based on nothing, so it is not read, and the next save replaces it.
    (entry_2,) = bucket.keys("0000000002.json")
    assert bucket.objects[entry_2].metadata["alpineagents-base"] == "refused"
    assert texts(Writer(bucket).read("s")) == ["m0", "m1"]
    winner.write("s", entries(2, 3), snapshot(3))
    assert texts(Writer(bucket).read("s")) == ["m0", "m1", "m2"]


def test_disowning_leaves_an_entry_a_winner_replaced_meanwhile(bucket: FakeBucket) -> None:
    Writer(bucket).write("s", entries(0, 1), snapshot(1), create=True)
    first, writer = Writer(bucket), Writer(bucket)
    first.read("s")
    writer.read("s")
    first.write("s", entries(1, 2), snapshot(2))
    winner = {"seq": 2, "kind": "user", "data": {"text": "winner"}}

    def replace_first(batch: int, calls: Sequence[Call]) -> None:
        refusal = [c for c in calls if c.params.get("Metadata", {}).get("alpineagents-base")]
        if refusal and refusal[0].params["Metadata"]["alpineagents-base"] == "refused":
            key = refusal[0].params["Key"]
            bucket.put_object(Key=key, Body=json.dumps(winner).encode(), Metadata={"x": "y"})

    with pytest.raises(ConcurrentWriteError):
        writer.write("s", entries(1, 3, "other"), snapshot(3), before=replace_first)
    (entry_2,) = bucket.keys("0000000002.json")
    assert json.loads(bucket.objects[entry_2].body) == winner  # the If-Match PUT got 412


def over_locks(steps: Steps[Any], step: Any) -> Any:
    """``step``, or the step after the locks ``steps`` takes and lets go of from there on.

    This driver runs in one thread: a lock held elsewhere is a test error.
    """
    while isinstance(step, Hold | Release):
        if isinstance(step, Hold):
            assert not step.lock.locked, "the scripted driver would wait forever"
            step.lock.acquire()
        else:
            step.lock.release()
        step = steps.send([])
    return step


def until_snapshot_put(steps: Steps[Any], bucket: FakeBucket) -> Batch:
    """Answer ``steps`` from ``bucket`` up to its snapshot PUT, and return that batch unsent."""
    step = over_locks(steps, next(steps))
    while True:
        assert isinstance(step, Batch)
        if any(c.params["Key"].endswith("snapshot.json") for c in step.calls):
            return step
        step = over_locks(steps, steps.send([bucket.answer(c) for c in step.calls]))


def finish(steps: Steps[Any], step: Any, bucket: FakeBucket) -> None:
    """Answer ``steps`` from ``bucket``, ``step`` on, to its end; its exception propagates."""
    try:
        while True:
            step = over_locks(steps, step)
            assert isinstance(step, Batch)
            step = steps.send([bucket.answer(c) for c in step.calls])
    except StopIteration:
        return


def race_to_a_pending_entry(bucket: FakeBucket) -> tuple[Writer, Writer, Steps[Any], Batch]:
    """B stores its entry 1 and is held right before its snapshot PUT; A and the reader read."""
    Writer(bucket).write("s", entries(0, 1), snapshot(1), create=True)
    a, b, reader = Writer(bucket), Writer(bucket), Writer(bucket)
    a.read("s")
    b.read("s")
    reader.read("s")
    held = write(b.layout, b.ledger, "s", entries(1, 2, "B"), snapshot(2, "B"), False)
    return a, reader, held, until_snapshot_put(held, bucket)


@pytest.mark.parametrize("first", ["A", "B"])
def test_a_load_while_two_saves_race_reads_neither_saves_pending_entries(
    bucket: FakeBucket, first: str
) -> None:
    """The interleaving reliability/repro_mixed_read.py found, step by step, then both ends.

    B stores its entry 1 and is held before its snapshot PUT. A saves two entries and meets
    B's entry 1: before B's snapshot lands, A claims the snapshot and wins; after, A is refused.
    A load at every step of A's save reads one writer's history, never a mix.
    """
    a, reader, held, step = race_to_a_pending_entry(bucket)
    seen: list[list[str]] = []

    def load(batch: int, calls: Sequence[Call]) -> None:
        seen.append(texts(Writer(bucket).read("s")))

    if first == "B":
        finish(held, step, bucket)  # B's snapshot PUT lands: B won
        with pytest.raises(ConcurrentWriteError):
            a.write("s", entries(1, 3, "A"), snapshot(3, "A"), before=load)
        assert {tuple(s) for s in seen} == {("m0", "m1B")}
        winner = ["m0", "m1B"]
    else:
        a.write("s", entries(1, 3, "A"), snapshot(3, "A"), before=load)
        with pytest.raises(ConcurrentWriteError):  # B's snapshot PUT can no longer land
            finish(held, step, bucket)
        assert {tuple(s) for s in seen} == {("m0",)}
        winner = ["m0", "m1A", "m2A"]
    assert len(seen) > 3
    assert texts(Writer(bucket).read("s")) == winner
    with pytest.raises(ConcurrentWriteError):  # the reader, saving on top of what it read
        reader.write("s", entries(1, 2, "C"), snapshot(2, "C"))
    assert texts(Writer(bucket).read("s")) == winner


def test_a_save_killed_before_its_snapshot_did_not_happen_and_the_resume_goes_on(
    bucket: FakeBucket,
) -> None:
    writer = Writer(bucket)
    writer.write("s", entries(0, 1), snapshot(1), create=True)
    killed = write(writer.layout, writer.ledger, "s", entries(1, 3, "killed"), snapshot(3), False)
    until_snapshot_put(killed, bucket)
    killed.close()  # the process died before its snapshot PUT: the save never returned
    resumed = Writer(bucket)
    assert texts(resumed.read("s")) == ["m0"]  # its entries are pending: no snapshot counts them
    resumed.write("s", entries(1, 2, "R"), snapshot(2, "R"))  # a claim, then entry 1 replaced
    claims = [c for c in bucket.made("put_object", Key=snapshot_key("s")) if "IfMatch" in c.params]
    assert len(claims) == 2  # the claim (the stored snapshot again), then the save's own
    assert json.loads(claims[0].params["Body"]) == snapshot(1)
    assert texts(Writer(bucket).read("s")) == ["m0", "m1R"]  # the killed entry 2 is not read
    resumed.write("s", entries(2, 3, "R"), snapshot(3, "R"))  # replaces it, no claim needed
    assert texts(Writer(bucket).read("s")) == ["m0", "m1R", "m2R"]
    assert len(bucket.made("put_object", Key=snapshot_key("s"))) == 4


@pytest.mark.parametrize("finishes_first", ["A", "B"])
def test_two_saves_that_each_took_a_seq_the_other_needs_end_with_one_winner(
    bucket: FakeBucket, finishes_first: str
) -> None:
    """Was "both refused": A stores seq 1 and B seq 2 before either learns of the other."""
    Writer(bucket).write("s", entries(0, 1), snapshot(1), create=True)
    a, b = Writer(bucket), Writer(bucket)
    a.read("s")
    b.read("s")
    saves = {
        "A": write(a.layout, a.ledger, "s", entries(1, 3, "A"), snapshot(3, "A"), False),
        "B": write(b.layout, b.ledger, "s", entries(1, 3, "B"), snapshot(3, "B"), False),
    }
    puts: dict[str, Sequence[Call]] = {}  # [seq 1, seq 2] each
    for who, steps in saves.items():
        batch = over_locks(steps, next(steps))
        assert isinstance(batch, Batch)
        puts[who] = batch.calls
    answers: dict[str, list[Any]] = {"A": [None, None], "B": [None, None]}
    answers["A"][0] = bucket.answer(puts["A"][0])
    answers["B"][1] = bucket.answer(puts["B"][1])
    answers["A"][1] = bucket.answer(puts["A"][1])  # 412: B's
    answers["B"][0] = bucket.answer(puts["B"][0])  # 412: A's
    outcomes: dict[str, str] = {}
    for who in (finishes_first, "B" if finishes_first == "A" else "A"):
        steps, answer = saves[who], answers[who]
        try:
            finish(steps, steps.send(answer), bucket)
            outcomes[who] = "saved"
        except ConcurrentWriteError:
            outcomes[who] = "refused"
    loser = "B" if finishes_first == "A" else "A"
    assert outcomes == {finishes_first: "saved", loser: "refused"}
    stored = texts(Writer(bucket).read("s"))
    assert stored == ["m0", f"m1{finishes_first}", f"m2{finishes_first}"]


def test_an_orphan_of_a_save_still_under_way_is_never_replaced(bucket: FakeBucket) -> None:
    """A save's entry 3 lands before its 1 and 2; a reader takes it for an orphan."""
    Writer(bucket).write("s", entries(0, 1), snapshot(1), create=True)
    w, reader = Writer(bucket), Writer(bucket)
    w.read("s")
    steps = write(w.layout, w.ledger, "s", entries(1, 4, "W"), snapshot(4, "W"), False)
    batch = over_locks(steps, next(steps))
    assert isinstance(batch, Batch)
    late = [c for c in batch.calls if not c.params["Key"].endswith("0000000003.json")]
    early = bucket.answer(next(c for c in batch.calls if c not in late))
    assert texts(reader.read("s")) == ["m0"]  # seq 3 is an orphan beyond the gap at 1
    answers = {id(c): bucket.answer(c) for c in late}
    step = steps.send([early if c not in late else answers[id(c)] for c in batch.calls])
    finish(steps, step, bucket)  # W's snapshot PUT lands
    with pytest.raises(ConcurrentWriteError):  # the claim finds W's snapshot: nothing touched
        reader.write("s", entries(1, 2, "R"), snapshot(2, "R"))
    assert texts(Writer(bucket).read("s")) == ["m0", "m1W", "m2W", "m3W"]


def test_a_claim_whose_answer_was_lost_is_recognised(bucket: FakeBucket) -> None:
    writer = Writer(bucket)
    writer.write("s", entries(0, 1), snapshot(1), create=True)
    killed = write(writer.layout, writer.ledger, "s", entries(1, 2, "killed"), snapshot(2), False)
    until_snapshot_put(killed, bucket)
    killed.close()
    resumed = Writer(bucket)
    resumed.read("s")
    bucket.rules.append(
        Rule(lambda c: is_snapshot_put(c, "IfMatch"), lambda c: lost(), applied=True)
    )
    with pytest.raises(S3StoreError):
        resumed.write("s", entries(1, 2, "R"), snapshot(2, "R"))
    resumed.write("s", entries(1, 2, "R"), snapshot(2, "R"))  # sent again: lands
    assert texts(Writer(bucket).read("s")) == ["m0", "m1R"]


def test_entries_saved_alone_by_two_writers_are_read_up_to_the_first_ones(
    bucket: FakeBucket,
) -> None:
    Writer(bucket).write("s", entries(0, 1), snapshot(1), create=True)
    a, b = Writer(bucket), Writer(bucket)
    a.read("s")
    b.read("s")
    a.write("s", entries(1, 2, "A"), None)  # a tool result saved alone
    # B's entries go one after the other: its seq 1 is refused (A's), so its 2 is never sent.
    with pytest.raises(ConcurrentWriteError):
        b.write("s", entries(1, 3, "B"), None)
    assert not bucket.keys("0000000002.json")
    assert texts(Writer(bucket).read("s")) == ["m0", "m1A"]
    a.write("s", entries(2, 3, "A"), snapshot(3, "A"))
    assert texts(Writer(bucket).read("s")) == ["m0", "m1A", "m2A"]


def test_entries_saved_alone_that_a_reader_saved_on_top_of_are_saved(bucket: FakeBucket) -> None:
    """A's tool result is committed by its PUT; another process loads it and saves on top."""
    Writer(bucket).write("s", entries(0, 1), snapshot(1), create=True)
    a, reader = Writer(bucket), Writer(bucket)
    a.read("s")
    a.write("s", entries(1, 2, "A"), None)
    assert texts(reader.read("s")) == ["m0", "m1A"]
    reader.write("s", entries(2, 3, "R"), snapshot(3, "R"))
    assert texts(Writer(bucket).read("s")) == ["m0", "m1A", "m2R"]
    with pytest.raises(ConcurrentWriteError):  # but A's copy is behind: its next save is refused
        a.write("s", entries(2, 3, "A"), snapshot(3, "A"))
    with pytest.raises(ConcurrentWriteError):  # alone too: seq 2 is the reader's
        a.write("s", entries(2, 3, "A"), None)
    assert texts(Writer(bucket).read("s")) == ["m0", "m1A", "m2R"]


def test_a_store_object_that_did_not_read_never_counts_a_killed_saves_entries(
    bucket: FakeBucket,
) -> None:
    writer = Writer(bucket)
    writer.write("s", entries(0, 1), snapshot(1), create=True)
    killed = write(writer.layout, writer.ledger, "s", entries(1, 4, "killed"), snapshot(4), False)
    until_snapshot_put(killed, bucket)
    killed.close()
    Writer(bucket).write("s", entries(1, 2, "R"), snapshot(2, "R"))  # its first request
    assert texts(Writer(bucket).read("s")) == ["m0", "m1R"]  # not the killed 2 and 3
    assert bucket.objects[snapshot_key("s")].metadata[ENTRIES_META] == "2"


def test_a_refused_stale_copy_leaves_nothing_that_is_read(bucket: FakeBucket) -> None:
    Writer(bucket).write("s", entries(0, 1), snapshot(1), create=True)
    a, stale = Writer(bucket), Writer(bucket)
    a.read("s")
    stale.read("s")
    a.write("s", [], snapshot(1, "data only"))
    with pytest.raises(ConcurrentWriteError, match="nothing of this save will be read"):
        stale.write("s", entries(1, 2, "stale"), snapshot(2, "stale"))
    assert texts(Writer(bucket).read("s")) == ["m0"]
    a.write("s", entries(1, 2, "A"), snapshot(2, "A"))
    assert texts(Writer(bucket).read("s")) == ["m0", "m1A"]


def test_an_entry_committed_alone_after_another_writers_snapshot_is_kept_and_both_are_refused(
    bucket: FakeBucket,
) -> None:
    """B replaces the snapshot with a save that adds no entry; A, holding the one before,
    commits a tool result alone (layout 3: its PUT is the save, nothing is checked).

    The result is the State's (a load reads it on B's snapshot: a tool that ran is never
    lost), and each writer is refused at its next save that contends: A at its next snapshot
    PUT, B at the seq A holds.
    """
    Writer(bucket).write("s", entries(0, 1), snapshot(1), create=True)
    a, b = Writer(bucket), Writer(bucket)
    a.read("s")
    b.read("s")
    b.write("s", [], snapshot(1, "B"))
    a.write("s", entries(1, 2, "A"), None)  # a tool result, committed alone
    record = Writer(bucket).read("s")
    assert texts(record) == ["m0", "m1A"] and stored_small(record)["tag"] == "B"
    with pytest.raises(ConcurrentWriteError, match="another writer"):
        a.write("s", entries(2, 3, "A"), snapshot(3, "A"))
    with pytest.raises(ConcurrentWriteError):
        b.write("s", entries(1, 2, "B"), None)
    record = Writer(bucket).read("s")
    assert texts(record) == ["m0", "m1A"] and stored_small(record)["tag"] == "B"


def test_a_save_after_the_state_was_deleted_raises_and_leaves_nothing(
    bucket: FakeBucket,
) -> None:
    running = Writer(bucket)
    running.write("s", entries(0, 2), snapshot(2), create=True)
    other = Writer(bucket)
    run(delete(other.layout, other.ledger, "s"), bucket)
    # A tool result committed alone: no request tells the store object, so it is stored...
    running.write("s", entries(2, 3), None)
    assert len(bucket.keys()) == 1
    # ...under a generation no snapshot names (no load reads it), until the next save with a
    # snapshot, which raises and removes what the store object committed alone since.
    with pytest.raises(KeyError, match="was deleted"):
        running.write("s", entries(3, 4), snapshot(4))
    assert bucket.keys() == []
    running.write("t", entries(0, 1), snapshot(1), create=True)
    run(delete(other.layout, other.ledger, "t"), bucket)
    with pytest.raises(KeyError, match="was deleted"):
        running.write("t", entries(1, 2), snapshot(2))
    assert bucket.keys() == []


def test_a_delete_between_an_entry_put_and_the_snapshot_put_leaves_nothing(
    bucket: FakeBucket,
) -> None:
    running = Writer(bucket)
    running.write("s", entries(0, 1), snapshot(1), create=True)
    running.write("s", entries(1, 2), None)  # committed alone
    other = Writer(bucket)

    def delete_now(batch: int, calls: Sequence[Call]) -> None:
        if any(c.params["Key"].endswith("snapshot.json") for c in calls):  # entries stored
            run(delete(other.layout, other.ledger, "s"), bucket)

    with pytest.raises(KeyError):
        running.write("s", entries(2, 4), snapshot(4), before=delete_now)
    assert bucket.keys() == []


def test_entries_saved_alone_after_a_lost_snapshot_answer_are_read(bucket: FakeBucket) -> None:
    writer = Writer(bucket)
    writer.write("s", entries(0, 1), snapshot(1), create=True)
    bucket.rules.append(
        Rule(lambda c: is_snapshot_put(c, "IfMatch"), lambda c: lost(), applied=True)
    )
    with pytest.raises(S3StoreError):
        writer.write("s", entries(1, 2), snapshot(2))
    writer.write("s", entries(2, 3), None)  # based on the snapshot that did land
    assert texts(Writer(bucket).read("s")) == ["m0", "m1", "m2"]


def test_entries_written_before_bases_were_recorded_are_still_read(bucket: FakeBucket) -> None:
    writer = Writer(bucket)
    writer.write("s", entries(0, 1), snapshot(1), create=True)
    stored = bucket.objects[snapshot_key("s")]
    generation = stored.metadata[GENERATION_META]
    key = writer.layout.entry_key("s", generation, 1)
    bucket.put_object(Key=key, Body=json.dumps(entries(1, 2)[0]).encode())  # no base
    # A layout 3 snapshot reads after its count only entries committed alone (so marked)...
    assert texts(Writer(bucket).read("s")) == ["m0"]
    # ...and one of layout 1 (as written then, without the mark) the entries saved alone.
    stored.metadata = {k: v for k, v in stored.metadata.items() if k != LAYOUT_META}
    assert texts(Writer(bucket).read("s")) == ["m0", "m1"]


def test_a_sweep_keeps_a_create_under_way_and_removes_old_leftovers(bucket: FakeBucket) -> None:
    writer = Writer(bucket)
    old = write(writer.layout, writer.ledger, "old", entries(0, 2), snapshot(2), True)
    until_snapshot_put(old, bucket)
    old.close()  # killed before its snapshot PUT
    later = datetime.now(UTC) + timedelta(minutes=30)
    for stored in bucket.objects.values():
        stored.modified -= timedelta(hours=3)  # three hours ago
    under_way = write(writer.layout, writer.ledger, "new", entries(0, 1), snapshot(1), True)
    step = until_snapshot_put(under_way, bucket)
    removed = run(sweep(writer.layout, 3600, now=later), bucket)
    assert [k.rsplit("/", 1)[1] for k in removed] == ["0000000000.json", "0000000001.json"]
    assert all("/old/" in k for k in removed)
    finish(under_way, step, bucket)  # the create under way lands, whole
    assert texts(Writer(bucket).read("new")) == ["m0"]
    assert run(sweep(writer.layout, 0), bucket) == []


# Orphans and listings -----------------------------------------------------------------------


def plant_orphans(bucket: FakeBucket, writer: Writer, state_id: str, seqs: list[int]) -> str:
    """Entry objects beyond a gap, as a save killed during its parallel PUTs leaves them."""
    generation = bucket.objects[snapshot_key(state_id)].metadata[GENERATION_META]
    for entry in entries(0, max(seqs) + 1, "killed"):
        if entry["seq"] in seqs:
            key = writer.layout.entry_key(state_id, generation, entry["seq"])
            bucket.put_object(Key=key, Body=json.dumps(entry).encode())
    return generation


def test_orphans_are_left_out_then_replaced_or_removed_by_the_next_save(
    bucket: FakeBucket,
) -> None:
    Writer(bucket).write("s", entries(0, 1), snapshot(1), create=True)
    writer = Writer(bucket)
    generation = plant_orphans(bucket, writer, "s", [2, 3])
    assert texts(writer.read("s")) == ["m0"]  # seq 1 is missing: 2 and 3 are orphans
    writer.write("s", entries(1, 3), snapshot(3))
    orphan_2 = writer.layout.entry_key("s", generation, 2)
    replaced = bucket.made("put_object", Key=orphan_2)
    assert [c.params.get("IfMatch") is not None for c in replaced] == [True]
    deleted = [
        o["Key"] for c in bucket.made("delete_objects") for o in c.params["Delete"]["Objects"]
    ]
    assert deleted == [writer.layout.entry_key("s", generation, 3)]
    assert texts(Writer(bucket).read("s")) == ["m0", "m1", "m2"]


def test_an_orphan_replaced_by_someone_else_meanwhile_is_a_second_writer(
    bucket: FakeBucket,
) -> None:
    Writer(bucket).write("s", entries(0, 1), snapshot(1), create=True)
    writer = Writer(bucket)
    generation = plant_orphans(bucket, writer, "s", [2])
    writer.read("s")
    key = writer.layout.entry_key("s", generation, 2)
    bucket.put_object(Key=key, Body=json.dumps(entries(2, 3, "C")[0]).encode())  # new ETag
    with pytest.raises(ConcurrentWriteError, match=r"0000000002\.json already holds"):
        writer.write("s", entries(1, 3), snapshot(3))


def test_clearing_orphans_holds_the_states_lock_and_releases_it(bucket: FakeBucket) -> None:
    Writer(bucket).write("s", entries(0, 1), snapshot(1), create=True)
    writer = Writer(bucket)
    plant_orphans(bucket, writer, "s", [2])
    writer.read("s")
    seen: list[type] = []  # the steps on the orphans' lock
    appends = writer.ledger.appends.get("s")  # the lock of the store object's saves of it
    generator = write(writer.layout, writer.ledger, "s", entries(1, 2), snapshot(2), False)
    outcomes: list[Outcome] = []
    started = False
    try:
        while True:
            step = generator.send(outcomes) if started else next(generator)
            started = True
            if isinstance(step, Hold | Release):
                outcomes = []
                if step.lock is not appends:
                    assert step.lock is writer.ledger.lock("s")
                    seen.append(type(step))
            else:
                assert isinstance(step, Batch)
                outcomes = [bucket.answer(c) for c in step.calls]
    except StopIteration:
        pass
    assert seen == [Hold, Release]


def test_a_write_waits_for_the_lock_another_thread_holds(bucket: FakeBucket) -> None:
    Writer(bucket).write("s", entries(0, 1), snapshot(1), create=True)
    writer = Writer(bucket)
    plant_orphans(bucket, writer, "s", [2])
    writer.read("s")
    driver = SyncDriver(lambda: bucket, 4, client=bucket)
    lock = writer.ledger.lock("s")
    lock.acquire()
    done = threading.Event()

    def save() -> None:
        driver.run(write(writer.layout, writer.ledger, "s", entries(1, 2), snapshot(2), False))
        done.set()

    thread = threading.Thread(target=save)
    thread.start()
    time.sleep(0.2)
    assert not done.is_set() and not bucket.made("delete_objects")
    lock.release()
    thread.join(5)
    assert done.is_set() and not lock.locked
    assert texts(Writer(bucket).read("s")) == ["m0", "m1"]


def test_a_failure_while_clearing_releases_the_lock(bucket: FakeBucket) -> None:
    Writer(bucket).write("s", entries(0, 1), snapshot(1), create=True)
    writer = Writer(bucket)
    plant_orphans(bucket, writer, "s", [3])
    writer.read("s")
    bucket.rules.append(
        Rule(lambda c: c.method == "delete_objects", lambda c: client_error("AccessDenied", 403))
    )
    with pytest.raises(S3AccessDeniedError, match="DeleteObjects s3://b/runs/s/entries/"):
        writer.write("s", entries(1, 2), snapshot(2))
    assert not writer.ledger.lock("s").locked


def test_a_read_lists_again_when_the_snapshot_counts_entries_it_missed(
    bucket: FakeBucket,
) -> None:
    writer = Writer(bucket)
    writer.write("s", entries(0, 2), snapshot(2), create=True)
    # The listing is answered as it was before the writer's next save...
    stale = bucket.list_objects_v2(Prefix=f"{ROOT}s/entries/")
    bucket.rules.append(
        Rule(
            lambda c: (
                c.method == "list_objects_v2"
                and c.params["Prefix"].endswith("/entries/")
                and "StartAfter" not in c.params
            ),
            lambda c: stale,
        )
    )
    writer.write("s", entries(2, 4), snapshot(4))  # ...and the snapshot GET after it
    assert bucket.objects[snapshot_key("s")].metadata[ENTRIES_META] == "4"
    assert texts(Writer(bucket).read("s")) == ["m0", "m1", "m2", "m3"]
    relisted = [c for c in bucket.made("list_objects_v2") if "StartAfter" in c.params]
    assert len(relisted) == 1 and relisted[0].params["StartAfter"].endswith("0000000001.json")


def test_entries_missing_below_the_snapshots_count_are_corrupt(bucket: FakeBucket) -> None:
    Writer(bucket).write("s", entries(0, 3), snapshot(3), create=True)
    (middle,) = bucket.keys("0000000001.json")
    del bucket.objects[middle]
    with pytest.raises(CorruptStateError, match=r"accounts for 3 history entries, but .* holds 1"):
        Writer(bucket).read("s")


def test_a_listing_of_many_pages_is_followed(
    bucket: FakeBucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The core's own summary needs the core's snapshot; these snapshots are the fake's.
    monkeypatch.setattr(
        _contract,
        "summarize",
        lambda state_id, small: SimpleNamespace(id=state_id, updated_at=None),
    )
    writer = Writer(bucket)
    for n in range(5):
        writer.write(f"s{n}", entries(0, 1), snapshot(1), create=True)
    bucket.put_object(Key=f"{ROOT}not an id!/snapshot.json", Body=b"{}")
    small_pages = Rule(
        lambda c: c.method == "list_objects_v2",
        lambda c: bucket.list_objects_v2(**{**c.params, "MaxKeys": 2}),
        times=99,
    )
    bucket.rules.append(small_pages)
    summaries = run(list_states(writer.layout), bucket)
    assert sorted(s.id for s in summaries) == [f"s{n}" for n in range(5)]
    assert len(bucket.made("list_objects_v2", Delimiter="/")) == 3


def test_delete_removes_the_snapshot_before_the_entries(bucket: FakeBucket) -> None:
    writer = Writer(bucket)
    writer.write("s", entries(0, 3), snapshot(3), create=True)
    bucket.calls.clear()
    run(delete(writer.layout, writer.ledger, "s"), bucket)
    methods = [c.method for c in bucket.calls]
    # The listing comes after the snapshot is gone: a writer's entry PUT it misses is that
    # writer's to remove (it finds no snapshot when it checks).
    assert methods == ["head_object", "delete_object", "list_objects_v2", "delete_objects"]
    assert bucket.calls[1].params["Key"] == snapshot_key("s")
    assert bucket.keys() == []


# Error translation ----------------------------------------------------------------------------

WHERE = Where("PutObject", "s3://b/runs/k", "b", "http://fake", "s3://b/runs/", "If-Match: x")


@pytest.mark.parametrize(
    ("code", "status", "conditions", "error", "says"),
    [
        ("NoSuchBucket", 404, "", BucketNotFoundError, "the bucket 'b' does not exist"),
        ("AccessDenied", 403, "", S3AccessDeniedError, "s3:PutObject"),
        ("Whatever", 403, "", S3AccessDeniedError, "s3:ListBucket on the bucket 'b'"),
        ("ExpiredToken", 400, "", S3AccessDeniedError, "check the credentials"),
        ("ConditionalRequestConflict", 409, "", ConcurrentWriteError, "409"),
        ("NotImplemented", 501, "If-Match: x", ConditionalWritesUnsupportedError, "If-Match"),
        ("NotImplemented", 501, "", S3StoreError, "NotImplemented (HTTP 501)"),
        ("InternalError", 500, "", S3StoreError, "after botocore's retries"),
    ],
)
def test_each_s3_answer_becomes_the_error_the_table_says(
    code: str, status: int, conditions: str, error: type[Exception], says: str
) -> None:
    where = Where("PutObject", "s3://b/runs/k", "b", "http://fake", "s3://b/runs/", conditions)
    raised = translate(client_error(code, status), where)
    assert type(raised) is error
    assert "PutObject s3://b/runs/k" in str(raised) and says in str(raised)


def test_client_side_failures_name_what_to_do() -> None:
    assert "AWS_ACCESS_KEY_ID" in str(translate(NoCredentialsError(), WHERE))
    unreachable = translate(EndpointConnectionError(endpoint_url="http://fake"), WHERE)
    assert "cannot connect to http://fake" in str(unreachable)
    assert "ValueError: odd" in str(translate(ValueError("odd"), WHERE))


def test_a_key_that_delete_objects_could_not_remove_is_named() -> None:
    layout = Layout("b", ROOT, "http://fake")
    keys = [f"{ROOT}s/entries/g/{n:010d}.json" for n in range(3)]
    answer = {"Errors": [{"Key": keys[1], "Code": "AccessDenied", "Message": "no"}]}
    with pytest.raises(S3AccessDeniedError, match=r"1 of 3 keys failed\) s3://b/runs/s/.*01.json"):
        check_deletes(layout, keys, [answer], required=True)
    check_deletes(layout, keys, [answer], required=False)  # logged only
    fault = Fault("SlowDown", None, "slow")
    assert "SlowDown (HTTP None)" in str(translate_fault(fault, WHERE))


# The lock -------------------------------------------------------------------------------------


def hold_and_note(lock: HandoffLock, notes: list[Any], note: Any) -> None:
    """Take the lock (waiting if needed), note that, and release it."""
    lock.acquire()
    notes.append(note)
    lock.release()


def test_the_lock_serves_threads_in_order() -> None:
    lock = HandoffLock()
    lock.acquire()
    order: list[int] = []
    threads = []
    for n in range(3):
        thread = threading.Thread(target=hold_and_note, args=(lock, order, n))
        thread.start()
        threads.append(thread)
        time.sleep(0.05)  # queued in this order
    assert order == []
    lock.release()
    for thread in threads:
        thread.join(5)
    assert order == [0, 1, 2] and not lock.locked
    with pytest.raises(RuntimeError, match="not held"):
        lock.release()


async def test_the_lock_serves_tasks_and_threads_and_survives_cancellation() -> None:
    lock = HandoffLock()
    await lock.aacquire()
    got: list[str] = []

    async def task(name: str) -> None:
        await lock.aacquire()
        got.append(name)
        lock.release()

    first = asyncio.create_task(task("first"))
    cancelled = asyncio.create_task(task("cancelled"))
    await asyncio.sleep(0.01)
    cancelled.cancel()  # leaves the queue without taking the lock
    thread = threading.Thread(target=hold_and_note, args=(lock, got, "thread"))
    thread.start()
    await asyncio.sleep(0.05)
    lock.release()
    await first
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    await asyncio.to_thread(thread.join, 5)
    assert got == ["first", "thread"] and not lock.locked


async def test_a_task_cancelled_as_the_lock_is_handed_to_it_hands_it_on() -> None:
    lock = HandoffLock()
    await lock.aacquire()
    waiter = asyncio.create_task(lock.aacquire())
    after = asyncio.create_task(lock.aacquire())
    await asyncio.sleep(0.01)
    lock.release()  # handed to ``waiter``, which is cancelled before it runs
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await asyncio.wait_for(after, 5)  # the lock went on to the next waiter
    assert lock.locked
    lock.release()
    assert not lock.locked


def test_a_password_in_the_endpoint_is_never_repeated(monkeypatch: pytest.MonkeyPatch) -> None:
    from botocore.config import Config

    from alpineagents_s3 import S3Store

    for name, value in {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}.items():
        monkeypatch.setenv(name, value)
    store = S3Store(
        "bbb",
        endpoint_url="http://user:s3cr3t@127.0.0.1:9",  # nothing listens on port 9
        region_name="us-east-1",
        config=Config(retries={"total_max_attempts": 1}, connect_timeout=2),
    )
    with pytest.raises(S3StoreError) as raised:
        store.read("x")
    assert "s3cr3t" not in str(raised.value) and "***@127.0.0.1:9" in str(raised.value)
    assert "s3cr3t" not in repr(store)
    where = Where("GetObject", "s3://b/k", "b", "http://u:s3cr3t@h", "s3://b/", "")
    assert "s3cr3t" not in str(translate(client_error("NoSuchBucket", 404), where))
    store.close()
