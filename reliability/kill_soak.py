"""Kill soak: an Agent run in a real child process, killed again and again, resumed each time.

    python reliability/kill_soak.py [--kills 100] [--seconds 600] [--seed 1]
                                    [--store file|s3|both] [--signals kill,term]
                                    [--endpoint URL]

Each State is run by a child process that this process forks (it has imported everything
already, so a child starts in milliseconds; the child opens its own store, and its own boto3
client, after the fork). The child is killed with SIGKILL or SIGTERM at a random moment or
at a chosen step; the next child loads the State and runs it again, and so on until a run
finishes; then a new State starts. The model is a ``FunctionModel`` that works through a few
steps, calling the tool ``work`` once or several times at once per step (parallel calls), and
the Agent compacts its context now and then (a small ``compact_at``).

Kill moments, one per child:

* ``timer``: the parent sleeps a random time, then signals the child;
* ``write``: the child signals itself just before or just after its k-th store write
  (``Store.write``), so the kill lands between two saves;
* ``io``: the child signals itself before its k-th low-level write: an S3 request sent or
  answered, or for FileStore an ``os.write``/``os.replace``/``os.rename``/``os.mkdir``. With
  SIGKILL on FileStore, a third of these write half the bytes first (a torn write);
* ``tool``: the k-th tool call signals its own process after it has logged its start.

SIGTERM is turned into ``SystemExit`` by the handler of the guide ("Stop cleanly on SIGTERM").
On S3 a State's saves pack its history as they go (every 16 entry objects become a segment),
so the kills land in packing saves, and in the engine check of each child's first save, too.

After every child, this process reads and loads the State through a store object of its own
and checks (docs/guide.md, "If the process stops" and "Stop cleanly on SIGTERM"):

* the State can be read and loaded, without an error;
* the stored seqs are 0..n-1, none missing, none twice;
* every entry an earlier check saw is still stored, unchanged (saved entries never change or
  vanish), and so is every entry a child saw ``Store.write`` return for (the child logs them
  after the write returns);
* each tool call has exactly one result, or none when a notice leaves its step out of the
  conversation (the calls among the missing steps are named in the notice);
* no call id was started twice (the tool appends its call id to a log, fsync'd, before its
  work), and every result of ``work`` comes from a call that started;
* after SIGTERM during a run: the child exited with ``SystemExit`` (status 143), every
  entry it had in memory is stored, the load settles nothing (no "(unknown: …)" result, no
  notice), and calls cut short were closed with ``(aborted: SystemExit)``;
* a run that returned left the State stopped by ``finish`` with the answer ``"done"``;
* a child raised nothing. A plain ``S3StoreError`` is the one exception: an S3 request that
  failed after botocore's retries (LocalStack under load drops a connection now and then),
  which ``fault_proxy.py`` judges. It is counted and printed, not judged, and the State
  resumes in the next child; the runner's own reads are tried again after one.

At the end of the S3 soak it counts what the bucket holds by role (heads, entries, segments,
objects no head names, probes of engine checks), sweeps it (``sweep(older_than=0)``: nothing
runs any more), and checks that the sweep removed exactly what no head names and the probes,
and that every State then loads the entries the last check saw (docs/protocol.md, "A kill
between any two requests").

It prints one line per store and signal (kills, resumes, States finished, violations, time),
a total per store, then each violation with its State id, and exits 1 on any violation.
``--break drop-save`` makes the children's store drop every tool result saved alone while
still reporting it saved: the soak must then find violations (a test uses it).

Without ``--endpoint``, moto's ``ThreadedMotoServer`` runs on 127.0.0.1 in a process of its
own (this process stays single-threaded, so forking it is safe).

The children's side (the store, model and tool that report to this process, and where they
signal themselves) is in ``_soak_child.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import select
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
from _bucket import remove_bucket
from _soak_child import (
    ANSWER,
    ERROR_STATUS,
    POINTS,
    PREFIX,
    TERM_STATUS,
    Plan,
    Point,
    StoreKind,
    Target,
    canonical,
    child_main,
)

from alpineagents import (
    FileStore,
    Record,
    State,
    StateNotFoundError,
    Store,
)
from alpineagents.history import MODEL, NOTICE, TOOL_RESULT, HistoryEntry
from alpineagents_s3 import S3Store, S3StoreError
from alpineagents_s3.testing import separate_process

POINT_WEIGHTS = (4, 2, 3, 2)  # timer, write, io, tool

CHILD_TIMEOUT = 60.0  # a child still alive this long after its start (or its SIGTERM) hangs
TERM_GRACE = 15.0
MAX_CHILDREN = 60  # children for one State before it is judged never to finish
# A plain S3StoreError is an S3 request that failed after botocore's retries (a server that
# dropped a connection, say): the fault runner's subject, not this one's. A child that raised
# one is counted and the State resumed; a read of the runner's is tried this many times.
S3_ERROR = f"{S3StoreError.__module__}.{S3StoreError.__qualname__}"
TRIES = 5
READS = "the runner's reads"
BUILTINS = frozenset({"finish", "ask"})

# Dummy credentials for moto and LocalStack; never a real account.
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


# The parent's store object ----------------------------------------------------------------


class Keeping(Store):
    """A store that keeps what its last ``read`` returned: a check loads once, and sees both
    the stored entries and the State that ``load`` rebuilds from them."""

    last: Record | None = None

    def read(self, state_id: str) -> Record | None:
        """Read, and keep the record."""
        self.last = super().read(state_id)
        return self.last


class _KeepingFileStore(Keeping, FileStore):
    pass


class _KeepingS3Store(Keeping, S3Store):
    pass


def fresh_store(target: Target) -> Keeping:
    """A store object of the parent's, new for each check (closed after it: no thread of its
    outlives the check, so forking stays safe).

    On S3 it has a memory of its own: the parent's stays empty, so each child, a fork of the
    parent, starts with none, as a resumed process does; and each check reads the State cold.
    """
    if target.kind == "file":
        assert target.folder is not None
        return _KeepingFileStore(target.folder)
    store = _KeepingS3Store(
        target.bucket, PREFIX, endpoint_url=target.endpoint, client=target.client
    )
    separate_process(store)
    return store


# The parent: children ------------------------------------------------------------------------


@dataclass
class Ended:
    """How a child ended.

    Attributes:
        status: ``os.waitstatus_to_exitcode``: 0, 143 (SystemExit after SIGTERM), 70 (an
            error), or minus the signal that ended it.
        signal_sent: The signal this process sent (``timer``), if any.
        hung: The child did not end in time and was killed with SIGKILL.
        seconds: From the fork to the end.
    """

    status: int
    signal_sent: int | None
    hung: bool
    seconds: float


def wait_for(pid: int, seconds: float) -> int | None:
    """The child's exit status once it ended, or ``None`` if it still runs after ``seconds``."""
    deadline = time.monotonic() + seconds
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = -1
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if fd >= 0:
                select.select([fd], [], [], left)
            else:
                time.sleep(min(left, 0.002))
    finally:
        if fd >= 0:
            os.close(fd)


