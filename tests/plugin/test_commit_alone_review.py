"""A review of layout 3 (saves committed by their entry alone), at protocol level, no server.

Store operations are driven batch by batch against ``FakeBucket`` (``test_protocol_decisions``)
with ``Driven`` (``test_protocol_review``): two store objects interleaved, saves killed at a
batch, answers lost. The snapshots are ones the installed core can summarise (the keys of
``alpineagents._serialize.snapshot_of``), so saves take the alone path with a change.

Covered: a save of one entry with a change of the snapshot, saves of entries alone (tool
results), checkpoints, claims and orphans on layout 3, ``list()`` of open snapshots, and a
seeded random interleaving of two writers with kills and lost answers. The holes the review
found (F1 to F8, each test's docstring or name says which) are mended and pinned here; the
other tests pin interleavings that held from the start.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from alpineagents_s3 import ConcurrentWriteError, S3StoreError, _contract
from alpineagents_s3._layout import ALONE_META, ENTRIES_META
from alpineagents_s3._reading import list_states
from alpineagents_s3._steps import Batch, Call, Hold
from alpineagents_s3._writing import CHECKPOINT_EVERY, write
from tests.plugin.test_protocol_decisions import (
    FakeBucket,
    Rule,
    Writer,
    lost,
    plant_orphans,
    run,
    snapshot_key,
    texts,
)
from tests.plugin.test_protocol_review import Driven, claim_put, saving, snapshot_put

Stop = Callable[[Sequence[Call]], bool]

CREATED = "2024-01-01T00:00:00+00:00"


def snap(n: int, data: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    """A snapshot the core summarises (``snapshot_of``'s keys): running unless ``stopped_by``."""
    return {
        "v": 1,
        "id": "s",
        "task": "t",
        "entries": n,
        "data": {} if data is None else data,
        "stopped_by": None,
        "stop_seq": None,
        "answer": None,
        "agent": None,
        "created_at": CREATED,
        "updated_at": f"2024-01-01T00:00:{n % 60:02d}+00:00",
        **fields,
    }


pytestmark = pytest.mark.skipif(
    _contract.run_summary("s", snap(1)) is None,
    reason="the installed core does not summarise these snapshots: no save commits alone",
)


@pytest.fixture
def bucket() -> FakeBucket:
    return FakeBucket()


def ent(seq: int, text: str) -> dict[str, Any]:
    return {"seq": seq, "kind": "user", "data": {"text": text}}


def created(bucket: FakeBucket, small: dict[str, Any] | None = None, first: str = "t") -> Writer:
    """State "s" with entry 0 (its text ``first``), created by the store object returned."""
    creator = Writer(bucket)
    creator.write("s", [ent(0, first)], small or snap(1), create=True)
    return creator


def entry_key(bucket: FakeBucket, seq: int) -> str:
    (key,) = bucket.keys(f"/{seq:010d}.json")
    return key


def put_of(seq: int, header: str = "IfNoneMatch") -> Stop:
    """The batch that PUTs entry ``seq`` with ``header`` (a replacement: ``IfMatch``)."""
    name = f"/{seq:010d}.json"
    return lambda calls: any(
        c.method == "put_object" and c.params["Key"].endswith(name) and header in c.params
        for c in calls
    )


def deletes(calls: Sequence[Call]) -> bool:
    return any(c.method in ("delete_objects", "delete_object") for c in calls)


def listed(bucket: FakeBucket) -> Any:
    (summary,) = run(list_states(Writer(bucket).layout), bucket)
    return summary


# Holes -------------------------------------------------------------------------------------


LONG = "a task long enough to be referred to " * 10  # more than _refs.MIN_LENGTH


def test_an_entry_repeating_a_long_task_commits_alone_without_raising(
    bucket: FakeBucket,
) -> None:
    w = created(bucket, snap(1, task=LONG))
    w.write("s", [ent(1, "a")], snap(2, task=LONG, data={"n": 1}))
    w.write("s", [ent(2, LONG)], snap(3, task=LONG, data={"n": 2}))
    assert ALONE_META in bucket.objects[entry_key(bucket, 2)].metadata  # it did land, alone
    record = Writer(bucket).read("s")
    assert record.snapshot == snap(3, task=LONG, data={"n": 2})


@pytest.mark.skipif(_contract.GENERATION != "snapshot", reason="SavedState has the task")
def test_list_shows_the_task_a_snapshot_refers_to_an_entry(bucket: FakeBucket) -> None:
    created(bucket, snap(1, task=LONG), first=LONG)  # the task is the first message
    assert Writer(bucket).read("s").snapshot["task"] == LONG  # a load resolves it
    assert listed(bucket).task == LONG


def test_a_nested_change_over_a_snapshot_a_second_writer_replaced_still_loads(
    bucket: FakeBucket,
) -> None:
    a = created(bucket, snap(1, {"cfg": {"n": 0}}))
    a.write("s", [ent(1, "A1")], snap(2, {"cfg": {"n": 1}}))
    b = Writer(bucket)
    b.read("s")
    b.write("s", [], snap(2, {"cfg": "flat"}))  # data alone: no seq, A is not told
    a.write("s", [ent(2, "A2")], snap(3, {"cfg": {"n": 2}}))  # committed alone
    assert ALONE_META in bucket.objects[entry_key(bucket, 2)].metadata
    record = Writer(bucket).read("s")  # CorruptStateError
    assert texts(record) == ["t", "A1", "A2"]


def test_a_first_write_without_entries_counts_what_was_committed_alone(
    bucket: FakeBucket,
) -> None:
    a = created(bucket, snap(1, {"n": 0}))
    for n in range(1, 4):
        a.write("s", [ent(n, f"m{n}")], snap(n + 1, {"n": n}))
    assert bucket.objects[snapshot_key("s")].metadata[ENTRIES_META] == "1"  # all alone
    last = snap(4, {"n": 99}, updated_at="2024-01-01T01:00:00+00:00")
    Writer(bucket).write("s", [], last)  # an equal store object, the same copy
    assert Writer(bucket).read("s").snapshot == last


def test_two_replacements_of_one_pending_entry_with_one_body_leave_one_winner(
    bucket: FakeBucket,
) -> None:
    created(bucket)
    a, b = Writer(bucket), Writer(bucket)
    a.read("s")
    b.read("s")
    refused = saving(b, "s", [ent(1, "B1")], snap(2, {"by": "B"})).until(snapshot_put)
    a.write("s", [], snap(1, {"a": 1}))  # A replaces the snapshot (data alone)
    with pytest.raises(ConcurrentWriteError):
        refused.finish()  # B's pending entry 1 stays, on the older snapshot
    b.read("s")
    tool = saving(a, "s", [ent(1, "A1")], None).until(put_of(1, "IfMatch"))
    again = saving(b, "s", [ent(1, "B1"), ent(2, "B2")], snap(3, {"by": "B"}))
    again.until(snapshot_put)  # B re-marked its entry 1 (same body: same ETag)
    outcomes: list[str] = []
    for held in (tool, again):
        try:
            held.finish()
            outcomes.append("saved")
        except ConcurrentWriteError:
            outcomes.append("refused")
    assert sorted(outcomes) == ["refused", "saved"]  # both were "saved"
    assert texts(Writer(bucket).read("s")) in (["t", "A1"], ["t", "B1", "B2"])


def test_a_counted_entry_is_never_replaced_by_a_stale_replacement(bucket: FakeBucket) -> None:
    created(bucket)
    a, b = Writer(bucket), Writer(bucket)
    a.read("s")
    b.read("s")
    saving(a, "s", [ent(1, "A1")], snap(2, {"by": "A"})).until(snapshot_put).kill()
    b.write("s", [], snap(1, {"b": 1}))  # B's own open snapshot: its next save commits alone
    held_b = saving(b, "s", [ent(1, "B1")], snap(2, {"b": 2})).until(put_of(1, "IfMatch"))
    Writer(bucket).write("s", [ent(1, "A1")], snap(2, {"by": "A"}))  # A's copy, returned
    assert texts(Writer(bucket).read("s")) == ["t", "A1"]
    with pytest.raises(ConcurrentWriteError):
        held_b.finish()  # it returns: its replacement landed
    assert texts(Writer(bucket).read("s")) == ["t", "A1"]


def test_a_lost_answer_re_marked_alone_is_never_replaced_by_a_claimer(
    bucket: FakeBucket,
) -> None:
    created(bucket)
    a, b = Writer(bucket), Writer(bucket)
    a.read("s")
    b.read("s")
    bucket.rules.append(Rule(put_of_call(1), lambda c: lost(), applied=True))
    with pytest.raises(S3StoreError):
        b.write("s", [ent(1, "B1")], snap(2, {"by": "B"}))  # stored, pending: answer lost
    held_a = saving(a, "s", [ent(1, "A1")], snap(2, {"by": "A"})).until(claim_put)
    tool = saving(b, "s", [ent(1, "B1"), ent(2, "B2")], None).until(put_of(1, "IfMatch"))
    held_a.until(put_of(1, "IfMatch"))  # A claimed; B's pending 1 is stale to it
    # B replaces its 1 as pending first, finds A's claim stored, and is refused: no load read
    # its entry, and its save did not return.
    with pytest.raises(ConcurrentWriteError):
        tool.finish()
    assert texts(Writer(bucket).read("s")) == ["t"]
    held_a.finish()  # B's entry, on the snapshot before A's claim, is replaced
    assert texts(Writer(bucket).read("s")) == ["t", "A1"]


def killed_pending_then_equal_store_object(bucket: FakeBucket) -> Writer:
    """B's save of entry 1 dies before its snapshot PUT; an equal store object F saves the
    same copy's tool results 1 and 2 alone (``snapshot=None``). Returns a reader X that
    loaded before."""
    created(bucket)
    b = Writer(bucket)
    b.read("s")
    saving(b, "s", [ent(1, "B1")], snap(2, {"by": "B"})).until(snapshot_put).kill()
    x = Writer(bucket)
    x.read("s")
    Writer(bucket).write("s", [ent(1, "B1"), ent(2, "B2")], None)  # F: returned
    return x


def test_another_store_objects_pending_entry_is_not_taken_as_committed(
    bucket: FakeBucket,
) -> None:
    killed_pending_then_equal_store_object(bucket)
    assert texts(Writer(bucket).read("s")) == ["t", "B1", "B2"]


def test_a_reader_from_before_is_refused_at_the_entry_committed_alone_on_its_seq(
    bucket: FakeBucket,
) -> None:
    """F6b, mended: F claimed and committed 1 and 2 alone; X, which read before, saves 1."""
    x = killed_pending_then_equal_store_object(bucket)
    with pytest.raises(ConcurrentWriteError):
        x.write("s", [ent(1, "X1")], snap(2, {"by": "X"}))
    assert texts(Writer(bucket).read("s")) == ["t", "B1", "B2"]


def orphan_and_pending(bucket: FakeBucket) -> None:
    """Entry 0 counted; a killed save's pending entries 1 and 2 (loads see 2 as an orphan)."""
    created(bucket)
    o = Writer(bucket)
    o.read("s")
    saving(o, "s", [ent(1, "O1"), ent(2, "O2")], snap(3)).until(snapshot_put).kill()


def test_an_orphan_clear_never_deletes_an_entry_loads_read(bucket: FakeBucket) -> None:
    """F7, mended: a save committing alone deletes the orphans, then PUTs its entries in seq
    order; a second writer that read meanwhile meets no orphan of it, only its seq."""
    orphan_and_pending(bucket)
    a = Writer(bucket)
    a.read("s")
    tool = saving(a, "s", [ent(1, "A1"), ent(2, "A2")], None).until(put_of(1, "IfMatch"))
    assert not bucket.keys("/0000000002.json")  # the orphan, deleted before any entry
    b = Writer(bucket)
    assert texts(b.read("s")) == ["t"]  # 1 is still the killed save's, pending
    tool.finish()  # returned
    assert texts(Writer(bucket).read("s")) == ["t", "A1", "A2"]
    with pytest.raises(ConcurrentWriteError):
        b.write("s", [ent(1, "B1")], snap(2, {"by": "B"}))
    assert texts(Writer(bucket).read("s")) == ["t", "A1", "A2"]


def test_an_orphan_replaced_alone_by_a_killed_save_is_never_read_after_another_history(
    bucket: FakeBucket,
) -> None:
    """F8, mended: W, saving tool results 1-2 alone, deletes orphan 2 (it replaces none) and
    dies before its PUT of 1; X's save then reads as X's history alone."""
    orphan_and_pending(bucket)
    w = Writer(bucket)
    w.read("s")
    saving(w, "s", [ent(1, "W1"), ent(2, "W2")], None).until(put_of(1)).kill()
    assert not bucket.keys("/0000000002.json")
    assert texts(Writer(bucket).read("s")) == ["t"]
    Writer(bucket).write("s", [ent(1, "X1")], snap(2, {"by": "X"}))  # X's copy was ["t"]
    assert texts(Writer(bucket).read("s")) == ["t", "X1"]


# What holds ----------------------------------------------------------------------------------


def test_one_writer_loads_and_lists_the_snapshot_of_its_last_save(bucket: FakeBucket) -> None:
    """Changes that set, nest and remove; tool results alone; a checkpoint every 16 entries."""
    w = created(bucket)
    data: dict[str, Any] = {}
    seq = 1
    snapshot_puts = 0
    for n in range(40):
        data = copy.deepcopy(data)
        if n % 5 == 1:
            data.setdefault("cfg", {})[f"k{n}"] = [n, {"deep": n}]
        elif n % 5 == 2 and data.get("cfg"):
            data["cfg"].pop(next(iter(data["cfg"])))
        elif n % 5 == 3:
            data.pop("last", None)
        else:
            data["last"] = {"n": n, "text": f"value  {n} "}
        before = len(bucket.made("put_object", Key=snapshot_key("s")))
        last = snap(seq + 1, data, updated_at=f"2024-01-01T00:{n:02d}:00+00:00")
        w.write("s", [ent(seq, f"m{seq}")], last)
        snapshot_puts += len(bucket.made("put_object", Key=snapshot_key("s"))) - before
        seq += 1
        if n % 3 == 0:  # a tool result, saved alone: the snapshot stays as the last save's
            w.write("s", [ent(seq, f"r{seq}")], None)
            seq += 1
        record = Writer(bucket).read("s")
        assert record.snapshot == last
        assert [e["seq"] for e in record.entries] == list(range(seq))
        summary = listed(bucket)
        assert summary == _contract.summarize("s", last)
    assert 0 < snapshot_puts <= 40 // (CHECKPOINT_EVERY // 2)  # checkpoints, not every save


@pytest.mark.parametrize("first", ["A", "B"])
def test_two_store_objects_committing_alone_at_one_seq_have_one_winner(
    bucket: FakeBucket, first: str
) -> None:
    a = created(bucket)
    a.write("s", [ent(1, "A1")], snap(2, {"n": 1}))  # A's own open snapshot after this
    b = Writer(bucket)
    b.read("s")
    held = {
        "A": saving(a, "s", [ent(2, "A2")], snap(3, {"n": 2})).until(put_of(2)),
        "B": saving(b, "s", [ent(2, "B2")], None).until(put_of(2)),
    }
    assert a.ledger.versions["s"].own  # A commits alone: its PUT is the save
    held[first].finish()
    other = "B" if first == "A" else "A"
    with pytest.raises(ConcurrentWriteError):
        held[other].finish()
    assert texts(Writer(bucket).read("s")) == ["t", "A1", f"{first}2"]


def count_batches(make: Callable[[FakeBucket], Driven]) -> int:
    bucket = FakeBucket()
    driven = make(bucket)
    batches = 0
    while not driven.done:
        batches += isinstance(driven.step, Batch)
        driven._answer()
    return batches


def alone_with_orphans(bucket: FakeBucket) -> Driven:
    """Writer W's save of a tool result alone, at the gap below an orphan W knows of: it
    claims, removes the orphan, then PUTs its entry alone (a save with a change would end
    with a snapshot PUT: orphans known)."""
    w = created(bucket, snap(1, {"n": 0}))
    w.write("s", [ent(1, "W1")], snap(2, {"n": 1}))  # committed alone
    plant_orphans(bucket, w, "s", [3])
    w.read("s")  # W knows the orphan; the snapshot is its own still
    return saving(w, "s", [ent(2, "W2")], None)


@pytest.mark.parametrize("killed_before", range(count_batches(alone_with_orphans) + 1))
def test_a_save_committing_alone_killed_at_any_batch_leaves_a_state_the_next_save_continues(
    killed_before: int,
) -> None:
    bucket = FakeBucket()
    saving_w = alone_with_orphans(bucket)
    batches = 0
    while not saving_w.done and batches < killed_before:
        batches += isinstance(saving_w.step, Batch)
        saving_w._answer()
    landed = saving_w.done
    saving_w.kill()
    record = Writer(bucket).read("s")
    assert texts(record) in (["t", "W1"], ["t", "W1", "W2"])
    assert record.snapshot == snap(2, {"n": 1})
    assert landed <= (len(record.entries) == 3)
    resumed = Writer(bucket)
    have = len(resumed.read("s").entries)
    resumed.write("s", [ent(have, "R")], snap(have + 1, {"n": "R"}))
    resumed.write("s", [ent(have + 1, "R2")], snap(have + 2, {"n": "R2"}))
    again = Writer(bucket).read("s")
    assert texts(again) == [*texts(record), "R", "R2"]
    assert again.snapshot == snap(have + 2, {"n": "R2"})


def test_the_killed_save_above_claims_removes_the_orphan_and_commits_alone() -> None:
    bucket = FakeBucket()
    saving_w = alone_with_orphans(bucket)
    before = len(bucket.calls)
    saving_w.finish()
    puts = [c for c in bucket.calls[before:] if c.method == "put_object"]
    assert [c.params["Key"].rsplit("/", 1)[-1] for c in puts] == [
        "snapshot.json",  # the claim
        "0000000002.json",
    ]
    assert ALONE_META in puts[-1].params["Metadata"] and not bucket.keys("0000000003.json")


@pytest.mark.parametrize("applied", [True, False])
def test_a_lost_answer_on_an_alone_commit_is_recognised_and_loads_read_the_last_save(
    bucket: FakeBucket, applied: bool
) -> None:
    w = created(bucket)
    w.write("s", [ent(1, "m1")], snap(2, {"n": 1}))
    bucket.rules.append(Rule(put_of_call(2), lambda c: lost(), applied=applied))
    with pytest.raises(S3StoreError):
        w.write("s", [ent(2, "m2")], snap(3, {"n": 2}))
    record = Writer(bucket).read("s")
    assert record.snapshot == (snap(3, {"n": 2}) if applied else snap(2, {"n": 1}))
    w.write("s", [ent(2, "m2"), ent(3, "m3")], snap(4, {"n": 3}))  # the core sends 2 again
    w.write("s", [ent(4, "m4")], snap(5, {"n": 4}))
    record = Writer(bucket).read("s")
    assert texts(record) == ["t", "m1", "m2", "m3", "m4"] and record.snapshot == snap(5, {"n": 4})


def put_of_call(seq: int) -> Callable[[Call], bool]:
    stop = put_of(seq)
    return lambda call: stop([call])


def test_a_flat_save_of_data_alone_by_a_second_writer_is_merged_and_both_are_refused_later(
    bucket: FakeBucket,
) -> None:
    """The documented weakening, on flat keys: the State has both; later saves contend."""
    a = created(bucket, snap(1, {"a": 0, "b": 0}))
    a.write("s", [ent(1, "A1")], snap(2, {"a": 1, "b": 0}))
    b = Writer(bucket)
    b.read("s")
    b.write("s", [], snap(2, {"a": 1, "b": "B"}))
    a.write("s", [ent(2, "A2")], snap(3, {"a": 2, "b": 0}))  # committed alone, not told
    record = Writer(bucket).read("s")
    assert texts(record) == ["t", "A1", "A2"] and record.snapshot["data"] == {"a": 2, "b": "B"}
    with pytest.raises(ConcurrentWriteError):
        a.write("s", [ent(3, "A3"), ent(4, "A4")], snap(5, {"a": 3, "b": 0}))
    with pytest.raises(ConcurrentWriteError):
        b.write("s", [ent(2, "B2")], snap(3, {"a": 1, "b": "B"}))
    assert texts(Writer(bucket).read("s")) == ["t", "A1", "A2"]


# Random interleavings ------------------------------------------------------------------------


@dataclass
class Client:
    """One process running State "s": a store object and its copy, saved as the core saves."""

    name: str
    bucket: FakeBucket
    lineages: list[list[str]]
    store: Writer = field(init=False)
    lineage: list[str] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    small: dict[str, Any] = field(default_factory=dict)
    saved: int = 0
    run: int = 0
    made: int = 0

    def __post_init__(self) -> None:
        self.store = Writer(self.bucket)
        self.load()

    def load(self) -> None:
        """Load the State again (after a refusal or a kill): a new copy, new texts."""
        record = self.store.read("s")
        self.history = copy.deepcopy(record.entries)
        self.small = copy.deepcopy(record.snapshot)
        self.saved = len(self.history)
        self.run += 1
        self.made = 0
        self.lineage = [e["data"]["text"] for e in self.history]
        self.lineages.append(self.lineage)

    def add(self, n: int) -> None:
        for _ in range(n):
            self.made += 1
            text = f"{self.name}{self.run}.{self.made}"
            self.history.append(ent(len(self.history), text))
            self.lineage.append(text)

    def save(self, rng: random.Random) -> tuple[Driven, int]:
        kind = rng.choice(["alone"] * 4 + ["tool"] * 2 + ["tools", "several", "data", "stop"])
        small = copy.deepcopy(self.small)
        small["stopped_by"] = "reply" if kind == "stop" else None
        small["updated_at"] = f"2024-01-01T00:{rng.randrange(60):02d}:{rng.randrange(60):02d}Z"
        small["updated_at"] = small["updated_at"].replace("Z", "+00:00")
        self.add({"alone": 1, "tool": 1, "tools": 2, "several": 2, "stop": 1}.get(kind, 0))
        if kind in ("alone", "data", "several"):
            small["data"][kind] = small["data"].get(kind, 0) + 1
        if kind == "alone" and rng.random() < 0.5:
            small["data"].setdefault("cfg", {})[f"k{rng.randrange(3)}"] = rng.randrange(9)
        small["entries"] = len(self.history)
        self.small = small
        new = copy.deepcopy(self.history[self.saved :])
        sent = None if kind in ("tool", "tools") else copy.deepcopy(small)
        steps = write(self.store.layout, self.store.ledger, "s", new, sent, False)
        return Driven(steps, self.bucket), len(self.history)


def same_call(chosen: Call) -> Callable[[Call], bool]:
    return lambda call: call is chosen


def interleave(seed: int) -> str | None:
    """Two clients saving State "s" at random, kills and lost answers; the first broken promise."""
    rng = random.Random(seed)
    bucket = FakeBucket()
    created(bucket)
    lineages: list[list[str]] = []
    clients = [Client("A", bucket, lineages), Client("B", bucket, lineages)]
    running: dict[str, tuple[Driven, int]] = {}
    refused: set[tuple[str, int]] = set()
    last = ["t"]
    for _ in range(60):
        for client in clients:
            if client.name not in running and rng.random() < 0.5:
                running[client.name] = client.save(rng)
        if not running:
            continue
        name = rng.choice(sorted(running))
        client = next(c for c in clients if c.name == name)
        driven, count = running[name]
        if isinstance(driven.step, Hold) and driven.step.lock.locked:
            continue
        dice = rng.random()
        returned = False
        try:
            if dice < 0.04:
                driven.kill()
                del running[name]
                client.store = Writer(bucket)
                client.load()
                continue
            if dice < 0.10 and isinstance(driven.step, Batch):
                chosen = rng.choice(list(driven.step.calls))
                bucket.rules.append(
                    Rule(same_call(chosen), lambda c: lost(), applied=rng.random() < 0.6)
                )
            driven._answer()
            if driven.done:
                del running[name]
                client.saved = count
                returned = True
        except (ConcurrentWriteError, KeyError):
            del running[name]
            refused.add((name, client.run))
            client.load()
        except S3StoreError:
            del running[name]
        seen = texts(Writer(bucket).read("s"))  # promise 3: every load succeeds
        if not any(lineage[: len(seen)] == seen for lineage in lineages):
            return f"a mix: {seen}"  # promise 2
        if seen[: len(last)] != last:
            return f"not monotonic: {last} -> {seen}"  # promise 1
        last = seen
        if returned:
            mine = [e["data"]["text"] for e in client.history[:count]]
            if seen[:count] != mine:
                return f"returned, not read: {mine} / {seen}"  # promise 1
    return None


def test_seeded_interleavings_of_two_writers_keep_the_promises() -> None:
    """Two store objects, each reloading after a refusal or a kill, texts never sent twice.

    The random search that found F5-F8 (with equal store objects and repeated bodies, and at
    about one seed in a thousand here); then that a load finding its own snapshot kept no word
    of another writer's entries committed alone after it (seeds 1409, 2686), that an orphan was
    deleted after another writer had committed alone at its seq (6049, 2947), and that an
    entry was replaced again after another writer's claim (3965, 8243). All mended; seeds 0 to
    12,000 held once they were. These seeds, and the ones that broke.
    """
    seeds = [*range(120), 237, 1409, 2686, 2947, 3965, 6049, 8243]
    broken = {seed: why for seed in seeds if (why := interleave(seed)) is not None}
    assert broken == {}
