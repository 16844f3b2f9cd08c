"""FileStore: States in a local folder, one folder each.

Layout under the store's path::

    <id>/entries.jsonl   history entries, one JSON line each, only ever appended
    <id>/snapshot.json   the rest of the State, replaced atomically (temp file + os.replace)

A process killed while appending can leave a torn last line; it has no newline, is dropped
when read and cut off before the next append. A new State is written in a hidden folder and
renamed into place, so creating it is all or nothing and exclusive between processes.

A save whose snapshot is byte for byte the one on disk does not replace it.

Files are ``0600`` and folders ``0700`` whatever the umask (the folders it makes above the
store's path too): history holds tool results and messages.

Two writers. Every write holds an advisory lock (``flock``) on the State's folder itself, and
reads hold it shared, so a write sees the folder as no other write leaves it halfway. Before
it writes a byte, a write checks it against its basis, with one rule (``FileStore._check``):

    A write may go on only if the snapshot on disk is one its writer last saw (saved or
    loaded) or tried to write, the folder holds at least the entries its writer knows are
    saved, and every entry on disk from there on is one the write sends again, the same.

Anything else refuses the write with ``ConcurrentWriteError``, before a byte is written. The
basis (:class:`_Basis`) is the copy's: a save of a State (``store.save``, the Agent's saves)
writes with what that copy of the State last saw (:func:`alpineagents._saving.basis`), so
the check follows the copy's own history, whichever FileStore object for the folder writes
it. A write made through the Store API directly (``write()``, with no State behind it) has
what this store object last wrote or read of the State (its :class:`_Seen`), or, the first
time, what is on disk. Where ``fcntl`` is missing (Windows) writes are not locked: the check
still refuses a stale writer, but two writes racing at the same instant are not told apart.

Leftovers. A killed create leaves ``.<id>.<hex>.new``, a killed delete ``.<id>.<hex>.deleted``
(with the deleted State in it) and a killed snapshot write ``<id>/.snapshot.json.<hex>.tmp``.
Each is written while its writer holds the lock of the folder it is in, so
:meth:`FileStore.sweep` removes one only when that lock is free: its writer is gone.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO, Final

import pydantic_core

from alpineagents import _saving
from alpineagents._gc import paused
from alpineagents._serialize import check_stored, dumps, loads
from alpineagents.errors import (
    ConcurrentWriteError,
    CorruptStateError,
    NotJSONError,
    SchemaVersionError,
    StateExistsError,
    StateNotFoundError,
    StoreError,
    StorePermissionError,
)
from alpineagents.state import validate_id
from alpineagents.store import Record, SavedState, Store

if sys.platform != "win32":
    import fcntl

__all__ = ["Check", "Deleted", "FileStore"]

logger = logging.getLogger(__name__)

ENTRIES = "entries.jsonl"
SNAPSHOT = "snapshot.json"
# How much of entries.jsonl a load reads and parses at a time.
_READ_CHUNK = 1 << 18
_FILE_MODE = 0o600
_DIR_MODE = 0o700
_CHUNK = 64 * 1024
# Without a lock to ask (no fcntl, or a file system that refuses flock), a leftover is taken
# for abandoned only when its folder has not changed for this many seconds.
UNLOCKED_LEFTOVER_AGE = 3600.0
_LEFTOVER_SUFFIXES = (".new", ".deleted")
_LEFTOVER: Final = re.compile(r"\.([A-Za-z0-9_-]{1,128})\.[0-9a-f]{12}\.(?:new|deleted)")
# A snapshot ends with its updated_at (the serialiser writes it last): the end of the file
# ranks it for list(limit=...) without reading it all.
_TAIL = 128
_UPDATED_AT_AT_END: Final = re.compile(rb'"updated_at":"([0-9T:.+\-]{10,40})"\}\s*\Z')
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
# A fifo where a file should be would make a plain open wait for a writer: never wait.
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


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


@dataclass(frozen=True)
class Check:
    """One check of :meth:`FileStore.doctor`: what it checked, whether it passed, and how."""

    name: str
    ok: bool
    detail: str

    def __str__(self) -> str:
        return f"{'ok' if self.ok else 'FAILED'}  {self.name}: {self.detail}"


@dataclass(frozen=True)
class _Seen:
    """What one FileStore object last wrote or read of one State.

    Attributes:
        folder: ``(st_dev, st_ino)`` of the State's folder: a State deleted and created again
            is another folder.
        count: How many entries the folder held (seqs ``0`` to ``count - 1``).
        snapshot: The digest of ``snapshot.json``.
        tried: Digests of snapshots this object began to write without seeing the write end:
            finding one of them on disk means the write landed, not that another writer saved.
    """

    folder: tuple[int, int]
    count: int
    snapshot: bytes
    tried: frozenset[bytes] = frozenset()


@dataclass(frozen=True)
class _Basis:
    """The version of a State a write may replace: what its writer last saw of it.

    Made of the copy's :class:`alpineagents._saving.Basis` for a save of a State, else of the
    store object's :class:`_Seen` (a write made through the Store API directly).

    Attributes:
        count: How many entries the writer knows are saved.
        digests: Digests of the snapshots the writer saw, or tried to write.
        snapshots: The same snapshots as values: one on disk in other bytes than this
            version's ``dumps`` (a file written by another version) is compared as JSON.
        folder: ``(st_dev, st_ino)`` of the State's folder, where the writer knows it.
    """

    count: int
    digests: frozenset[bytes]
    snapshots: tuple[dict[str, Any], ...] = ()
    folder: tuple[int, int] | None = None

    @classmethod
    def of(cls, copy: _saving.Basis | None, seen: _Seen | None) -> _Basis | None:
        """The copy's basis if a save of a copy is writing, else the store object's memory."""
        if copy is not None:
            values = (copy.snapshot, *copy.tried)
            digests = set()
            for value in values:
                with contextlib.suppress(NotJSONError):
                    digests.add(_digest(dumps(value)))
            return cls(copy.count, frozenset(digests), values)
        if seen is not None:
            return cls(seen.count, seen.tried | {seen.snapshot}, (), seen.folder)
        return None

    def knows(self, raw: bytes) -> bool:
        """Whether the snapshot ``raw`` on disk is one this writer saw or tried to write."""
        if _digest(raw) in self.digests:
            return True
        if not self.snapshots:
            return False
        try:
            value = json.loads(raw)
        except (ValueError, RecursionError):
            return False
        return any(value == snapshot for snapshot in self.snapshots)


class FileStore(Store):
    """Keeps each State in a folder of its own under ``path``.

    One process at a time should run a given State; a second process that saves it anyway is
    refused with ``ConcurrentWriteError`` instead of losing or overwriting what the first one
    saved. The check follows the copy of the State being saved, not the store object: a copy
    saves when nothing was saved since it was last saved or loaded (through any FileStore
    object for the folder, in any process), and is refused, writing nothing, when anything
    was, even a save that changed only the snapshot (``state.data``, say). Two FileStores for
    one folder are the same store, and two copies of one State loaded through one object are
    told apart. The rule is in the module docstring. Limit: where ``fcntl`` is missing
    (Windows) writes are not locked, so two saves at the same instant can still both land.

    Leftovers of killed processes (a half-created State, a half-deleted one, a half-written
    snapshot) are removed by :meth:`sweep`, never while their writer is alive. The store calls
    it for its top folder by itself, once per store object at its first write and after every
    ``delete``.

    Args:
        path: The store's folder; made (``0700``, with any missing parents) at the first write.
        fsync: Also flush every write to disk, so a power cut loses nothing either. A killed
            process loses nothing saved without it.
    """

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = False):
        self.path = Path(path)
        self.fsync = fsync
        self._real = os.path.realpath(self.path)
        self._seen: dict[str, _Seen] = {}
        self._swept = False
        self._unlockable = False

    def __repr__(self) -> str:
        return f"FileStore({str(self.path)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FileStore) and other._real == self._real

    def __hash__(self) -> int:
        return hash(("FileStore", self._real))

    # Writing ---------------------------------------------------------------------------

    def write(
        self,
        state_id: str,
        entries: Sequence[dict[str, Any]],
        snapshot: dict[str, Any] | None,
        *,
        create: bool = False,
    ) -> None:
        """Append the entries the folder lacks, then replace the snapshot (unless ``None``).

        Raises ``ConcurrentWriteError`` (nothing written) when another writer changed the State
        since this store object last wrote or read it.
        """
        folder = self._folder(state_id)
        if not self._swept:
            self._swept = True
            self._sweep_top(quiet=True)
        with self._errors(state_id):
            if create:
                self._create(state_id, folder, entries, snapshot)
                return
            with self._locked(folder, state_id, exclusive=True) as here:
                self._update(state_id, folder, here, entries, snapshot)
        logger.debug(
            "saved %d entries of %s (snapshot: %s)", len(entries), state_id, bool(snapshot)
        )

    def _update(
        self,
        state_id: str,
        folder: Path,
        here: tuple[int, int],
        entries: Sequence[dict[str, Any]],
        snapshot: dict[str, Any] | None,
    ) -> None:
        """The write of a State that exists, with the folder locked."""
        path = folder / ENTRIES
        current_raw = self._read_snapshot(state_id, folder)
        if current_raw is None:
            raise CorruptStateError(f"{self._where(state_id, folder)} has no {SNAPSHOT}")
        current = _digest(current_raw)
        body = None if snapshot is None else dumps(snapshot)
        seen = self._seen.get(state_id)
        try:
            fd = self._open_file(state_id, path, os.O_RDWR)
        except FileNotFoundError:
            raise CorruptStateError(f"{self._where(state_id, folder)} has no {ENTRIES}") from None
        try:
            os.fchmod(fd, _FILE_MODE)
            last, valid = _last_seq(fd, self._where(state_id, path))
            basis = _Basis.of(_saving.basis(state_id), seen)
            self._check(state_id, folder, basis, here, current_raw, fd, last + 1, valid, entries)
            if valid != os.fstat(fd).st_size:
                logger.warning("dropping a torn last entry of %s", path)
                os.ftruncate(fd, valid)
            count = self._append_new(fd, path, last, valid, entries)
        finally:
            os.close(fd)
        tried = seen.tried if seen is not None else frozenset()
        self._seen[state_id] = _Seen(here, count, current, tried)
        if body is not None and (new := _digest(body)) != current:
            self._seen[state_id] = _Seen(here, count, current, tried | {new})
            self._replace_snapshot(folder, body)
            self._seen[state_id] = _Seen(here, count, new)
        elif body is not None:
            # The snapshot on disk is the one this save sends: no write of this object is in
            # doubt any more, as when it was written again.
            self._seen[state_id] = _Seen(here, count, current)

    def _check(
        self,
        state_id: str,
        folder: Path,
        basis: _Basis | None,
        here: tuple[int, int],
        current: bytes,
        fd: int,
        count: int,
        valid: int,
        entries: Sequence[dict[str, Any]],
    ) -> None:
        """Refuse a write whose basis is not what is on disk: the rule of the module docstring.

        A snapshot on disk the basis does not know is read first: one that is damaged or of a
        newer schema is refused as such (``CorruptStateError``, ``SchemaVersionError``), not as
        another writer's, and so are entries fewer than a snapshot it knows accounts for.
        """
        first = min(int(e["seq"]) for e in entries) if entries else None
        if basis is None or not basis.knows(current):
            self._readable_snapshot(state_id, folder, current)
        if basis is None:
            # Met first in a write: the copy saving has every entry below its first unsaved one.
            known = count if first is None else first
        else:
            known = basis.count
            if basis.folder is not None and basis.folder != here:
                raise self._refused(state_id, "it was deleted and created again")
            if not basis.knows(current):
                raise self._refused(state_id, f"{folder / SNAPSHOT} was replaced")
        if count < known:
            if basis is not None:  # the snapshot is the one the writer saw: entries were lost
                raise CorruptStateError(
                    f"{self._where(state_id, folder / ENTRIES)} holds {count} entries, but its "
                    f"snapshot was saved with {known}: the file was cut short or replaced"
                )
            raise self._refused(
                state_id, f"{folder / ENTRIES} holds {count} entries, not {known} or more"
            )
        if first is None:
            if count > known:
                raise self._refused(state_id, f"entries {known}-{count - 1} were added")
            return
        if first > count:
            raise self._refused(
                state_id,
                f"{folder / ENTRIES} ends at entry {count - 1}; this save starts at {first}",
            )
        # An entry on disk that this save sends again must be the same (a retried save, or
        # saves of one turn finishing out of order); one from `known` on that it does not
        # send was saved by another writer.
        start = min(first, known)
        if start >= count:
            return
        sent = {int(e["seq"]): e for e in entries}
        lines = _last_lines(fd, valid, count - start)
        if len(lines) < count - start:
            raise CorruptStateError(
                f"{self._where(state_id, folder / ENTRIES)}: its last entry has seq {count - 1}, "
                f"but the file has fewer lines"
            )
        for seq, line in enumerate(lines, start):
            entry = sent.get(seq)
            where = f"entry {seq} of {folder / ENTRIES}"
            if entry is None and seq < known:
                continue  # saved by this writer, from this copy or an older one
            if entry is None or not _same_entry(line, entry, where):
                raise self._refused(state_id, f"{where} was saved by another writer")

    def _refused(self, state_id: str, what: str) -> ConcurrentWriteError:
        return ConcurrentWriteError(
            f"State {state_id!r} in {self!r} was saved by another writer since this copy of "
            f"it was last saved or loaded ({what}); nothing was written. Load it again with "
            f"store.load({state_id!r}) and continue from what is saved"
        )

    def _state_place(self, state_id: str) -> str:
        """A State in errors of a load: its id, the store and its folder."""
        return f"State {state_id!r} in {self!r} ({self.path / state_id})"

    def _where(self, state_id: str, path: Path) -> str:
        """How a message names a path of a State: ``runs/x/snapshot.json (State 'x')``."""
        return f"{path} (State {state_id!r})"

    def _readable_snapshot(self, state_id: str, folder: Path, raw: bytes) -> None:
        """Refuse a snapshot on disk that is damaged or of a newer schema, naming it."""
        check_stored(
            loads(raw, self._where(state_id, folder / SNAPSHOT)),
            self._where(state_id, folder / SNAPSHOT),
        )

    def _create(
        self,
        state_id: str,
        folder: Path,
        entries: Sequence[dict[str, Any]],
        snapshot: dict[str, Any] | None,
    ) -> None:
        if snapshot is None:
            raise ValueError(f"creating State {state_id!r} needs a snapshot")
        if self._present(state_id, folder):
            raise self._taken(state_id)
        self._make_root()
        body = dumps(snapshot)
        while True:
            staging = self.path / f".{state_id}.{uuid.uuid4().hex[:12]}.new"
            os.mkdir(staging, _DIR_MODE)
            with contextlib.ExitStack() as stack:
                try:
                    here = stack.enter_context(self._locked(staging, state_id, exclusive=True))
                except StateNotFoundError:
                    continue  # swept between its mkdir and its lock: nothing was written to it
                try:
                    os.chmod(staging, _DIR_MODE)
                    count = self._append(staging / ENTRIES, entries)
                    self._write_file(staging / SNAPSHOT, body)  # no one sees it before the rename
                    if self.fsync:
                        _fsync_dir(staging)
                    try:
                        # Atomic, and fails if another process renamed its folder there first.
                        os.rename(staging, folder)
                    except OSError as e:
                        if e.errno in (errno.EEXIST, errno.ENOTEMPTY):
                            raise self._taken(state_id) from e
                        raise
                    if self.fsync:
                        _fsync_dir(self.path)
                except BaseException:
                    shutil.rmtree(staging, ignore_errors=True)
                    raise
                self._seen[state_id] = _Seen(here, count, _digest(body))
                break
        logger.debug("created %s with %d entries", state_id, len(entries))

    def _present(self, state_id: str, folder: Path) -> bool:
        """Whether the State's folder exists; ``CorruptStateError`` for anything else there."""
        try:
            mode = os.lstat(folder).st_mode
        except FileNotFoundError:
            return False
        except NotADirectoryError:
            raise self._not_a_store(state_id) from None
        if not stat.S_ISDIR(mode):
            raise CorruptStateError(
                f"{self._where(state_id, folder)} is {_kind(mode)}, not a State folder "
                "FileStore made: move it out of the store"
            )
        return True

    def _not_a_store(self, state_id: str) -> CorruptStateError:
        return CorruptStateError(
            f"State {state_id!r} in {self!r}: {self.path} is not a folder, so it holds no States"
        )

    def _taken(self, state_id: str) -> StateExistsError:
        return StateExistsError(
            f"{self!r} already has a State with id {state_id!r}: continue it with "
            f"store.load({state_id!r}), or pick another id"
        )

    def _append(self, path: Path, entries: Sequence[dict[str, Any]]) -> int:
        """Append to a file no one else writes; the number of entries it then holds."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT, _FILE_MODE)
        try:
            os.fchmod(fd, _FILE_MODE)
            last, valid = _last_seq(fd, str(path))
            return self._append_new(fd, path, last, valid, entries)
        finally:
            os.close(fd)

    def _append_new(
        self, fd: int, path: Path, last: int, valid: int, entries: Sequence[dict[str, Any]]
    ) -> int:
        """Write the entries after seq ``last`` at offset ``valid``; the count after."""
        new = [e for e in entries if e["seq"] > last]
        if not new:
            return last + 1
        expected = last + 1
        for entry in new:
            if entry["seq"] != expected:
                raise ValueError(
                    f"cannot append entry {entry['seq']} to {path}: the next seq is {expected}"
                )
            expected += 1
        data = b"".join(dumps(e) + b"\n" for e in new)
        os.lseek(fd, valid, os.SEEK_SET)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if self.fsync:
            os.fsync(fd)
        return expected

    def _replace_snapshot(self, folder: Path, body: bytes) -> None:
        """Replace the snapshot of a locked State folder: a temp file, then one ``os.replace``.

        Renaming onto the old snapshot costs about a millisecond on ext4, which then starts
        writing the new file's data to disk (``auto_da_alloc``). That is kept on purpose: after
        a power cut the snapshot is the old one or the new one, never an empty file.
        """
        temp = folder / f".{SNAPSHOT}.{uuid.uuid4().hex[:12]}.tmp"
        self._write_file(temp, body)
        os.replace(temp, folder / SNAPSHOT)
        if self.fsync:
            _fsync_dir(folder)

    def _write_file(self, path: Path, data: bytes) -> None:
        """Write a new file (``0600``); removed again if the write fails."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _FILE_MODE)
        try:
            os.fchmod(fd, _FILE_MODE)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if self.fsync:
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise
        os.close(fd)

    def _make_root(self) -> None:
        if self.path.is_dir():
            return
        if os.path.lexists(self.path) and not self.path.is_dir():  # a folder made meanwhile is fine
            raise CorruptStateError(f"{self!r}: {self.path} is not a folder, so it holds no States")
        missing = []
        folder = self.path.absolute()
        while not folder.exists() and folder != folder.parent:
            missing.append(folder)
            folder = folder.parent
        for folder in reversed(missing):
            try:
                os.mkdir(folder, _DIR_MODE)
            except FileExistsError:
                continue  # made by another process meanwhile: not ours to change
            os.chmod(folder, _DIR_MODE)  # the umask may have taken bits off, never added

    # Locking ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self, folder: Path, state_id: str, *, exclusive: bool) -> Iterator[tuple[int, int]]:
        """Hold the lock of a State's folder; yield the folder's ``(st_dev, st_ino)``.

        ``StateNotFoundError`` if there is no such folder, or it was deleted while this
        waited for the lock.
        """
        while True:
            try:
                fd = os.open(folder, os.O_RDONLY | _DIRECTORY | _NOFOLLOW)
            except FileNotFoundError:
                raise StateNotFoundError(
                    f"no saved State with id {state_id!r} in {self!r}"
                ) from None
            except NotADirectoryError:  # a file or a link where the folder would be
                if not self._present(state_id, folder):
                    raise StateNotFoundError(
                        f"no saved State with id {state_id!r} in {self!r}"
                    ) from None
                continue  # a folder now: made meanwhile
            except PermissionError as e:
                if sys.platform != "win32":
                    raise self._denied(state_id, folder, e) from e
                fd = -1  # Windows opens no folders: no lock, the folder's identity by path
            try:
                if fd >= 0:
                    self._lock(fd, folder, exclusive=exclusive, wait=True)
                try:
                    now = os.stat(folder)
                except (FileNotFoundError, NotADirectoryError):
                    raise StateNotFoundError(
                        f"no saved State with id {state_id!r} in {self!r}: it was deleted"
                    ) from None
                held = os.fstat(fd) if fd >= 0 else now
                if (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino):
                    continue  # deleted and created again while this waited: lock the new one
                yield (held.st_dev, held.st_ino)
                return
            finally:
                if fd >= 0:
                    os.close(fd)  # releases the lock

    def _lock(self, fd: int, where: Path, *, exclusive: bool, wait: bool) -> bool | None:
        """Lock ``fd`` with flock: True, False when busy (``wait=False``), or None.

        None: the platform or the file system has no such lock (a warning says so, once).
        """
        if sys.platform == "win32" or self._unlockable:
            return None
        how = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        try:
            fcntl.flock(fd, how if wait else how | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        except OSError as e:
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EBADF, errno.EINVAL):
                raise
            self._unlockable = True
            logger.warning(
                "%s: the file system refuses flock (%s); writes of this store are not locked "
                "against other processes",
                where,
                e,
            )
            return None
        return True

    # Leftovers -------------------------------------------------------------------------

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

    def _names(self) -> list[str]:
        try:
            return os.listdir(self.path)
        except FileNotFoundError:
            return []

    # Checks --------------------------------------------------------------------------------

    def doctor(self) -> builtins.list[Check]:
        """Check that this store can work where it is; one :class:`Check` per promise.

        ``folder``: the store's folder exists, or can be made (its nearest existing parent is
        a folder this user may write in). ``writable``: a file can be written and read back
        there. ``modes``: a folder made ``0700`` and a file made ``0600`` keep those modes (some
        file systems, such as a mounted Windows share, do not). ``locks``: advisory locks
        (``flock``) work on this file system, so two writers are kept apart. The checks write
        only in a hidden folder, ``.doctor.<hex>``, removed before this returns (in the
        nearest existing parent when the store's folder does not exist yet).
        """
        checks = []
        base = self.path.absolute()
        while not base.exists() and base != base.parent:
            base = base.parent
        if base == self.path.absolute() and base.is_dir():
            mode = stat.S_IMODE(os.stat(base).st_mode)
            note = "" if mode == _DIR_MODE else f" (mode {mode:04o}; the States' own are 0700)"
            checks.append(Check("folder", True, f"{self.path} exists{note}"))
        elif base.is_dir() and os.access(base, os.W_OK | os.X_OK):
            checks.append(
                Check("folder", True, f"{self.path} does not exist yet; the first save makes it")
            )
        else:
            what = "is not a folder" if base == self.path.absolute() else "cannot be made"
            checks.append(Check("folder", False, f"{self.path} {what} (nearest: {base})"))
            return [*checks, *(Check(n, False, "not checked: no folder") for n in _PROBES)]
        probe = base / f".doctor.{uuid.uuid4().hex[:12]}"
        try:
            checks += self._probe(probe)
        finally:
            with contextlib.suppress(OSError):
                _remove_tree(probe)
        return checks

    def _probe(self, probe: Path) -> builtins.list[Check]:
        """The checks of ``doctor`` that write: in the folder ``probe``, made here."""
        try:
            os.mkdir(probe, _DIR_MODE)
            os.chmod(probe, _DIR_MODE)
            self._write_file(probe / "file", b"{}")
            back = (probe / "file").read_bytes()
        except OSError as e:
            return [Check(n, False, f"cannot write in {probe.parent}: {e}") for n in _PROBES]
        if back != b"{}":
            return [Check(n, False, f"{probe / 'file'} reads back other bytes") for n in _PROBES]
        checks = [Check("writable", True, f"wrote and read back a file in {probe.parent}")]
        modes = (
            stat.S_IMODE(os.stat(probe).st_mode),
            stat.S_IMODE(os.stat(probe / "file").st_mode),
        )
        checks.append(
            Check(
                "modes",
                modes == (_DIR_MODE, _FILE_MODE),
                f"a folder made 0700 is {modes[0]:04o}, a file made 0600 is {modes[1]:04o}",
            )
        )
        checks.append(_lock_check(probe))
        return checks

    # Reading ---------------------------------------------------------------------------

    def read(self, state_id: str) -> Record | None:
        """Everything saved of one State, or ``None``.

        Makes what it read the version this store object's next save of the State may replace.
        """
        folder = self._folder(state_id)
        try:
            with self._errors(state_id), self._locked(folder, state_id, exclusive=False) as here:
                snapshot_raw = self._read_snapshot(state_id, folder)
                if snapshot_raw is None:
                    raise CorruptStateError(f"{self._where(state_id, folder)} has no {SNAPSHOT}")
                try:
                    fd = self._open_file(state_id, folder / ENTRIES, os.O_RDONLY)
                except FileNotFoundError:
                    raise CorruptStateError(
                        f"{self._where(state_id, folder)} has no {ENTRIES}"
                    ) from None
                # Parsed while locked, a chunk at a time, so that the file's bytes are never
                # all in memory beside the entries made of them.
                with os.fdopen(fd, "rb") as file:  # closed here, still locked
                    entries = _read_entries(file, self._where(state_id, folder / ENTRIES))
                # Recorded while locked: a save of this store object in another thread that
                # waits for the lock records its newer view after this one, never before.
                self._seen[state_id] = _Seen(here, len(entries), _digest(snapshot_raw))
        except StateNotFoundError:
            return None
        where = self._where(state_id, folder / SNAPSHOT)
        return Record(entries, check_stored(loads(snapshot_raw, where), where))

    def list(self, *, limit: int | None = None) -> builtins.list[SavedState]:
        """The saved States, most recently updated first (reads only the snapshots).

        ``limit``: only the ``limit`` most recently updated, the first ``limit`` of the whole
        list. Cheaper than listing all: a snapshot ends with its ``updated_at``, so the end of
        each file (a hundred bytes) ranks the States, and only the newest are read whole.

        A folder whose name is not a State id is not listed; a State whose snapshot is damaged
        or of a newer schema is left out with a warning on this module's logger (its ``load``
        raises the error).
        """
        if limit is not None and (type(limit) is not int or limit < 0):
            raise ValueError(f"limit must be an int >= 0 or None, not {limit!r}")
        names = self._state_names()
        if limit is not None and limit < len(names):
            return self._newest(names, limit)
        saved = [summary for name in names if (summary := self._summary(name)) is not None]
        saved.sort(key=lambda s: s.updated_at, reverse=True)
        return saved if limit is None else saved[:limit]

    async def alist(self, *, limit: int | None = None) -> builtins.list[SavedState]:
        """Async ``list``, on a worker thread."""
        return await asyncio.to_thread(self.list, limit=limit)

    def _summary(self, name: str) -> SavedState | None:
        """The summary of one State for ``list``, or ``None`` (a warning says why, if not gone)."""
        path = self.path / name / SNAPSHOT
        try:
            raw = self._read_snapshot(name, self.path / name)
            if raw is None:
                return None  # being deleted, or not a State's folder
            where = self._where(name, path)
            return SavedState.from_snapshot(name, loads(raw, where), where)
        except (CorruptStateError, SchemaVersionError, StorePermissionError) as e:
            # One State that cannot be read does not hide the others; its load says why.
            logger.warning("not listing State %r: %s: %s", name, type(e).__name__, e)
            return None

    def _newest(self, names: builtins.list[str], limit: int) -> builtins.list[SavedState]:
        """The first ``limit`` of ``list()``, reading the end of each snapshot to rank them.

        The same States in the same order as the whole list: ties keep the folder's order, a
        snapshot whose end does not name its time is read whole, and one whose whole
        ``updated_at`` is not what its end said sends the list back to reading them all.
        """
        ranked: builtins.list[tuple[datetime, str, SavedState | None]] = []
        for name in names:
            when = self._updated_at_from_end(name)
            if when is not None:
                ranked.append((when, name, None))
            elif (summary := self._summary(name)) is not None:
                ranked.append((summary.updated_at, name, summary))
        ranked.sort(key=lambda item: item[0], reverse=True)
        newest: builtins.list[SavedState] = []
        for when, name, summary in ranked:
            if len(newest) == limit:
                break
            summary = summary or self._summary(name)
            if summary is None:
                continue  # damaged, or deleted meanwhile: the next one takes its place
            if summary.updated_at != when:
                return self.list()[:limit]  # changed meanwhile: rank them all again
            newest.append(summary)
        return newest

    def _updated_at_from_end(self, name: str) -> datetime | None:
        """The ``updated_at`` a snapshot ends with, or ``None`` if its end does not say."""
        try:
            fd = self._open_file(name, self.path / name / SNAPSHOT, os.O_RDONLY)
        except (FileNotFoundError, StoreError):
            return None
        try:
            size = os.fstat(fd).st_size
            tail = os.pread(fd, _TAIL, max(0, size - _TAIL))
        finally:
            os.close(fd)
        found = _UPDATED_AT_AT_END.search(tail)
        if found is None:
            return None
        try:
            when = datetime.fromisoformat(found[1].decode("ascii"))
        except ValueError:
            return None
        return when if when.tzinfo is not None else None

    def _state_names(self) -> builtins.list[str]:
        """The names of the folders under the store's path that may be States.

        Not a hidden folder (a State being created or deleted), a name that is not a State id,
        a file or a symbolic link.
        """
        try:
            found = builtins.list(os.scandir(self.path))
        except FileNotFoundError:
            return []
        except NotADirectoryError:
            raise CorruptStateError(
                f"{self!r}: {self.path} is not a folder, so it holds no States"
            ) from None
        except PermissionError as e:
            raise StorePermissionError(
                f"{self!r}: permission denied listing {self.path} ({e.strerror})"
            ) from e
        names = []
        for item in found:
            name = item.name
            if name.startswith("."):
                continue
            try:
                validate_id(name)
                is_folder = item.is_dir(follow_symlinks=False)
            except (ValueError, OSError):
                is_folder = False
            if not is_folder:
                logger.debug("not listing %s: not a State's folder", self.path / name)
                continue
            names.append(name)
        return names

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

    def _folder(self, state_id: str) -> Path:
        return self.path / validate_id(state_id)

    # Opening what is on disk ----------------------------------------------------------

    def _open_file(self, state_id: str, path: Path, flags: int) -> int:
        """Open a file of a State; ``FileNotFoundError`` if there is none.

        Only a regular file: a symbolic link, a folder, a fifo or a device where FileStore
        keeps a file is ``CorruptStateError`` (a fifo is never waited on), a file this user
        may not open ``StorePermissionError``.
        """
        try:
            fd = os.open(path, flags | _NOFOLLOW | _NONBLOCK)
        except FileNotFoundError:
            raise
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EPERM):
                raise self._denied(state_id, path, e) from e
            if e.errno == errno.ELOOP:
                raise self._foreign(state_id, path, "a symbolic link") from e
            if e.errno in (errno.EISDIR, errno.ENXIO):
                raise self._foreign(state_id, path, _kind(os.lstat(path).st_mode)) from e
            if e.errno == errno.ENOTDIR:
                raise self._foreign(state_id, path.parent, "not a folder") from e
            raise
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                raise self._foreign(state_id, path, _kind(mode))
            if _NONBLOCK:
                os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _read_snapshot(self, state_id: str, folder: Path) -> bytes | None:
        """The bytes of a State's snapshot, or ``None`` if it has none."""
        try:
            fd = self._open_file(state_id, folder / SNAPSHOT, os.O_RDONLY)
        except FileNotFoundError:
            return None
        with os.fdopen(fd, "rb") as file:
            return file.read()

    def _foreign(self, state_id: str, path: Path, kind: str) -> CorruptStateError:
        return CorruptStateError(
            f"{self._where(state_id, path)} is {kind}, not a file FileStore wrote"
        )

    def _denied(self, state_id: str, path: Path, e: OSError) -> StorePermissionError:
        return StorePermissionError(
            f"{self._where(state_id, path)}: permission denied; FileStore's files and folders "
            "must belong to the user that runs it (modes 0600 and 0700)"
        )

    @contextlib.contextmanager
    def _errors(self, state_id: str) -> Iterator[None]:
        """Name the State in an error of the file system that the steps did not name.

        ``PermissionError`` becomes ``StorePermissionError``; a folder where a file should be
        or a file where a folder should be (``IsADirectoryError``, ``NotADirectoryError``)
        becomes ``CorruptStateError``. Store errors and other ``OSError`` pass as they are.
        """
        try:
            yield
        except StoreError:
            raise
        except PermissionError as e:
            raise self._denied(state_id, Path(e.filename or self.path), e) from e
        except (IsADirectoryError, NotADirectoryError) as e:
            raise CorruptStateError(
                f"{self._where(state_id, Path(e.filename or self.path))}: {e.strerror}: not "
                "what FileStore keeps there"
            ) from e


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