def run_child(target: Target, plan: Plan) -> Ended:
    """Fork a child for ``plan``, kill it as planned, and reap it."""
    started = time.monotonic()
    # A SIGTERM sent early waits until the child has installed the guide's handler.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        child_main(target, plan)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    sent = None
    status: int | None = None
    if plan.signum is not None and plan.point == "timer":
        status = wait_for(pid, plan.delay)
        if status is None:
            os.kill(pid, plan.signum)
            sent = plan.signum
    hung = False
    if status is None:
        status = wait_for(pid, TERM_GRACE if sent == signal.SIGTERM else CHILD_TIMEOUT)
    if status is None:
        hung = True
        os.kill(pid, signal.SIGUSR1)  # its threads' stacks, into its log
        status = wait_for(pid, 1.0)
    if status is None:
        os.kill(pid, signal.SIGKILL)
        status = wait_for(pid, CHILD_TIMEOUT)
        if status is None:
            raise RuntimeError(f"child {pid} survived SIGKILL")
    return Ended(status, sent, hung, time.monotonic() - started)


# The parent: checks ------------------------------------------------------------------------


@dataclass
class Watch:
    """What the parent knows of one State across its children."""

    state_id: str
    steps: int
    parts: tuple[int, ...]
    started: Path
    seen: dict[int, str] = field(default_factory=dict)
    children: int = 0
    kills: Counter[int] = field(default_factory=Counter)
    last_kill: int | None = None


def read_lines(path: Path) -> list[str]:
    """The lines of a log, or none if it does not exist."""
    try:
        return path.read_text().splitlines()
    except FileNotFoundError:
        return []


