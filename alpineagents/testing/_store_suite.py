"""A conformance suite for Store implementations, ours or yours.

(Over 400 lines: every requirement a store must meet is one test here, so that a store author
reads the whole contract in one file.)

Subclass :class:`StoreConformance` in a test module and give it a ``store`` fixture that
returns a new, empty store; every test then runs in sync and in async mode::

    import pytest
    from alpineagents.testing import StoreConformance

    class TestMyStore(StoreConformance):
        @pytest.fixture
        def store(self):
            return MyStore(...)

The suite finds out what a store supports and skips the rest, with the reason: the sync
tests of an async-only store (one that implements only ``awrite`` and ``aread``), and the
tests of ``list`` or ``delete`` when the store implements neither it nor its async twin.
Set ``concurrent_create = False`` where the backend cannot make a create exclusive (an
emulator that checks conditions without a lock): that test is then skipped. The suite
checks behaviour through public names only, and needs only pytest.

(Longer than this project's ~400 lines on purpose: one class, so that a subclass inherits
every test of the store contract.)
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, TypeVar

import pytest

from alpineagents import _saving
from alpineagents._serialize import entry_to_dict, snapshot_of
from alpineagents.history import MODEL, TOOL_RESULT
from alpineagents.state import State
from alpineagents.store import Record, SavedState, Store

__all__ = ["StoreConformance", "StoreIO", "implements", "needs"]

_Test = TypeVar("_Test", bound=Callable[..., Any])


class StoreIO:
    """Calls a store's sync methods (on a worker thread) or its async twins, by mode."""

    def __init__(self, store: Store, mode: str):
        self.store = store
        self.mode = mode

    async def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if self.mode == "async":
            return await getattr(self.store, "a" + name)(*args, **kwargs)
        return await asyncio.to_thread(getattr(self.store, name), *args, **kwargs)

    async def write(
        self,
        state_id: str,
        entries: Sequence[dict[str, Any]],
        snapshot: dict[str, Any] | None,
        *,
        create: bool = False,
    ) -> None:
        """``write`` or ``awrite``."""
        await self._call("write", state_id, entries, snapshot, create=create)

    async def read(self, state_id: str) -> Record | None:
        """``read`` or ``aread``."""
        result: Record | None = await self._call("read", state_id)
        return result

    async def list(self, **options: Any) -> list[SavedState]:
        """``list`` or ``alist``; ``options`` (``limit=``) for a store whose method takes them."""
        result: list[SavedState] = await self._call("list", **options)
        return result

    async def delete(self, state_id: str) -> None:
        """``delete`` or ``adelete``."""
        await self._call("delete", state_id)

    async def delete_with(self, state_id: str, **options: Any) -> object:
        """``delete`` or ``adelete`` with ``options`` (``purge=``, where taken); its result."""
        return await self._call("delete", state_id, **options)

    async def save_result(self, state: State) -> bool:
        """Save the new entries of ``state`` alone, as the Agent saves a tool result at once."""
        if self.mode == "async":
            return await _saving.asave(self.store, state, entries_only=True)
        return await asyncio.to_thread(_saving.save, self.store, state, entries_only=True)

    def takes(self, name: str, keyword: str) -> bool:
        """Whether the method ``name`` of this mode (``list``/``alist``) takes ``keyword``."""
        method = getattr(self.store, name if self.mode == "sync" else "a" + name)
        return keyword in inspect.signature(method).parameters

    def method_name(self, name: str) -> str:
        """``MyStore.list`` or ``MyStore.alist``, by mode."""
        return f"{type(self.store).__name__}.{name if self.mode == 'sync' else 'a' + name}"

    async def load(self, state_id: str) -> State:
        """``load`` or ``aload``."""
        result: State = await self._call("load", state_id)
        return result

    async def get(self, state_id: str) -> State | None:
        """``get`` or ``aget``."""
        result: State | None = await self._call("get", state_id)
        return result

    async def save(self, state: State) -> bool:
        """``save`` or ``asave``."""
        result: bool = await self._call("save", state)
        return result

    async def close(self) -> None:
        """Close the store the way the mode would."""
        if self.mode == "async":
            await self.store.aclose()
        else:
            await asyncio.to_thread(self.store.close)


