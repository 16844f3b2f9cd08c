"""The model checker's world: processes running S3Store's operations, request by request.

Each process has a memory of its own (``alpineagents_s3._memory.Memory``, as a real process
has) and runs one operation per role at a time: the operation's generator of steps
(``alpineagents_s3._steps``) is advanced here, and each call of a batch is answered by the
:class:`~tests.protocol.bucket.Bucket` as one step of the schedule, so any two requests of
different processes can come in either order. A :class:`Chooser` decides everything: which
process moves, what it does, and what happens to each request (answered; failed before S3
applied it; applied with its answer lost; applied and answered by botocore's retry; 409; or
the process killed there, the request applied or not). Hypothesis draws the choices and shrinks
a failing schedule.

Roles (docs/protocol.md, "The model checker"): two writers, each a process with its own copy of
the State, saving as the core does (what the store lacks, sent again after a failure); a monitor
that loads the State in the first writer's process; a reader that loads and lists; an admin
that sweeps and sometimes deletes. Every check raises :class:`InvariantError` naming the
invariant of docs/protocol.md it is.
"""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from botocore.exceptions import ClientError, ReadTimeoutError

from alpineagents_s3 import _delete, _keys, _list, _load, _pack, _save, _sweep
from alpineagents_s3._keys import Layout
from alpineagents_s3._memory import Bodies, Ctx, Memory
from alpineagents_s3._steps import Batch, Call, Hold, Outcome, Steps
from alpineagents_s3.errors import (
    ConcurrentWriteError,
    ConditionalWritesUnsupportedError,
    CorruptStateError,
    IncompleteListError,
    S3StoreError,
    StateExistsError,
    StateNotFoundError,
)
from tests.protocol.bucket import EPOCH, Bucket, client_error

ID = "s"
ROOT = "runs/"
LAYOUT = Layout(bucket="b", root=ROOT, endpoint="http://model", sse={})
HEAD = LAYOUT.head_key(ID)
# The size a head of a State is at least, by the record's rule (invariant 13).
SMALLEST_HEAD = 512
SCOPE = ("http://model", "b", ROOT)
# What can happen to a request, and how often (of 54).
FAULTS = [("ok", 40), ("fail", 3), ("lost", 3), ("retried", 3), ("conflict", 3), ("kill", 2)]
STRANGERS = [
    f"{ROOT}states/{ID}/0123456789abcdef/e0000000000.0123456789abcdef.json",
    f"{ROOT}states/other/0123456789abcdef/s0000000000-0000000003.fedcba9876543210.json",
    f"{ROOT}probes/00000000000000aa.json",
    f"{ROOT}heads/{ID}.json.bak",
    "elsewhere/states/s/x.json",
]


class InvariantError(AssertionError):
    """An invariant of docs/protocol.md does not hold."""


class Chooser:
    """Where the world's choices come from: ``choose(n)`` is a number in ``0 .. n - 1``."""

    def __init__(self, choose: Callable[[int], int]):
        self._choose = choose

    def pick(self, options: list[Any]) -> Any:
        return options[self._choose(len(options))] if len(options) > 1 else options[0]

    def weighted(self, options: list[tuple[Any, int]]) -> Any:
        n = self._choose(sum(weight for _, weight in options))
        for option, weight in options:
            if n < weight:
                return option
            n -= weight
        raise AssertionError("unreachable")


# What the bucket holds, read by a rule of the checker's own (not the store's code) -----------


@dataclass(frozen=True)
class Content:
    """A head's State: its wid, its entries' JSON in seq order and its snapshot's JSON."""

    write: str
    inc: str
    entries: tuple[str, ...]
    snapshot: str


def oracle(bucket: Bucket) -> Content | None:
    """The State the bucket holds now, by the commit rule (invariant 1); raises if broken."""
    body = bucket.body(HEAD)
    if body is None:
        return None
    doc = json.loads(body)
    if doc.get("deleted"):  # a tombstone head: no State
        if doc["parts"] or doc["snapshot"] is not None:
            raise InvariantError("invariant 12: a tombstone head names parts or a snapshot")
        return None
    entries: list[str] = []
    for first, last, wid, kind, *_ in doc["parts"]:
        names = (
            [(f"e{seq:010d}", seq, seq) for seq in range(first, last + 1)]
            if kind == "e"
            else [(f"s{first:010d}-{last:010d}", first, last)]
        )
        for name, low, high in names:
            key = f"{ROOT}states/{ID}/{doc['inc']}/{name}.{wid}.json"
            part = bucket.body(key)
            if part is None:
                raise InvariantError(f"invariants 1, 3, 7: the head names {key}, which is missing")
            value = json.loads(part)
            held = value if kind == "s" else [value]
            if [e["seq"] for e in held] != list(range(low, high + 1)):
                raise InvariantError(f"invariant 1: {key} does not hold entries {low} to {high}")
            entries += [json.dumps(e, sort_keys=True) for e in held]
    if len(entries) != doc["count"]:
        raise InvariantError("invariant 1: the head's count is not what its parts hold")
    snapshot = json.dumps(doc["snapshot"], sort_keys=True)
    return Content(doc["write"], doc["inc"], tuple(entries), snapshot)


