"""FileStore's deletes and the leftovers of killed processes.

A delete renames the State's folder to a hidden ``.<id>.<hex>.deleted`` at once, then removes
it; a killed create leaves ``.<id>.<hex>.new`` and a killed snapshot write
``<id>/.snapshot.json.<hex>.tmp``. Each is written while its writer holds the lock of the folder
it is in, so a sweep removes one only when that lock is free: its writer is gone.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import os
import re
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Final

from alpineagents._filestore.base import _DIRECTORY, _NOFOLLOW, _Base, _fsync_dir, _remove_tree
from alpineagents.errors import (
    StateNotFoundError,
)

logger = logging.getLogger("alpineagents.filestore")

# Without a lock to ask (no fcntl, or a file system that refuses flock), a leftover is taken
# for abandoned only when its folder has not changed for this many seconds.
UNLOCKED_LEFTOVER_AGE = 3600.0


_LEFTOVER_SUFFIXES = (".new", ".deleted")


_LEFTOVER: Final = re.compile(r"\.([A-Za-z0-9_-]{1,128})\.[0-9a-f]{12}\.(?:new|deleted)")


@dataclass(frozen=True)
class Deleted:
    """What :meth:`FileStore.delete` removed of one State.

    Attributes:
        state_id: The State's id.
        files: Files removed: the State's own and those of its leftover folders.
        leftovers: Leftover folders of the State removed (of killed creates and deletes; with
            ``purge=True`` also of ones that were still being written).
        purged: Whether it was a purge.
    """

    state_id: str
    files: int
    leftovers: int
    purged: bool = False

    def __str__(self) -> str:
        files = f"{self.files} file{'' if self.files == 1 else 's'}"
        folders = f"{self.leftovers} leftover folder{'' if self.leftovers == 1 else 's'}"
        how = "purged" if self.purged else "removed"
        return f"{how} State {self.state_id!r}: {files}, {folders}"


class _Leftovers(_Base):
    """Deleting States, and sweeping what killed processes left."""

    def sweep(self) -> list[Path]:
        """Remove what killed processes left behind; the paths removed.

        That is: the hidden ``.<id>.<hex>.new`` folders of creates and ``.<id>.<hex>.deleted``
        folders of deletes (which hold whole deleted States), and ``.snapshot.json.<hex>.tmp``
        files in State folders. A leftover is removed only when the lock its writer held is
        free, so never while that writer is alive; without locks (Windows, a file system that
        refuses ``flock``) only when unchanged for ``UNLOCKED_LEFTOVER_AGE`` seconds. The store
        runs the first part (the hidden folders) by itself, once per store object at its first
        write and after every ``delete``; call this for the rest, for example from a cron job.
        """
        removed = self._sweep_top(quiet=False)
        for name in self._names():
            if name.startswith("."):
                continue
            folder = self.path / name
            try:
                names = os.listdir(folder)
            except (FileNotFoundError, NotADirectoryError):
                continue
            temps = [n for n in names if n.startswith(".") and n.endswith(".tmp")]
            if temps and self._abandoned(folder, partial(_remove_files, folder, temps)):
                removed += [folder / n for n in temps]
        return removed

    def _sweep_top(self, *, quiet: bool) -> list[Path]:
        """Remove the abandoned ``.new`` and ``.deleted`` folders under the store's path."""
        removed = []
        try:
            for name in self._names():
                if name.startswith(".") and name.endswith(_LEFTOVER_SUFFIXES):
                    path = self.path / name
                    if self._abandoned(path, partial(_remove_tree, path)):
                        logger.info("removed %s, left by a killed process", path)
                        removed.append(path)
        except OSError as e:
            if not quiet:
                raise
            logger.warning("could not sweep %s: %s", self.path, e)
        return removed

    def _abandoned(self, folder: Path, remove: Callable[[], object]) -> bool:
        """Call ``remove()`` while holding the free lock of ``folder``; whether it ran."""
        if sys.platform == "win32":  # no folder locks: by age alone
            try:
                age = time.time() - os.stat(folder).st_mtime
            except FileNotFoundError:
                return False
            if age < UNLOCKED_LEFTOVER_AGE:
                return False
            remove()
            return True
        try:
            fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        except (FileNotFoundError, NotADirectoryError):
            return False
        try:
            locked = self._lock(fd, folder, exclusive=True, wait=False)
            if locked is False:
                return False  # its writer is alive
            if locked is None and time.time() - os.fstat(fd).st_mtime < UNLOCKED_LEFTOVER_AGE:
                return False
            try:
                now, held = os.stat(folder), os.fstat(fd)
            except FileNotFoundError:
                return False  # removed by its writer meanwhile
            if (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino):
                return False
            remove()
            return True
        finally:
            os.close(fd)

    def delete(  # type: ignore[override]  # the contract's delete returns None; this says what it removed
        self, state_id: str, *, purge: bool = False
    ) -> Deleted:
        """Remove a State's folder; ``KeyError`` if there is none. Returns what it removed.

        Waits for a write of the State in progress; a later save of it raises ``KeyError``
        (``StateNotFoundError``). Then sweeps the leftovers of killed creates and deletes
        whose writer is gone.

        ``purge=True`` also removes every leftover of this State, waiting for the writer of
        one that is alive: when it returns, nothing of the State is left under the store's
        path (the hidden ``.<id>.<hex>.new`` and ``.<id>.<hex>.deleted`` folders included).
        A purge of an id whose folder is gone but whose leftovers are not (a delete killed
        halfway) removes them; ``KeyError`` only when there is nothing of it at all. The file
        system may keep the bytes of removed files on disk until it reuses them.
        """
        folder = self._folder(state_id)
        files = 0
        found = True
        with self._errors(state_id):
            try:
                with self._locked(folder, state_id, exclusive=True):
                    trash = self.path / f".{state_id}.{uuid.uuid4().hex[:12]}.deleted"
                    os.rename(folder, trash)  # atomic: the State is gone at once, whole
                    self._seen.pop(state_id, None)
                    files += _remove_tree(trash)  # still locked: a sweep leaves it to this process
            except StateNotFoundError:
                if not purge:
                    raise
                found = False
            leftovers = 0
            if purge:
                for path in self._leftovers_of(state_id):
                    removed = self._remove_when_free(path)
                    if removed is not None:
                        files, leftovers = files + removed, leftovers + 1
                if self.fsync:
                    _fsync_dir(self.path)
        swept = [p for p in self._sweep_top(quiet=True) if _leftover_id(p.name) == state_id]
        leftovers += len(swept)
        if not found and not leftovers:
            raise StateNotFoundError(f"no saved State with id {state_id!r} in {self!r}")
        report = Deleted(state_id, files, leftovers, purge)
        logger.info("%s from %r", report, self)
        return report

    async def adelete(  # type: ignore[override]  # as delete: returns what it removed
        self, state_id: str, *, purge: bool = False
    ) -> Deleted:
        """Async ``delete``, on a worker thread."""
        return await asyncio.to_thread(self.delete, state_id, purge=purge)

    def _leftovers_of(self, state_id: str) -> builtins.list[Path]:
        """The hidden folders of creates and deletes of ``state_id``, alive or killed."""
        return [self.path / name for name in self._names() if _leftover_id(name) == state_id]

    def _remove_when_free(self, path: Path) -> int | None:
        """Remove a leftover folder once its writer's lock is free: files removed, or None.

        None when it is gone by then (its writer renamed or removed it).
        """
        try:
            fd = os.open(path, os.O_RDONLY | _DIRECTORY | _NOFOLLOW)
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            self._lock(fd, path, exclusive=True, wait=True)
            try:
                now, held = os.stat(path), os.fstat(fd)
            except FileNotFoundError:
                return None
            if (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino):
                return None
            return _remove_tree(path)
        finally:
            os.close(fd)


def _leftover_id(name: str) -> str | None:
    """The State id of a leftover folder's name (``.<id>.<hex>.new``), or None."""
    found = _LEFTOVER.fullmatch(name)
    return found[1] if found else None


def _remove_files(folder: Path, names: Sequence[str]) -> None:
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(folder / name)
