"""A signal's exception inside a save (Ctrl+C's KeyboardInterrupt, the guide's SIGTERM handler
raising SystemExit) never leaves the State's lock held in the process.

The Agent saves once more when its run is interrupted; a lock left held by the interrupted
save would make that save wait for ever, and the process hang on SIGTERM. The exception lands
where a signal can: inside the wait for the lock (a real SIGALRM, while another thread's save
holds it), and just after the lock is taken (the handler runs at the next bytecode).
"""

from __future__ import annotations

import asyncio
import inspect
import signal
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from alpineagents import State
from alpineagents_s3 import S3Store
from alpineagents_s3._lock import HandoffLock
from tests.helpers import MakeBucket


class Interrupted(BaseException):
    """What the test's signal handler raises, as the guide's handler raises SystemExit."""


@pytest.fixture
def alarm() -> Iterator[None]:
    """SIGALRM raises :class:`Interrupted` in the main thread while the test runs."""

    def interrupt(signum: int, frame: Any) -> None:
        raise Interrupted

    before = signal.signal(signal.SIGALRM, interrupt)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)


def saves_within(store: S3Store, state: State, seconds: float = 20) -> None:
    """``store.save(state)`` in a thread; fails (instead of hanging) if it does not end."""
    outcome: list[BaseException | None] = []

    def save() -> None:
        try:
            store.save(state)
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001 - the outcome is the test's
            outcome.append(e)

    thread = threading.Thread(target=save, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "the save still waits for the State's lock"
    assert outcome == [None]


def holding(
    url: str, bucket: str, state_id: str
) -> tuple[S3Store, threading.Thread, threading.Event]:
    """A store whose thread "holder" is inside a save of ``state_id`` (so holds its lock),
    paused in a PUT until the event returned is set."""
    in_put, go_on = threading.Event(), threading.Event()

    def hold_in_thread(**kwargs: Any) -> None:
        if threading.current_thread().name == "holder":
            in_put.set()
            assert go_on.wait(20)

    store = S3Store(
        bucket, "runs", endpoint_url=url, event_hooks={"before-send.s3.PutObject": hold_in_thread}
    )
    state = State("interrupted", id=state_id)
    store.save(state)
    state.add_user_message("saved by the holder")
    holder = threading.Thread(target=store.save, args=(state,), name="holder")
    holder.start()
    assert in_put.wait(20)
    return store, holder, go_on


def interrupt_once(monkeypatch: pytest.MonkeyPatch, name: str, *, before: bool = False) -> None:
    """``HandoffLock.<name>`` raises :class:`Interrupted` once: just after it returns (where a
    signal's handler runs, at the next bytecode), or ``before`` it does anything."""
    real = getattr(HandoffLock, name)
    armed = [True]

    def fire() -> None:
        if armed:
            armed.clear()
            raise Interrupted

    if inspect.iscoroutinefunction(real):

        async def apatched(self: HandoffLock, *args: Any) -> None:
            await real(self, *args)
            fire()

        monkeypatch.setattr(HandoffLock, name, apatched)
        return

    def patched(self: HandoffLock, *args: Any) -> None:
        if before:
            fire()
        real(self, *args)
        fire()  # nothing once fired

    monkeypatch.setattr(HandoffLock, name, patched)


def test_a_signal_while_a_save_waits_for_the_lock_does_not_keep_it(
    alarm: None, moto_url: str, moto_bucket: MakeBucket
) -> None:
    store, holder, go_on = holding(moto_url, moto_bucket(), "i")

    mine = store.load("i")
    mine.data = {"by": "main"}
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    try:
        store.save(mine)  # waits for the holder's lock until the signal comes
    except Interrupted:
        go_on.set()
        holder.join(20)
        # As the Agent does: saves again while the exception (and its traceback) is alive.
        again = store.load("i")
        again.add_user_message("after the signal")
        saves_within(store, again)
    else:
        pytest.fail("the signal did not interrupt the save")
    assert [e.text for e in store.load("i").history][-2:] == [
        "saved by the holder",
        "after the signal",
    ]
    store.close()


def test_a_signal_just_after_the_lock_is_taken_does_not_keep_it(
    monkeypatch: pytest.MonkeyPatch, moto_url: str, moto_bucket: MakeBucket
) -> None:
    store = S3Store(moto_bucket(), "runs", endpoint_url=moto_url)
    state = State("interrupted", id="j")
    store.save(state)
    interrupt_once(monkeypatch, "acquire")
    state.add_user_message("interrupted")
    try:
        store.save(state)
    except Interrupted:
        saves_within(store, state)  # as the Agent does, with the exception alive
    else:
        pytest.fail("the save was not interrupted")
    assert [e.text for e in store.load("j").history][-1:] == ["interrupted"]
    store.close()


async def test_a_task_cancelled_while_its_save_waits_for_the_lock_does_not_keep_it(
    moto_url: str, moto_bucket: MakeBucket
) -> None:
    store, holder, go_on = await asyncio.to_thread(holding, moto_url, moto_bucket(), "c")

    mine = await store.aload("c")
    mine.data = {"by": "task"}
    waiting = asyncio.ensure_future(store.asave(mine))
    await asyncio.sleep(0.3)
    assert not waiting.done()  # it waits for the holder's lock
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    go_on.set()
    await asyncio.to_thread(holder.join, 20)

    again = await store.aload("c")
    again.add_user_message("after the cancel")
    await asyncio.wait_for(store.asave(again), 20)
    assert [e.text for e in (await store.aload("c")).history][-2:] == [
        "saved by the holder",
        "after the cancel",
    ]
    await store.aclose()
    store.close()


async def test_an_exception_just_after_a_task_takes_the_lock_does_not_keep_it(
    monkeypatch: pytest.MonkeyPatch, moto_url: str, moto_bucket: MakeBucket
) -> None:
    store = S3Store(moto_bucket(), "runs", endpoint_url=moto_url)
    state = State("interrupted", id="k")
    await store.asave(state)
    interrupt_once(monkeypatch, "aacquire")
    state.add_user_message("interrupted")
    try:
        await store.asave(state)
    except Interrupted:
        await asyncio.wait_for(store.asave(state), 20)  # with the exception alive
    else:
        pytest.fail("the save was not interrupted")
    assert [e.text for e in (await store.aload("k")).history][-1:] == ["interrupted"]
    await store.aclose()
    store.close()


def test_the_lock_is_released_only_by_its_holder_and_an_interrupted_waiter_leaves(
    alarm: None,
) -> None:
    """The lock alone (no server, fast tier): what the drivers' ``finally`` relies on."""
    lock, holder, waiter, third = HandoffLock(), object(), object(), object()
    lock.acquire(holder)
    lock.release(waiter)  # not its holder: nothing happens
    assert lock.locked
    signal.setitimer(signal.ITIMER_REAL, 0.2)
    with pytest.raises(Interrupted):
        lock.acquire(waiter)  # waits for the holder until the signal comes
    lock.release(waiter)  # as a driver's finally does: it never got the lock
    assert lock.locked
    lock.release(holder)
    assert not lock.locked  # not handed to the waiter that left
    lock.acquire(third)
    lock.release(third)
    assert not lock.locked


def test_a_signal_inside_the_release_does_not_keep_the_lock_from_the_next_save(
    alarm: None, monkeypatch: pytest.MonkeyPatch, moto_url: str, moto_bucket: MakeBucket
) -> None:
    """The signal lands in the driver's ``finally``, before the release: the lock stays held
    by this thread, whose next save (the Agent's, on the same thread) takes it over."""
    store = S3Store(moto_bucket(), "runs", endpoint_url=moto_url)
    state = State("interrupted", id="r")
    store.save(state)
    interrupt_once(monkeypatch, "release", before=True)
    state.add_user_message("saved, then interrupted")
    try:
        store.save(state)
    except Interrupted:
        state.add_user_message("the Agent's last save")
        signal.setitimer(signal.ITIMER_REAL, 20)  # a hang fails the test instead
        store.save(state)
        signal.setitimer(signal.ITIMER_REAL, 0)
    else:
        pytest.fail("the save was not interrupted")
    assert [e.text for e in store.load("r").history][-2:] == [
        "saved, then interrupted",
        "the Agent's last save",
    ]
    store.close()
