"""S3 faults between S3Store and the server: nothing acknowledged is lost, only documented errors.

    python reliability/fault_proxy.py [--faults 2000] [--seconds 600] [--seed 1] [--rate 0.15]
                                      [--workers 4] [--read-timeout 1] [--endpoint URL]
                                      [--kind KIND ...] [--read SECONDS] [--list SECONDS]
                                      [--fake-ack RATE (test only)]

A loopback proxy (reliability/_proxy.py) sits in front of moto's ThreadedMotoServer (started
here) or ``--endpoint`` (LocalStack) and injects, per request, by a seeded random draw at
``--rate``: 500, 503 ``SlowDown``, a reset before forwarding, an answer lost after the write
applied, an answer held past the client's read timeout (``--read-timeout``, set on the
stores' botocore ``Config``), and outages in which every request fails for a while.

Workers (half sync, half async, each with a store of its own through the proxy) take fresh
States in turn: an Agent run (``FunctionModel`` calling tools, two at once then one, then a
reply), or a series of direct saves of messages and ``data``. After any error they go on
from the State in memory: the run again, or the next save. A State's saves pack its history
as they go (every 16 entry objects become a segment), so packing saves meet the faults too.
Every State is checked after each error and at its end, by a store that talks to the server
directly (not through the proxy) with a memory of its own (``testing.separate_process``: it
never takes a part's bytes from what the workers wrote), cold at the end:

* nothing acknowledged is lost: every entry a write that returned sent is stored, unchanged,
  and the stored snapshot is the last acknowledged one or one sent after it;
* nothing foreign is stored: the entries are seqs 0, 1, 2, ... each one this State sent;
* the State always loads;
* only documented errors were raised: plain ``S3StoreError`` (an S3 request failed after
  botocore's retries). ``ConcurrentWriteError`` or ``StateExistsError`` from a store's own
  lost answer, or any other error, is a violation;
* the State can be saved again from memory after an error, and at its end what is stored is
  exactly the State in memory. A State whose saves (or run) failed ``--attempts`` times in a
  row is tried up to ``OFF_TRIES`` (3) more times with faults off for its requests (header
  ``x-fault-proxy: pass``): if a save returns then, it is counted ("saved once faults
  stopped"), not a violation; if none does, the State is stuck, a violation. Under
  a high fault rate botocore's retry quota (standard mode: 500 units per client, 5 spent per
  retry, 10 per timeout, 1 earned back per request that succeeds at once) runs out, and
  botocore then stops retrying: every request fails on its first fault. The run prints how
  often that happened;
* no tool ran twice;
* the State is deleted through the proxy too: a delete either returns with nothing of the
  State left (its head, and everything in the folder of the incarnation its head named; what
  it reports kept, of other incarnations, may stay for ``sweep``), or raises a plain
  ``S3StoreError`` leaving a State that still loads whole or has no head; run again (the same
  tries, then with faults off) it finishes the same way. ``StateNotFoundError`` is allowed
  only from a delete run again (an earlier try removed everything and lost its answer).

With ``--read SECONDS``, two readers each read a State under way every ``SECONDS``, through
the proxy with faults, while its worker saves it (packing as it goes), runs it, checks it or
deletes it: in turn with a store of the worker's own process (a monitor thread: it shares
what the process knows of the State) and with one of another process. A read may raise only
a plain ``S3StoreError``; it must find the State if it existed throughout the read, and what
it finds must hold at any moment: seqs 0, 1, 2, ..., each entry and the snapshot ones this
State sent.

With ``--list SECONDS``, a lister calls ``list()`` (sync and async in turn) through the proxy
every ``SECONDS``. Besides the workers' States, a few States made at the start exist
throughout the run. A list either returns every State that existed throughout it, or raises
``IncompleteListError`` whose ``.states`` and ``.failed`` together hold each of them (a plain
``S3StoreError`` when the LIST itself failed); it never names an id that was never saved. A
list that silently leaves out such a State is a violation.

At the end every State was deleted: the run prints what is left in the bucket (what the
deletes reported kept, probes of engine checks whose delete failed, anything else: a
violation), sweeps it with ``sweep(older_than=0)`` directly, and the bucket must then be
empty.

It prints the faults injected by kind, the saves acknowledged, the errors by type, the
States checked, the reads, lists and deletes by outcome, and the violations, and exits 1 on a
violation. ``--faults`` is the target number of injected faults; ``--seconds`` bounds the run
either way.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import re
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import boto3
from _bucket import is_tombstone, remove_bucket, state_keys
from _proxy import EXTRA_KINDS, KINDS, LABELS, PASS_HEADER, FaultProxy, Plan
from botocore.config import Config

from alpineagents import Agent, ModelRequest, State
from alpineagents.testing import FunctionModel, call
from alpineagents_s3 import S3Store
from alpineagents_s3.errors import IncompleteListError, S3StoreError, StateNotFoundError
from alpineagents_s3.testing import embedded_moto, separate_process

PREFIX = "fault-proxy"
# Dummy credentials for moto and LocalStack; never a real account.
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
# A State's saves (or its run, or its delete) are tried again this many times under faults,
# waiting longer each time (``pause``: 0.2 s doubling up to 5 s, about 40 s in all: outages
# last up to 1.5 s, and a loaded machine answers slowly), then with faults off (``OFF_TRIES``):
# a State that does not save then is a violation.
ATTEMPTS = 12
# Tries with faults off. More than one: with no fault injected, a request can still fail once
# (moto answers 500 when a LIST meets a key deleted meanwhile; an overloaded machine answers
# after the read timeout), and once the retry quota is spent botocore does not retry it.
OFF_TRIES = 3
# The readers of ``--read``; the States of ``--list`` that exist throughout the run.
READERS = 2
FIXED_STATES = 5


def pause(attempt: int) -> None:
    """The wait before try ``attempt + 2``."""
    time.sleep(min(0.2 * 2**attempt, 5.0))


def documented(error: BaseException) -> bool:
    """Whether ``error`` is one docs/s3.md allows when S3 requests fail.

    Only a plain ``S3StoreError`` ("any other failure of an S3 request, after botocore's
    retries"). Its subclasses name a state of the bucket (a second writer, a taken or unknown
    id, a corrupt object, ...) that faults of the network alone never create.
    """
    return type(error) is S3StoreError


def describe(error: BaseException) -> str:
    """An error's type and the first line of its message."""
    text = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {text[:300]}"


