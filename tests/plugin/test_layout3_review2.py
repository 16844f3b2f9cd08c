"""Second review of layout 3 (saves committed by their entry alone), at protocol level.

Driven batch by batch on ``FakeBucket`` (``test_protocol_decisions``) with ``Driven``
(``test_protocol_review``), as the first review (``test_commit_alone_review``) was, on what it
did not touch: packing (``pack``, ``remove_entries``, a load that packs, a damaged segment),
``delete``, ``sweep`` and ``objects`` while entries are committed alone, and ``list()`` of
States mixing open and closed snapshots.

The snapshots are ones the installed core summarises: this repository's core's snapshot, or
the info dict of alpineagents 0.5+ (so that, unlike the first review's module, these tests
also run under the published 0.7.1, whose Agent commits its model replies and tool results
alone). A core whose summary neither fits (0.4.0 keeps a model context: never the change
path) skips the module.

Each test keeps a model of what the writer saved and checks the promises: a save that
returned is what a new store object loads (unless that writer was told since), ``list()``
is the summary of what a load returns, and a pack never changes what a load returns.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import pytest

from alpineagents_s3 import ConcurrentWriteError, CorruptStateError, S3Store, _contract
from alpineagents_s3._deleting import delete
from alpineagents_s3._layout import ALONE_META, ENTRIES_META, OPEN_META, PENDING_META
from alpineagents_s3._packing import pack, read_and_pack
from alpineagents_s3._reading import list_states, objects
from alpineagents_s3._steps import Call
from alpineagents_s3._sweeping import sweep
from alpineagents_s3._writing import CHECKPOINT_EVERY
from tests.plugin.test_commit_alone_review import CREATED, snap
from tests.plugin.test_protocol_decisions import FakeBucket, Writer, run, snapshot_key
from tests.plugin.test_protocol_review import Driven, saving, snapshot_put

Stop = Callable[[Sequence[Call]], bool]

INFO = _contract.GENERATION == "info"


def small(n: int, data: dict[str, Any] | None = None, *, stopped: bool = False) -> dict[str, Any]:
    """A snapshot (or info dict) the installed core summarises, running unless ``stopped``.

    ``n`` only moves ``updated_at``: saves that change nothing else commit alone.
    """
    updated = f"2024-01-01T{n // 3600:02d}:{n // 60 % 60:02d}:{n % 60:02d}+00:00"
    if INFO:
        return {
            "v": 5,
            "first_message": "t",
            "created_at": CREATED,
            "updated_at": updated,
            "turn": 1,
            "stopped": {"kind": "until", "name": "waiting"} if stopped else None,
            "finished": False,
            "parent_id": None,
            "extra": {} if data is None else data,
        }
    return snap(n, data, stopped_by="reply" if stopped else None, updated_at=updated)


SUMMARISED = not (
    _contract.run_summary("s", small(1)) is None
    or not _contract.running(_contract.run_summary("s", small(1)) or ())
    or _contract.running(_contract.run_summary("s", small(1, stopped=True)) or ())
)


def ent(seq: int, text: str) -> dict[str, Any]:
    return {"seq": seq, "kind": "user", "data": {"text": text}}


def small_of(record: Any) -> Any:
    return getattr(record, "info" if INFO else "snapshot")


@dataclass
class Run:
    """One process running State ``state_id``: its store object, and what it saved."""

    bucket: FakeBucket
    state_id: str = "s"
    store: Writer = field(init=False)
    entries: list[dict[str, Any]] = field(default_factory=list)
    snapshot: dict[str, Any] = field(default_factory=dict)
    n: int = 0

    def __post_init__(self) -> None:
        self.store = Writer(self.bucket)

    def create(self) -> Run:
        self.entries = [ent(0, f"{self.state_id} 0")]
        self.snapshot = small(1, {"n": 0})
        self.store.write(self.state_id, self.entries, self.snapshot, create=True)
        self.n = 1
        return self

    def new(self, count: int) -> list[dict[str, Any]]:
        made = [
            ent(len(self.entries) + k, f"{self.state_id} {len(self.entries) + k}")
            for k in range(count)
        ]
        return made

    def step(self, count: int = 1, *, stopped: bool = False, tool: bool = False) -> None:
        """Save ``count`` new entries (one: committed alone, if the rules allow), with a change
        of ``data``; ``tool``: a tool result saved with ``snapshot=None`` (snapshot contract)."""
        new = self.new(count)
        self.n += 1
        if tool and not INFO:
            self.store.write(self.state_id, new, None)
        else:
            snapshot = small(self.n, {"n": self.n, "deep": {"k": self.n}}, stopped=stopped)
            self.store.write(self.state_id, new, snapshot)
            self.snapshot = snapshot
        self.entries += new

    def driven(self, count: int = 1, *, stopped: bool = False) -> tuple[Driven, Callable[[], None]]:
        """The next save, driven by hand; call the second value once it returned."""
        new = self.new(count)
        n = self.n + 1
        snapshot = small(n, {"n": n, "deep": {"k": n}}, stopped=stopped)

        def returned() -> None:
            self.n = n
            self.entries += new
            self.snapshot = snapshot

        return saving(self.store, self.state_id, new, snapshot), returned


def texts(entries: Sequence[dict[str, Any]]) -> list[str]:
    return [e["data"]["text"] for e in entries]


def loaded(bucket: FakeBucket, state_id: str = "s") -> tuple[list[str], Any]:
    """What a new store object loads: the texts of the history, and the snapshot or info."""
    record = Writer(bucket).read(state_id)
    assert record is not None
    entries = sorted(record.entries, key=lambda e: e["seq"])
    assert [e["seq"] for e in entries] == list(range(len(entries)))  # contiguous
    return texts(entries), small_of(record)


def summaries(bucket: FakeBucket) -> dict[str, Any]:
    return {s.id: s for s in run(list_states(Writer(bucket).layout), bucket)}


def keeps_promises(bucket: FakeBucket, *runs: Run) -> None:
    """Each run's saves are what a new store object loads, and what ``list()`` summarises."""
    listed = summaries(bucket)
    for r in runs:
        history, snapshot = loaded(bucket, r.state_id)
        assert history == texts(r.entries)
        assert snapshot == r.snapshot
        assert listed[r.state_id] == _contract.summarize(r.state_id, snapshot)


