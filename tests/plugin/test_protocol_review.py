"""An adversarial review of the S3 protocol of issue 9, interleaving writers request by request.

Each test drives store operations (generators of steps) against ``FakeBucket``, whose ETags are
the MD5 of the body as on S3 without KMS. Tests marked ``xfail(strict=True)`` are holes found
in the protocol as it stands: each reason says what breaks. The others pin interleavings that
hold.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from alpineagents_s3 import ConcurrentWriteError, S3StoreError
from alpineagents_s3._deleting import delete
from alpineagents_s3._layout import BASE_META, ENTRIES_META, PENDING_META
from alpineagents_s3._lock import HandoffLock
from alpineagents_s3._steps import Batch, Call, Hold, Outcome, Release, Steps
from alpineagents_s3._sweeping import sweep
from alpineagents_s3._writing import write
from tests.plugin.test_protocol_decisions import (
    FakeBucket,
    Rule,
    Writer,
    entries,
    is_snapshot_put,
    lost,
    plant_orphans,
    run,
    snapshot,
    snapshot_key,
    texts,
)

Stop = Callable[[Sequence[Call]], bool]


@pytest.fixture
def bucket() -> FakeBucket:
    return FakeBucket()


class Driven:
    """One store operation driven by hand: answered from the bucket up to a batch, then held."""

    def __init__(self, steps: Steps[Any], bucket: FakeBucket) -> None:
        self.steps = steps
        self.bucket = bucket
        self.held: list[HandoffLock] = []
        self.step: Any = next(steps)
        self.done = False

    def _answer(self) -> None:
        outcomes: list[Outcome] = []
        if isinstance(self.step, Hold):
            assert not self.step.lock.locked, "the scripted driver would wait forever"
            self.step.lock.acquire()
            self.held.append(self.step.lock)
        elif isinstance(self.step, Release):
            self.held.remove(self.step.lock)
            self.step.lock.release()
        else:
            assert isinstance(self.step, Batch)
            outcomes = [self.bucket.answer(call) for call in self.step.calls]
        try:
            self.step = self.steps.send(outcomes)
        except StopIteration:
            self.done = True
            self._release()
        except BaseException:
            self.done = True
            self._release()
            raise

    def until(self, stop: Stop) -> Driven:
        """Answer batches until the next one matches ``stop``; leave that one unsent."""
        while not self.done:
            if isinstance(self.step, Batch) and stop(self.step.calls):
                return self
            self._answer()
        raise AssertionError("the operation ended before the batch it was to stop at")

    def finish(self) -> None:
        """Answer everything to the end; the operation's exception propagates."""
        while not self.done:
            self._answer()

    def kill(self) -> None:
        """The process dies here: nothing more is sent."""
        self.steps.close()
        self.done = True
        self._release()

    def _release(self) -> None:
        for lock in self.held:
            lock.release()
        self.held.clear()


def saving(
    writer: Writer, state_id: str, new: list[dict[str, Any]], small: dict[str, Any] | None
) -> Driven:
    return Driven(write(writer.layout, writer.ledger, state_id, new, small, False), writer.bucket)


def claim_put(calls: Sequence[Call]) -> bool:
    """The claim: a snapshot PUT whose body is the stored snapshot's JSON again."""
    return any(is_snapshot_put(c, "IfMatch") for c in calls)


def snapshot_put(calls: Sequence[Call]) -> bool:
    return any(c.params["Key"].endswith("snapshot.json") for c in calls if c.method == "put_object")


def final_put(tag: str) -> Stop:
    """The save's own snapshot PUT (its snapshot's tag), not a claim (the stored one's)."""

    def matches(calls: Sequence[Call]) -> bool:
        return any(
            json.loads(c.params["Body"]).get("tag") == tag
            for c in calls
            if c.method == "put_object" and c.params["Key"].endswith("snapshot.json")
        )

    return matches


def head_check(calls: Sequence[Call]) -> bool:
    return any(c.method == "head_object" and "IfMatch" in c.params for c in calls)


def disown(calls: Sequence[Call]) -> bool:
    """The PUTs that mark a refused save's entries as based on nothing."""
    return any(c.params.get("Metadata", {}).get(BASE_META) == "refused" for c in calls)


def stored_tag(bucket: FakeBucket, state_id: str = "s") -> str:
    tag: str = json.loads(bucket.objects[snapshot_key(state_id)].body)["tag"]
    return tag


def kill_pending(bucket: FakeBucket, tag: str = "killed", last: int = 2) -> None:
    """A process saves entries 1.. of State "s" and dies before its snapshot PUT."""
    killed = Writer(bucket)
    killed.read("s")
    saving(killed, "s", entries(1, last, tag), snapshot(last, tag)).until(snapshot_put).kill()


