"""The store conformance suite on FileStore and on stores written as a user would."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from alpineagents import FileStore, State, Store
from alpineagents.testing import StoreConformance
from tests.helpers import AsyncMemoryStore, MemoryStore


class TestFileStore(StoreConformance):
    @pytest.fixture
    def store(self, tmp_path: Path) -> Store:
        return FileStore(tmp_path / "runs")


class TestMemoryStore(StoreConformance):
    @pytest.fixture
    def store(self) -> Store:
        return MemoryStore()


class TestAsyncOnlyMemoryStore(StoreConformance):
    # No `modes` setting: the suite sees the store is async-only and skips the sync tests.
    @pytest.fixture
    def store(self) -> Store:
        return AsyncMemoryStore()


def test_async_only_store_refuses_sync_calls_with_advice() -> None:
    store = AsyncMemoryStore()
    with pytest.raises(TypeError, match=r"async-only.*await agent\.arun\(state\)"):
        store.load("x")
    with pytest.raises(TypeError, match="async-only"):
        store.write("x", [], None)
    assert store.is_async_only and not MemoryStore().is_async_only


def test_store_without_methods_says_what_is_missing() -> None:
    class Empty(Store):
        pass

    with pytest.raises(NotImplementedError, match=r"Empty does not implement read\(\) or aread"):
        Empty().read("x")
    with pytest.raises(NotImplementedError, match="list"):
        Empty().list()


BROKEN_STORES = {
    # Appends entries it already has: the history comes back with seqs twice.
    "does_not_skip_known_seqs": """
        def write(self, state_id, entries, snapshot, *, create=False):
            with self._lock:
                if create and state_id in self._states:
                    raise ValueError(state_id)
                saved, old = self._states.setdefault(state_id, ([], snapshot))
                saved.extend(entries)
                self._states[state_id] = (saved, snapshot or old)

        def read(self, state_id):
            if state_id not in self._states:
                return None
            saved, snapshot = self._states[state_id]
            return Record(list(saved), snapshot)
    """,
    # Overwrites a State when a new one is created with its id.
    "create_overwrites": """
        def write(self, state_id, entries, snapshot, *, create=False):
            if create:
                self._states.pop(state_id, None)
            if not create and state_id not in self._states:
                raise KeyError(state_id)
            saved, old = self._states.setdefault(state_id, ({}, snapshot))
            for e in entries:
                saved.setdefault(e["seq"], e)
            self._states[state_id] = (saved, snapshot or old)
    """,
    # Takes new entries of an id it does not have without an error, and keeps none of them
    # (a tool result saved after a delete was lost without a word).
    "entries_after_a_delete_dropped_quietly": """
        def write(self, state_id, entries, snapshot, *, create=False):
            if not create and snapshot is None and state_id not in self._states:
                return
            MemoryStore.write(self, state_id, entries, snapshot, create=create)
    """,
    # Takes limit= and lists every State all the same.
    "list_ignores_its_limit": """
        def list(self, *, limit=None):
            return MemoryStore.list(self)

        async def alist(self, *, limit=None):
            return self.list(limit=limit)
    """,
    # Takes purge= and, purging, removes nothing.
    "purge_removes_nothing": """
        def delete(self, state_id, *, purge=False):
            if not purge:
                return MemoryStore.delete(self, state_id)
            if state_id not in self._states:
                raise KeyError(state_id)

        async def adelete(self, state_id, *, purge=False):
            return self.delete(state_id, purge=purge)
    """,
    # Lists oldest first.
    "lists_oldest_first": """
        def list(self):
            return list(reversed(MemoryStore.list(self)))
    """,
}


@pytest.mark.parametrize("flaw", sorted(BROKEN_STORES))
def test_suite_fails_on_a_store_that_breaks_the_contract(
    pytester: pytest.Pytester, flaw: str
) -> None:
    body = textwrap.indent(textwrap.dedent(BROKEN_STORES[flaw]), "    ")
    pytester.makepyfile(
        test_broken=f"""
import pytest
from alpineagents.store import Record
from alpineagents.testing import StoreConformance
from tests.helpers import MemoryStore

class Broken(MemoryStore):
{body}

class TestBroken(StoreConformance):
    many_entries = 20

    @pytest.fixture
    def store(self):
        return Broken()
"""
    )
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-q")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) >= 2, result.stdout.str()  # in both modes
    assert outcomes.get("passed", 0) > 0


def test_suite_skips_what_a_store_does_not_support(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_partial="""
import pytest
from alpineagents import Store
from alpineagents.testing import StoreConformance
from tests.helpers import MemoryStore

class ReadWriteOnly(Store):  # no list, no delete
    def __init__(self):
        self._inner = MemoryStore()

    def write(self, state_id, entries, snapshot, *, create=False):
        self._inner.write(state_id, entries, snapshot, create=create)

    def read(self, state_id):
        return self._inner.read(state_id)

class AsyncOnly(Store):
    def __init__(self):
        self._inner = MemoryStore()

    async def awrite(self, state_id, entries, snapshot, *, create=False):
        self._inner.write(state_id, entries, snapshot, create=create)

    async def aread(self, state_id):
        return self._inner.read(state_id)

class TestReadWriteOnly(StoreConformance):
    many_entries = 20
    concurrent_create = False

    @pytest.fixture
    def store(self):
        return ReadWriteOnly()

class TestAsyncOnly(StoreConformance):
    many_entries = 20

    @pytest.fixture
    def store(self):
        return AsyncOnly()
"""
    )
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-q", "-rs")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0, result.stdout.str()
    out = result.stdout.str()
    assert "ReadWriteOnly implements neither list() nor alist()" in out
    assert "concurrent_create = False" in out
    assert "AsyncOnly is async-only: it has no sync API to test" in out
    assert "ReadWriteOnly implements neither delete() nor adelete()" in out
    # ReadWriteOnly: the 8 list/delete tests and the race, in both modes. AsyncOnly: every
    # sync test, and the 8 list/delete tests in async mode.
    suite = len([name for name in dir(StoreConformance) if name.startswith("test_")])
    assert outcomes["skipped"] == (8 + 1) * 2 + suite + 8, out
    assert outcomes["passed"] == (suite - 9) * 2 + (suite - 8), out


def test_saving_a_state_in_a_second_store_is_refused(tmp_path: Path) -> None:
    state = State("task")
    FileStore(tmp_path / "a").save(state)
    with pytest.raises(ValueError, match="saved in FileStore"):
        FileStore(tmp_path / "b").save(state)
    # Two FileStore objects for the same folder are the same store.
    state.add_user_message("more")
    assert FileStore(tmp_path / "a").save(state) is True
    assert FileStore(tmp_path / "a") == FileStore(str(tmp_path / "x" / ".." / "a"))
    assert hash(FileStore(tmp_path / "a")) == hash(FileStore(tmp_path / "a"))