def oracle_of(head: bytes, bucket: Bucket) -> tuple[str, ...]:
    """The entries a head's body names, read from the bucket (the head being replaced)."""
    saved = bucket.body(HEAD)
    versions = bucket.objects.get(HEAD)
    assert versions is not None and saved is not None
    real = versions[-1].body
    versions[-1].body = head
    try:
        content = oracle(bucket)
    finally:
        versions[-1].body = real
    return content.entries if content is not None else ()


def as_content(value: Any) -> tuple[tuple[str, ...], str]:
    """What a read returned, as :class:`Content` holds it."""
    entries, snapshot = value
    return tuple(json.dumps(e, sort_keys=True) for e in entries), json.dumps(
        snapshot, sort_keys=True
    )


# Processes and operations ---------------------------------------------------------------------


@dataclass
class Copy:
    """A writer's copy of the State, as the core holds one.

    Attributes:
        entries: Its history.
        snapshot: Its snapshot.
        saved: How many entries the store has, as the core believes.
        snapshot_saved: Whether the store has ``snapshot``, as the core believes.
        based_on: The index in ``World.events`` of the head it was loaded from or last saved
            as; -1 for a State still to be created.
        inc: The incarnation of that head ("" for a State still to be created).
    """

    entries: list[dict[str, Any]]
    snapshot: dict[str, Any] | None
    saved: int
    snapshot_saved: bool
    based_on: int
    inc: str = ""


@dataclass
class Op:
    kind: str
    role: str
    steps: Steps[Any]
    started: int  # len(World.events) when it began
    tick: int  # the bucket's tick when it began
    pending: list[Call] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)
    create: bool = False
    # What a save sent, as JSON: the copy's entries, and the snapshot (None: the stored one kept).
    sent: tuple[tuple[str, ...], str | None] = ((), None)
    # Whether the process had read a newer head than its copy's when the save began: its save
    # is then conditional on that head (docs/protocol.md, "Limits").
    behind: bool = False
    # A save by a process that never read or wrote the State (its copy came from elsewhere).
    fresh: bool = False


@dataclass
class Process:
    name: str
    roles: tuple[str, ...]  # "writer", "monitor", "reader", "admin"
    memory: Memory = field(default_factory=Memory)
    copy: Copy | None = None
    ops: dict[str, Op] = field(default_factory=dict)  # the operation under way, by role
    seen: set[str] = field(default_factory=set)  # wids of heads it read, or PUT itself
    newest: int = 0  # the index in World.events of the newest head it read or wrote

    def ctx(self) -> Ctx:
        return Ctx(LAYOUT, self.memory, SCOPE, False)

    def restart(self, keeps_bodies: bool) -> None:
        """A new process in its place: nothing of the old one's memory or copy."""
        self.memory = Memory(bodies=Bodies() if keeps_bodies else Bodies(limit=0))
        self.ops.clear()
        self.copy = None
        self.seen = set()
        self.newest = 0