def implements(store: Store, name: str) -> bool:
    """Whether ``store`` implements ``name`` (``"list"``, ``"delete"``, …) or its async twin."""
    return any(
        getattr(type(store), method) is not getattr(Store, method) for method in (name, "a" + name)
    )


def needs(*names: str) -> Callable[[_Test], _Test]:
    """Mark a suite test as needing these optional store methods; skipped without them."""

    def mark(test: _Test) -> _Test:
        test.store_needs = names  # type: ignore[attr-defined]
        return test

    return mark


def scenario(
    test: Callable[..., Coroutine[Any, Any, None]],
) -> Callable[..., None]:
    """Run an ``async def test(self, io, ...)`` in a new event loop, closing the store after."""

    def run(self: Any, io: StoreIO, **kwargs: Any) -> None:
        async def main() -> None:
            try:
                await test(self, io, **kwargs)
            finally:
                await io.close()

        asyncio.run(main())

    params = list(inspect.signature(test).parameters.values())
    run.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    run.__name__ = test.__name__
    run.__qualname__ = test.__qualname__
    run.__doc__ = test.__doc__
    run.store_needs = getattr(test, "store_needs", ())  # type: ignore[attr-defined]
    return run


_EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def make_entries(first: int, stop: int, text: str = "entry") -> list[dict[str, Any]]:
    """History entry dicts with seqs ``first`` to ``stop - 1``, as the serialiser writes them."""
    state = State("task")
    state.history.clear()
    for seq in range(stop):
        entry = state.append(TOOL_RESULT, f"{text} {seq}", {"call_id": f"call-{seq}", "name": "t"})
        entry.at = _EPOCH + timedelta(seconds=seq)
    return [entry_to_dict(e) for e in state.history[first:]]


def make_snapshot(state_id: str, entries: int, **changes: Any) -> dict[str, Any]:
    """A snapshot for ``state_id`` accounting for ``entries`` entries."""
    state = State("the task", id=state_id)
    state.created_at = state.updated_at = _EPOCH
    snapshot = snapshot_of(state)
    snapshot.update(entries=entries, **changes)
    return snapshot