def read_report(path: Path) -> dict[str, Any] | None:
    """A child's JSON report; ``None`` if there is none or SIGKILL cut it short."""
    try:
        found: dict[str, Any] = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return found


def skipped_by_notices(history: Sequence[HistoryEntry]) -> set[int]:
    """The seqs a notice leaves out of the conversation."""
    skipped: set[int] = set()
    for entry in history:
        if entry.kind == NOTICE:
            span = entry.as_notice().skipped
            if span is not None:
                skipped.update(range(*span))
    return skipped


def stacks(log: Path) -> str:
    """The thread stacks a hung child wrote to its log on SIGUSR1, indented."""
    try:
        text = log.read_text(errors="replace")
    except FileNotFoundError:
        return "    (no log)"
    starts = [i for i in (text.find("Thread 0x"), text.find("Current thread 0x")) if i >= 0]
    dump = text[min(starts) :] if starts else "(none written)"
    return "\n".join(f"    {line}" for line in dump.strip().splitlines())


def s3_failed(target: Target, watch: Watch, plan: Plan, ended: Ended) -> bool:
    """Whether the child ended by a plain ``S3StoreError`` (not judged here; counted)."""
    if ended.hung or ended.status != ERROR_STATUS:
        return False
    error = read_report(target.work / f"{watch.state_id}.error-{plan.number}") or {}
    return error.get("type") == S3_ERROR


def tried(failures: Counter[str], read: Any, *args: Any) -> Any:
    """``read(*args)``, tried again (up to ``TRIES``) when it raises a plain S3StoreError."""
    for attempt in range(TRIES):
        try:
            return read(*args)
        except S3StoreError as e:
            if type(e) is not S3StoreError or attempt == TRIES - 1:
                raise
            failures[READS] += 1
            time.sleep(0.2 * 2**attempt)
    raise AssertionError("unreachable")


def check(
    target: Target, watch: Watch, plan: Plan, ended: Ended, failures: Counter[str]
) -> list[str]:
    """Every promise after one child; the broken ones, one sentence each."""
    found: list[str] = []
    work = target.work
    n = plan.number
    status = ended.status
    if ended.hung:
        found.append(
            f"child {n} did not end within its time ({plan.point}, signal {plan.signum});"
            f" its stacks:\n{stacks(work / f'{watch.state_id}.log')}"
        )
    elif s3_failed(target, watch, plan, ended):
        failures["children"] += 1
    elif status == ERROR_STATUS:
        error = read_report(work / f"{watch.state_id}.error-{n}") or {}
        last = str(error.get("error", "(no report)")).strip().splitlines()[-1:]
        found.append(f"child {n} raised: {' '.join(last)}")
    elif status == -signal.SIGTERM:
        found.append(f"child {n} was ended by SIGTERM without SystemExit")
    elif status not in (0, TERM_STATUS, -signal.SIGKILL):
        found.append(f"child {n} exited with status {status}")

    store = fresh_store(target)
    acked = [json.loads(line) for line in read_lines(work / f"{watch.state_id}.saved")]
    loaded: State | None = None
    failed = False
    try:
        loaded = tried(failures, store.load, watch.state_id)
    except StateNotFoundError:
        pass
    except Exception as e:
        failed = True
        found.append(f"after child {n}: the load failed: {type(e).__name__}: {e}")
    finally:
        store.close()
    record = store.last
    if record is None:
        if failed:
            return found  # the read itself failed
        if watch.seen or acked:
            found.append(f"after child {n}: the State is gone ({len(watch.seen)} seen)")
        return found
    stored = check_entries(watch, record.entries, acked, n, found)
    if loaded is None:
        return found
    found += check_calls(watch, loaded.history, n)

    if status == TERM_STATUS:
        exit_report = read_report(work / f"{watch.state_id}.exit-{n}") or {}
        if exit_report.get("in_run"):
            if exit_report.get("history") != len(stored):
                notes = "; ".join(exit_report.get("notes", [])) or "no note"
                found.append(
                    f"after SIGTERM (child {n}): {exit_report.get('history')} entries in "
                    f"memory, {len(stored)} stored ({notes})"
                )
            added = loaded.history[len(stored) :]
            if added:
                kinds = ", ".join(e.kind for e in added)
                found.append(f"after SIGTERM (child {n}): the load settled entries ({kinds})")
        for item in loaded.history:
            if item.kind == TOOL_RESULT and item.text.startswith("(aborted:"):
                if item.text != "(aborted: SystemExit)":
                    found.append(f"after SIGTERM (child {n}): a call closed with {item.text}")
    if status == 0 and not ended.hung:
        if loaded.stopped_by != "finish" or loaded.answer != ANSWER:
            found.append(
                f"child {n} returned, but the State is stopped by {loaded.stopped_by!r} "
                f"with {loaded.answer!r}"
            )
    return found