# Holes ---------------------------------------------------------------------------------------


def test_two_tool_results_saved_alone_by_one_store_object_are_stored_one_after_the_other(
    bucket: FakeBucket,
) -> None:
    """Two tools of one turn finish together; the first result's save claims (an orphan).

    A store object commits the entries of one State alone one save at a time (layout 3): the
    second save waits for the first's lock, so its entry never lands before the first's and no
    load meets a hole between them.
    """
    Writer(bucket).write("s", entries(0, 3), snapshot(3), create=True)
    w = Writer(bucket)
    plant_orphans(bucket, w, "s", [6])  # a save killed halfway, long ago
    assert texts(w.read("s")) == ["m0", "m1", "m2"]
    result_3 = saving(w, "s", entries(3, 4), None).until(claim_put)
    result_4 = saving(w, "s", entries(3, 5), None)  # the core sends 3 and 4: 4 is not saved
    assert isinstance(result_4.step, Hold) and result_4.step.lock.locked  # it waits
    result_3.finish()
    result_4.finish()  # 3 is stored already: only 4 is PUT
    assert texts(Writer(bucket).read("s")) == ["m0", "m1", "m2", "m3", "m4"]
    assert len(bucket.keys("0000000003.json")) == 1 and not bucket.keys("0000000006.json")


def test_an_orphan_claim_never_replaces_another_writers_acknowledged_tool_result(
    bucket: FakeBucket,
) -> None:
    Writer(bucket).write("s", entries(0, 1), snapshot(1), create=True)
    v, w = Writer(bucket), Writer(bucket)
    v.read("s")
    plant_orphans(bucket, w, "s", [3])  # a save that was killed halfway
    w.read("s")  # W remembers the orphan
    v.write("s", entries(1, 2, "V"), None)  # V's tool result: stored, checked, returned
    assert texts(Writer(bucket).read("s")) == ["m0", "m1V"]
    with pytest.raises(ConcurrentWriteError):
        w.write("s", entries(1, 2, "W"), snapshot(2, "W"))
    assert texts(Writer(bucket).read("s")) == ["m0", "m1V"]


def test_a_third_claim_does_not_let_the_first_claimers_snapshot_land(bucket: FakeBucket) -> None:
    Writer(bucket).write("s", entries(0, 1), snapshot(1), create=True)
    kill_pending(bucket)  # a killed save's pending entry 1
    x = Writer(bucket)
    x.read("s")
    held_x = saving(x, "s", entries(1, 3, "X"), snapshot(3, "X")).until(final_put("X"))
    claimed_by_x = bucket.objects[snapshot_key("s")].etag  # X claimed, replaced, is slow
    b = Writer(bucket)
    b.read("s")
    saving(b, "s", entries(1, 3, "B"), snapshot(3, "B")).until(final_put("B")).kill()
    c = Writer(bucket)
    c.read("s")
    held_c = saving(c, "s", entries(1, 3, "C"), snapshot(3, "C")).until(final_put("C"))
    # Three claims, three ETags: with two whitespace forms, C's claim had X's ETag again.
    assert bucket.objects[snapshot_key("s")].etag != claimed_by_x
    assert len({c.params["Body"] for c in bucket.calls if claim_put([c])}) >= 3
    with pytest.raises(ConcurrentWriteError):  # X's snapshot must not land any more
        held_x.finish()
    held_c.finish()
    assert texts(Writer(bucket).read("s")) == ["m0", "m1C", "m2C"]
    assert stored_tag(bucket) == "C"


def test_a_first_write_refused_at_one_entry_is_refused_at_the_next(bucket: FakeBucket) -> None:
    Writer(bucket).write("s", entries(0, 1), snapshot(1), create=True)
    other = Writer(bucket)
    other.read("s")  # the Agent's copy was loaded through an equal store object then
    other.write("s", entries(1, 2, "B"), snapshot(2, "B"))
    agent_store = Writer(bucket)  # its first request is a write
    with pytest.raises(ConcurrentWriteError):
        agent_store.write("s", entries(1, 2, "V"), None)  # tool result 1: seq 1 is B's
    try:
        agent_store.write("s", entries(2, 3, "V"), None)  # tool result 2, the same turn
    except ConcurrentWriteError:
        pass
    assert texts(Writer(bucket).read("s")) == ["m0", "m1B"]