def _kind(mode: int) -> str:
    """What a file of ``mode`` is, for a message (``a folder``, ``a fifo``)."""
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a fifo"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a file" if stat.S_ISREG(mode) else "not a regular file"


def _read_entries(file: BinaryIO, path: str) -> list[Any]:
    """Parse the complete lines of an entries file; the part after the last newline is torn.

    The cyclic garbage collector is paused meanwhile (see :mod:`alpineagents._gc`).
    """
    with paused():
        return _parse_file(file, path)


def _parse_file(file: BinaryIO, path: str) -> list[Any]:
    entries: list[Any] = []
    held: list[bytes] = []  # the start of a line that goes on in the next chunk
    while chunk := file.read(_READ_CHUNK):
        end = chunk.rfind(b"\n") + 1
        if not end:
            held.append(chunk)
            continue
        if held:
            held.append(chunk[:end])
            _parse_lines(b"".join(held), path, entries)
        else:
            _parse_lines(chunk[:end] if end < len(chunk) else chunk, path, entries)
        held = [chunk[end:]] if end < len(chunk) else []
    return entries


# The quick parser: pydantic_core's (Rust). It parses a line in about half the time
# json.loads takes, and shares the str of a key or short value between lines (json.loads
# gives each line its own), so a load takes less memory too. It takes a line only when
# json.loads does, with the same value (NaN and Infinity included, as json.loads takes them);
# some lines json.loads takes it refuses, and those go to json.loads. tests/test_core_perf.py
# pins that on edge cases and on 30,000 damaged lines.
_quick_json: Final = partial(pydantic_core.from_json, allow_inf_nan=True, cache_strings=True)