def plain(value: Any) -> Any:
    """``value`` as JSON reads it back, so that what was sent and what is stored compare."""
    return json.loads(json.dumps(value))


# What each State sent, and what was acknowledged --------------------------------------------


@dataclass
class Sent:
    """Every write of one State, as the store was asked to make it."""

    entries: dict[int, list[Any]] = field(default_factory=dict)  # seq: the versions sent
    acked: dict[int, Any] = field(default_factory=dict)  # seq: the entry acknowledged
    snapshots: list[Any] = field(default_factory=list)  # the acked one and those sent since
    every_snapshot: list[Any] = field(default_factory=list)  # each one ever sent
    acked_snapshot: Any = None
    acked_at: float | None = None  # when a save of the State first returned: it exists
    saves: int = 0


class Recording(S3Store):
    """An S3Store that remembers what each write sent and which writes returned."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: dict[str, Sent] = {}
        self._lock = threading.Lock()

    def _before(
        self, state_id: str, entries: Sequence[dict[str, Any]], snapshot: dict[str, Any] | None
    ) -> None:
        with self._lock:
            sent = self.sent.setdefault(state_id, Sent())
            for entry in entries:
                versions = sent.entries.setdefault(entry["seq"], [])
                if plain(entry) not in versions:
                    versions.append(plain(entry))
            if snapshot is not None:
                sent.snapshots.append(plain(snapshot))
                sent.every_snapshot.append(plain(snapshot))

    def _after(
        self, state_id: str, entries: Sequence[dict[str, Any]], snapshot: dict[str, Any] | None
    ) -> None:
        with self._lock:
            sent = self.sent[state_id]
            sent.saves += 1
            if sent.acked_at is None:
                sent.acked_at = time.monotonic()
            for entry in entries:
                sent.acked[entry["seq"]] = plain(entry)
            if snapshot is not None:
                sent.acked_snapshot = plain(snapshot)
                sent.snapshots = [sent.acked_snapshot]

    def write(
        self,
        state_id: str,
        entries: Sequence[dict[str, Any]],
        snapshot: dict[str, Any] | None,
        *,
        create: bool = False,
    ) -> None:
        """``S3Store.write``, recorded."""
        self._before(state_id, entries, snapshot)
        super().write(state_id, entries, snapshot, create=create)
        self._after(state_id, entries, snapshot)

    async def awrite(
        self,
        state_id: str,
        entries: Sequence[dict[str, Any]],
        snapshot: dict[str, Any] | None,
        *,
        create: bool = False,
    ) -> None:
        """``S3Store.awrite``, recorded."""
        self._before(state_id, entries, snapshot)
        await super().awrite(state_id, entries, snapshot, create=create)
        self._after(state_id, entries, snapshot)


# The figures -----------------------------------------------------------------------------------


@dataclass
class Figures:
    """The run's figures, shared by the workers."""

    saves: Counter[str] = field(default_factory=Counter)  # by API
    errors: Counter[str] = field(default_factory=Counter)  # by type
    states: Counter[str] = field(default_factory=Counter)  # by scenario
    runs: int = 0
    once_faults_stopped: Counter[str] = field(default_factory=Counter)  # saves, runs, deletes
    reads: Counter[str] = field(default_factory=Counter)  # the readers' reads, by outcome
    lists: Counter[str] = field(default_factory=Counter)  # the lister's lists, by outcome
    deletes: Counter[str] = field(default_factory=Counter)  # the workers' deletes, by outcome
    packed: Counter[str] = field(default_factory=Counter)  # States with segments at their end
    kept: set[str] = field(default_factory=set)  # keys of other incarnations deletes left
    violations: list[str] = field(default_factory=list)  # each told once per State
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _add(self, text: str) -> None:
        if text not in self.violations:
            self.violations.append(text)

    def error(self, state_id: str, error: BaseException) -> None:
        """Count an error raised to the caller; a violation unless documented."""
        with self.lock:
            self.errors[type(error).__name__] += 1
            if not documented(error):
                self._add(f"{state_id}: an undocumented error: {describe(error)}")

    def violation(self, state_id: str, text: str) -> None:
        """Record a broken promise."""
        with self.lock:
            self._add(f"{state_id}: {text}")

    def count(self, counter: str, *outcomes: str) -> None:
        """Count outcomes in one of the counters (``reads``, ``lists``, ``deletes``, ...)."""
        with self.lock:
            for outcome in outcomes:
                getattr(self, counter)[outcome] += 1


class _Retries(logging.Handler):
    """Counts botocore's retries, and the retries its retry quota refused (standard mode)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.retried = 0
        self.refused = 0

    def emit(self, record: logging.LogRecord) -> None:
        message = record.msg if isinstance(record.msg, str) else ""
        if message.startswith("Retry needed, retrying"):
            self.retried += 1
        elif message.startswith("Retry needed but retry quota reached"):
            self.refused += 1


class _Warnings(logging.Handler):
    """Counts the store's warnings (parts packed away it could not delete, ...) by first words."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.counted: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        message = record.msg if isinstance(record.msg, str) else ""
        self.counted[message.split(":")[0].split("%")[0].strip()] += 1


