"""Two writers on one S3 State: who wins, what the loser gets, and what is left in the bucket.

    python reliability/two_writers.py [--trials 20] [--seconds 300] [--endpoint URL]
                                      [--mode sync|async|both] [--locking yes|no|auto]
                                      [--scenario NAME ...] [--no-watch]

Each scenario sets up a fresh State through the public API, gives it to two writers, plays
its script, then checks what docs/protocol.md promises ("What each request may see"). Every
S3Store object of one process shares what the process knows of each State (the head its next
save is conditional on), so a writer here is a store made a process of its own with
``alpineagents_s3.testing.separate_process``: two of them are two processes to the store, and
S3 cannot tell them from two either.

* race: both writers loaded the State; each adds messages and both save at once (two threads
  released by a barrier). One head PUT lands, the other save raises ``ConcurrentWriteError``.
  A third process loads the State all along (unless ``--no-watch``): no load fails or reads an
  entry of the loser's save.
* stale-copy: A saves a message; B, holding a copy from before, saves messages:
  ``ConcurrentWriteError``. B is another process (its head PUT's ``If-Match`` is stale), or on
  odd trials a second copy in A's own process: that one is refused by its entries (the head
  has other entries at the seqs it sends again, invariant 6), not by the ETag.
* data-only: A saves a change of ``data`` alone; B, another process holding a copy from
  before, saves a message, a message and ``data``, or ``data`` alone: ``ConcurrentWriteError``.
* delete: an Agent runs the State; its tool deletes the State through another process. Every
  save after the delete raises ``StateNotFoundError``: each tool result saved alone, the run,
  a later save; nothing is left in the bucket and the State is not listed.
* create-race: two processes create a State with the same id at once: one save returns, the
  other raises ``StateExistsError`` and removes what it wrote.

After each trial (both writers done): a reader with a store of its own loads the State and
finds exactly the winner's history and data, seqs 0, 1, 2, … with no gap; the loser's save,
sent again, is refused again; the winner saves again; the loser loads and continues; a delete
leaves no object under the State's prefix. Any departure is a violation, printed with the
trial's id; the exit status is 1 if there was any.

moto checks ``If-None-Match``/``If-Match`` without a lock, so two writers racing there can both
win (localstack/README.md). On a server without that lock, the race and create-race scenarios
are run and their figures printed, but not judged. Without ``--endpoint``, moto's
``ThreadedMotoServer`` is started on 127.0.0.1 in this process; an endpoint that answers
LocalStack's health check is taken to lock (``--locking`` overrides).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import boto3
from _bucket import is_tombstone, remove_bucket, state_keys

from alpineagents import (
    Agent,
    ConcurrentWriteError,
    ModelRequest,
    State,
    StateExistsError,
    StateNotFoundError,
)
from alpineagents.testing import FunctionModel, call
from alpineagents_s3 import S3Store
from alpineagents_s3.testing import embedded_moto, separate_process

if TYPE_CHECKING:
    from types_boto3_s3 import S3Client

Mode = Literal["sync", "async"]
T = TypeVar("T")
PREFIX = "two-writers"
TASK = "keep one history"

# Dummy credentials for moto and LocalStack; never a real account.
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


class Violation(Exception):
    """A promise that did not hold in a trial."""


@dataclass
class Outcome:
    """How one trial went.

    Attributes:
        kind: What happened, e.g. ``"one winner"``, ``"both won"``.
        expected: Whether that is the documented outcome.
        violations: The broken promises, one sentence each.
    """

    kind: str
    expected: bool
    violations: list[str] = field(default_factory=list)


@dataclass
class Server:
    """The S3 endpoint the trials run against, and a bucket of their own on it.

    ``client`` is one boto3 client that every store object's sync calls share (what a store
    knows of a State is kept apart by ``separate_process``, not by the client; a client each
    would cost most of the run's CPU).
    """

    endpoint: str
    bucket: str
    locking: bool
    mode: Literal["sync", "async", "both"]
    client: S3Client
    watch: bool = True

    def mode_of(self, trial: int) -> Mode:
        """The API a trial uses: sync, async, or each in turn."""
        if self.mode == "both":
            return "sync" if trial % 2 == 0 else "async"
        return self.mode

    def keys(self, state_id: str) -> list[str]:
        """The State's head (unless a tombstone) and its folder's objects, without the store."""
        return state_keys(self.client, self.bucket, PREFIX, state_id)


class Process:
    """One process: a store with a memory of its own, and for the async API an event loop.

    The async methods run on that loop (on a thread), as in a process that keeps one loop, so
    the store opens its async client once. Its first save checks the engine, as a process does.
    """

    def __init__(self, server: Server, mode: Mode) -> None:
        self.store = separate_process(
            S3Store(
                server.bucket,
                PREFIX,
                endpoint_url=server.endpoint,
                region_name="us-east-1",
                client=server.client,
            )
        )
        self.mode = mode
        self.loop: asyncio.AbstractEventLoop | None = None
        if mode == "async":
            self.loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
            self._thread.start()

    def wait(self, work: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on this process's loop and wait for its result."""
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(work, self.loop).result()

    def save(self, state: State) -> bool:
        """``store.save(state)``, or ``asave`` on this process's loop."""
        if self.loop is None:
            return self.store.save(state)
        return self.wait(self.store.asave(state))

    def load(self, state_id: str) -> State:
        """``store.load(state_id)``, or ``aload`` on this process's loop."""
        # S3Store.load is typed Any (it returns the installed core's State): this core's.
        state: State
        if self.loop is None:
            state = self.store.load(state_id)
        else:
            state = self.wait(self.store.aload(state_id))
        return state

    def delete(self, state_id: str) -> None:
        """``store.delete(state_id)``, or ``adelete`` on this process's loop."""
        if self.loop is None:
            self.store.delete(state_id)
        else:
            self.wait(self.store.adelete(state_id))

    def run(self, agent: Agent, state: State) -> None:
        """``agent.run(state)``, or ``arun`` on this process's loop."""
        if self.loop is None:
            agent.run(state)
        else:
            self.wait(agent.arun(state))

    def close(self) -> None:
        """Close the store (and the loop)."""
        if self.loop is not None:
            self.wait(self.store.aclose())
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join()
            self.loop.close()
        self.store.close()