class _Scratch(Store):
    """A store that only records its writes: (id, seqs, create)."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, list[int], bool]] = []

    def write(
        self,
        state_id: str,
        entries: Sequence[dict[str, Any]],
        snapshot: dict[str, Any] | None,
        *,
        create: bool = False,
    ) -> None:
        """Record the write."""
        self.writes.append((state_id, [e["seq"] for e in entries], create))


async def _gather(*calls: Awaitable[Any]) -> list[Any]:
    return list(await asyncio.gather(*calls, return_exceptions=True))


class StoreConformance:
    """What the user guide and DESIGN.md promise of every store, as tests.

    Override the ``store`` fixture. Class settings:

    * ``modes``: which APIs to test (``"sync"``, ``"async"``); an async-only store's sync
      tests are skipped without it;
    * ``many_entries``: how many entries the long-history test writes;
    * ``concurrent_create``: whether to race creators of one id (``False`` skips the test,
      for a backend whose conditional create is not atomic).
    """

    modes: ClassVar[tuple[str, ...]] = ("sync", "async")
    many_entries: ClassVar[int] = 1100
    concurrent_create: ClassVar[bool] = True

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        """Run every test once per mode."""
        if "io" in metafunc.fixturenames:
            metafunc.parametrize("mode", self.modes)

    @pytest.fixture
    def store(self) -> Store:
        """A new, empty store. Subclasses must override this fixture."""
        raise NotImplementedError("override the `store` fixture in your StoreConformance class")

    @pytest.fixture
    def io(self, store: Store, mode: str, request: pytest.FixtureRequest) -> StoreIO:
        """The store, called in the mode under test; skips what the store does not support."""
        if mode == "sync" and store.is_async_only:
            pytest.skip(f"{type(store).__name__} is async-only: it has no sync API to test")
        for name in getattr(request.function, "store_needs", ()):
            if not implements(store, name):
                pytest.skip(f"{type(store).__name__} implements neither {name}() nor a{name}()")
        return StoreIO(store, mode)

    # Reading what is not there ---------------------------------------------------------

    @scenario
    async def test_read_unknown_id_is_none(self, io: StoreIO) -> None:
        assert await io.read("never-written") is None

    @scenario
    async def test_load_unknown_id_is_key_error(self, io: StoreIO) -> None:
        with pytest.raises(KeyError, match="never-written"):
            await io.load("never-written")

    @scenario
    async def test_load_invalid_id_is_value_error(self, io: StoreIO) -> None:
        with pytest.raises(ValueError, match="invalid State id"):
            await io.load("../escape")

    @scenario
    @needs("list")
    async def test_list_of_empty_store(self, io: StoreIO) -> None:
        assert await io.list() == []

    # Create ----------------------------------------------------------------------------

    @scenario
    async def test_create_then_read(self, io: StoreIO) -> None:
        entries, snapshot = make_entries(0, 3), make_snapshot("s1", 3)
        await io.write("s1", entries, snapshot, create=True)
        record = await io.read("s1")
        assert record is not None
        assert sorted(record.entries, key=lambda e: e["seq"]) == entries
        assert record.snapshot == snapshot

    @scenario
    async def test_create_with_taken_id_is_refused_and_keeps_the_saved_state(
        self, io: StoreIO
    ) -> None:
        await io.write("taken", make_entries(0, 2, "first"), make_snapshot("taken", 2), create=True)
        with pytest.raises(ValueError, match="taken"):
            await io.write(
                "taken",
                make_entries(0, 3, "second"),
                make_snapshot("taken", 3, task="other"),
                create=True,
            )
        record = await io.read("taken")
        assert record is not None
        assert sorted(record.entries, key=lambda e: e["seq"]) == make_entries(0, 2, "first")
        assert record.snapshot == make_snapshot("taken", 2)

    @scenario
    async def test_concurrent_creates_of_one_id_have_one_winner(self, io: StoreIO) -> None:
        if not self.concurrent_create:
            pytest.skip("concurrent_create = False: this backend's create is not exclusive")
        for round_ in range(5):
            state_id = f"race-{round_}"

            async def create(n: int, state_id: str = state_id) -> None:
                snapshot = make_snapshot(state_id, 1, task=f"writer {n}")
                await io.write(state_id, make_entries(0, 1, f"writer {n}"), snapshot, create=True)

            outcomes = await _gather(*(create(n) for n in range(4)))
            winners = [n for n, outcome in enumerate(outcomes) if outcome is None]
            assert len(winners) == 1, outcomes
            assert all(isinstance(o, ValueError) for o in outcomes if o is not None), outcomes
            record = await io.read(state_id)
            assert record is not None
            assert record.snapshot["task"] == f"writer {winners[0]}"
            assert record.entries[0]["text"] == f"writer {winners[0]} 0"

    # Incremental writes ----------------------------------------------------------------

    @scenario
    async def test_entries_the_store_has_are_skipped(self, io: StoreIO) -> None:
        await io.write("s", make_entries(0, 3), make_snapshot("s", 3), create=True)
        # After a failed write the Agent sends entries again, with new ones after them.
        await io.write("s", make_entries(1, 5), make_snapshot("s", 5))
        record = await io.read("s")
        assert record is not None
        assert sorted(record.entries, key=lambda e: e["seq"]) == make_entries(0, 5)
        assert record.snapshot["entries"] == 5

    @scenario
    async def test_a_resent_seq_never_overwrites_what_is_saved(self, io: StoreIO) -> None:
        await io.write("s", make_entries(0, 2, "kept"), make_snapshot("s", 2), create=True)
        try:
            await io.write("s", make_entries(1, 2, "other"), None)
        except Exception:  # noqa: BLE001 - refusing a different entry under a saved seq is allowed
            pass
        record = await io.read("s")
        assert record is not None
        assert sorted(record.entries, key=lambda e: e["seq"]) == make_entries(0, 2, "kept")

    @scenario
    async def test_snapshot_none_adds_entries_and_keeps_the_snapshot(self, io: StoreIO) -> None:
        snapshot = make_snapshot("s", 2)
        await io.write("s", make_entries(0, 2), snapshot, create=True)
        await io.write("s", make_entries(2, 3), None)
        await io.write("s", make_entries(3, 4), None)
        record = await io.read("s")
        assert record is not None
        assert record.snapshot == snapshot
        assert sorted(record.entries, key=lambda e: e["seq"]) == make_entries(0, 4)

    @scenario
    async def test_snapshot_is_replaced(self, io: StoreIO) -> None:
        await io.write("s", make_entries(0, 1), make_snapshot("s", 1), create=True)
        changed = make_snapshot("s", 1, data={"k": [1, 2]}, stopped_by="reply")
        await io.write("s", [], changed)
        record = await io.read("s")
        assert record is not None and record.snapshot == changed

    @scenario
    async def test_write_to_unknown_id_without_create_is_key_error(self, io: StoreIO) -> None:
        with pytest.raises(KeyError, match="ghost"):
            await io.write("ghost", make_entries(0, 1), make_snapshot("ghost", 1))
        assert await io.read("ghost") is None

    @scenario
    async def test_long_history_comes_back_whole_and_in_order(self, io: StoreIO) -> None:
        n = self.many_entries
        await io.write("long", make_entries(0, 1), make_snapshot("long", 1), create=True)
        step = max(1, n // 3)
        for start in range(1, n, step):
            stop = min(n, start + step)
            await io.write("long", make_entries(start, stop), make_snapshot("long", stop))
        record = await io.read("long")
        assert record is not None
        assert [e["seq"] for e in sorted(record.entries, key=lambda e: e["seq"])] == list(range(n))
        assert sorted(record.entries, key=lambda e: e["seq"]) == make_entries(0, n)

    @scenario
    async def test_large_and_unicode_entries_round_trip(self, io: StoreIO) -> None:
        state = State("ünïcødé task ✓", id="big")
        state.append(TOOL_RESULT, "x" * 1_000_000, {"call_id": "c", "name": "read"})
        state.append(TOOL_RESULT, '日本語 🎉 \u2028 "quotes" \\ \n newline', {"call_id": "d"})
        await io.save(state)
        loaded = await io.load("big")
        assert [e.text for e in loaded.history] == [e.text for e in state.history]
        assert loaded.task == "ünïcødé task ✓"

    # Separate States -------------------------------------------------------------------

    @scenario
    @needs("list", "delete")
    async def test_ids_sharing_a_prefix_are_separate_states(self, io: StoreIO) -> None:
        ids = ["a", "a-b", "ab", "a_1", "A"]
        for n, state_id in enumerate(ids):
            await io.write(
                state_id,
                make_entries(0, n + 1, state_id),
                make_snapshot(state_id, n + 1),
                create=True,
            )
        for n, state_id in enumerate(ids):
            record = await io.read(state_id)
            assert record is not None
            assert sorted(record.entries, key=lambda e: e["seq"]) == make_entries(
                0, n + 1, state_id
            )
        await io.delete("a")
        assert await io.read("a") is None
        assert {s.id for s in await io.list()} == set(ids) - {"a"}

    # List and delete -------------------------------------------------------------------

    @scenario
    @needs("list")
    async def test_list_is_newest_first_with_summaries(self, io: StoreIO) -> None:
        base = datetime(2026, 1, 1, tzinfo=UTC)
        order = ["middle", "oldest", "newest"]
        times = {
            "oldest": base,
            "middle": base + timedelta(hours=1),
            "newest": base + timedelta(hours=2),
        }
        for state_id in order:
            snapshot = make_snapshot(
                state_id,
                1,
                task=f"task of {state_id}",
                stopped_by="reply",
                updated_at=times[state_id].isoformat(),
            )
            await io.write(state_id, make_entries(0, 1), snapshot, create=True)
        listed = await io.list()
        assert [s.id for s in listed] == ["newest", "middle", "oldest"]
        assert listed[0] == SavedState("newest", "task of newest", times["newest"], "reply")

    @scenario
    @needs("list")
    async def test_list_follows_updates(self, io: StoreIO) -> None:
        one, two = State("one", id="one"), State("two", id="two")
        await io.save(one)
        await io.save(two)
        one.data["touched"] = True
        await io.save(one)
        assert [s.id for s in await io.list()] == ["one", "two"]

    @scenario
    @needs("list", "delete")
    async def test_delete_removes_only_that_state(self, io: StoreIO) -> None:
        for state_id in ("keep", "drop"):
            await io.write(state_id, make_entries(0, 3), make_snapshot(state_id, 3), create=True)
        await io.write("drop", make_entries(3, 4), None)
        await io.delete("drop")
        assert await io.read("drop") is None
        assert [s.id for s in await io.list()] == ["keep"]
        with pytest.raises(KeyError, match="drop"):
            await io.delete("drop")
        # The id is free again.
        await io.write("drop", make_entries(0, 1), make_snapshot("drop", 1), create=True)
        record = await io.read("drop")
        assert record is not None and len(record.entries) == 1

    @scenario
    @needs("delete")
    async def test_every_save_after_a_delete_is_a_not_found_error(self, io: StoreIO) -> None:
        state = State("to be deleted", id="gone", data={"n": 1})
        state.add_user_message("saved")
        await io.save(state)
        copy = await io.load("gone")
        await io.delete("gone")
        # A message and the snapshot; a tool result saved alone; the snapshot alone.
        state.add_user_message("after the delete")
        with pytest.raises(LookupError, match="gone"):
            await io.save(state)
        state.append(TOOL_RESULT, "a result", {"call_id": "c1", "name": "t"})
        with pytest.raises(LookupError, match="gone"):
            await io.save_result(state)
        copy.data["n"] = 2
        with pytest.raises(LookupError, match="gone"):
            await io.save(copy)
        # The same through write: entries alone, the snapshot alone.
        with pytest.raises(LookupError, match="gone"):
            await io.write("gone", make_entries(2, 3), None)
        with pytest.raises(LookupError, match="gone"):
            await io.write("gone", [], make_snapshot("gone", 2))
        assert await io.read("gone") is None
        # Nothing of it came back: the id is free.
        await io.save(State("a new State", id="gone"))
        assert [e.text for e in (await io.load("gone")).history] == ["a new State"]

    @scenario
    @needs("list")
    async def test_list_with_a_limit_gives_the_most_recently_updated(self, io: StoreIO) -> None:
        if not io.takes("list", "limit"):
            pytest.skip(f"{io.method_name('list')} takes no limit= (beyond the contract)")
        base = datetime(2026, 1, 1, tzinfo=UTC)
        for n in (3, 0, 4, 1, 2):
            snapshot = make_snapshot(f"s{n}", 1, updated_at=(base + timedelta(hours=n)).isoformat())
            await io.write(f"s{n}", make_entries(0, 1), snapshot, create=True)
        everything = [s.id for s in await io.list()]
        assert everything == ["s4", "s3", "s2", "s1", "s0"]
        for limit in (0, 1, 3, 5, 9):
            listed = await io.list(limit=limit)
            assert [s.id for s in listed] == everything[:limit], limit
        assert await io.list(limit=None) == await io.list()

    @scenario
    @needs("delete")
    async def test_delete_with_purge_removes_the_state_and_leaves_the_others(
        self, io: StoreIO
    ) -> None:
        if not io.takes("delete", "purge"):
            pytest.skip(f"{io.method_name('delete')} takes no purge= (beyond the contract)")
        for state_id in ("keep", "purged"):
            await io.write(state_id, make_entries(0, 3), make_snapshot(state_id, 3), create=True)
        await io.write("purged", make_entries(3, 4), None)
        await io.write("purged", [], make_snapshot("purged", 4, data={"v": 2}))
        report = await io.delete_with("purged", purge=True)
        if report is not None:
            assert "purged" in str(report), report
        assert await io.read("purged") is None
        with pytest.raises(LookupError, match="purged"):
            await io.write("purged", make_entries(4, 5), None)
        record = await io.read("keep")
        assert record is not None and len(record.entries) == 3
        with pytest.raises(KeyError, match="purged"):
            await io.delete_with("purged", purge=True)
        await io.write("purged", make_entries(0, 1), make_snapshot("purged", 1), create=True)
        again = await io.read("purged")
        assert again is not None and len(again.entries) == 1

    # Whole States ----------------------------------------------------------------------

    @scenario
    async def test_state_round_trip_through_load(self, io: StoreIO) -> None:
        state = State("Review pull request 42", id="review-pr-42", data={"pr": 42, "t": (1, 2)})
        state.append(MODEL, "looking", {"content": [{"type": "text", "text": "looking"}]})
        state.add_user_message("thanks")
        state.stopped_by = "reply"
        state.answer = {"ok": True}
        assert await io.save(state) is True
        assert await io.save(state) is False  # nothing changed, nothing written
        loaded = await io.load("review-pr-42")
        assert loaded.id == state.id and loaded.task == state.task
        assert loaded.history == state.history
        assert loaded.data == {"pr": 42, "t": [1, 2]}
        assert (loaded.stopped_by, loaded.answer) == ("reply", {"ok": True})
        assert loaded.updated_at == state.updated_at
        with pytest.raises(ValueError, match="saved in"):  # a loaded State is saved there
            await StoreIO(_Scratch(), io.mode).save(loaded)
        loaded.add_user_message("one more")
        assert await io.save(loaded) is True
        again = await io.load("review-pr-42")
        assert [e.text for e in again.history][-2:] == ["thanks", "one more"]

    @scenario
    async def test_changes_to_a_loaded_state_are_saved(self, io: StoreIO) -> None:
        state = State("t", id="changes", data={"n": 1, "nested": {"l": [1]}})
        state.answer = {"a": [1]}
        await io.save(state)
        loaded = await io.load("changes")
        loaded.data["n"] = 2  # data alone: no new history entry
        loaded.data["nested"]["l"].append(2)
        assert await io.save(loaded) is True
        again = await io.load("changes")
        assert again.data == {"n": 2, "nested": {"l": [1, 2]}}
        again.answer["a"].append(2)
        assert await io.save(again) is True
        assert (await io.load("changes")).answer == {"a": [1, 2]}

    @scenario
    async def test_get_starts_or_continues_a_state_by_id(self, io: StoreIO) -> None:
        assert await io.get("unknown-yet") is None
        with pytest.raises(ValueError, match="invalid State id"):
            await io.get("not/an/id")
        await io.save(State("first message", id="unknown-yet"))
        state = await io.get("unknown-yet")
        assert state is not None and state.task == "first message"
        state.add_user_message("second message")
        assert await io.save(state) is True  # a State get returns is saved in this store
        assert [e.text for e in (await io.load("unknown-yet")).history] == [
            "first message",
            "second message",
        ]

    @scenario
    async def test_new_state_with_a_saved_id_is_refused(self, io: StoreIO) -> None:
        await io.save(State("first", id="same"))
        second = State("second", id="same")
        with pytest.raises(ValueError, match="same"):
            await io.save(second)
        assert (await io.load("same")).task == "first"
        # Nothing of the refused State counts as saved: another store takes it as new.
        scratch = _Scratch()
        assert await StoreIO(scratch, io.mode).save(second) is True
        assert scratch.writes == [("same", [0], True)]