def check_entries(
    watch: Watch,
    entries: Sequence[dict[str, Any]],
    acked: Sequence[dict[str, Any]],
    n: int,
    found: list[str],
) -> dict[int, str]:
    """Seqs 0..n-1, entries seen before unchanged, entries reported saved stored; by seq."""
    stored: dict[int, str] = {}
    for entry in entries:
        seq = entry["seq"]
        if seq in stored:
            found.append(f"after child {n}: seq {seq} is stored twice")
        stored[seq] = canonical(entry)
    if sorted(stored) != list(range(len(stored))):
        found.append(f"after child {n}: the stored seqs are not 0..n-1: {sorted(stored)}")
    for seq, before in sorted(watch.seen.items()):
        if seq not in stored:
            found.append(f"after child {n}: entry {seq}, seen before, is gone")
        elif stored[seq] != before:
            found.append(f"after child {n}: entry {seq}, seen before, changed")
    for entry in acked:
        seq = entry["seq"]
        if stored.get(seq) != canonical(entry):
            what = "is missing" if seq not in stored else "differs"
            found.append(f"after child {n}: entry {seq} ({entry['kind']}), saved, {what}")
    for seq, now in stored.items():
        watch.seen.setdefault(seq, now)  # the first sight stays the reference
    return stored


def check_calls(watch: Watch, history: Sequence[HistoryEntry], n: int) -> list[str]:
    """One result per tool call (or a notice), no call started twice, no result without a run."""
    found: list[str] = []
    skipped = skipped_by_notices(history)
    results: Counter[str] = Counter()
    ran_results: set[str] = set()
    for entry in history:
        if entry.kind == TOOL_RESULT:
            result = entry.as_tool_result()
            results[result.call_id] += 1
            if result.name == "work" and entry.text.startswith("step "):
                ran_results.add(result.call_id)
    noticed = " ".join(e.text for e in history if e.kind == NOTICE)
    for entry in history:
        if entry.kind != MODEL:
            continue
        for call in entry.as_model().tool_calls:
            count = results[call["id"]]
            if call["name"] in BUILTINS:
                if count > 1:
                    found.append(f"after child {n}: {call['id']} (finish) has {count} results")
                continue
            if count > 1:
                found.append(f"after child {n}: call {call['id']} has {count} results")
            elif count == 0 and not (entry.seq in skipped and call["name"] in noticed):
                found.append(f"after child {n}: call {call['id']} has no result and no notice")
    starts = Counter(read_lines(watch.started))
    for call_id, count in starts.items():
        if count > 1:
            found.append(f"after child {n}: call {call_id} was started {count} times")
    for call_id in sorted(ran_results - set(starts)):
        found.append(f"after child {n}: call {call_id} has a result but never started")
    return found


# The parent: the soak ----------------------------------------------------------------------


@dataclass
class Tally:
    """The figures of one store and one signal."""

    kills: int = 0
    resumes: int = 0
    finished: int = 0
    violations: int = 0
    seconds: float = 0.0
    during_run: int = 0  # SIGTERM: children stopped inside ``agent.run``