def attempt(process: Process, state: State) -> BaseException | None:
    """Save; the exception raised, or ``None`` when the save returned."""
    try:
        process.save(state)
    except Exception as e:
        return e
    return None


def at_once(saves: Sequence[Callable[[], BaseException | None]]) -> list[BaseException | None]:
    """Run the saves on threads released together by a barrier; their outcomes, in order."""
    barrier = threading.Barrier(len(saves))
    results: list[BaseException | None] = [None] * len(saves)

    def run(i: int) -> None:
        barrier.wait()
        results[i] = saves[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(saves))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


@contextlib.contextmanager
def processes(server: Server, mode: Mode, count: int) -> Iterator[list[Process]]:
    """``count`` writers, closed at the end."""
    made = [Process(server, mode) for _ in range(count)]
    try:
        yield made
    finally:
        for process in made:
            process.close()


# Checks --------------------------------------------------------------------------------------


def texts(state: State) -> list[str]:
    """The texts of a State's history, task first."""
    return [entry.text for entry in state.history]


def name(error: BaseException | None) -> str:
    """An outcome as a short phrase: ``returned`` or the exception's type and message."""
    return "returned" if error is None else f"{type(error).__name__}: {error}"


def expect_error(what: str, got: BaseException | None, wanted: type[Exception]) -> None:
    """Raise ``Violation`` unless ``got`` is a ``wanted``."""
    if not isinstance(got, wanted):
        raise Violation(f"{what}: expected {wanted.__name__}, got {name(got)}")


def expect_saved(what: str, process: Process, state: State) -> None:
    """Save, and raise ``Violation`` unless the save returned having written something."""
    try:
        wrote = process.save(state)
    except Exception as e:
        raise Violation(f"{what}: the save raised {name(e)}") from e
    if not wrote:
        raise Violation(f"{what}: the save wrote nothing")