def _parse_lines(lines: bytes, path: str, entries: list[Any]) -> None:
    """Append the JSON values of ``lines`` (whole lines, each ending with a newline).

    Each line is parsed on its own: joined into one JSON array, a value that goes on over two
    lines and a line of two values would make up for each other. The lines of a chunk go
    through the quick parser first; only when it refuses one (damage, or what only json.loads
    takes: a lone surrogate, a byte order mark, deep nesting) does each line of the chunk go
    through it again, and one it refuses through :func:`loads` (json.loads of the line's
    bytes, as every line once was), which decides and names a damaged line by its number: no
    message is built for good lines.
    """
    split = lines.split(b"\n")
    split.pop()  # after the last newline: nothing
    first = len(entries)
    try:
        entries.extend(map(_quick_json, split))
        return
    except (ValueError, RecursionError):
        del entries[first:]
    for number, line in enumerate(split, first + 1):
        try:
            value = _quick_json(line)
        except (ValueError, RecursionError):
            value = loads(line, f"line {number} of {path}")
        entries.append(value)


def _same_entry(line: bytes, entry: dict[str, Any], where: str) -> bool:
    """Whether a stored line holds ``entry`` (the same bytes, or the same JSON)."""
    sent = dumps(entry)
    return line == sent or bool(loads(line, where) == loads(sent, where))


