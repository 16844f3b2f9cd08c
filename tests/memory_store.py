"""A small in-memory store, written the way a user would, to prove the suite is reusable."""

from __future__ import annotations

import copy
import threading
from collections.abc import Sequence
from typing import Any

from alpineagents import SavedState, Store
from alpineagents.store import Record


class MemoryStore(Store):
    def __init__(self) -> None:
        self._states: dict[str, tuple[dict[int, dict[str, Any]], dict[str, Any]]] = {}
        self._lock = threading.Lock()

    def write(
        self,
        state_id: str,
        entries: Sequence[dict[str, Any]],
        snapshot: dict[str, Any] | None,
        *,
        create: bool = False,
    ) -> None:
        with self._lock:
            if create:
                if state_id in self._states:
                    raise ValueError(f"id {state_id!r} is taken")
                assert snapshot is not None
                self._states[state_id] = (
                    {e["seq"]: copy.deepcopy(e) for e in entries},
                    copy.deepcopy(snapshot),
                )
                return
            if state_id not in self._states:
                raise KeyError(state_id)
            saved, old = self._states[state_id]
            for entry in entries:
                saved.setdefault(entry["seq"], copy.deepcopy(entry))
            if snapshot is not None:
                self._states[state_id] = (saved, copy.deepcopy(snapshot))

    def read(self, state_id: str) -> Record | None:
        with self._lock:
            if state_id not in self._states:
                return None
            saved, snapshot = self._states[state_id]
            return Record(
                [copy.deepcopy(e) for _, e in sorted(saved.items())], copy.deepcopy(snapshot)
            )

    def list(self) -> list[SavedState]:
        with self._lock:
            found = [SavedState.from_snapshot(i, s) for i, (_, s) in self._states.items()]
        return sorted(found, key=lambda s: s.updated_at, reverse=True)

    def delete(self, state_id: str) -> None:
        with self._lock:
            del self._states[state_id]


class AsyncMemoryStore(Store):
    """The same store reached only asynchronously."""

    def __init__(self) -> None:
        self._inner = MemoryStore()

    async def awrite(
        self,
        state_id: str,
        entries: Sequence[dict[str, Any]],
        snapshot: dict[str, Any] | None,
        *,
        create: bool = False,
    ) -> None:
        self._inner.write(state_id, entries, snapshot, create=create)

    async def aread(self, state_id: str) -> Record | None:
        return self._inner.read(state_id)

    async def alist(self) -> list[SavedState]:
        return self._inner.list()

    async def adelete(self, state_id: str) -> None:
        self._inner.delete(state_id)