def expect_stored(
    server: Server, state_id: str, history: list[str], data: dict[str, Any], when: str
) -> None:
    """A reader of its own loads exactly ``history`` and ``data``, with seqs from 0, no gap."""
    reader = Process(server, "sync")
    try:
        try:
            state = reader.load(state_id)
        except Exception as e:
            raise Violation(f"{when}: the load failed: {name(e)}") from e
    finally:
        reader.close()
    seqs = [entry.seq for entry in state.history]
    if seqs != list(range(len(seqs))):
        raise Violation(f"{when}: the loaded seqs are {seqs}")
    if texts(state) != history:
        raise Violation(f"{when}: the stored history is {texts(state)}, expected {history}")
    if state.data != data:
        raise Violation(f"{when}: the stored data is {state.data}, expected {data}")


def expect_gone(server: Server, process: Process, state_id: str, when: str) -> None:
    """No object under the State's prefix, and a load raises ``StateNotFoundError``."""
    left = server.keys(state_id)
    if left:
        raise Violation(f"{when}: {len(left)} object(s) left: {left}")
    try:
        process.load(state_id)
    except StateNotFoundError:
        return
    except Exception as e:
        raise Violation(f"{when}: a load raised {name(e)}, not StateNotFoundError") from e
    raise Violation(f"{when}: a load found the deleted State")


def delete_and_check(server: Server, state_id: str, mode: Mode) -> None:
    """Delete the State through a writer of its own; nothing may be left."""
    with processes(server, mode, 1) as (process,):
        try:
            process.delete(state_id)
        except Exception as e:
            raise Violation(f"the closing delete raised {name(e)}") from e
        expect_gone(server, process, state_id, "after the closing delete")


@dataclass
class Copy:
    """One writer's copy of a State, and the history and data it expects to be stored."""

    process: Process
    state: State
    history: list[str]
    data: dict[str, Any]

    def add(self, *messages: str) -> None:
        """Add user messages, here and in the history this copy expects to be stored."""
        for text in messages:
            self.state.add_user_message(text)
            self.history.append(text)

    def set_data(self, data: dict[str, Any]) -> None:
        """Rebind ``data`` (a mutation of a loaded State's dict would look like no change)."""
        self.state.data = dict(data)
        self.data = dict(data)


def loaded(process: Process, state_id: str, history: list[str], data: dict[str, Any]) -> Copy:
    """The copy ``process`` loads, expected to hold ``history`` and ``data``."""
    return Copy(process, process.load(state_id), list(history), dict(data))


def after_one_winner(
    server: Server,
    state_id: str,
    winner: Copy,
    loser: Copy,
    loser_error: BaseException | None,
    wanted: type[Exception],
) -> None:
    """What must hold once one writer won and the other lost, up to the closing delete."""
    expect_error("the loser's save", loser_error, wanted)
    expect_stored(server, state_id, winner.history, winner.data, "after the two saves")
    # Sent again, the loser's save is refused again: never a silent overwrite.
    expect_error("the loser's save sent again", attempt(loser.process, loser.state), wanted)
    expect_stored(server, state_id, winner.history, winner.data, "after the loser retried")
    winner.add("winner: carries on")
    expect_saved("the winner's next save", winner.process, winner.state)
    expect_stored(server, state_id, winner.history, winner.data, "after the winner's next save")
    # The loser loads what is stored and continues from it.
    try:
        again = loaded(loser.process, state_id, winner.history, winner.data)
    except Exception as e:
        raise Violation(f"the loser's load failed: {name(e)}") from e
    if texts(again.state) != winner.history:
        raise Violation(f"the loser loaded {texts(again.state)}, expected {winner.history}")
    again.add("loser: continues after a load")
    expect_saved("the loser's save after a load", again.process, again.state)
    expect_stored(server, state_id, again.history, again.data, "after the loser continued")


def judged(kind: str, check: Callable[[], None], *, expected: bool) -> Outcome:
    """Run the checks of a trial whose outcome was ``kind`` (the documented one if ``expected``).

    A trial counts as expected only if its checks hold too.
    """
    try:
        check()
    except Violation as e:
        return Outcome(kind, False, [str(e)])
    return Outcome(kind, expected)