def alone_seqs(bucket: FakeBucket, state_id: str = "s") -> list[int]:
    """The seqs of the entry objects committed alone (their metadata carries a change)."""
    return sorted(
        int(key.rsplit("/", 1)[1].split(".")[0])
        for key, stored in bucket.objects.items()
        if key.startswith(f"runs/{state_id}/entries/") and ALONE_META in stored.metadata
    )


def count(bucket: FakeBucket, state_id: str = "s") -> int:
    return int(bucket.objects[snapshot_key(state_id)].metadata[ENTRIES_META])


def packing(bucket: FakeBucket, remove_entries: bool = False, state_id: str = "s") -> Driven:
    return Driven(pack(Writer(bucket).layout, state_id, remove_entries), bucket)


def segment_put(calls: Sequence[Call]) -> bool:
    return any(c.method == "put_object" and "/packed/" in c.params["Key"] for c in calls)


def head_of_snapshot(calls: Sequence[Call]) -> bool:
    return any(
        c.method == "head_object" and c.params["Key"].endswith("snapshot.json") for c in calls
    )


def listing_entries(calls: Sequence[Call]) -> bool:
    return any(c.method == "list_objects_v2" and "/entries/" in c.params["Prefix"] for c in calls)


def deletes(calls: Sequence[Call]) -> bool:
    return any(c.method in ("delete_objects", "delete_object") for c in calls)


def running(bucket: FakeBucket, alone: int = 3) -> Run:
    """State "s" created, a first save (a checkpoint), then ``alone`` saves committed alone."""
    r = Run(bucket).create()
    r.step()
    for _ in range(alone):
        r.step()
    assert len(alone_seqs(bucket)) >= alone, "the saves did not commit alone"
    assert count(bucket) < len(r.entries)
    return r


@pytest.fixture
def bucket() -> FakeBucket:
    """A bucket in memory; the protocol tests need snapshots the core summarises."""
    if not SUMMARISED:
        pytest.skip("the installed core summarises neither shape: no save commits alone")
    return FakeBucket()


# What the saves above take -----------------------------------------------------------------


def test_saves_of_one_entry_commit_alone_and_a_save_of_two_is_a_checkpoint(
    bucket: FakeBucket,
) -> None:
    r = running(bucket)
    before = count(bucket)
    r.step(2)
    assert count(bucket) == len(r.entries) > before
    keeps_promises(bucket, r)