@dataclass
class Soak:
    """One store's soak."""

    target: Target
    signals: list[int]
    rng: random.Random
    kills_wanted: int
    deadline: float
    tallies: dict[int, Tally] = field(default_factory=dict)
    points: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    states: int = 0
    finished: int = 0
    children: int = 0
    seconds: float = 0.0
    full_seconds: float = 0.5
    full_ticks: Counter[str] = field(default_factory=Counter)
    turn: int = 0
    watches: list[Watch] = field(default_factory=list)
    failures: Counter[str] = field(default_factory=Counter)  # plain S3StoreErrors, not judged

    @property
    def kills(self) -> int:
        """Kills so far, all signals."""
        return sum(t.kills for t in self.tallies.values())

    def plan(self, watch: Watch, kill: bool) -> Plan:
        """The next child of ``watch``'s State: a kill (if ``kill``) at a random point."""
        rng = self.rng
        signum: int | None = None
        point: Point = "timer"
        at, delay, torn = 0, 0.0, False
        if kill:
            signum = self.signals[self.turn % len(self.signals)]
            self.turn += 1
            point = rng.choices(POINTS, POINT_WEIGHTS)[0]
            if point == "timer":
                delay = rng.uniform(0, self.full_seconds)
            else:
                at = rng.randint(1, max(1, int(self.full_ticks[point] * 0.8)))
            torn = (
                point == "io"
                and self.target.kind == "file"
                and signum == signal.SIGKILL
                and rng.random() < 1 / 3
            )
        return Plan(
            watch.state_id,
            watch.steps,
            watch.parts,
            signum,
            point,
            at,
            delay,
            torn,
            rng.getrandbits(32),
            watch.children,
        )

    def new_watch(self) -> Watch:
        """A new State to run."""
        steps = self.rng.randint(3, 6)
        parts = tuple(self.rng.randint(1, 3) for _ in range(steps))
        self.states += 1
        state_id = f"soak-{uuid.uuid4().hex[:12]}"
        watch = Watch(state_id, steps, parts, self.target.work / f"{state_id}.started")
        self.watches.append(watch)
        return watch

    def calibrate(self) -> None:
        """Run two States without a kill: how long a run takes, how many steps of each kind."""
        for _ in range(2):
            watch = self.new_watch()
            ended, report_ = self.child(watch, self.plan(watch, kill=False))
            if report_ is not None:
                for point, count in report_.get("ticks", {}).items():
                    self.full_ticks[point] = max(self.full_ticks[point], count)
            self.full_seconds = max(ended.seconds, 0.05)
            if ended.status == 0:
                self.finished += 1

    def child(self, watch: Watch, plan: Plan) -> tuple[Ended, dict[str, Any] | None]:
        """Run one child of ``watch``'s State and check after it; count everything."""
        began = time.monotonic()
        ended = run_child(self.target, plan)
        found = check(self.target, watch, plan, ended, self.failures)
        watch.children += 1
        self.children += 1
        report_ = read_report(self.target.work / f"{watch.state_id}.exit-{plan.number}")
        killed_by = None
        if ended.status == -signal.SIGKILL and not ended.hung:
            killed_by = signal.SIGKILL
        elif ended.status == TERM_STATUS:
            killed_by = signal.SIGTERM
        spent = time.monotonic() - began
        if plan.signum is not None:
            tally = self.tallies.setdefault(plan.signum, Tally())
            tally.seconds += spent
            tally.violations += len(found)
            if killed_by is not None:
                tally.kills += 1
                tally.during_run += killed_by == signal.SIGTERM and bool(
                    report_ and report_.get("in_run")
                )
                watch.kills[killed_by] += 1
                self.points[plan.point] += 1
        elif found:
            self.tallies.setdefault(0, Tally()).violations += len(found)
        if plan.number > 0 and watch.last_kill is not None:
            self.tallies.setdefault(watch.last_kill, Tally()).resumes += 1
        watch.last_kill = killed_by
        self.violations += [f"{watch.state_id}: [{plan.describe()}] {v}" for v in found]
        return ended, report_

    def run(self) -> None:
        """States one after another, each killed and resumed until it finishes."""
        self.calibrate()
        while self.kills < self.kills_wanted and time.monotonic() < self.deadline:
            watch = self.new_watch()
            budget = self.rng.randint(1, 8)
            while True:
                kill = (
                    sum(watch.kills.values()) < budget
                    and self.kills < self.kills_wanted
                    and time.monotonic() < self.deadline
                )
                plan = self.plan(watch, kill)
                ended, _ = self.child(watch, plan)
                if ended.hung or (
                    ended.status == ERROR_STATUS and not s3_failed(self.target, watch, plan, ended)
                ):
                    break  # reported; a State its own run cannot continue is left there
                if ended.status == 0:
                    self.finished += 1
                    for signum in watch.kills:
                        self.tallies.setdefault(signum, Tally()).finished += 1
                    break
                if watch.children >= MAX_CHILDREN:
                    self.violations.append(
                        f"{watch.state_id}: not finished after {watch.children} children"
                    )
                    break


# Stores and output ---------------------------------------------------------------------------