def pick(
    results: Sequence[BaseException | None], first: Copy, second: Copy
) -> tuple[Copy, Copy, BaseException | None]:
    """The winner, the loser and the loser's error, of two saves of which one returned."""
    if results[0] is None:
        return first, second, results[1]
    return second, first, results[0]


# Scenarios -----------------------------------------------------------------------------------


class Watcher:
    """A third process that loads the State over and over while two writers save it."""

    def __init__(self, server: Server, state_id: str, active: bool) -> None:
        self.server = server
        self.state_id = state_id
        self.active = active
        self.seen: list[list[str] | BaseException] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch)

    def __enter__(self) -> Watcher:
        if self.active:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.active:
            self.thread.join()

    def _watch(self) -> None:
        with processes(self.server, "sync", 1) as (reader,):
            while not self.stop.is_set():
                try:
                    self.seen.append(texts(reader.load(self.state_id)))
                except Exception as e:
                    self.seen.append(e)

    def check(self, loser: Copy) -> None:
        """Every load succeeded, and none read an entry of a refused save (``loser``'s)."""
        theirs = set(loser.history) - {TASK}
        for seen in self.seen:
            if isinstance(seen, BaseException):
                raise Violation(f"a load during the saves failed: {name(seen)}")
            if theirs & set(seen):
                raise Violation(f"a load during the saves read the loser's entries: {seen}")