class World:
    """One schedule: the processes, the bucket, and the invariants (see the module)."""

    def __init__(self, chooser: Chooser, *, lying: bool = False, versioned: bool = False):
        self.choose = chooser
        self.bucket = Bucket(random.Random(chooser.pick(list(range(64)))), lying, versioned)
        for key in STRANGERS:
            self.bucket.put_stranger(key, b"{}")
        # Every head the bucket has held, in order (None: no head), and who changed it.
        self.events: list[tuple[Content | None, str]] = [(None, "start")]
        self.processes = [
            Process("p1", ("writer", "monitor")),
            Process("p2", ("writer",)),
            Process("p3", ("reader",)),
            Process("p4", ("admin",)),
        ]
        self.counter = 0
        self.deletes = 0
        self.dead: set[str] = set()  # incarnations a tombstone head has named
        self.log: list[str] = []
        # Half the schedules' processes keep no bodies: every load fetches every part (and
        # takes more steps, overlapping more of the others).
        self.keeps_bodies = chooser.pick([True, False])
        for process in self.processes:
            process.restart(self.keeps_bodies)

    def run(self, steps: int) -> None:
        """``steps`` moves of the processes, then every operation finished without faults."""
        p1, p2, p3, p4 = self.processes
        # A third of the schedules have one writer: any refusal of its saves is then wrong.
        second = self.choose.pick([5, 5, 0])
        for _ in range(steps):
            process = self.choose.weighted([(p1, 6), (p2, second), (p3, 2), (p4, 3)])
            role = self.choose.weighted([(r, 2 if r == "writer" else 1) for r in process.roles])
            op = process.ops.get(role)
            if op is None:
                self._start(process, role)
            else:
                self._answer(process, op, self.choose.weighted(FAULTS))
        self.drain()

    def drain(self) -> None:
        for _ in range(100_000):
            busy = [(p, op) for p in self.processes for op in p.ops.values()]
            if not busy:
                break
            self._answer(*busy[0], "ok")
        final = Process("final", ("reader",))
        got = self._run_to_end(_load.read(final.ctx(), ID))
        now = oracle(self.bucket)
        if now is None and got is not None:
            raise InvariantError(
                "invariant 8: a final load returned a State the bucket does not hold"
            )
        if now is not None and (got is None or as_content(got) != (now.entries, now.snapshot)):
            raise InvariantError("invariant 8: a final load does not return what the head names")

    # Starting operations ---------------------------------------------------------------------

    def _start(self, process: Process, role: str) -> None:
        ctx = process.ctx()
        started = len(self.events), self.bucket.tick
        if role == "admin":
            if self.deletes < 4 and self.choose.pick([0, 1]) == 0:
                self.deletes += 1
                purge = self.choose.pick([False, True])
                op = Op("delete", role, _delete.delete(ctx, ID, purge), *started)
            else:
                op = Op("sweep", role, _sweep.sweep(ctx, 0, False, self._sweep_now()), *started)
        elif role == "reader" and self.choose.pick([0, 1, 2]) == 0:
            op = Op("list", role, _list.list_states(ctx), *started)
        elif role != "writer" or process.copy is None or self.choose.pick([0, 1, 2, 3]) == 0:
            op = Op("load", role, _load.read(ctx, ID), *started)
        elif (
            process is self.processes[1]
            and not process.ops
            and self.choose.pick(list(range(8))) == 0
        ):
            # The copy moves to a new process (pickled, say): it saves with no memory at all.
            self.log.append(f"{process.name} starts afresh with its copy")
            copy = process.copy
            process.restart(self.keeps_bodies)
            process.copy = copy
            op = self._save(process, process.ctx(), started)
        else:
            op = self._save(process, ctx, started)
        process.ops[role] = op
        self.log.append(f"{process.name} {role}: {op.kind}")
        self._advance(process, op, None)

    def _save(self, process: Process, ctx: Ctx, started: tuple[int, int]) -> Op:
        copy = process.copy
        assert copy is not None
        self.counter += 1
        mark = f"{process.name}:{self.counter}"
        create = copy.based_on < 0
        how = "create" if create else self.choose.pick(["one", "two", "snapshot", "entries"])
        if how == "create":
            for _ in range(self.choose.pick([0, 1, 5])):
                copy.entries.append(_entry(len(copy.entries), mark))
        elif how in ("one", "two", "entries"):
            for _ in range(2 if how == "two" else 1):
                copy.entries.append(_entry(len(copy.entries), mark))
        if how != "entries":
            copy.snapshot = _snap(mark, len(copy.entries), self.counter)
            copy.snapshot_saved = False
        if copy.saved and self.choose.pick([0, 0, 0, 1]):
            copy.saved -= 1  # an entry sent again, as after a save whose answer was lost
        snapshot = None if copy.snapshot_saved else copy.snapshot
        new = [dict(e) for e in copy.entries[copy.saved :]]
        op = Op("save", "writer", _save.write(ctx, ID, new, snapshot, create), *started)
        op.create = create
        op.behind = copy.based_on < process.newest
        op.fresh = not create and process.memory.seen(SCOPE, ID).head is None
        op.sent = (
            tuple(json.dumps(e, sort_keys=True) for e in copy.entries),
            None if snapshot is None else json.dumps(snapshot, sort_keys=True),
        )
        return op

    def _sweep_now(self) -> datetime:
        """A sweep's "now": no object of an operation under way is older (the age guard)."""
        ticks = [op.tick for p in self.processes for op in p.ops.values()]
        return EPOCH + timedelta(seconds=min(ticks, default=self.bucket.tick) + 0.5)

    # Answering calls --------------------------------------------------------------------------

    def _answer(self, process: Process, op: Op, fault: str) -> None:
        call = op.pending.pop(0)
        self.log.append(f"  {process.name} {call.method} {call.params.get('Key', '')}: {fault}")
        if fault == "kill":
            if self.choose.pick([0, 1]):
                self._apply(call, process)
            self._kill(process)
            return
        if fault == "ok":
            outcome = self._apply(call, process)
        elif fault == "fail":
            outcome = client_error("ServiceUnavailable", 503, _operation(call))
        elif fault == "conflict":
            outcome = client_error("ConditionalRequestConflict", 409, _operation(call))
        elif fault == "lost":
            self._apply(call, process)
            outcome = ReadTimeoutError(endpoint_url="http://model")
        else:  # "retried": applied, its answer lost; botocore sends it again, some time later
            self._apply(call, process)
            op.pending.insert(0, call)  # the retry is answered as a request of its own
            return
        if call.method == "get_object" and call.params["Key"] == HEAD:
            read = json.loads(outcome["Body"]) if isinstance(outcome, dict) else {}
            # The head a fresh process's save takes as its base, the one a delete replaces,
            # and a tombstone head (a create replaces it).
            if read and (op.fresh or op.kind == "delete" or read.get("deleted")):
                process.seen.add(read["write"])
        op.outcomes.append(outcome)
        if not op.pending:
            outcomes, op.outcomes = op.outcomes, []
            self._advance(process, op, outcomes)

    def _apply(self, call: Call, process: Process | None) -> Outcome:
        before = self.bucket.body(HEAD)
        try:
            outcome: Outcome = getattr(self.bucket, call.method)(**call.params)
        except ClientError as e:
            outcome = e
        after = self.bucket.body(HEAD)
        is_head_put = call.method == "put_object" and call.params["Key"] == HEAD
        if is_head_put and process is not None:
            self._check_base(process, call, before, applied=after != before)
        if after != before:
            self._changed(process)
        self.check()
        return outcome

    def _check_base(
        self, process: Process, call: Call, before: bytes | None, applied: bool
    ) -> None:
        """Invariants 4 and 11: a head PUT that lands replaces a head its process had seen."""
        if self.bucket.lying:
            raise InvariantError(
                "invariant 11: a head PUT was sent to an engine that ignores conditions"
            )
        op = process.ops.get("writer")
        if applied and before is not None and op is not None and op.fresh:
            # A fresh process takes the stored head as its base, if its copy holds its entries.
            held = oracle_of(before, self.bucket)
            if held != op.sent[0][: len(held)]:
                raise InvariantError(
                    f"invariant 6: {process.name}, a fresh process, saved on a head whose "
                    "entries its copy does not hold"
                )
        elif applied and before is not None and json.loads(before)["write"] not in process.seen:
            raise InvariantError(
                f"invariant 4: {process.name}'s head PUT replaced a head it had never seen "
                f"({json.loads(before)['write']})"
            )
        process.seen.add(json.loads(call.params["Body"])["write"])

    def _changed(self, process: Process | None) -> None:
        content = oracle(self.bucket)
        before = self.events[-1][0]
        body = self.bucket.body(HEAD)
        if body is not None and json.loads(body).get("deleted"):
            self.dead.add(json.loads(body)["inc"])
        if content is not None and content.inc in self.dead:
            raise InvariantError(
                f"invariant 12: the head names incarnation {content.inc}, deleted before"
            )
        self.events.append((content, process.name if process else "?"))
        if content is not None and (before is None or before.inc != content.inc):
            # A stranger's object in the new incarnation's folder, named as the store names its
            # parts: delete and sweep must leave it (invariant 9).
            key = f"{ROOT}states/{ID}/{content.inc}/e9999999999.{content.inc}.json"
            self.bucket.put_stranger(key, b"{}")
            self.bucket.put_stranger(key, b"{ }")  # and an older version of it
            gone = f"{ROOT}states/{ID}/{content.inc}/e9999999998.{content.inc}.json"
            self.bucket.put_stranger(gone, b"{}")
            self.bucket.delete_stranger(gone)  # its data under its own delete marker
        if content is not None and before is not None and content.inc == before.inc:
            if content.entries[: len(before.entries)] != before.entries:
                raise InvariantError(
                    "invariant 6: a head dropped or changed an entry of the one before"
                )

    def check(self) -> None:
        """Invariants 1, 3, 7 and 13: the current head names parts that hold its entries; 2: no
        PUT reached a key under ``states/`` with other bytes than it first held."""
        if self.bucket.rewritten:
            raise InvariantError(
                f"invariant 2: {self.bucket.rewritten[0]} was written again with other bytes"
            )
        if oracle(self.bucket) is not None and len(self.bucket.body(HEAD) or b"") < SMALLEST_HEAD:
            raise InvariantError(
                f"invariant 13: the head of a State is smaller than {SMALLEST_HEAD} bytes"
            )

    def _kill(self, process: Process) -> None:
        self.log.append(f"  {process.name} killed")
        for op in process.ops.values():
            op.steps.close()
        process.restart(self.keeps_bodies)

    def _run_to_end(self, steps: Steps[Any]) -> Any:
        try:
            step = next(steps)
            while True:
                calls = step.calls if isinstance(step, Batch) else []
                step = steps.send([self._apply(call, None) for call in calls])
        except StopIteration as done:
            return done.value

    # Operations ending -------------------------------------------------------------------------

    def _advance(self, process: Process, op: Op, outcomes: list[Outcome] | None) -> None:
        try:
            step = next(op.steps) if outcomes is None else op.steps.send(outcomes)
            while isinstance(step, Hold) or not step.calls:
                step = op.steps.send([])
        except StopIteration as done:
            del process.ops[op.role]
            self._ended(process, op, done.value, None)
            return
        except (S3StoreError, ConcurrentWriteError) as error:
            del process.ops[op.role]
            self._ended(process, op, None, error)
            return
        op.pending = list(step.calls)

    def _ended(self, process: Process, op: Op, value: Any, error: Exception | None) -> None:
        self.log.append(
            f"{process.name} {op.role}: {op.kind} ends {type(error).__name__ if error else 'ok'}"
        )
        if isinstance(error, CorruptStateError):
            raise InvariantError(
                f"invariant 8: {op.kind} found a damaged State: {error}"
            ) from error
        if op.kind == "load" and error is None:
            self._loaded(process, op, value)
        elif op.kind == "list":
            self._listed(op, value, error)
        elif op.kind == "save":
            self._saved(process, op, error)

    def _during(self, op: Op) -> list[tuple[int, Content | None]]:
        """The heads current at some moment of an operation, with their index in events."""
        return [(i, content) for i, (content, _) in enumerate(self.events)][op.started - 1 :]

    def _loaded(self, process: Process, op: Op, value: Any) -> None:
        during = self._during(op)
        if value is None:
            if all(content is not None for _, content in during):
                raise InvariantError(
                    "invariant 8: a load found no State while one existed throughout"
                )
            if op.role == "writer":
                process.copy = Copy([], None, 0, False, -1)  # it is to be created
            return
        got = as_content(value)
        match = [(i, c) for i, c in during if c is not None and (c.entries, c.snapshot) == got]
        if not match:
            raise InvariantError("invariant 8: a load returned what no head named during it")
        process.seen.update(c.write for _, c in match)
        process.newest = max(process.newest, match[-1][0])
        if op.role == "writer":
            entries, snapshot = value
            index, content = match[-1]
            process.copy = Copy(
                [dict(e) for e in entries], snapshot, len(entries), True, index, content.inc
            )

    def _listed(self, op: Op, value: Any, error: Exception | None) -> None:
        if isinstance(error, IncompleteListError):
            value = error.states
        elif error is not None:
            return
        during = [c for _, c in self._during(op)]
        stamps = {
            json.loads(c.snapshot)["updated_at"]
            for c in during
            if c is not None and c.snapshot != "null"
        }
        named = isinstance(error, IncompleteListError) and ID in error.failed
        if not value and not named and all(c is not None and c.snapshot != "null" for c in during):
            raise InvariantError(
                "invariants 10, 13: list() left out a State that existed throughout it"
            )
        for summary in value:
            if summary.updated_at.isoformat() not in stamps:
                raise InvariantError(
                    "invariant 8: list() summarised a snapshot no head held during it"
                )

    def _saved(self, process: Process, op: Op, error: Exception | None) -> None:
        copy = process.copy
        if copy is None:  # killed meanwhile
            return
        since = [(i, c, by) for i, (c, by) in enumerate(self.events) if i > copy.based_on]
        by_others = [c for _, c, by in since if by != process.name or c is None]
        if error is None:
            # Every entry of the copy is stored at its seq; its snapshot too, if it sent one. A
            # save sent with no snapshot keeps the stored one, and a copy older than what its
            # process had read saves on that (docs/protocol.md, "Limits"): its entries are then
            # a beginning of the head's, and its snapshot may be another's.
            entries, snapshot = op.sent
            mine = [(i, c) for i, c, by in since if by == process.name and c is not None]
            whole = [i for i, c in mine if c.entries == entries and snapshot in (None, c.snapshot)]
            # Behind: on the same incarnation, the copy's entries begin the head's; on another
            # one (the State was deleted and made again, and its process had read that), the
            # save lands on it as the record's limit says.
            behind = [
                i for i, c in mine if c.inc != copy.inc or c.entries[: len(entries)] == entries
            ]
            landed = whole or (behind if op.behind else [])
            if not landed:
                raise InvariantError(
                    f"a save of {process.name} returned, but no head of it holds its copy"
                )
            if op.behind:  # this copy is not the State now: the writer loads it again
                process.copy = None
                return
            process.newest = max(process.newest, landed[-1])
            copy.saved, copy.snapshot_saved, copy.based_on = len(copy.entries), True, landed[-1]
            copy.inc = self.events[landed[-1]][0].inc  # type: ignore[union-attr]
        elif isinstance(error, ConditionalWritesUnsupportedError):
            if not self.bucket.lying:
                raise InvariantError("invariant 11: an honest engine was refused") from error
        elif isinstance(error, ConcurrentWriteError | StateExistsError):
            if not by_others and not op.fresh:  # a fresh process may have to prove its copy
                history = [(i, by, c and c.write) for i, (c, by) in enumerate(self.events)]
                raise InvariantError(
                    f"invariant 5: {process.name}'s save was refused as a second writer's, but "
                    f"no one else changed the State since its copy was read ({error}); its "
                    f"copy is of head {copy.based_on} of {history}"
                ) from error
        elif isinstance(error, StateNotFoundError):
            if not any(c is None for c in by_others):
                raise InvariantError("a save found no State, but it was never deleted") from error
            process.copy = None