_PROBES = ("writable", "modes", "locks")


def _lock_check(folder: Path) -> Check:
    """Whether ``flock`` works on the file system of ``folder``: a second lock must wait."""
    if sys.platform == "win32":
        return Check(
            "locks", False, "no flock on Windows: two writers at the same instant can both land"
        )
    first = os.open(folder, os.O_RDONLY)
    second = os.open(folder, os.O_RDONLY)
    try:
        try:
            fcntl.flock(first, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            return Check("locks", False, f"{folder}: the file system refuses flock ({e})")
        try:
            fcntl.flock(second, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return Check("locks", True, "flock keeps a second writer waiting")
        return Check(
            "locks", False, f"{folder}: flock does not keep writers apart on this file system"
        )
    finally:
        os.close(second)
        os.close(first)


def _leftover_id(name: str) -> str | None:
    """The State id of a leftover folder's name (``.<id>.<hex>.new``), or None."""
    found = _LEFTOVER.fullmatch(name)
    return found[1] if found else None


def _remove_tree(top: Path) -> int:
    """Remove a folder and everything in it, never following a link; the files removed."""
    count = 0
    for folder, folders, names in os.walk(top, topdown=False):
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(folder, name))
                count += 1
        for name in folders:
            path = os.path.join(folder, name)
            with contextlib.suppress(FileNotFoundError):
                if os.path.islink(path):
                    os.unlink(path)
                    count += 1
                else:
                    os.rmdir(path)
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(top)
    return count


def _remove_files(folder: Path, names: Sequence[str]) -> None:
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(folder / name)


def _last_seq(fd: int, path: str) -> tuple[int, int]:
    """The seq of the last complete line and the size up to its end (-1, 0 if none).

    ``path`` names the file in errors: a last entry that is damaged, has no seq, or is of a
    newer schema (``SchemaVersionError``) refuses the write before it writes a byte.
    """
    size = os.fstat(fd).st_size
    end = _rfind_newline(fd, size)
    if end < 0:
        return -1, 0
    start = _rfind_newline(fd, end) + 1
    line = os.pread(fd, end - start, start)
    where = f"the last entry of {path}"
    entry = check_stored(loads(line, where), where)
    seq = entry.get("seq")
    if type(seq) is not int or seq < 0:
        raise CorruptStateError(f"{where} has no seq")
    return seq, end + 1


def _last_lines(fd: int, end: int, count: int) -> list[bytes]:
    """The last ``count`` complete lines before offset ``end`` (which follows a newline)."""
    lines: list[bytes] = []
    position = end - 1  # the newline that ends the last line
    while len(lines) < count and position >= 0:
        start = _rfind_newline(fd, position) + 1
        lines.append(os.pread(fd, position - start, start))
        position = start - 1
    lines.reverse()
    return lines


def _rfind_newline(fd: int, before: int) -> int:
    """The offset of the last newline before ``before``, or -1."""
    position = before
    while position > 0:
        start = max(0, position - _CHUNK)
        found = os.pread(fd, position - start, start).rfind(b"\n")
        if found >= 0:
            return start + found
        position = start
    return -1


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