def race(server: Server, trial: int, state_id: str) -> Outcome:
    """Both loaded; each adds 1-3 messages; both save at once. One wins.

    A third process loads the State all along: every load succeeds and none reads the
    loser's entries.
    """
    with processes(server, server.mode_of(trial), 3) as (setup, a, b):
        setup.save(State(TASK, id=state_id))
        first, second = loaded(a, state_id, [TASK], {}), loaded(b, state_id, [TASK], {})
        first.add(*(f"A{trial}: {i}" for i in range(1 + trial % 3)))
        second.add(*(f"B{trial}: {i}" for i in range(1 + (trial // 3) % 3)))
        with Watcher(server, state_id, server.watch) as watcher:
            results = at_once([lambda: attempt(a, first.state), lambda: attempt(b, second.state)])
        if results == [None, None]:
            return Outcome("both won", False, ["both saves returned"])
        if None not in results:
            # Nothing acknowledged is lost: the State is as it was, and a load continues it.
            def nobody() -> None:
                watcher.check(first)
                watcher.check(second)
                for who, error in zip("AB", results, strict=True):
                    expect_error(f"writer {who}", error, ConcurrentWriteError)
                expect_stored(server, state_id, [TASK], {}, "after both were refused")
                # Nothing is lost, but both head PUTs were conditional on the same ETag: one
                # of the two must land.
                raise Violation("both saves were refused")

            return judged("both refused", nobody, expected=False)
        winner, loser, error = pick(results, first, second)

        def check() -> None:
            watcher.check(loser)
            after_one_winner(server, state_id, winner, loser, error, ConcurrentWriteError)

        return judged("one winner", check, expected=isinstance(error, ConcurrentWriteError))


def stale_copy(server: Server, trial: int, state_id: str) -> Outcome:
    """A saves 1-2 messages; B, from a copy loaded before, saves 1-3 messages. A wins.

    B is another process, or (odd trials) a second copy loaded in A's own process. In one
    process the base of B's save is A's head (the process's memory is one writer's), so no
    ETag tells the copies apart; B's save is refused because it sends entries again at seqs
    where A's head has others (invariant 6: append only). A copy in A's process that saved
    ``data`` alone would replace A's snapshot: the limit of one process, not tried here.
    """
    own = trial % 2 == 1
    with processes(server, server.mode_of(trial), 3) as (setup, a, b):
        start = State(TASK, id=state_id)
        start.add_user_message("before")
        setup.save(start)
        first = loaded(a, state_id, [TASK, "before"], {})
        second = loaded(a if own else b, state_id, [TASK, "before"], {})
        first.add(*(f"A{trial}: {i}" for i in range(1 + (trial // 2) % 2)))
        a_error = attempt(a, first.state)
        second.add(*(f"B{trial}: {i}" for i in range(1 + (trial // 4) % 3)))
        b_error = attempt(second.process, second.state)

        def check() -> None:
            if a_error is not None:
                raise Violation(f"A's save (the first): {name(a_error)}")
            after_one_winner(server, state_id, first, second, b_error, ConcurrentWriteError)

        refused = a_error is None and isinstance(b_error, ConcurrentWriteError)
        kind = "B refused" if refused else "B not refused"
        return judged(kind + (" (same process)" if own else ""), check, expected=refused)


def data_only(server: Server, trial: int, state_id: str) -> Outcome:
    """A saves a change of data alone; B, another process with a copy from before, saves.

    A wins: B's head PUT is conditional on the head before A's. (B in A's own process is left
    out: a save of ``data`` alone carries no entry to tell an older copy by; see stale_copy.)
    """
    variant = ("a message", "a message and data", "data alone")[trial % 3]
    with processes(server, server.mode_of(trial), 3) as (setup, a, b):
        setup.save(State(TASK, id=state_id, data={"step": 0}))
        first = loaded(a, state_id, [TASK], {"step": 0})
        second = loaded(b, state_id, [TASK], {"step": 0})
        first.set_data({"step": 1, "by": "A"})
        a_error = attempt(a, first.state)
        if variant != "data alone":
            second.add(f"B{trial}: after A's data")
        if variant != "a message":
            second.set_data({"step": 1, "by": "B"})
        b_error = attempt(b, second.state)

        def check() -> None:
            if a_error is not None:
                raise Violation(f"A's save of data alone: {name(a_error)}")
            after_one_winner(server, state_id, first, second, b_error, ConcurrentWriteError)

        refused = a_error is None and isinstance(b_error, ConcurrentWriteError)
        kind = f"B ({variant}) {'refused' if refused else 'not refused'}"
        return judged(kind, check, expected=refused)


class _Catch(logging.Handler):
    """Collects the exceptions of the Agent's "saving a tool result failed" warnings."""

    def __init__(self, into: list[BaseException]) -> None:
        super().__init__(logging.WARNING)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.exc_info[1] is not None:
            if "saving a tool result failed" in record.getMessage():
                self.into.append(record.exc_info[1])


def delete_during_run(server: Server, trial: int, state_id: str) -> Outcome:
    """An Agent runs the State; its tool deletes it through another process meanwhile.

    The turn has one tool call, or (odd trials) two run at once, the second finishing after
    the delete. Every save after the delete raises ``StateNotFoundError`` (its head PUT's
    ``If-Match`` meets no head): each tool result saved alone (the Agent logs it and goes on),
    the run's next save, and a later one. Each removes the entry objects it wrote first, so
    nothing is left under the id.
    """
    calls = 1 + trial % 2
    with processes(server, server.mode_of(trial), 3) as (setup, runner, other):
        setup.save(State(TASK, id=state_id))
        state = runner.load(state_id)
        deleted = threading.Event()

        def work(n: int) -> str:
            """Do a piece of work; the first call deletes the State elsewhere meanwhile."""
            if n == 0:
                other.delete(state_id)
                deleted.set()
            else:
                deleted.wait(30)
            return f"work {n} done"

        def respond(request: ModelRequest) -> str | list[dict[str, Any]]:
            if len(request.messages) == 1:
                return [call("work", n=n) for n in range(calls)]
            return "all done"

        agent = Agent(FunctionModel(respond), tools=[work], store=runner.store)
        alone: list[BaseException] = []
        catcher = _Catch(alone)
        agent_log = logging.getLogger("alpineagents.agent")
        agent_log.addHandler(catcher)
        run_error: BaseException | None = None
        try:
            runner.run(agent, state)
        except Exception as e:
            run_error = e
        finally:
            agent_log.removeHandler(catcher)

        def check() -> None:
            if len(alone) != calls:
                raise Violation(
                    f"{calls} tool result(s) saved alone after the delete, {len(alone)} refused"
                )
            for error in alone:
                expect_error("a tool result saved alone", error, StateNotFoundError)
            expect_error("the run", run_error, StateNotFoundError)
            expect_gone(server, other, state_id, "after the run")
            # A later save: refused, and nothing written.
            state.add_user_message("after the delete")
            expect_error("a later save", attempt(runner, state), StateNotFoundError)
            expect_gone(server, other, state_id, "after a later save")
            if state_id in [saved.id for saved in other.store.list()]:
                raise Violation("the deleted State is still listed")

        expected = isinstance(run_error, StateNotFoundError)
        return judged(f"{calls} tool call(s)", check, expected=expected)


def create_race(server: Server, trial: int, state_id: str) -> Outcome:
    """Two writers create a State with one id at once (odd trials: with a message). One wins."""
    with processes(server, server.mode_of(trial), 2) as (a, b):
        copies = []
        for process, who in ((a, "A"), (b, "B")):
            task = f"{who}{trial}: {TASK}"
            copy = Copy(process, State(task, id=state_id), [task], {})
            if trial % 2 == 1:
                copy.add(f"{who}{trial}: a first message")
            copies.append(copy)
        first, second = copies
        results = at_once([lambda: attempt(a, first.state), lambda: attempt(b, second.state)])
        if results == [None, None]:
            return Outcome("both won", False, ["both creates returned"])
        if None not in results:
            return Outcome("both refused", False, [f"both creates failed: {name(results[0])}"])
        winner, loser, error = pick(results, first, second)

        def check() -> None:
            # The loser removed its entries: only the winner's head and entries are left.
            roles = sorted({obj.role for obj in winner.process.store.objects(state_id)})
            if roles != ["entry", "head"]:
                raise Violation(f"the roles of the objects of the id after the race: {roles}")
            after_one_winner(server, state_id, winner, loser, error, StateExistsError)

        return judged("one winner", check, expected=isinstance(error, StateExistsError))


Scenario = Callable[[Server, int, str], Outcome]

# name: (function, whether its outcome depends on the server's lock)
SCENARIOS: dict[str, tuple[Scenario, bool]] = {
    "race": (race, True),
    "stale-copy": (stale_copy, False),
    "data-only": (data_only, False),
    "delete": (delete_during_run, False),
    "create-race": (create_race, True),
}


# The run -------------------------------------------------------------------------------------


@dataclass
class Tally:
    """The figures of one scenario."""

    trials: int = 0
    expected: int = 0
    violations: list[str] = field(default_factory=list)
    kinds: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def add(self, state_id: str, outcome: Outcome, seconds: float) -> None:
        """Count one trial."""
        self.trials += 1
        self.expected += outcome.expected
        self.kinds[outcome.kind] = self.kinds.get(outcome.kind, 0) + 1
        self.violations += [f"{state_id}: {v}" for v in outcome.violations]
        self.seconds += seconds


def run_trial(server: Server, scenario: Scenario, label: str, trial: int) -> tuple[str, Outcome]:
    """One trial on a fresh id, the closing delete included; never raises."""
    state_id = f"{label}-{trial}-{uuid.uuid4().hex[:8]}"
    try:
        outcome = scenario(server, trial, state_id)
    except Exception as e:  # a step outside the checks failed: a violation too
        outcome = Outcome("error", False, [f"the scenario raised {name(e)}"])
    if label != "delete" and server.keys(state_id):
        try:
            delete_and_check(server, state_id, server.mode_of(trial))
        except Violation as e:
            outcome.violations.append(str(e))
    return state_id, outcome


def run(server: Server, names: Sequence[str], trials: int, seconds: float) -> dict[str, Tally]:
    """The trials, scenario after scenario in turn, until ``trials`` each or the time bound."""
    tallies = {label: Tally() for label in names}
    deadline = time.monotonic() + seconds
    for trial in range(trials):
        for label in names:
            if time.monotonic() >= deadline:
                return tallies
            started = time.monotonic()
            state_id, outcome = run_trial(server, SCENARIOS[label][0], label, trial)
            tallies[label].add(state_id, outcome, time.monotonic() - started)
    return tallies


def report(server: Server, tallies: dict[str, Tally], trials: int) -> int:
    """Print one line per scenario and the violations; the number of judged violations."""
    judged_violations = 0
    for label, tally in tallies.items():
        racing = SCENARIOS[label][1]
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(tally.kinds.items()))
        cut = f" (time bound: {tally.trials} of {trials})" if tally.trials < trials else ""
        line = (
            f"{label:<12} trials {tally.trials:>4}  expected {tally.expected:>4}  "
            f"violations {len(tally.violations):>3}  [{kinds}]  {tally.seconds:.1f}s{cut}"
        )
        if racing and not server.locking:
            line += "  (moto: no lock, not judged)"
        else:
            judged_violations += len(tally.violations)
        print(line)
    for label, tally in tallies.items():
        for violation in tally.violations[:5]:
            print(f"  {label}: {violation}")
        if len(tally.violations) > 5:
            print(f"  {label}: … and {len(tally.violations) - 5} more")
    return judged_violations


def is_localstack(endpoint: str) -> bool:
    """Whether ``endpoint`` answers LocalStack's health check."""
    try:
        with urllib.request.urlopen(f"{endpoint}/_localstack/health", timeout=5) as answer:
            health = json.load(answer)
    except Exception:
        return False
    return isinstance(health, dict) and "services" in health


@contextlib.contextmanager
def endpoint(url: str | None) -> Iterator[str]:
    """``url``, or moto's server started in this process."""
    if url is not None:
        yield url
        return
    with embedded_moto() as started:
        yield started


def main(argv: Sequence[str] | None = None) -> int:
    """Run the scenarios and print their figures; 1 on a judged violation."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoint", help="an S3 endpoint (default: moto, started here)")
    parser.add_argument("--trials", type=int, default=20, help="trials per scenario")
    parser.add_argument("--seconds", type=float, default=600.0, help="time bound of the run")
    parser.add_argument("--mode", choices=["sync", "async", "both"], default="both")
    parser.add_argument("--locking", choices=["yes", "no", "auto"], default="auto")
    parser.add_argument(
        "--no-watch",
        dest="watch",
        action="store_false",
        help="no third process loading the State during the race",
    )
    parser.add_argument(
        "--scenario", action="append", choices=list(SCENARIOS), help="only these (repeatable)"
    )
    args = parser.parse_args(argv)
    for key, value in CREDENTIALS.items():
        os.environ.setdefault(key, value)
    # The Agent warns when a tool result saved alone fails: that is expected here.
    logging.getLogger("alpineagents.agent").propagate = False
    names = args.scenario or list(SCENARIOS)
    started = time.monotonic()
    with endpoint(args.endpoint) as url:
        if args.locking == "auto":
            locking = args.endpoint is not None and is_localstack(url)
        else:
            locking = args.locking == "yes"
        kind = "LocalStack" if args.endpoint and is_localstack(url) else "moto"
        bucket = f"two-writers-{uuid.uuid4().hex[:12]}"
        client = boto3.client("s3", endpoint_url=url, region_name="us-east-1")
        client.create_bucket(Bucket=bucket)
        server = Server(url, bucket, locking, args.mode, client, args.watch)
        print(
            f"two writers on {kind} at {url} (conditions {'locked' if locking else 'not locked'})"
            f", bucket {bucket}, mode {args.mode}, {args.trials} trials per scenario, "
            f"bound {args.seconds:g}s",
            flush=True,
        )
        try:
            tallies = run(server, names, args.trials, args.seconds)
            violations = report(server, tallies, args.trials)
            keys = [
                o["Key"]
                for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
                for o in page.get("Contents", [])
            ]
            tombstones = [
                k
                for k in keys
                if k.startswith(f"{PREFIX}/heads/") and is_tombstone(client, bucket, k)
            ]
            left = len(keys) - len(tombstones)
            print(f"objects left in the bucket: {left} (and {len(tombstones)} tombstone heads)")
            if left:
                violations += 1
            else:
                remove_bucket(client, bucket)
        finally:
            client.close()
    total = sum(t.trials for t in tallies.values())
    print(
        f"total: {total} trials, {violations} judged violations, {time.monotonic() - started:.1f}s"
    )
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