def _entry(seq: int, mark: str) -> dict[str, Any]:
    return {"seq": seq, "kind": "note", "text": f"entry {seq}", "by": mark}


def _operation(call: Call) -> str:
    return "".join(part.title() for part in call.method.split("_"))


@contextlib.contextmanager
def counted_wids() -> Iterator[None]:
    """Write ids from a counter while it lasts, so that a schedule runs the same every time."""
    saved = _keys.new_wid
    numbers = iter(range(1, 1 << 62))

    def wid() -> str:
        return f"{next(numbers):016x}"

    _keys.new_wid = wid
    try:
        yield
    finally:
        _keys.new_wid = saved


def explore(
    seeds: range, steps: int = 80, **world: bool
) -> tuple[int, InvariantError | AssertionError, list[str]] | None:
    """Run the schedules of ``seeds`` (a seeded random chooser each); the first violation.

    Returns ``(seed, violation, log)``, or ``None`` when every schedule kept the invariants. A
    stranger's object deleted is an ``AssertionError`` of the bucket's.
    """
    for seed in seeds:
        rng = random.Random(seed)
        with counted_wids():
            run = World(Chooser(rng.randrange), **world)
            try:
                run.run(steps)
            except AssertionError as found:
                return seed, found, run.log
    return None


# Scenarios: schedules written out, for interleavings too rare for the random search -------------


