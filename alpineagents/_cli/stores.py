"""How the commands of ``alpineagents`` open a store.

From a path or URL (a refused one is a usage error), checked to be a folder where one is
needed; an async-only store is driven through the sync API on one event loop of its own.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import inspect
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from alpineagents._cli.redact import shown
from alpineagents._cli.status import (
    EXIT_NOT_FOUND,
    EXIT_USAGE,
    CommandError,
)
from alpineagents.filestore import FileStore
from alpineagents.store import Record, SavedState, Store, open_store


class _SyncOver(Store):
    """The sync methods of an async-only store, each run to completion on one event loop."""

    def __init__(self, inner: Store):
        self.inner = inner
        self._runner = asyncio.Runner()

    def __repr__(self) -> str:
        return repr(self.inner)

    def __eq__(self, other: object) -> bool:
        return self.inner == (other.inner if isinstance(other, _SyncOver) else other)

    def __hash__(self) -> int:
        return hash(self.inner)

    def write(
        self,
        state_id: str,
        entries: Sequence[dict[str, Any]],
        snapshot: dict[str, Any] | None,
        *,
        create: bool = False,
    ) -> None:
        self._runner.run(self.inner.awrite(state_id, entries, snapshot, create=create))

    def read(self, state_id: str) -> Record | None:
        return self._runner.run(self.inner.aread(state_id))

    def list(self, *, limit: int | None = None) -> builtins.list[SavedState]:
        if limit is not None and takes(self.inner.alist, "limit"):
            return self._runner.run(self.inner.alist(limit=limit))  # type: ignore[call-arg]
        listed = self._runner.run(self.inner.alist())
        return listed if limit is None else listed[:limit]

    def delete(  # type: ignore[override]  # returns what the store's adelete returns
        self, state_id: str, *, purge: bool = False
    ) -> object:
        if purge:
            return self._runner.run(self.inner.adelete(state_id, purge=True))  # type: ignore[call-arg]
        result: object = self._runner.run(self.inner.adelete(state_id))
        return result

    def run(self, awaitable: Any) -> Any:
        """Run a coroutine of the inner store (its ``doctor()``, say) on this loop."""
        return self._runner.run(awaitable)

    def close(self) -> None:
        try:
            self._runner.run(self.inner.aclose())
        finally:
            self._runner.close()


def takes(method: Callable[..., Any], keyword: str) -> bool:
    """Whether a store's method takes ``keyword`` (``limit``, ``purge``), beyond the contract."""
    try:
        return keyword in inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False


def _open(url: str) -> Store:
    """``open_store(url)``; a URL or path it refuses (``ValueError``) is a usage error."""
    if not url.strip() or url.strip() in ("file://", "file:"):
        raise CommandError("no store given: a store is a folder path or a URL", EXIT_USAGE)
    if "\0" in url:
        raise CommandError(f"{url!r} holds a NUL character: not a path or URL", EXIT_USAGE)
    try:
        return open_store(url)
    except ValueError as e:
        message = str(e)
        if url not in message:
            message = f"{url!r} is not a store this can open: {message}"
        raise CommandError(message, EXIT_USAGE) from e


@contextlib.contextmanager
def opened(url: str, *, must_exist: bool) -> Iterator[Store]:
    """Open the store at ``url`` for the sync API; ``must_exist``: a source, not a target."""
    store = _open(url)
    if isinstance(store, FileStore):
        if store.path.exists() and not store.path.is_dir():
            raise CommandError(f"{store.path} is a file, not a store folder", EXIT_USAGE)
        if must_exist and not store.path.is_dir():
            raise CommandError(
                f"no store folder {str(store.path)!r}: check the path (it must exist)",
                EXIT_NOT_FOUND,
            )
    if store.is_async_only:
        store = _SyncOver(store)
    try:
        yield store
    finally:
        store.close()


def _not_found(state_id: str, store: Store, url: str) -> CommandError:
    return CommandError(
        f"no saved State with id {state_id!r} in {shown(store)}: see `alpineagents ls {url}`",
        EXIT_NOT_FOUND,
    )
