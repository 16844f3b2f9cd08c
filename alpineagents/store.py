"""The Store contract: where States are kept between processes.

A store knows four operations on (state id, entry dicts, snapshot dict) and nothing of the
Agent, the model or State internals. Implement the sync methods (``write``, ``read`` and
optionally ``list``, ``delete``) or their async twins (``awrite``, ``aread``, ``alist``,
``adelete``); each side defaults to the other where that is possible:

* the async methods of a sync store run the sync method on a worker thread;
* the sync methods of an async-only store refuse with a message that says to use ``arun``.

``load`` and ``aload`` are built on ``read`` (and ``get``/``aget``, which answer ``None`` for
an unknown id, on them), and ``save`` and ``asave`` on ``write``: a save
writes what the store lacks of a State, a load rebuilds the State and applies the resume
policy (what a State does with the steps that were running when its process stopped).
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from importlib import import_module
from importlib.metadata import entry_points
from types import TracebackType
from typing import Any, Self
from urllib.parse import urlsplit

from alpineagents import _saving
from alpineagents._resume import continue_loaded
from alpineagents._serialize import SCHEMA_VERSION as SCHEMA_VERSION
from alpineagents._serialize import DamagedStateError
from alpineagents._serialize import check_stored as check_stored
from alpineagents.errors import CorruptStateError, StateNotFoundError, StoreError
from alpineagents.state import State, validate_id

__all__ = [
    "Record",
    "SavedState",
    "Store",
    "open_store",
]

# Not part of the Store contract: the serialiser's helpers stay importable from here only
# while this repository's S3 plugin still imports them from this module (it is moving to its
# own copies); new code must not use them.
from alpineagents._serialize import dumps as dumps
from alpineagents._serialize import loads as loads
from alpineagents._serialize import same_snapshot as same_snapshot


@dataclass(frozen=True)
class Record:
    """What a store read for one State: its history entries and its snapshot.

    Attributes:
        entries: History entries as dicts, each with ``seq``; any order.
        snapshot: The rest of the State, as the last write left it.
    """

    entries: Sequence[dict[str, Any]]
    snapshot: dict[str, Any]


@dataclass(frozen=True)
class SavedState:
    """One saved State as ``Store.list()`` reports it."""

    id: str
    task: str
    updated_at: datetime
    stopped_by: str | None

    @classmethod
    def from_snapshot(cls, state_id: str, snapshot: Any, where: str = "") -> SavedState:
        """Summarise a snapshot without loading the State's history.

        Raises ``CorruptStateError`` or ``SchemaVersionError`` for a snapshot this version
        cannot read; ``where`` names it (a path, a bucket and key) in the message.
        """
        where = where or f"the snapshot of State {state_id!r}"
        snapshot = check_stored(snapshot, where)
        try:
            updated_at = datetime.fromisoformat(snapshot["updated_at"])
            task = snapshot["task"]
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptStateError(f"{where} is not an alpineagents snapshot: {e!r}") from e
        if updated_at.tzinfo is None or not isinstance(task, str):
            raise CorruptStateError(f"{where} is not an alpineagents snapshot")
        return cls(
            id=state_id, task=task, updated_at=updated_at, stopped_by=snapshot.get("stopped_by")
        )


class Store:
    """Base class of every store. Subclass it and implement the sync or the async methods.

    ``write(state_id, entries, snapshot, create=...)``:
        ``entries`` are history entries as dicts, each with ``seq``, its position in history.
        Skip entries whose seq you already have: after a failed write, the Agent sends them
        again. ``snapshot`` is a dict with the rest of the State, or ``None`` to keep the
        current one. ``create=True`` is the first write of a new State: refuse an id you
        already have with ``ValueError``, and write all of it or nothing. A write without
        ``create`` for an id you do not have raises ``KeyError``.
    ``read(state_id)``:
        Return ``Record(entries, snapshot)``, or ``None`` when the id is unknown.
    ``list()``:
        Return ``SavedState`` summaries, most recently updated first.
    ``delete(state_id)``:
        Remove everything of the State; ``KeyError`` when the id is unknown.

    Stores are compared with ``==``: two store objects that keep States in the same place are
    the same store. Override ``__eq__`` and ``__hash__`` where that is not object identity.
    """

    # The sync methods ------------------------------------------------------------------

    def write(
        self,
        state_id: str,
        entries: Sequence[dict[str, Any]],
        snapshot: dict[str, Any] | None,
        *,
        create: bool = False,
    ) -> None:
        """Add the entries the store lacks, then replace the snapshot (unless ``None``)."""
        raise self._missing("write")

    def read(self, state_id: str) -> Record | None:
        """Return everything saved of one State, or ``None`` if the store has no such id."""
        raise self._missing("read")

    def list(self) -> builtins.list[SavedState]:
        """The saved States, most recently updated first."""
        raise self._missing("list")

    def delete(self, state_id: str) -> None:
        """Remove a saved State; ``KeyError`` if there is none with that id."""
        raise self._missing("delete")

    def close(self) -> None:
        """Release the store's connections. The base store holds none."""

    # The async twins -------------------------------------------------------------------

    async def awrite(
        self,
        state_id: str,
        entries: Sequence[dict[str, Any]],
        snapshot: dict[str, Any] | None,
        *,
        create: bool = False,
    ) -> None:
        """Async ``write``; by default the sync method, run on a worker thread."""
        self._require_sync("awrite", "write")
        await asyncio.to_thread(self.write, state_id, entries, snapshot, create=create)

    async def aread(self, state_id: str) -> Record | None:
        """Async ``read``; by default the sync method, run on a worker thread."""
        self._require_sync("aread", "read")
        return await asyncio.to_thread(self.read, state_id)

    async def alist(self) -> builtins.list[SavedState]:
        """Async ``list``; by default the sync method, run on a worker thread."""
        self._require_sync("alist", "list")
        return await asyncio.to_thread(self.list)

    async def adelete(self, state_id: str) -> None:
        """Async ``delete``; by default the sync method, run on a worker thread."""
        self._require_sync("adelete", "delete")
        await asyncio.to_thread(self.delete, state_id)

    async def aclose(self) -> None:
        """Async ``close``; by default the sync method."""
        self.close()

    # Built on read and write ---------------------------------------------------------

    def load(self, state_id: str) -> State:
        """Rebuild a saved State, ready to run again. ``KeyError`` if the id is unknown.

        Steps that were running when the State's process stopped are settled as the user
        guide says: a tool call without a saved result gets the "(unknown: …)" result, and
        saved steps that cannot be replayed leave the context with a notice.
        """
        validate_id(state_id)
        return self._loaded(state_id, self.read(state_id))

    async def aload(self, state_id: str) -> State:
        """Async ``load``."""
        validate_id(state_id)
        return self._loaded(state_id, await self.aread(state_id))

    def get(self, state_id: str) -> State | None:
        """Like ``load``, but ``None`` when the store has no State with this id.

        The way to start or continue a conversation by id::

            state = store.get(conversation_id)
            if state is None:
                state = State(message, id=conversation_id)
            else:
                state.add_user_message(message)
        """
        try:
            return self.load(state_id)  # a store's own load (and its error notes) applies
        except StateNotFoundError:
            return None

    async def aget(self, state_id: str) -> State | None:
        """Async ``get``."""
        try:
            return await self.aload(state_id)
        except StateNotFoundError:
            return None

    def save(self, state: State) -> bool:
        """Write everything of ``state`` this store does not have yet; whether anything was.

        Nothing is written when nothing changed. Raises ``ValueError`` for a State saved in
        another store, or for a new State whose id this store already has, and ``TypeError``
        naming the path of a value in ``state.data`` (or the answer) that JSON cannot hold.
        """
        return _saving.save(self, state)

    async def asave(self, state: State) -> bool:
        """Async ``save``."""
        return await _saving.asave(self, state)

    def _loaded(self, state_id: str, record: Record | None) -> State:
        if record is None:
            raise StateNotFoundError(f"no saved State with id {state_id!r} in {self!r}")
        try:
            state, covered = _saving.restore(
                self, state_id, list(record.entries), record.snapshot, self._state_place(state_id)
            )
            continue_loaded(state, covered)
        except DamagedStateError as e:
            # The rebuild named the entry (or the snapshot) and the field; name the store too.
            error = CorruptStateError(f"{self._state_place(state_id)}, {e.detail}")
            raise error.with_traceback(e.__traceback__) from None
        except StoreError:
            raise
        except (TypeError, ValueError, KeyError, AttributeError) as e:
            # A field of the wrong type or shape: the stored State is damaged, whatever failed.
            raise CorruptStateError(
                f"{self._state_place(state_id)} cannot be rebuilt from what is stored: "
                f"{type(e).__name__}: {e}"
            ) from e
        return state

    def _state_place(self, state_id: str) -> str:
        """How an error of a load names the State: ``State 'x' in <the store's repr>``.

        A store whose States have a place of their own (a folder) adds it.
        """
        return f"State {state_id!r} in {self!r}"

    # Sync/async defaults ---------------------------------------------------------------

    @property
    def is_async_only(self) -> bool:
        """Whether the store implements only the async methods (it then needs ``arun``)."""
        return self._overrides("awrite") and not self._overrides("write")

    def _overrides(self, name: str) -> bool:
        return getattr(type(self), name) is not getattr(Store, name)

    def _missing(self, name: str) -> Exception:
        twin = "a" + name
        if self._overrides(twin):
            return TypeError(
                f"{type(self).__name__} is an async-only store: it implements {twin}() but not "
                f"{name}(). Use the async API instead: `await agent.arun(state)`, "
                f"`await store.{twin}(...)`, `await store.aload(id)`"
            )
        return NotImplementedError(f"{type(self).__name__} does not implement {name}() or {twin}()")

    def _require_sync(self, name: str, sync_name: str) -> None:
        if not self._overrides(sync_name):
            raise NotImplementedError(
                f"{type(self).__name__} does not implement {sync_name}() or {name}()"
            )

    # Context managers ------------------------------------------------------------------

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