def _drive(
    bucket: Bucket,
    steps: Steps[Any],
    hold: Callable[[Call], bool] | None = None,
    fault: Callable[[Call], str | None] | None = None,
) -> Any:
    """Run ``steps`` on ``bucket``, every call answered at once; ``hold(call)`` true: the call is
    applied and the generator is returned with its answer not delivered (``(steps, call)``);
    ``fault(call)`` ``"lost"``: applied, answered with a timeout; ``"fail"``: not applied,
    answered 503."""
    try:
        step = next(steps)
        while True:
            outcomes: list[Outcome] = []
            for call in step.calls if isinstance(step, Batch) else []:
                if hold is not None and hold(call):
                    getattr(bucket, call.method)(**call.params)
                    return steps, call
                what = fault(call) if fault is not None else None
                if what == "fail":
                    outcomes.append(client_error("ServiceUnavailable", 503, _operation(call)))
                    continue
                if what == "lost":
                    getattr(bucket, call.method)(**call.params)
                    outcomes.append(ReadTimeoutError(endpoint_url="http://model"))
                    continue
                try:
                    outcomes.append(getattr(bucket, call.method)(**call.params))
                except ClientError as e:
                    outcomes.append(e)
                oracle(bucket)
            step = steps.send(outcomes)
    except StopIteration as done:
        return done.value