MOTO = """
import sys
from alpineagents_s3.testing import embedded_moto
with embedded_moto() as url:
    print(url, flush=True)
    sys.stdin.read()
"""


@contextlib.contextmanager
def moto_process() -> Iterator[str]:
    """moto's ThreadedMotoServer in a process of its own; its URL."""
    server = subprocess.Popen(
        [sys.executable, "-c", MOTO], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        if not url.startswith("http"):
            raise RuntimeError("moto's server did not start")
        yield url
    finally:
        assert server.stdin is not None
        server.stdin.close()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def signal_name(signum: int) -> str:
    """``SIGKILL``, ``SIGTERM``, or ``none`` for children left to finish."""
    return signal.Signals(signum).name if signum else "none"


def print_soak(label: str, soak: Soak) -> None:
    """One line per signal, then the store's total."""
    for signum, tally in sorted(soak.tallies.items(), key=lambda item: -item[0]):
        if signum == 0 and not tally.violations:
            continue
        print(
            f"{label:<4} {signal_name(signum):<7}  kills {tally.kills:>5}  resumes "
            f"{tally.resumes:>5}  States finished {tally.finished:>4}  violations "
            f"{tally.violations:>3}  {tally.seconds:.1f}s"
            + (f"  ({tally.during_run} inside agent.run)" if signum == signal.SIGTERM else "")
        )
    points = ", ".join(f"{p} {soak.points[p]}" for p in POINTS)
    print(
        f"{label:<4} total    kills {soak.kills:>5}  children {soak.children:>5}  States "
        f"{soak.states} ({soak.finished} finished)  violations {len(soak.violations):>3}  "
        f"[kill points: {points}]  {soak.seconds:.1f}s"
        + (
            f" (time bound: {soak.kills} of {soak.kills_wanted} kills)"
            if soak.kills < soak.kills_wanted
            else ""
        ),
        flush=True,
    )
    if soak.failures:
        print(
            f"{label:<4} S3 requests failed after botocore's retries (plain S3StoreError, not "
            f"judged): children {soak.failures['children']}, the runner's reads "
            f"{soak.failures[READS]}",
            flush=True,
        )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the soak on each store and print its figures; 1 on any violation."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=100, help="kills per store")
    parser.add_argument("--seconds", type=float, default=600.0, help="time bound of the run")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--store", choices=["file", "s3", "both"], default="both")
    parser.add_argument("--signals", default="kill,term", help="kill, term or kill,term")
    parser.add_argument("--endpoint", help="an S3 endpoint (default: moto, in its own process)")
    parser.add_argument("--break", dest="broken", choices=["drop-save"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    names = {"kill": int(signal.SIGKILL), "term": int(signal.SIGTERM)}
    try:
        signals = [names[s.strip()] for s in args.signals.split(",") if s.strip()]
    except KeyError as e:
        parser.error(f"--signals: unknown signal {e}")
    if not signals:
        parser.error("--signals: at least one of kill, term")
    for key, value in CREDENTIALS.items():
        os.environ.setdefault(key, value)
    kinds: list[StoreKind] = ["file", "s3"] if args.store == "both" else [args.store]
    started = time.monotonic()
    rng = random.Random(args.seed)
    soaks: list[tuple[str, Soak]] = []
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kill-soak-")))
        url = ""
        if "s3" in kinds:
            url = args.endpoint or stack.enter_context(moto_process())
        print(
            f"kill soak: stores {', '.join(kinds)}"
            + (f" (S3 at {url}{'' if args.endpoint else ', moto'})" if url else "")
            + f", signals {args.signals}, {args.kills} kills per store, bound "
            f"{args.seconds:g}s, seed {args.seed}"
            + (f", BROKEN: {args.broken}" if args.broken else ""),
            flush=True,
        )
        for i, kind in enumerate(kinds):
            left = args.seconds - (time.monotonic() - started)
            deadline = time.monotonic() + left / (len(kinds) - i)
            target = Target(kind, work / kind, broken=args.broken)
            target.work.mkdir()
            if kind == "file":
                target.folder = work / "store"
            else:
                session = boto3.Session()
                target.session = session
                target.endpoint = url
                target.bucket = f"kill-soak-{uuid.uuid4().hex[:12]}"
                target.client = session.client("s3", endpoint_url=url, region_name="us-east-1")
                target.client.create_bucket(Bucket=target.bucket)
            soak = Soak(target, signals, random.Random(rng.getrandbits(64)), args.kills, deadline)
            begun = time.monotonic()
            try:
                soak.run()
                soak.seconds = time.monotonic() - begun
                if kind == "s3":
                    sweep_and_check(soak)
            finally:
                if kind == "s3":
                    _empty_bucket(target)
            print_soak(kind, soak)
            soaks.append((kind, soak))
    total = sum(len(s.violations) for _, s in soaks)
    for label, soak in soaks:
        for violation in soak.violations[:20]:
            print(f"  {label}: {violation}")
        if len(soak.violations) > 20:
            print(f"  {label}: … and {len(soak.violations) - 20} more")
    kills = sum(s.kills for _, s in soaks)
    print(f"total: {kills} kills, {total} violations, {time.monotonic() - started:.1f}s")
    return 1 if total else 0


ROLES = ("head", "entry", "segment", "unnamed", "probe", "other")


def by_role(target: Target, failures: Counter[str]) -> dict[str, set[str]]:
    """Every key of the run's bucket by role: what a head names, what none does, probes."""
    client = target.client
    found: dict[str, set[str]] = {role: set() for role in ROLES}
    heads: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=target.bucket):
        for item in page.get("Contents", []):
            key = item["Key"]
            if key.startswith(f"{PREFIX}/probes/"):
                found["probe"].add(key)
            elif key.startswith(f"{PREFIX}/heads/") and key.endswith(".json"):
                heads.append(key.removeprefix(f"{PREFIX}/heads/").removesuffix(".json"))
            elif not key.startswith(f"{PREFIX}/states/"):
                found["other"].add(key)
    store = separate_process(
        S3Store(target.bucket, PREFIX, endpoint_url=target.endpoint, client=target.client)
    )
    try:
        for state_id in heads:
            for obj in tried(failures, store.objects, state_id):
                found[obj.role].add(obj.key)
        named = set().union(*(found[r] for r in ("head", "entry", "segment", "unnamed")))
        for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=target.bucket, Prefix=f"{PREFIX}/states/"
        ):
            for item in page.get("Contents", []):
                if item["Key"] not in named:  # a folder of a State without a head
                    found["unnamed"].add(item["Key"])
    finally:
        store.close()
    return found


def sweep_and_check(soak: Soak) -> None:
    """What the kills left, swept: only what no head names goes, and every State still loads.

    Prints the objects by role before and after ``sweep(older_than=0)`` (nothing runs any
    more, so every object no head names is a leftover); any other outcome is a violation.
    """
    target = soak.target
    failures = soak.failures
    before = by_role(target, failures)
    store = separate_process(
        S3Store(target.bucket, PREFIX, endpoint_url=target.endpoint, client=target.client)
    )
    same = 0
    try:
        removed = set(tried(failures, store.sweep, 0))
        after = by_role(target, failures)
        expected = before["unnamed"] | before["probe"]
        if removed != expected:
            soak.violations.append(
                f"sweep removed {len(removed)} keys, {len(expected)} were named by no head or "
                f"probes: {sorted(removed ^ expected)[:5]}"
            )
        for role in ("unnamed", "probe", "other"):
            if after[role]:
                soak.violations.append(f"after the sweep, {role}: {sorted(after[role])[:5]}")
        for watch in soak.watches:
            try:
                record = tried(failures, store.read, watch.state_id)
            except Exception as e:
                soak.violations.append(f"{watch.state_id}: after the sweep, {describe(e)}")
                continue
            stored = {e["seq"]: canonical(e) for e in record.entries} if record else {}
            if stored == watch.seen:
                same += 1
            else:
                soak.violations.append(
                    f"{watch.state_id}: after the sweep, {len(stored)} entries stored, "
                    f"{len(watch.seen)} seen by the last check"
                )
    finally:
        store.close()
    counts = ", ".join(f"{role} {len(before[role])}" for role in ROLES if role != "other")
    print(
        f"s3   left by the soak: {counts}; sweep(older_than=0) removed {len(removed)}; "
        f"{same} of {len(soak.watches)} States load what the last check saw",
        flush=True,
    )


def describe(error: BaseException) -> str:
    """An error's type and the first line of its message."""
    text = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {text[:300]}"


def _empty_bucket(target: Target) -> None:
    """Remove the run's bucket and everything in it."""
    remove_bucket(target.client, target.bucket)
    target.client.close()


if __name__ == "__main__":
    sys.exit(main())