# 1. Packing --------------------------------------------------------------------------------


def test_pack_with_entries_committed_alone_then_a_checkpoint_then_pack_again(
    bucket: FakeBucket,
) -> None:
    r = running(bucket)
    first = run(pack(Writer(bucket).layout, "s", False), bucket)
    assert first.covered == count(bucket) < len(r.entries)  # alone entries are not packed
    keeps_promises(bucket, r)
    r.step()
    r.step()  # still alone
    keeps_promises(bucket, r)
    r.step(2)  # a checkpoint: the snapshot counts everything
    r.step()
    second = run(pack(Writer(bucket).layout, "s", False), bucket)
    assert second.covered == count(bucket)
    keeps_promises(bucket, r)
    third = run(pack(Writer(bucket).layout, "s", True), bucket)
    assert third.covered == count(bucket)
    keeps_promises(bucket, r)
    for _ in range(3):
        r.step()
    r.step(stopped=True)
    keeps_promises(bucket, r)


def test_pack_with_remove_entries_keeps_the_entries_committed_alone_and_their_changes(
    bucket: FakeBucket,
) -> None:
    r = running(bucket, alone=5)
    alone = alone_seqs(bucket)
    packed = run(pack(Writer(bucket).layout, "s", True), bucket)
    assert alone_seqs(bucket) == [s for s in alone if s >= packed.covered]
    keeps_promises(bucket, r)
    r.step()
    keeps_promises(bucket, r)


@pytest.mark.parametrize("stop", ["segment", "head"])
def test_a_pack_racing_alone_commits_and_a_checkpoint_changes_no_load(
    bucket: FakeBucket, stop: str
) -> None:
    r = running(bucket)
    held = packing(bucket, remove_entries=True).until(
        segment_put if stop == "segment" else head_of_snapshot
    )
    r.step()
    r.step(2)  # a checkpoint counting the alone entries
    r.step()
    r.step()
    held.finish()
    keeps_promises(bucket, r)
    run(pack(Writer(bucket).layout, "s", True), bucket)
    keeps_promises(bucket, r)


def test_a_pack_removing_entries_between_a_loads_listing_and_its_gets(bucket: FakeBucket) -> None:
    r = running(bucket)
    r.step(2)
    r.step()
    r.step()
    box: list[Any] = []
    held = Driven(capturing(reader_steps(Writer(bucket)), box), bucket)
    held.until(lambda calls: not listing_only(calls))
    run(pack(Writer(bucket).layout, "s", True), bucket)
    r.step()
    held.finish()
    assert texts(sorted(box[0].entries, key=lambda e: e["seq"])) in (
        texts(r.entries),
        texts(r.entries[:-1]),
    )
    keeps_promises(bucket, r)


def reader_steps(reader: Writer) -> Any:
    from alpineagents_s3._reading import read

    return read(reader.layout, reader.ledger, "s")


def listing_only(calls: Sequence[Call]) -> bool:
    """The first round of a load: the snapshot GET and the listings."""
    return any(c.method == "list_objects_v2" for c in calls) and any(
        c.method == "get_object" and c.params["Key"].endswith("snapshot.json") for c in calls
    )


def test_a_pack_after_a_loads_snapshot_get_and_a_checkpoint_merging_segments(
    bucket: FakeBucket,
) -> None:
    """The reader's snapshot counts fewer entries than the segment the pack then writes, and
    the segment it listed is merged away and the entry objects removed."""
    r = running(bucket)
    run(pack(Writer(bucket).layout, "s", False), bucket)  # a small segment, merged next
    r.step()
    box: list[Any] = []
    held = Driven(capturing(reader_steps(Writer(bucket)), box), bucket)
    held.until(lambda calls: not listing_only(calls))
    before = texts(r.entries)
    r.step(2)
    run(pack(Writer(bucket).layout, "s", True), bucket)
    held.finish()
    assert texts(sorted(box[0].entries, key=lambda e: e["seq"])) in (before, texts(r.entries))
    keeps_promises(bucket, r)