def _scenario_bucket() -> Bucket:
    bucket = Bucket(random.Random(0))
    bucket.put_stranger(STRANGERS[0], b"{}")
    return bucket


def _entries(first: int, last: int, by: str) -> list[dict[str, Any]]:
    return [_entry(seq, by) for seq in range(first, last)]


def _snap(by: str, count: int, at: int = 0) -> dict[str, Any]:
    """A snapshot of ``count`` entries, saved by ``by``, updated ``at`` seconds after EPOCH."""
    return {
        "v": 1,
        "id": ID,
        "task": "t",
        "entries": count,
        "data": {"save": by},
        "stopped_by": None,
        "created_at": EPOCH.isoformat(),
        "updated_at": (EPOCH + timedelta(seconds=at)).isoformat(),
    }


def scenario_a_lost_answer_then_saves_on_top() -> None:
    """A head PUT lands, its answer is lost; another process saves twice on top; botocore's
    retry then gets 412: it is not known whether the save landed, so its parts must stay."""
    bucket = _scenario_bucket()
    one, two = Process("one", ("writer",)), Process("two", ("writer",))
    _drive(bucket, _save.write(one.ctx(), ID, _entries(0, 2, "one"), _snap("one", 2), True))
    _drive(bucket, _load.read(two.ctx(), ID))
    held = _drive(
        bucket,
        _save.write(two.ctx(), ID, _entries(2, 3, "two"), _snap("two", 3), False),
        hold=lambda call: call.method == "put_object" and call.params["Key"] == HEAD,
    )
    steps, call = held
    got = _drive(bucket, _load.read(one.ctx(), ID))  # the other process saw the head that landed
    assert got is not None
    for n in (3, 4):
        _drive(
            bucket,
            _save.write(one.ctx(), ID, _entries(n, n + 1, "one"), _snap("one", n + 1), False),
        )
    try:
        _drive(bucket, _resume(steps, bucket, call))
    except ConcurrentWriteError:
        pass
    oracle(bucket)