def test_a_refused_save_of_entries_alone_is_never_read_before_it_is_disowned(
    bucket: FakeBucket,
) -> None:
    Writer(bucket).write("s", entries(0, 1), snapshot(1), create=True)
    other = Writer(bucket)
    other.read("s")
    other.write("s", entries(1, 2, "B"), snapshot(2, "B"))
    agent_store = Writer(bucket)  # never read: the stored snapshot counts 2, its copy 1
    before = len(bucket.calls)
    with pytest.raises(ConcurrentWriteError):
        saving(agent_store, "s", entries(1, 3, "V"), None).finish()
    assert not [c for c in bucket.calls[before:] if c.method == "put_object"]  # refused first
    assert texts(Writer(bucket).read("s")) == ["m0", "m1B"]


def test_a_sweep_never_removes_the_entries_of_a_create_being_retried(bucket: FakeBucket) -> None:
    writer = Writer(bucket)
    bucket.rules.append(Rule(lambda c: is_snapshot_put(c, "IfNoneMatch"), lambda c: lost()))
    with pytest.raises(S3StoreError):
        writer.write("s", entries(0, 2), snapshot(2), create=True)  # not applied
    for stored in bucket.objects.values():
        stored.modified -= timedelta(days=2)
    sweeping = Driven(sweep(writer.layout, 86_400.0), bucket)
    sweeping.until(lambda calls: calls[0].method == "delete_objects")
    writer.write("s", entries(0, 2), snapshot(2), create=True)  # the retry lands
    sweeping.finish()
    assert texts(Writer(bucket).read("s")) == ["m0", "m1"]


def test_a_delete_racing_a_saves_entry_puts_raises_not_found_and_leaves_nothing(
    bucket: FakeBucket,
) -> None:
    Writer(bucket).write("s", entries(0, 1), snapshot(1), create=True)
    kill_pending(bucket)  # seq 1 holds a killed save's pending entry
    w = Writer(bucket)
    w.read("s")
    saving_w = saving(w, "s", entries(1, 3, "W"), snapshot(3, "W"))
    deleting = Driven(delete(w.layout, Writer(bucket).ledger, "s"), bucket)
    deleting.until(lambda calls: calls[0].method == "delete_objects")  # listed, not deleted
    saving_w.until(lambda calls: calls[0].method == "get_object")  # its PUTs were answered
    deleting.finish()
    with pytest.raises(KeyError):
        saving_w.finish()
    assert bucket.keys() == []


# Interleavings that hold ----------------------------------------------------------------------


def test_a_claim_racing_a_claim_has_one_winner_and_the_loser_touches_nothing(
    bucket: FakeBucket,
) -> None:
    Writer(bucket).write("s", entries(0, 1), snapshot(1), create=True)
    x, y = Writer(bucket), Writer(bucket)
    x.read("s")
    y.read("s")
    kill_pending(bucket)
    claiming_x = saving(x, "s", entries(1, 3, "X"), snapshot(3, "X")).until(claim_put)
    claiming_y = saving(y, "s", entries(1, 3, "Y"), snapshot(3, "Y")).until(claim_put)
    claiming_x.finish()
    before = {k: (v.etag, dict(v.metadata)) for k, v in bucket.objects.items()}
    with pytest.raises(ConcurrentWriteError):
        claiming_y.finish()
    assert {k: (v.etag, dict(v.metadata)) for k, v in bucket.objects.items()} == before
    assert texts(Writer(bucket).read("s")) == ["m0", "m1X", "m2X"]
    x.write("s", entries(3, 4, "X"), snapshot(4, "X"))  # the winner carries on
    assert texts(Writer(bucket).read("s")) == ["m0", "m1X", "m2X", "m3X"]


def test_a_delete_between_a_claims_get_and_put_stops_the_save_and_leaves_nothing(
    bucket: FakeBucket,
) -> None:
    Writer(bucket).write("s", entries(0, 1), snapshot(1), create=True)
    kill_pending(bucket)
    w = Writer(bucket)
    w.read("s")
    claiming = saving(w, "s", entries(1, 3, "W"), snapshot(3, "W")).until(claim_put)
    run(delete(w.layout, Writer(bucket).ledger, "s"), bucket)
    with pytest.raises(KeyError, match="deleted"):
        claiming.finish()
    assert bucket.keys() == []


def test_a_claim_whose_answer_was_lost_while_the_other_save_finishes_refuses_that_one(
    bucket: FakeBucket,
) -> None:
    """The claim landed but its answer was lost; the save it claimed against comes to its PUT."""
    Writer(bucket).write("s", entries(0, 1), snapshot(1), create=True)
    slow, w = Writer(bucket), Writer(bucket)
    slow.read("s")
    w.read("s")
    held = saving(slow, "s", entries(1, 2, "S"), snapshot(2, "S")).until(snapshot_put)
    bucket.rules.append(Rule(claim_put_call, lambda c: lost(), applied=True))
    with pytest.raises(S3StoreError):
        w.write("s", entries(1, 3, "W"), snapshot(3, "W"))
    with pytest.raises(ConcurrentWriteError):
        held.finish()  # the claim did land: the slow save is refused
    assert texts(Writer(bucket).read("s")) == ["m0"]
    w.write("s", entries(1, 3, "W"), snapshot(3, "W"))  # sent again: its own claim recognised
    assert texts(Writer(bucket).read("s")) == ["m0", "m1W", "m2W"]