def test_a_load_that_packs_through_the_runs_own_store_object_does_not_disturb_the_run(
    bucket: FakeBucket,
) -> None:
    r = running(bucket)
    run(read_and_pack(r.store.layout, r.store.ledger, "s", 1), bucket)  # auto_pack=1
    assert bucket.keys("/packed/")
    puts = len(bucket.made("put_object"))
    r.step()  # still committed alone: one PUT
    assert len(bucket.made("put_object")) == puts + 1
    keeps_promises(bucket, r)
    run(read_and_pack(Writer(bucket).layout, Writer(bucket).ledger, "s", 1), bucket)
    keeps_promises(bucket, r)
    r.step(2)
    run(read_and_pack(r.store.layout, r.store.ledger, "s", 1), bucket)
    r.step()
    keeps_promises(bucket, r)


@pytest.mark.parametrize("remove_entries", [False, True])
def test_a_damaged_segment_with_entries_committed_alone_after_it(
    bucket: FakeBucket, remove_entries: bool, caplog: pytest.LogCaptureFixture
) -> None:
    r = running(bucket)
    run(pack(Writer(bucket).layout, "s", remove_entries), bucket)
    r.step()
    (key,) = bucket.keys("/packed/")
    stored = bucket.objects[key]
    bucket.objects[key] = type(stored)(
        stored.body[: len(stored.body) // 2], '"damaged"', {}, stored.modified
    )
    if remove_entries:
        with pytest.raises(CorruptStateError, match=r"damaged|packed segment"):
            Writer(bucket).read("s")
        return
    with caplog.at_level(logging.WARNING, "alpineagents_s3"):
        keeps_promises(bucket, r)
    assert "reading its entries from their own objects" in caplog.text
    run(pack(Writer(bucket).layout, "s", False), bucket)  # writes it again
    r.step()
    keeps_promises(bucket, r)


# 2. delete, sweep, objects -------------------------------------------------------------


def test_a_delete_during_alone_commits_the_next_checkpoint_raises_and_leaves_nothing(
    bucket: FakeBucket,
) -> None:
    r = running(bucket)
    run(delete(Writer(bucket).layout, Writer(bucket).ledger, "s"), bucket)
    r.step()  # committed alone under a generation no snapshot names: returns
    r.step(tool=True)
    assert bucket.keys("runs/s/")
    with pytest.raises(KeyError):
        r.step(2)
    assert bucket.keys("runs/s/") == []
    assert run(objects(Writer(bucket).layout, "s"), bucket) == []


def test_a_delete_whose_listing_missed_an_alone_commit_leaves_nothing_after_the_checkpoint(
    bucket: FakeBucket,
) -> None:
    r = running(bucket)
    held = Driven(delete(Writer(bucket).layout, Writer(bucket).ledger, "s"), bucket).until(deletes)
    held._answer()  # the snapshot DELETE
    held.until(deletes)  # listed: the next alone commit is not in it
    r.step()
    held.finish()
    assert bucket.keys("runs/s/")  # the entry committed after the listing
    with pytest.raises(KeyError):
        r.step(2)
    assert bucket.keys("runs/s/") == []


def test_the_sixteenth_alone_commit_after_a_delete_raises_and_leaves_nothing(
    bucket: FakeBucket,
) -> None:
    r = running(bucket, alone=1)
    run(delete(Writer(bucket).layout, Writer(bucket).ledger, "s"), bucket)
    returned = 0

    def until_refused() -> None:
        nonlocal returned
        while returned <= CHECKPOINT_EVERY:
            r.step()
            returned += 1

    with pytest.raises(KeyError):
        until_refused()
    assert 1 < returned < CHECKPOINT_EVERY  # alone commits returned, the checkpoint raised
    assert bucket.keys("runs/s/") == []


def test_a_delete_and_create_again_during_alone_commits(bucket: FakeBucket) -> None:
    """Another process deletes the State and creates a new one under its id: the run is
    refused at its next checkpoint, the new State never reads the run's entries, and nothing
    of the run is left (as after a plain delete)."""
    r = running(bucket)
    run(delete(Writer(bucket).layout, Writer(bucket).ledger, "s"), bucket)
    other = Run(bucket).create()
    r.step()
    with pytest.raises((ConcurrentWriteError, KeyError)):
        r.step(2)
    keeps_promises(bucket, other)
    kinds = [o.kind for o in run(objects(Writer(bucket).layout, "s"), bucket)]
    assert kinds == ["entry", "snapshot"]


def test_sweep_never_removes_entries_committed_alone_of_a_live_state(bucket: FakeBucket) -> None:
    r = running(bucket)
    swept = run(sweep(Writer(bucket).layout, 0.0), bucket)
    assert swept == []
    keeps_promises(bucket, r)
    held = Driven(sweep(Writer(bucket).layout, 0.0), bucket).until(head_of_snapshot)
    r.step()
    r.step(2)
    r.step()
    held.finish()
    keeps_promises(bucket, r)
    r.step()
    keeps_promises(bucket, r)


def test_objects_names_entries_committed_alone_as_entries(bucket: FakeBucket) -> None:
    r = running(bucket)
    kinds = [o.kind for o in run(objects(Writer(bucket).layout, "s"), bucket)]
    assert kinds.count("entry") == len(r.entries) and kinds.count("snapshot") == 1


# 4. list() -----------------------------------------------------------------------------


def test_list_of_many_states_mixing_open_and_closed_snapshots(bucket: FakeBucket) -> None:
    runs = []
    for n in range(6):
        r = Run(bucket, f"s{n}").create()
        r.step()
        for _ in range(n):
            r.step()
        if n % 2:
            r.step(stopped=True)  # a closed snapshot
        runs.append(r)
    open_ = [
        r.state_id for r in runs if bucket.objects[snapshot_key(r.state_id)].metadata.get(OPEN_META)
    ]
    assert open_ and len(open_) < len(runs)
    keeps_promises(bucket, *runs)


def test_list_of_a_state_whose_next_entry_after_the_count_is_pending(bucket: FakeBucket) -> None:
    r = running(bucket)
    other = Writer(bucket)
    other.read("s")
    new = r.new(1)
    held = saving(other, "s", new, small(99, {"by": "other"})).until(snapshot_put)
    assert PENDING_META in bucket.objects[held_entry_key(bucket, new[0]["seq"])].metadata
    keeps_promises(bucket, r)  # the pending entry is no one's yet
    held.kill()
    keeps_promises(bucket, r)


def held_entry_key(bucket: FakeBucket, seq: int) -> str:
    (key,) = bucket.keys(f"/{seq:010d}.json")
    return key


def test_list_of_a_state_whose_alone_entries_are_another_writers(bucket: FakeBucket) -> None:
    """B loads, saves data alone (a snapshot PUT counting what it read), and is then the
    writer after the count; A's next entry is refused at its seq, or at its checkpoint."""
    a = running(bucket)
    b = Run(bucket)
    b.store.read("s")
    b.entries, b.snapshot, b.n = list(a.entries), a.snapshot, a.n
    b.step(2)  # B's first save after its load: a checkpoint
    b.step()  # committed alone by B
    keeps_promises(bucket, b)
    with pytest.raises(ConcurrentWriteError):
        a.step()
    keeps_promises(bucket, b)


@pytest.mark.parametrize("gone", ["first", "middle", "last"])
def test_list_of_an_open_snapshot_whose_alone_entries_are_deleted_meanwhile(
    bucket: FakeBucket, gone: str
) -> None:
    running(bucket, alone=3)
    after = [s for s in alone_seqs(bucket) if s >= count(bucket)]
    seq = {"first": after[0], "middle": after[1], "last": after[-1]}[gone]
    box: list[Any] = []
    listing = Driven(capturing(list_states(Writer(bucket).layout), box), bucket)
    listing.until(lambda calls: any(c.method == "head_object" for c in calls))
    del bucket.objects[held_entry_key(bucket, seq)]
    listing.finish()
    ((summary,),) = box
    _, snapshot = loaded(bucket)
    assert summary == _contract.summarize("s", snapshot)


def capturing(steps: Any, box: list[Any]) -> Any:
    """``steps``, keeping what it returns in ``box`` (``Driven`` keeps no return value)."""
    box.append((yield from steps))


# 3. The installed core's own Agent, on moto's server -----------------------------------------
#
# Not under the skip above: these run with every core (0.4.0 saves its tool results alone with
# ``snapshot=None``; 0.7.1 commits its model replies and tool results alone, and replaces the
# snapshot at each model request, whose ``turn`` is in its summary).

CHILD_SCRIPT = r'''
import json, os, sys, threading
sys.path.insert(0, sys.argv[1])  # tests/plugin, for cores.py
import cores
from alpineagents_s3 import S3Store

endpoint, bucket, state_id, kill_at, when, notes = sys.argv[2:8]
kill_at = int(kill_at)
puts = [0]
answered = [0]
lock = threading.Lock()
log = open(notes, "a")


def before(request, **kwargs):
    if request.method == "PUT":
        with lock:
            puts[0] += 1
            if when == "before" and puts[0] == kill_at:
                os._exit(9)


def after(http_response, parsed, model, **kwargs):
    if model.name != "PutObject" or http_response.status_code >= 300:
        return
    with lock:
        answered[0] += 1
        log.write(json.dumps(kwargs["context"].get("l3r2")) + "\n")
        log.flush()
        if when == "after" and answered[0] == kill_at:
            os._exit(9)


def provide(params, model, context, **kwargs):
    if model.name == "PutObject":
        context["l3r2"] = {"key": params.get("Key"), "meta": dict(params.get("Metadata") or {})}


def lookup(q: str) -> str:
    """Look a thing up.

    Args:
        q: The thing.
    """
    with open(notes + ".ledger", "a") as ledger:
        ledger.write(q + "\n")
    return "found " + q


store = S3Store(
    bucket,
    "runs",
    endpoint_url=endpoint,
    event_hooks={
        "provide-client-params.s3": provide,
        "before-send.s3": before,
        "after-call.s3": after,
    },
)
script = [("call", "lookup", {"q": "a"}), ("answer", "done")]
agent = cores.make_agent(cores.make_model(script), [lookup], store)
state = cores.make_state("look things up", state_id)
cores.run(agent, state, "sync")
print(json.dumps({"puts": puts[0], "history": cores.history(state)}))
'''


def load_cores() -> Any:
    """``cores.py`` of this folder (not a package: loaded by path, as the children do)."""
    spec = importlib.util.spec_from_file_location("l3r2_cores", PLUGIN / "cores.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PLUGIN = Path(__file__).resolve().parent
ALONE_KEY, ENTRIES_KEY = ALONE_META, ENTRIES_META


UNKNOWN = "(unknown:"  # how the core begins the result of a call whose result was not saved


def shape(history: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """A history in ``cores.history`` form without the call ids (random per process)."""
    return [(e["kind"], e.get("name"), e.get("text")) for e in history]


def begins(got: list[tuple[Any, ...]], full: list[tuple[Any, ...]]) -> bool:
    """Whether ``got`` is a beginning of ``full``, but for what the core makes up on load: the
    result of a call whose result was not saved, the error of a model request with no reply
    (0.7.1)."""
    if got and got[-1][0] == "error" and (len(got) > len(full) or full[len(got) - 1] != got[-1]):
        got = got[:-1]
    return len(got) <= len(full) and all(
        g == f or (g[0] == f[0] == "result" and str(g[2]).startswith(UNKNOWN))
        for g, f in zip(got, full, strict=False)
    )


def resumed_lookup(ledger: Path) -> Callable[[str], str]:
    def lookup(q: str) -> str:
        """Look a thing up.

        Args:
            q: The thing.
        """
        with open(ledger, "a") as f:
            f.write(q + "\n")
        return "found " + q

    return lookup


def least_read(notes: Path) -> int:
    """How many entries loads must read after the PUTs whose answers the child got: an entry
    committed alone up to its seq, a snapshot up to its count."""
    least = 0
    if not notes.exists():
        return 0
    for line in notes.read_text().splitlines():
        put = json.loads(line)
        key, meta = put["key"], put["meta"]
        if key.endswith("snapshot.json"):
            least = max(least, int(meta.get(ENTRIES_KEY, 0)))
        elif ALONE_KEY in meta:
            least = max(least, int(key.rsplit("/", 1)[1].split(".")[0]) + 1)
    return least


def test_the_cores_agent_killed_after_each_put_resumes_keeping_the_promises(
    moto_url: str, tmp_path: Path
) -> None:
    """The installed core's Agent (a tool call, then an answer), killed in a child process
    just before each of its PUTs is sent, and just after the last one landed (before its
    answer is read); a new store object then loads the State, lists it, and runs it on.

    As far as S3 can tell, a kill just after PUT n landed is the kill just before PUT n + 1:
    those two kill points would leave the bucket alike, so only the last PUT gets both."""
    cores = load_cores()
    client = boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1")
    bucket = f"l3r2-{uuid.uuid4().hex[:16]}"
    client.create_bucket(Bucket=bucket)
    made: list[S3Store] = []

    def make_store() -> S3Store:
        made.append(S3Store(bucket, "runs", endpoint_url=moto_url))
        return made[-1]

    child = tmp_path / "child.py"
    child.write_text(CHILD_SCRIPT)

    def start(name: str, kill_at: int, when: str) -> subprocess.Popen[bytes]:
        argv = [str(PLUGIN), moto_url, bucket, name, str(kill_at), when, str(tmp_path / name)]
        return subprocess.Popen(
            [sys.executable, "-P", str(child), *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(os.environ),
        )

    reference = start("reference", 0, "after")
    out, err = reference.communicate(timeout=120)
    assert reference.returncode == 0, err.decode()
    done = json.loads(out.decode().strip().splitlines()[-1])
    full, puts = shape(done["history"]), done["puts"]
    alone = sum(
        ALONE_KEY in json.loads(x)["meta"]
        for x in (tmp_path / "reference").read_text().splitlines()
    )
    kills = [(f"k{n}-before", n, "before") for n in range(1, puts + 1)]
    kills.append((f"k{puts}-after", puts, "after"))
    for first in range(0, len(kills), 8):
        batch = [(name, start(name, n, when)) for name, n, when in kills[first : first + 8]]
        for name, process in batch:
            _, err = process.communicate(timeout=120)
            assert process.returncode == 9, (name, err.decode())
    problems: list[str] = []
    for name, _, _ in kills:
        store = make_store()
        record = store.read(name)
        least = least_read(tmp_path / name)
        if record is None:
            if least:
                problems.append(f"{name}: nothing loads, {least} entries were answered")
            continue
        seqs = sorted(e["seq"] for e in record.entries)
        if seqs != list(range(len(seqs))) or len(seqs) < least:
            problems.append(f"{name}: loads read seqs {seqs}, at least {least} answered")
        listed = {s.id: s for s in store.list()}
        if listed.get(name) != _contract.summarize(name, small_of(record)):
            problems.append(f"{name}: list() {listed.get(name)} is not the loaded summary")
        state = cores.load(store, name, "sync")
        got = shape(cores.history(state))
        if not begins(got, full):
            problems.append(f"{name}: loaded {got}, not a beginning of {full}")
        if got != full:
            model = cores.make_model([("answer", "resumed")])
            agent = cores.make_agent(model, [resumed_lookup(tmp_path / f"{name}.ledger")], store)
            try:
                cores.run(agent, state, "sync")
            except Exception as e:  # noqa: BLE001 - reported below
                problems.append(f"{name}: the resumed run raised {type(e).__name__}: {e}")
                continue
        again = shape(cores.history(cores.load(make_store(), name, "sync")))
        if again != shape(cores.history(state)):
            problems.append(f"{name}: a new store object loads {again} after the resumed run")
        ledger = tmp_path / f"{name}.ledger"
        ran = ledger.read_text().splitlines() if ledger.exists() else []
        if len(ran) != len(set(ran)):
            problems.append(f"{name}: a tool ran twice: {ran}")
    assert not problems, "\n".join(problems)
    assert puts > 4 and (alone > 0) == (_contract.GENERATION == "info" or not INFO), alone


def test_list_and_load_agree_with_a_stray_object_among_the_entries_after_the_count(
    bucket: FakeBucket,
) -> None:
    """An object S3Store did not name, between the entries committed alone (a backup copy, an
    upload tool's part): a load skips it; ``list()`` must read the same changes."""
    r = running(bucket, alone=3)
    key = held_entry_key(bucket, count(bucket))
    bucket.put_object(Key=f"{key}.bak", Body=bucket.objects[key].body)
    keeps_promises(bucket, r)


@pytest.mark.skipif(INFO, reason="the info contract always sends the info: no entries-only save")
def test_entries_only_saves_leave_at_most_checkpoint_every_entries_after_the_count(
    bucket: FakeBucket,
) -> None:
    r = running(bucket, alone=1)
    for _ in range(CHECKPOINT_EVERY + 4):
        r.step(tool=True)
    keeps_promises(bucket, r)
    assert len(r.entries) - count(bucket) <= CHECKPOINT_EVERY