# Opening a store by URL -------------------------------------------------------------------

ENTRY_POINT_GROUP = "alpineagents.stores"

# Stores that come with alpineagents, by scheme, as "module:class": imported when a URL
# names them, so this module does not import its own subclasses.
_BUILTIN_SCHEMES: dict[str, str] = {
    "": "alpineagents.filestore:FileStore",
    "file": "alpineagents.filestore:FileStore",
}

# Schemes whose store is a distribution of its own: how to install it.
_KNOWN_SCHEMES: dict[str, str] = {
    "s3": "pip install alpineagents-s3 (from a checkout of this repository: "
    "pip install ./packaging/alpineagents-s3)"
}


def open_store(url: str, **options: Any) -> Store:
    """Open a store from a URL.

    A folder path or ``file://…`` gives a FileStore; other schemes (``s3://bucket/prefix``)
    are found through the ``alpineagents.stores`` entry points. The store class of a
    scheme must have a ``from_url(url, **options)`` class method.
    """
    scheme = urlsplit(url).scheme
    builtin = _BUILTIN_SCHEMES.get(scheme)
    if builtin is not None:
        module, name = builtin.split(":")
        store_class = getattr(import_module(module), name)
        built: Store = store_class(url.removeprefix("file://"), **options)
        return built
    found = entry_points(group=ENTRY_POINT_GROUP, name=scheme)
    if not found:
        hint = _KNOWN_SCHEMES.get(scheme)
        extra = f": install it with {hint}" if hint else ""
        raise ValueError(f"no store is registered for the scheme {scheme!r} of {url!r}{extra}")
    store_class = next(iter(found)).load()
    store = store_class.from_url(url, **options)
    if not isinstance(store, Store):
        raise TypeError(f"the store registered for {scheme!r} is not a Store: {store!r}")
    return store