def _resume(steps: Steps[Any], bucket: Bucket, call: Call) -> Steps[Any]:
    """``steps`` given botocore's retry of ``call`` (applied before) as its answer, then on."""
    try:
        answer: Outcome = getattr(bucket, call.method)(**call.params)
    except ClientError as e:
        answer = e
    try:
        step = steps.send([answer])
        while True:
            outcomes = yield step
            step = steps.send(outcomes)
    except StopIteration as done:
        return done.value


def scenario_b_stale_copy_of_a_state_made_again_smaller() -> None:
    """A process holds a copy of 3 entries; the State is deleted and made again with 1; the
    process loads the new one (a monitor); its old copy then saves entry 3: refused, and the
    new State is as it was (issue 34, item 6)."""
    bucket = _scenario_bucket()
    one, two = Process("one", ("writer",)), Process("two", ("admin",))
    _drive(bucket, _save.write(one.ctx(), ID, _entries(0, 3, "one"), _snap("one", 3), True))
    _drive(bucket, _delete.delete(two.ctx(), ID, False))
    _drive(bucket, _save.write(two.ctx(), ID, _entries(0, 1, "two"), _snap("two", 1), True))
    before = oracle(bucket)
    _drive(bucket, _load.read(one.ctx(), ID))
    try:
        _drive(bucket, _save.write(one.ctx(), ID, _entries(3, 4, "one"), _snap("one", 4), False))
    except ConcurrentWriteError:
        pass
    else:
        raise InvariantError("invariant 6: a stale copy continued a smaller State made again")
    if oracle(bucket) != before:
        raise InvariantError("invariant 6: a refused save changed the State")


def scenario_c_a_lost_create_then_a_failed_update() -> None:
    """A create lands and its answer is lost; the core, told it failed, creates again: the store
    finds its own head and saves on it, but that PUT fails before S3 applies it; the core
    creates a third time. Its own State: never refused as an id taken by another."""
    bucket = _scenario_bucket()
    one = Process("one", ("writer",))
    plan = ["lost", None, "fail"]  # the first three head PUTs

    def fault(call: Call) -> str | None:
        if call.method == "put_object" and call.params["Key"] == HEAD and plan:
            return plan.pop(0)
        return None

    for n in (1, 2, 3):
        try:
            _drive(
                bucket,
                _save.write(one.ctx(), ID, _entries(0, n, "one"), _snap("one", n), True),
                fault=fault,
            )
        except StateExistsError as error:
            raise InvariantError(
                f"invariant 5: create {n} of a State this process created was refused as "
                f"another's: {error}"
            ) from error
        except S3StoreError:
            assert n < 3, "the third create had no fault"
    stored = oracle(bucket)
    assert stored is not None and len(stored.entries) == 3, stored