def claim_put_call(call: Call) -> bool:
    return claim_put([call])


@pytest.mark.parametrize("killed_before", range(10))  # the save has 8 batches
def test_a_claiming_save_killed_at_any_request_leaves_a_state_the_next_save_continues(
    bucket: FakeBucket, killed_before: int
) -> None:
    """Killed saves on both sides of a claim: every load reads one writer's history."""
    Writer(bucket).write("s", entries(0, 1), snapshot(1), create=True)
    kill_pending(bucket, last=3)  # pending 1 and 2 of a killed save
    plant_orphans(bucket, Writer(bucket), "s", [5])  # and an orphan of another
    assert len(bucket.keys("/entries/")) == 4
    w = Writer(bucket)
    assert texts(w.read("s")) == ["m0"]
    saving_w = saving(w, "s", entries(1, 4, "W"), snapshot(4, "W"))
    batches = 0
    while not saving_w.done and batches < killed_before:
        if isinstance(saving_w.step, Batch):
            batches += 1
        saving_w._answer()
    landed = saving_w.done
    saving_w.kill()
    seen = texts(Writer(bucket).read("s"))
    assert seen in (["m0"], ["m0", "m1W", "m2W", "m3W"])
    assert landed == (seen != ["m0"])
    resumed = Writer(bucket)
    have = len(texts(resumed.read("s")))
    resumed.write("s", entries(have, have + 2, "R"), snapshot(have + 2, "R"))
    after = texts(Writer(bucket).read("s"))
    assert after == seen + [f"m{s}R" for s in range(have, have + 2)]
    snap = bucket.objects[snapshot_key("s")]
    assert snap.metadata[ENTRIES_META] == str(have + 2)
    assert all(
        PENDING_META in bucket.objects[k].metadata or BASE_META in bucket.objects[k].metadata
        for k in bucket.keys("/entries/")
    )


def test_a_tool_result_racing_a_full_save_of_another_writer_leaves_one_winner(
    bucket: FakeBucket,
) -> None:
    """The full save stores its entry first; the tool result meets it, claims and wins."""
    Writer(bucket).write("s", entries(0, 1), snapshot(1), create=True)
    full, tool = Writer(bucket), Writer(bucket)
    full.read("s")
    tool.read("s")
    held = saving(full, "s", entries(1, 2, "F"), snapshot(2, "F")).until(snapshot_put)
    tool.write("s", entries(1, 2, "T"), None)
    with pytest.raises(ConcurrentWriteError):
        held.finish()
    assert texts(Writer(bucket).read("s")) == ["m0", "m1T"]
    tool.write("s", entries(2, 3, "T"), snapshot(3, "T"))
    assert texts(Writer(bucket).read("s")) == ["m0", "m1T", "m2T"]


def test_a_tool_result_stored_first_refuses_the_full_save_that_meets_it(
    bucket: FakeBucket,
) -> None:
    Writer(bucket).write("s", entries(0, 1), snapshot(1), create=True)
    full, tool = Writer(bucket), Writer(bucket)
    full.read("s")
    tool.read("s")
    tool.write("s", entries(1, 2, "T"), None)
    with pytest.raises(ConcurrentWriteError):
        full.write("s", entries(1, 3, "F"), snapshot(3, "F"))
    assert texts(Writer(bucket).read("s")) == ["m0", "m1T"]
    tool.write("s", entries(2, 3, "T"), snapshot(3, "T"))  # replaces F's disowned entry 2
    assert texts(Writer(bucket).read("s")) == ["m0", "m1T", "m2T"]


def test_a_sweep_keeps_a_killed_saves_pending_entries_and_the_state_stays_whole(
    bucket: FakeBucket,
) -> None:
    Writer(bucket).write("s", entries(0, 1), snapshot(1), create=True)
    kill_pending(bucket, last=3)
    plant_orphans(bucket, Writer(bucket), "s", [5])
    later = datetime.now(UTC) + timedelta(days=3)
    assert run(sweep(Writer(bucket).layout, 0, now=later), bucket) == []
    w = Writer(bucket)
    assert texts(w.read("s")) == ["m0"]
    w.write("s", entries(1, 2, "W"), snapshot(2, "W"))
    assert texts(Writer(bucket).read("s")) == ["m0", "m1W"]
    assert stored_tag(bucket) == "W"