class _Catch(logging.Handler):
    """Collects the errors of the Agent's "saving a tool result failed" warnings, by State."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.caught: dict[str, list[BaseException]] = {}
        self._lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.exc_info[1] is not None and record.args:
            state_id = str(record.args[0]) if isinstance(record.args, tuple) else "?"
            with self._lock:
                self.caught.setdefault(state_id, []).append(record.exc_info[1])

    def take(self, state_id: str) -> list[BaseException]:
        """The errors caught for one State since the last call."""
        with self._lock:
            return self.caught.pop(state_id, [])


# The checks ------------------------------------------------------------------------------------


class Checker:
    """Reads States from the server directly and compares them with what was sent.

    Its store has a memory of its own (another process, to the store): what it reads it reads
    from the bucket, never from the bytes the workers' stores keep of what they wrote. The
    checks after an error go through that store, warm (it read the State before); the check
    at a State's end reads it cold too, through a store made for it.
    """

    def __init__(self, endpoint: str, bucket: str) -> None:
        self.endpoint = endpoint
        self.bucket = bucket
        self.store = self.new_store()
        self.client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")

    def new_store(self) -> S3Store:
        """A store on the server, with a memory of its own."""
        store = S3Store(self.bucket, PREFIX, endpoint_url=self.endpoint, region_name="us-east-1")
        return separate_process(store)

    def check(self, state: State, sent: Sent | None, final: bool) -> list[str]:
        """The broken promises about one State; ``final``: it was just saved, all of it."""
        found = self._check(self.store, state, sent, final)
        if final and not found:
            cold = self.new_store()
            try:
                found = [f"read cold: {text}" for text in self._check(cold, state, sent, final)]
            finally:
                cold.close()
        return found

    def _check(self, store: S3Store, state: State, sent: Sent | None, final: bool) -> list[str]:
        found: list[str] = []
        try:
            record = store.read(state.id)
        except Exception as e:
            return [f"the direct read failed: {describe(e)}"]
        if sent is None:
            return [] if record is None else ["stored, though nothing was sent"]
        if record is None:
            if sent.acked_snapshot is None:
                return []  # never acknowledged, never stored: nothing to check
            return ["an acknowledged State is not stored"]
        stored = {entry["seq"]: plain(entry) for entry in record.entries}
        seqs = [entry["seq"] for entry in record.entries]
        if seqs != list(range(len(seqs))):
            found.append(f"the stored seqs are {seqs}")
        for seq, entry in sorted(sent.acked.items()):
            if seq not in stored:
                found.append(f"acknowledged entry {seq} ({entry.get('kind')}) is not stored")
            elif stored[seq] != entry:
                found.append(f"acknowledged entry {seq} is stored changed: {stored[seq]}")
        for seq, entry in sorted(stored.items()):
            if entry not in sent.entries.get(seq, []):
                found.append(f"stored entry {seq} was never sent: {entry}")
        snapshot = plain(record.snapshot)
        if snapshot not in sent.snapshots:
            found.append(
                "the stored snapshot is neither the acknowledged one nor one sent since "
                f"(stored: {snapshot}; acknowledged: {sent.acked_snapshot})"
            )
        try:
            loaded = store.load(state.id)
        except Exception as e:
            found.append(f"the State does not load: {describe(e)}")
            return found
        if final:
            if len(record.entries) != len(state.history):
                found.append(
                    f"{len(record.entries)} entries stored, {len(state.history)} in memory"
                )
            if snapshot != sent.acked_snapshot:
                found.append("the stored snapshot is not the last one acknowledged")
            memory = [(e.seq, e.kind, e.text) for e in state.history]
            if [(e.seq, e.kind, e.text) for e in loaded.history] != memory:
                found.append("the loaded history is not the one in memory")
            if plain(loaded.data) != plain(state.data):
                found.append(f"loaded data {loaded.data} != in memory {state.data}")
        return found

    def parts(self, state_id: str) -> tuple[set[str], int]:
        """The folders of the incarnation the State's head names, and its segments."""
        named = [obj for obj in self.store.objects(state_id) if obj.role in ("entry", "segment")]
        folders = {obj.key.rsplit("/", 1)[0] + "/" for obj in named}
        return folders, sum(obj.role == "segment" for obj in named)

    def keys(self, state_id: str) -> list[str]:
        """The State's head (unless a tombstone) and its folder's objects, without the store."""
        return state_keys(self.client, self.bucket, PREFIX, state_id)

    def close(self) -> None:
        """Close the direct store and client."""
        self.store.close()
        self.client.close()


# The workers -----------------------------------------------------------------------------------


@dataclass
class Run:
    """What every worker, reader and lister shares."""

    endpoint: str  # the proxy's
    bucket: str
    checker_endpoint: str  # the server's
    read_timeout: float
    attempts: int  # tries from memory under faults, before the one with faults off
    max_attempts: int | None  # botocore's, if not the store's default
    figures: Figures
    catch: _Catch
    stop: threading.Event
    # The States under way, for the readers: id -> the store of the worker saving it.
    active: dict[str, Recording] = field(default_factory=dict)
    # Every State a worker began, and when its delete began (a State exists from its first
    # acknowledged save to the start of its delete); the States that exist all along.
    known: dict[str, Recording] = field(default_factory=dict)
    deleting: dict[str, float] = field(default_factory=dict)
    fixed: set[str] = field(default_factory=set)
    active_lock: threading.Lock = field(default_factory=threading.Lock)

    def begin(self, state_id: str, store: Recording) -> None:
        """A worker starts on ``state_id`` (its saves go through ``store``)."""
        with self.active_lock:
            self.active[state_id] = store
            self.known[state_id] = store

    def deletes(self, state_id: str) -> None:
        """A worker is about to delete ``state_id``."""
        with self.active_lock:
            self.deleting[state_id] = time.monotonic()

    def end(self, state_id: str) -> None:
        """A worker is done with ``state_id``, deleted."""
        with self.active_lock:
            self.active.pop(state_id, None)

    def existed(self, since: float) -> set[str]:
        """The States that existed from ``since`` until now (the fixed ones among them)."""
        with self.active_lock:
            found = set(self.fixed)
            for state_id, store in self.known.items():
                sent = store.sent.get(state_id)
                acked = sent.acked_at if sent is not None else None
                if acked is not None and acked < since and state_id not in self.deleting:
                    found.add(state_id)
            return found

    def store(self, passing: threading.Event) -> Recording:
        """A store of its own through the proxy, with the run's read timeout.

        While ``passing`` is set, its requests ask the proxy for no fault.
        """

        def mark(request: Any, **kwargs: Any) -> None:
            if passing.is_set():
                request.headers[PASS_HEADER] = "pass"

        config = Config(read_timeout=self.read_timeout, connect_timeout=self.read_timeout)
        if self.max_attempts is not None:
            config = config.merge(
                Config(retries={"mode": "standard", "total_max_attempts": self.max_attempts})
            )
        return Recording(
            self.bucket,
            PREFIX,
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            config=config,
            event_hooks={"before-send.s3": mark},
        )