def scenario_d_a_create_in_flight_across_a_delete() -> None:
    """A create's head PUT lands, its answer is lost; the State is deleted; botocore's retry of
    the same PUT then arrives. It must not bring the State back on the deleted incarnation
    (invariant 12: the model checker's own find). The creator then loads (no State) and saves
    its copy's snapshot again: refused, and nothing names the dead incarnation."""
    bucket = _scenario_bucket()
    one, two = Process("one", ("writer",)), Process("two", ("admin",))
    steps, call = _drive(
        bucket,
        _save.write(one.ctx(), ID, _entries(0, 2, "one"), _snap("one", 2), True),
        hold=lambda call: call.method == "put_object" and call.params["Key"] == HEAD,
    )
    created = oracle(bucket)
    assert created is not None
    _drive(bucket, _delete.delete(two.ctx(), ID, False))
    _drive(bucket, _resume(steps, bucket, call))  # the retry: 412, and the create committed
    if oracle(bucket) is not None:
        raise InvariantError("invariant 12: a create sent before a delete brought the State back")
    if _drive(bucket, _load.read(one.ctx(), ID)) is not None:
        raise InvariantError("invariant 8: a load found the deleted State")
    try:
        _drive(bucket, _save.write(one.ctx(), ID, [], _snap("one", 2, 9), False))
    except StateNotFoundError:
        pass
    stored = bucket.body(HEAD)
    if stored is None or (json.loads(stored)["inc"] == created.inc and oracle(bucket) is not None):
        raise InvariantError(
            f"invariant 12: the head names incarnation {created.inc}, deleted before"
        )


def scenario_e_a_first_delete_behind_an_engine_that_lies() -> None:
    """A State saved while the engine was honest; it then ignores conditions (under load, say).
    A process whose first request to the bucket is a delete must refuse before its tombstone
    PUT, as a save does (invariant 11)."""
    bucket = _scenario_bucket()
    one, two = Process("one", ("writer",)), Process("two", ("admin",))
    _drive(bucket, _save.write(one.ctx(), ID, _entries(0, 2, "one"), _snap("one", 2), True))
    bucket.lying = True
    head = bucket.body(HEAD)
    try:
        _drive(bucket, _delete.delete(two.ctx(), ID, False))
    except ConditionalWritesUnsupportedError:
        pass
    if bucket.body(HEAD) != head:
        raise InvariantError(
            "invariant 11: a delete's head PUT was sent to an engine that ignores conditions"
        )


def scenario_f_a_purge_beside_a_create_of_the_same_id() -> None:
    """A delete with purge lists the versions, its answer late; meanwhile another process makes
    the id again. The purge, resumed with that listing, must keep the new State (invariant 9:
    only a dead incarnation, never the current objects of a live one)."""
    bucket = Bucket(random.Random(0), versioned=True)
    one, two = Process("one", ("writer",)), Process("two", ("admin",))
    _drive(bucket, _save.write(one.ctx(), ID, _entries(0, 2, "one"), _snap("one", 2), True))
    steps, call = _drive(
        bucket,
        _delete.delete(two.ctx(), ID, True),
        hold=lambda call: call.method == "list_object_versions",
    )
    _drive(bucket, _load.read(one.ctx(), ID))  # no State: its tombstone is the base now
    _drive(bucket, _save.write(one.ctx(), ID, _entries(0, 1, "one"), _snap("one", 1), True))
    made = oracle(bucket)
    assert made is not None
    _drive(bucket, _resume(steps, bucket, call))
    if oracle(bucket) != made:
        raise InvariantError("invariant 9: a purge changed a State made again beside it")


SCENARIOS: list[Callable[[], None]] = [
    scenario_a_lost_answer_then_saves_on_top,
    scenario_b_stale_copy_of_a_state_made_again_smaller,
    scenario_c_a_lost_create_then_a_failed_update,
    scenario_d_a_create_in_flight_across_a_delete,
    scenario_e_a_first_delete_behind_an_engine_that_lies,
    scenario_f_a_purge_beside_a_create_of_the_same_id,
]


def run_scenarios() -> tuple[str, AssertionError] | None:
    """Run every scenario with the default packing; the first that fails, and how."""
    saved = _pack.FOLD, _pack.MERGE
    setattr(_pack, "FOLD", 16)  # noqa: B010 - no packing in these short histories
    setattr(_pack, "MERGE", 4)  # noqa: B010
    try:
        for scenario in SCENARIOS:
            with counted_wids():
                try:
                    scenario()
                except AssertionError as found:
                    return scenario.__name__, found
    finally:
        setattr(_pack, "FOLD", saved[0])  # noqa: B010
        setattr(_pack, "MERGE", saved[1])  # noqa: B010
    return None
