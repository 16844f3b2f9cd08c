"""FileStore's base: the folders, the lock of a State's folder, and opening what is on disk.

What every part of FileStore shares (writing.py, reading.py, leftovers.py, doctor.py): the
store's path and what this object last saw of each State (:class:`_Seen`), the ``flock`` of a
State's folder, opening only regular files (never following a link, never waiting on a fifo),
and naming the State in errors of the file system. The layout and the rules are in the
docstring of :mod:`alpineagents.filestore`.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import stat
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from alpineagents.errors import (
    CorruptStateError,
    StateNotFoundError,
    StoreError,
    StorePermissionError,
)
from alpineagents.state import validate_id
from alpineagents.store import Store

if sys.platform != "win32":
    import fcntl

logger = logging.getLogger("alpineagents.filestore")

ENTRIES = "entries.jsonl"


SNAPSHOT = "snapshot.json"


_FILE_MODE = 0o600


_DIR_MODE = 0o700


_CHUNK = 64 * 1024


_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


# A fifo where a file should be would make a plain open wait for a writer: never wait.
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


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


class _Base(Store):
    """The folders of a FileStore, their locks, and the files in them."""

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
        return isinstance(other, _Base) and other._real == self._real

    def __hash__(self) -> int:
        return hash(("FileStore", self._real))

    def _state_place(self, state_id: str) -> str:
        """A State in errors of a load: its id, the store and its folder."""
        return f"State {state_id!r} in {self!r} ({self.path / state_id})"

    def _where(self, state_id: str, path: Path) -> str:
        """How a message names a path of a State: ``runs/x/snapshot.json (State 'x')``."""
        return f"{path} (State {state_id!r})"

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

    def _names(self) -> list[str]:
        try:
            return os.listdir(self.path)
        except FileNotFoundError:
            return []

    def _folder(self, state_id: str) -> Path:
        return self.path / validate_id(state_id)

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