class Worker:
    """Takes fresh States in turn, sync or async, until the run stops."""

    def __init__(self, run: Run, number: int, mode: str) -> None:
        self.run = run
        self.number = number
        self.mode = mode
        self.passing = threading.Event()  # set: this worker's requests meet no fault
        self.store = run.store(self.passing)
        self.checker = Checker(run.checker_endpoint, run.bucket)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.executions: Counter[tuple[str, int]] = Counter()

    # The two APIs, one interface.

    def call(self, sync: Any, coroutine: Any, *args: Any) -> Any:
        """``sync(*args)``, or ``coroutine(*args)`` on this worker's loop."""
        return on(self.loop, sync, coroutine, *args)

    def save(self, state: State) -> bool:
        """Save through the proxy."""
        wrote: bool = self.call(self.store.save, self.store.asave, state)
        if wrote:
            with self.run.figures.lock:
                self.run.figures.saves[self.mode] += 1
        return wrote

    def main(self) -> None:
        """Work until the run stops (a thread's target)."""
        if self.mode == "async":
            self.loop = asyncio.new_event_loop()
        n = 0
        try:
            while not self.run.stop.is_set():
                kind = "agent run" if (n + self.number) % 2 == 0 else "direct saves"
                state_id = f"w{self.number}-{n}-{uuid.uuid4().hex[:6]}"
                self.run.begin(state_id, self.store)
                try:
                    if kind == "agent run":
                        self.agent_run(state_id)
                    else:
                        self.direct_saves(state_id, n)
                except Exception as e:  # a step outside the checks failed: a violation too
                    self.run.figures.violation(state_id, f"the worker raised {describe(e)}")
                self.run.end(state_id)
                with self.run.figures.lock:
                    self.run.figures.states[kind] += 1
                n += 1
        finally:
            if self.loop is not None:
                self.loop.run_until_complete(self.store.aclose())
                self.loop.close()
            self.store.close()
            self.checker.close()

    def check(self, state: State, final: bool) -> None:
        """Compare what the server has with what was sent; record any violation."""
        sent = self.store.sent.get(state.id)
        for text in self.checker.check(state, sent, final):
            self.run.figures.violation(state.id, text)

    def failed(self, state: State, error: BaseException) -> None:
        """Count an error, then check the State as stored."""
        self.run.figures.error(state.id, error)
        for caught in self.run.catch.take(state.id):
            self.run.figures.error(state.id, caught)
        self.check(state, final=False)

    def save_until_done(self, state: State) -> bool:
        """Save from memory until a save returns; whether one did.

        After ``--attempts`` failed tries, up to ``OFF_TRIES`` more with faults off: the State
        must save once S3 answers again.
        """
        last: Exception | None = None
        attempts = self.run.attempts
        for attempt in range(attempts + OFF_TRIES):
            if attempt >= attempts:
                self.passing.set()
            try:
                self.save(state)
            except Exception as e:
                self.failed(state, e)
                last = e
                pause(attempt)
                continue
            finally:
                self.passing.clear()
            if attempt >= attempts:
                self.run.figures.count("once_faults_stopped", "save")
            return True
        why = describe(last) if last else None
        self.run.figures.violation(
            state.id,
            f"no save from memory returned in {attempts} tries, nor in {OFF_TRIES} with "
            f"faults off (last: {why})",
        )
        return False

    def finish(self, state: State) -> None:
        """Save what is left, check that exactly the State in memory is stored, delete it."""
        if self.save_until_done(state):
            self.check(state, final=True)
        self.delete_until_done(state)
        self.run.end(state.id)
        # Only now: a reader's read of the State, until it is deleted, checks what was sent.
        self.store.sent.pop(state.id, None)

    def delete_until_done(self, state: State) -> None:
        """Delete the State through the proxy until a delete finishes; check what is left.

        A delete that returned must leave nothing of the State but what it reports kept, and
        nothing at all of the incarnation its head named. One that raised must leave a State
        that loads whole or has no head; it is run again (with faults off after
        ``--attempts`` tries). ``StateNotFoundError`` from a delete run again means an earlier
        try removed everything and its answer was lost: then nothing of that incarnation may
        be left either.
        """
        figures = self.run.figures
        try:
            live, segments = self.checker.parts(state.id)
            exists = bool(live)
        except Exception as e:
            figures.violation(state.id, f"objects() before the delete raised {describe(e)}")
            return
        if segments:
            figures.count("packed", *["States", *["segments"] * segments])
        self.run.deletes(state.id)
        attempts = self.run.attempts
        last: Exception | None = None
        for attempt in range(attempts + OFF_TRIES):
            if attempt >= attempts:
                self.passing.set()
            try:
                deleted = self.call(self.store.delete, self.store.adelete, state.id)
            except StateNotFoundError as e:
                if attempt == 0 and exists:
                    figures.violation(state.id, f"the delete of a stored State: {describe(e)}")
                outcome = "StateNotFoundError when run again" if attempt else "no State"
                self.deleted(state, live, None, outcome, attempt)
                return
            except Exception as e:
                figures.error(state.id, e)
                last = e
                self.after_failed_delete(state, live)
                pause(attempt)
                continue
            finally:
                self.passing.clear()
            outcome = "returned at once" if attempt == 0 else "returned when run again"
            self.deleted(state, live, deleted, outcome, attempt)
            return
        why = describe(last) if last else None
        figures.violation(
            state.id,
            f"no delete finished in {attempts} tries, nor in {OFF_TRIES} with faults off "
            f"(last: {why})",
        )

    def after_failed_delete(self, state: State, live: set[str]) -> None:
        """A delete raised: the State still loads whole, or its head is gone."""
        try:
            keys = self.checker.keys(state.id)
        except Exception as e:
            self.run.figures.violation(state.id, f"the listing after a delete: {describe(e)}")
            return
        if f"{PREFIX}/heads/{state.id}.json" in keys:
            self.check(state, final=True)

    def deleted(
        self, state: State, live: set[str], deleted: Any, outcome: str, attempt: int
    ) -> None:
        """A delete finished (``deleted``: its report, or ``None``); nothing may be left."""
        figures = self.run.figures
        figures.count("deletes", outcome)
        if attempt >= self.run.attempts:
            figures.count("once_faults_stopped", "delete")
        try:
            left = set(self.checker.keys(state.id))
        except Exception as e:
            figures.violation(state.id, f"the listing after a delete: {describe(e)}")
            return
        kept = set(deleted.kept) if deleted is not None else set()
        named = {key for key in left if any(key.startswith(folder) for folder in live)}
        head = f"{PREFIX}/heads/{state.id}.json"
        if head in left or named:
            figures.violation(
                state.id,
                f"a delete left {len(named) + (head in left)} objects of the State ({outcome}): "
                f"{sorted(named | ({head} & left))[:3]}",
            )
        elif deleted is not None and left - kept:
            figures.violation(
                state.id,
                f"a delete left {len(left - kept)} objects it did not report kept ({outcome}): "
                f"{sorted(left - kept)[:3]}",
            )
        with figures.lock:
            figures.kept |= left - named - {head}

    # The scenarios.

    def agent_run(self, state_id: str) -> None:
        """An Agent runs a State: two tools at once, then one, then a reply."""
        state = State(f"work through three steps ({state_id})", id=state_id)
        made = 0

        def work(k: int) -> str:
            """Do piece of work number k."""
            self.executions[(state_id, k)] += 1
            return f"piece {k} done"

        def respond(request: ModelRequest) -> str | list[dict[str, Any]]:
            nonlocal made
            turns = sum(1 for m in request.messages if m["role"] == "assistant")
            if turns >= 2:
                return "all three steps done"
            calls = 2 if turns == 0 else 1
            made += calls
            return [call("work", k=made - calls + i) for i in range(calls)]

        agent = Agent(FunctionModel(respond), tools=[work], store=self.store)
        reply = None
        last: Exception | None = None
        attempts = self.run.attempts
        for attempt in range(attempts + OFF_TRIES):
            if attempt >= attempts:  # the last tries, with faults off: the run must go on
                self.passing.set()
            try:
                reply = self.call(agent.run, agent.arun, state)
            except Exception as e:
                self.failed(state, e)
                last = e
                pause(attempt)
                continue
            finally:
                self.passing.clear()
            if attempt >= attempts:
                self.run.figures.count("once_faults_stopped", "run")
            break
        for error in self.run.catch.take(state_id):
            self.run.figures.error(state_id, error)
        with self.run.figures.lock:
            self.run.figures.runs += 1
        if reply != "all three steps done":
            why = describe(last) if last else None
            self.run.figures.violation(
                state_id, f"the run never ended: {reply!r} (last error: {why})"
            )
        for (sid, k), times in self.executions.items():
            if sid == state_id and times > 1:
                self.run.figures.violation(state_id, f"tool call {k} ran {times} times")
        self.executions = Counter({k: v for k, v in self.executions.items() if k[0] != state_id})
        self.finish(state)

    def direct_saves(self, state_id: str, n: int) -> None:
        """Many saves of one State: messages, ``data``, or both, each save after the last.

        18 or 19 messages in all, and the task: a save packs (16 entry objects make a segment).
        """
        state = State(f"keep saving ({state_id})", id=state_id, data={"step": 0})
        for step in range(1, 9):
            kind = (n + step) % 3
            if kind != 1:
                for i in range(2 + step % 4):
                    state.add_user_message(f"message {step}.{i} of {state_id}")
            if kind != 0:
                state.data = {"step": step, "note": f"café {step}", "list": list(range(step))}
            try:
                self.save(state)
            except Exception as e:
                self.failed(state, e)  # the next save goes on from memory
        self.finish(state)


class Reader:
    """Reads States under way every ``pause`` seconds, through the proxy, until the run stops.

    ``READERS`` of them run. Each turn, one State under way (mostly one created already), read
    sync or async, through a store of this process (it shares what the process knows of the
    State with the worker's store: a monitor thread) or of another process, in turn. Their
    requests meet faults all along (they never ask the proxy for none). A read racing the
    worker's saves cannot be compared with what was acknowledged; it is checked for what
    holds at any moment, and must find a State that existed throughout it.
    """

    def __init__(self, run: Run, pause: float, seed: int, number: int) -> None:
        self.run = run
        self.pause = pause
        self.number = number
        self.random = random.Random(seed)
        never = threading.Event()
        self.stores = {"same process": run.store(never), "other process": run.store(never)}
        separate_process(self.stores["other process"])
        self.loop = asyncio.new_event_loop()

    def main(self) -> None:
        """Read until the run stops (a thread's target)."""
        n = 0
        try:
            while not self.run.stop.wait(self.pause):
                with self.run.active_lock:
                    under_way = sorted(self.run.active.items())
                # Mostly States already created; now and then one whose create may be under way.
                created = [(i, w) for i, w in under_way if _created(w.sent.get(i))]
                if created and self.random.random() < 0.9:
                    under_way = created
                if under_way:
                    state_id, writer = self.random.choice(under_way)
                    which = ("same process", "other process")[(n // 2) % 2]
                    self.read(state_id, writer, which, use_async=(n + self.number) % 2 == 1)
                    n += 1
        finally:
            for store in self.stores.values():
                self.loop.run_until_complete(store.aclose())
                store.close()
            self.loop.close()

    def read(self, state_id: str, writer: Recording, which: str, use_async: bool) -> None:
        """One read of ``state_id``; its outcome counted, or a violation recorded."""
        sent = writer.sent.get(state_id)  # before the read (the worker drops it once done)
        store = self.stores[which]
        figures = self.run.figures
        began = time.monotonic()
        try:
            record = on(self.loop if use_async else None, store.read, store.aread, state_id)
        except Exception as e:
            if not documented(e):
                figures.violation(state_id, f"a read ({which}) raised {describe(e)}")
            figures.count("reads", which, type(e).__name__)
            return
        if record is None:
            if state_id in self.run.existed(began):
                figures.violation(state_id, f"a read ({which}) found no State, though it existed")
            why = "deleted meanwhile" if _created(sent) else "not created yet"
            figures.count("reads", which, f"none ({why})")
            return
        figures.count("reads", which, "found")
        # A State created while the read ran: the worker records a write before sending it, so
        # what it sent is known by the end of the read.
        sent = sent or writer.sent.get(state_id)
        self.check_read(state_id, record, sent)

    def check_read(self, state_id: str, record: Any, sent: Sent | None) -> None:
        """What holds of a read at any moment: seqs 0, 1, 2, ..., all of it sent by the State."""
        seqs = [entry["seq"] for entry in record.entries]
        if seqs != list(range(len(seqs))):
            self.run.figures.violation(state_id, f"a reader read the seqs {seqs}")
        for entry in record.entries:
            if sent is None or plain(entry) not in sent.entries.get(entry["seq"], []):
                self.run.figures.violation(
                    state_id, f"a reader read entry {entry['seq']}, which was never sent"
                )
        if sent is None or plain(record.snapshot) not in sent.every_snapshot:
            self.run.figures.violation(state_id, "a reader read a snapshot that was never sent")


class Lister:
    """Lists the States every ``pause`` seconds through the proxy (sync and async in turn).

    A list returns every State that existed throughout it, or raises ``IncompleteListError``
    naming those it could not read; it names no id that was never saved.
    """

    def __init__(self, run: Run, pause: float) -> None:
        self.run = run
        self.pause = pause
        self.store = run.store(threading.Event())
        self.loop = asyncio.new_event_loop()
        self.throughout = 0  # States that existed throughout a list, summed over the lists

    def main(self) -> None:
        """List until the run stops (a thread's target)."""
        n = 0
        try:
            while not self.run.stop.wait(self.pause):
                self.list(use_async=n % 2 == 1)
                n += 1
        finally:
            self.loop.run_until_complete(self.store.aclose())
            self.loop.close()
            self.store.close()

    def list(self, use_async: bool) -> None:
        """One list; its outcome counted, or a violation recorded."""
        figures = self.run.figures
        began = time.monotonic()
        failed: dict[str, Any] = {}
        try:
            found = on(self.loop if use_async else None, self.store.list, self.store.alist)
            outcome = "complete"
        except IncompleteListError as e:
            found, failed, outcome = e.states, e.failed, "IncompleteListError"
            figures.count("lists", *(["id not read"] * len(failed)))
            if not failed or not all(isinstance(v, S3StoreError) for v in failed.values()):
                figures.violation("list", f"an IncompleteListError that names nothing: {e}")
        except Exception as e:
            if not documented(e):
                figures.violation("list", f"a list raised {describe(e)}")
            figures.count("lists", type(e).__name__)
            return
        existed = self.run.existed(began)
        figures.count("lists", outcome, *(["State that existed throughout"] * len(existed)))
        ids = [summary.id for summary in found]
        if len(ids) != len(set(ids)):
            figures.violation("list", f"a list named a State twice: {sorted(ids)}")
        with self.run.active_lock:
            known = set(self.run.known) | self.run.fixed
        for state_id in (set(ids) | set(failed)) - known:
            figures.violation(state_id, "a list named a State that was never saved")
        missing = existed - set(ids) - set(failed)
        if missing:
            figures.violation(
                "list",
                f"a list left out {len(missing)} States that existed throughout it without "
                f"naming them ({outcome}): {sorted(missing)[:3]}",
            )


def _created(sent: Sent | None) -> bool:
    """Whether a save of the State that ``sent`` records was acknowledged: it exists."""
    return sent is not None and sent.acked_snapshot is not None


def on(
    loop: asyncio.AbstractEventLoop | None, sync: Any, coroutine: Any, *args: Any, **kw: Any
) -> Any:
    """``sync(*args, **kw)``, or ``coroutine(*args, **kw)`` run on ``loop``."""
    if loop is None:
        return sync(*args, **kw)
    return loop.run_until_complete(coroutine(*args, **kw))


# The run ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def server(url: str | None) -> Iterator[str]:
    """``url``, or moto's server started in this process."""
    if url is not None:
        yield url
        return
    with embedded_moto() as started:
        yield started


def by_kind(counted: Counter[str]) -> str:
    """``counted`` as ``"kind n, kind n"``, by kind."""
    return ", ".join(f"{kind} {n}" for kind, n in sorted(counted.items()))


def leftovers(client: Any, bucket: str, kept: set[str]) -> Counter[str]:
    """The objects left in the bucket, by kind: every State was deleted at its end."""
    left: Counter[str] = Counter()
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for item in page.get("Contents", []):
            key = item["Key"]
            if key in kept:
                left["kept by a delete"] += 1
            elif key.startswith(f"{PREFIX}/probes/"):
                left["probes"] += 1
            elif key.startswith(f"{PREFIX}/heads/") and is_tombstone(client, bucket, key):
                left["tombstone heads"] += 1
            else:
                left["else"] += 1
    return left


def kind_of(violation: str) -> str:
    """A violation without its State, numbers and details: what kind of promise broke."""
    text = violation.split(": ", 1)[1]
    if text.startswith("an undocumented error: "):
        return "an undocumented error: " + text.split(": ")[1]
    return re.sub(r"\d+", "N", text.split(" (")[0].split(": ")[0])


@dataclass
class End:
    """What the bucket held at the end, and what the sweep made of it."""

    left: Counter[str]
    swept: int
    after: int
    tombstones: int  # a deleted id's tombstone head stays (docs/protocol.md, invariant 12)


def report(
    proxy: FaultProxy,
    figures: Figures,
    retries: _Retries,
    warnings: _Warnings,
    attempts: int,
    end: End,
    seconds: float,
) -> None:
    """Print the figures."""
    with proxy.tally.lock:
        faults = Counter(proxy.tally.faults)
        requests = proxy.tally.requests
        outages = proxy.tally.outages
    with figures.lock:
        total = sum(faults.values())
        print(f"requests through the proxy: {requests}")
        print(f"faults injected: {total}")
        for kind in (*KINDS, *EXTRA_KINDS, "fake-ack"):
            if faults[kind] or kind in KINDS:
                extra = f" (in {outages} outages)" if kind == "outage" else ""
                print(f"  {LABELS[kind]:<32} {faults[kind]:>6}{extra}")
        saves = ", ".join(f"{api} {n}" for api, n in sorted(figures.saves.items()))
        print(f"saves acknowledged: {sum(figures.saves.values())} ({saves})")
        errors = ", ".join(f"{name} {n}" for name, n in figures.errors.most_common()) or "none"
        print(f"errors raised: {sum(figures.errors.values())} ({errors})")
        states = ", ".join(f"{kind} {n}" for kind, n in sorted(figures.states.items()))
        print(
            f"States checked: {sum(figures.states.values())} ({states}); agent runs {figures.runs}"
        )
        print(
            f"packed: {figures.packed['States']} States were named by segments at their end "
            f"({figures.packed['segments']} segments)"
        )
        print(f"botocore retries: {retries.retried}; refused by its retry quota: {retries.refused}")
        counted = ", ".join(f"{text} {n}" for text, n in warnings.counted.most_common())
        print(f"store warnings: {sum(warnings.counted.values())} ({counted or 'none'})")
        stopped = figures.once_faults_stopped
        print(
            f"after {attempts} failed tries, done once faults stopped: saves "
            f"{stopped['save']}, runs {stopped['run']}, deletes {stopped['delete']}"
        )
        deletes = figures.deletes
        print(
            f"deletes: {sum(deletes.values())} ({by_kind(deletes) or 'none'}); objects of "
            f"other incarnations they kept, for sweep: {len(figures.kept)}"
        )
        if figures.reads:
            reads = figures.reads
            places = ("same process", "other process")
            outcomes = Counter({k: n for k, n in reads.items() if k not in places})
            print(
                f"reads: {sum(reads[p] for p in places)} (same process {reads['same process']}, "
                f"other process {reads['other process']}): {by_kind(outcomes)}"
            )
        if figures.lists:
            lists = figures.lists
            ran = sum(
                n
                for k, n in lists.items()
                if k not in ("id not read", "State that existed throughout")
            )
            print(
                f"lists: {ran} (complete {lists['complete']}, IncompleteListError "
                f"{lists['IncompleteListError']} naming {lists['id not read']} ids, "
                f"S3StoreError {lists['S3StoreError']}); States that existed throughout a list: "
                f"{lists['State that existed throughout']}, each listed or named"
            )
        print(
            f"objects left after every State was deleted: {sum(end.left.values())} "
            f"({by_kind(end.left) or 'none'}); sweep(older_than=0) removed {end.swept}; "
            f"left after it: {end.after}; tombstone heads kept: {end.tombstones}"
        )
        print(f"violations: {len(figures.violations)}")
        kinds = Counter(kind_of(v) for v in figures.violations)
        for kind, n in kinds.most_common():
            print(f"  {n:>5}  {kind}")
        for violation in figures.violations[:20]:
            print(f"  {violation}")
        if len(figures.violations) > 20:
            print(f"  ... and {len(figures.violations) - 20} more")
        print(f"time: {seconds:.1f}s")


def seconds_option(parser: argparse.ArgumentParser, name: str, value: float) -> None:
    """Refuse a pause that is no number of seconds (NaN, negative)."""
    if not value >= 0:  # NaN too
        parser.error(f"{name} is a number of seconds, 0 for none, not {value}")


def make_fixed(checker: Checker, run: Run) -> None:
    """The States that exist throughout the run, for the lister: made directly."""
    for i in range(FIXED_STATES):
        state = State(f"exists throughout the run ({i})", id=f"fixed-{i}-{uuid.uuid4().hex[:6]}")
        checker.store.save(state)
        run.fixed.add(state.id)


def sweep_the_end(checker: Checker, client: Any, bucket: str, figures: Figures) -> End:
    """What is left once every State was deleted; swept; the bucket must then be empty."""
    left = leftovers(client, bucket, figures.kept)
    tombstones = left.pop("tombstone heads", 0)
    if left["else"]:
        figures.violation(bucket, f"objects left after every State was deleted: {by_kind(left)}")
    time.sleep(1.1)  # LastModified counts whole seconds: everything is older than now
    swept = len(checker.store.sweep(older_than=0))
    after = sum(
        not (o["Key"].startswith(f"{PREFIX}/heads/") and is_tombstone(client, bucket, o["Key"]))
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
        for o in page.get("Contents", [])
    )
    if after:
        figures.violation(bucket, f"{after} objects left after sweep(older_than=0)")
    return End(left, swept, after, tombstones)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the workers through the proxy and print the figures; 1 on a violation."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoint", help="an S3 endpoint (default: moto, started here)")
    parser.add_argument("--faults", type=int, default=2000, help="the faults to inject")
    parser.add_argument("--seconds", type=float, default=600.0, help="time bound of the run")
    parser.add_argument("--seed", type=int, default=1, help="seeds the proxy's draws")
    parser.add_argument("--rate", type=float, default=0.15, help="the chance of a fault")
    parser.add_argument("--workers", type=int, default=4, help="half sync, half async")
    parser.add_argument(
        "--read-timeout", type=float, default=1.0, help="the stores' botocore read timeout"
    )
    parser.add_argument(
        "--attempts",
        type=int,
        default=ATTEMPTS,
        help="tries from memory under faults before one with faults off",
    )
    parser.add_argument(
        "--max-attempts", type=int, help="botocore's attempts per request (default: the store's)"
    )
    parser.add_argument(
        "--kind",
        action="append",
        choices=KINDS + EXTRA_KINDS,
        help="only these faults (repeatable; cut only when named)",
    )
    parser.add_argument(
        "--read",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="each of two readers reads a State under way every SECONDS (default: no reader)",
    )
    parser.add_argument(
        "--list",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="list the States every SECONDS (default: no lister)",
    )
    # Test only: the runner must see these, and fail.
    parser.add_argument("--fake-ack", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    seconds_option(parser, "--read", args.read)
    seconds_option(parser, "--list", args.list)
    for key, value in CREDENTIALS.items():
        os.environ.setdefault(key, value)
    # A tool result saved alone that fails is logged by the Agent; the runner counts it.
    agent_log = logging.getLogger("alpineagents.agent")
    agent_log.propagate = False
    catch = _Catch()
    agent_log.addHandler(catch)
    store_log = logging.getLogger("alpineagents_s3")  # counted, not printed
    store_log.propagate = False
    warnings = _Warnings()
    store_log.addHandler(warnings)
    retries = _Retries()
    retry_log = logging.getLogger("botocore.retries.standard")  # aiobotocore logs there too
    retry_log.setLevel(logging.DEBUG)
    retry_log.propagate = False
    retry_log.addHandler(retries)

    started = time.monotonic()
    with server(args.endpoint) as url:
        plan = Plan(
            rate=args.rate,
            late_seconds=args.read_timeout + 0.5,
            kinds=tuple(args.kind or KINDS),
            fake_ack=args.fake_ack,
        )
        proxy = FaultProxy(url, plan, args.seed)
        proxy.start()
        bucket = f"fault-proxy-{uuid.uuid4().hex[:12]}"
        client = boto3.client("s3", endpoint_url=url, region_name="us-east-1")
        client.create_bucket(Bucket=bucket)
        print(
            f"fault proxy at {proxy.url} in front of {'moto' if not args.endpoint else url} "
            f"at {url}, bucket {bucket}; seed {args.seed}, rate {args.rate:g}, read timeout "
            f"{args.read_timeout:g}s, {args.workers} workers"
            + (f", {READERS} readers every {args.read:g}s" if args.read else "")
            + (f", a list every {args.list:g}s" if args.list else "")
            + f"; target {args.faults} faults, bound {args.seconds:g}s",
            flush=True,
        )
        figures = Figures()
        stop = threading.Event()
        run = Run(
            proxy.url,
            bucket,
            url,
            args.read_timeout,
            args.attempts,
            args.max_attempts,
            figures,
            catch,
            stop,
        )
        checker = Checker(url, bucket)
        if args.list:
            make_fixed(checker, run)
        workers = [Worker(run, i, "sync" if i % 2 == 0 else "async") for i in range(args.workers)]
        threads = [threading.Thread(target=w.main, name=f"worker {w.number}") for w in workers]
        if args.read > 0:
            for i in range(READERS):
                reader = Reader(run, args.read, args.seed * 100 + i, i)
                threads.append(threading.Thread(target=reader.main, name=f"reader {i}"))
        if args.list > 0:
            threads.append(threading.Thread(target=Lister(run, args.list).main, name="lister"))
        for thread in threads:
            thread.start()
        deadline = started + args.seconds
        next_line = time.monotonic() + 60
        try:
            while time.monotonic() < deadline and proxy.tally.total() < args.faults:
                if not any(thread.is_alive() for thread in threads):
                    break
                time.sleep(0.2)
                if time.monotonic() >= next_line:  # a line a minute in a long run
                    next_line += 60
                    with figures.lock:
                        saves, states = sum(figures.saves.values()), sum(figures.states.values())
                        violations = len(figures.violations)
                        stopped = sum(figures.once_faults_stopped.values())
                    print(
                        f"[{time.monotonic() - started:.0f}s] faults {proxy.tally.total()}, "
                        f"saves {saves}, States {states}, violations {violations}; retries "
                        f"{retries.retried}, refused by the retry quota {retries.refused}; "
                        f"done once faults stopped {stopped}",
                        flush=True,
                    )
        finally:
            stop.set()
            # The States under way are finished (saved whole, checked, deleted) without new
            # faults: each has already been saved again from memory after each of its errors.
            plan.paused = True
            for thread in threads:
                thread.join()
            proxy.stop()
            for state_id in sorted(run.fixed):
                checker.store.delete(state_id)
            end = sweep_the_end(checker, client, bucket, figures)
            checker.close()
            report(
                proxy, figures, retries, warnings, args.attempts, end, time.monotonic() - started
            )
            if not end.after:
                remove_bucket(client, bucket)  # what is left are tombstone heads
            client.close()
    return 1 if figures.violations else 0


if __name__ == "__main__":
    sys.exit(main())
