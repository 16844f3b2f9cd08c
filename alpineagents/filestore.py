"""FileStore: States in a local folder, one folder each.

Layout under the store's path::

    <id>/entries.jsonl   history entries, one JSON line each, only ever appended
    <id>/snapshot.json   the rest of the State, replaced atomically (temp file + os.replace)

A process killed while appending can leave a torn last line; it has no newline, is dropped
when read and cut off before the next append. A new State is written in a hidden folder and
renamed into place, so creating it is all or nothing and exclusive between processes.
Files are ``0600`` and folders ``0700`` whatever the umask: history holds tool results and
messages.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from alpineagents._serialize import dumps, loads
from alpineagents.errors import (
    CorruptStateError,
    SchemaVersionError,
    StateExistsError,
    StateNotFoundError,
)
from alpineagents.state import validate_id
from alpineagents.store import Record, SavedState, Store

__all__ = ["FileStore"]

logger = logging.getLogger(__name__)

ENTRIES = "entries.jsonl"
SNAPSHOT = "snapshot.json"
_FILE_MODE = 0o600
_DIR_MODE = 0o700
_CHUNK = 64 * 1024


class FileStore(Store):
    """Keeps each State in a folder of its own under ``path``.

    Args:
        path: The store's folder; made (``0700``) at the first write if missing.
        fsync: Also flush every write to disk, so a power cut loses nothing either. A killed
            process loses nothing saved without it.
    """

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = False):
        self.path = Path(path)
        self.fsync = fsync
        self._real = os.path.realpath(self.path)

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
        """Append the entries the folder lacks, then replace the snapshot (unless ``None``)."""
        folder = self._folder(state_id)
        if create:
            self._create(state_id, folder, entries, snapshot)
            return
        if not folder.is_dir():
            raise StateNotFoundError(f"no saved State with id {state_id!r} in {self!r}")
        if entries:
            self._append(folder / ENTRIES, entries)
        if snapshot is not None:
            self._replace(folder / SNAPSHOT, dumps(snapshot))
        logger.debug(
            "saved %d entries of %s (snapshot: %s)", len(entries), state_id, bool(snapshot)
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
        if folder.exists():
            raise self._taken(state_id)
        self._make_root()
        staging = self.path / f".{state_id}.{uuid.uuid4().hex[:12]}.new"
        os.mkdir(staging, _DIR_MODE)
        try:
            os.chmod(staging, _DIR_MODE)
            self._append(staging / ENTRIES, entries)
            self._replace(staging / SNAPSHOT, dumps(snapshot))
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
        logger.debug("created %s with %d entries", state_id, len(entries))

    def _taken(self, state_id: str) -> StateExistsError:
        return StateExistsError(
            f"{self!r} already has a State with id {state_id!r}: continue it with "
            f"store.load({state_id!r}), or pick another id"
        )

    def _append(self, path: Path, entries: Sequence[dict[str, Any]]) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, _FILE_MODE)
        try:
            os.fchmod(fd, _FILE_MODE)
            last, valid = _last_seq(fd, path)
            if valid != os.fstat(fd).st_size:
                logger.warning("dropping a torn last entry of %s", path)
                os.ftruncate(fd, valid)
            new = [e for e in entries if e["seq"] > last]
            if not new:
                return
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
        finally:
            os.close(fd)

    def _replace(self, path: Path, data: bytes) -> None:
        temp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _FILE_MODE)
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
                os.unlink(temp)
            raise
        os.close(fd)
        os.replace(temp, path)
        if self.fsync:
            _fsync_dir(path.parent)

    def _make_root(self) -> None:
        if not self.path.is_dir():
            os.makedirs(self.path, _DIR_MODE, exist_ok=True)
            os.chmod(self.path, _DIR_MODE)

    # Reading ---------------------------------------------------------------------------

    def read(self, state_id: str) -> Record | None:
        """Everything saved of one State, or ``None``."""
        folder = self._folder(state_id)
        try:
            snapshot_raw = (folder / SNAPSHOT).read_bytes()
        except FileNotFoundError:
            if folder.exists():
                raise CorruptStateError(f"{folder} has no {SNAPSHOT}") from None
            return None
        try:
            raw = (folder / ENTRIES).read_bytes()
        except FileNotFoundError:
            raise CorruptStateError(f"{folder} has no {ENTRIES}") from None
        lines = raw.split(b"\n")
        # The part after the last newline is a torn append (or empty): never valid.
        entries = [
            loads(line, f"line {number} of {folder / ENTRIES}")
            for number, line in enumerate(lines[:-1], 1)
        ]
        snapshot = loads(snapshot_raw, str(folder / SNAPSHOT))
        return Record(entries, snapshot)

    def list(self) -> list[SavedState]:
        """The saved States, most recently updated first (reads only the snapshots).

        A folder whose name is not a State id is not listed; a State whose snapshot is damaged
        or of a newer schema is left out with a warning on this module's logger (its ``load``
        raises the error).
        """
        try:
            names = os.listdir(self.path)
        except FileNotFoundError:
            return []
        saved = []
        for name in names:
            if name.startswith("."):  # a State being created, or being deleted
                continue
            try:
                validate_id(name)
            except ValueError:
                logger.debug("not listing %s: not a State id", self.path / name)
                continue
            path = self.path / name / SNAPSHOT
            try:
                snapshot = loads(path.read_bytes(), str(path))
                saved.append(SavedState.from_snapshot(name, snapshot, str(path)))
            except (FileNotFoundError, NotADirectoryError):
                continue
            except (CorruptStateError, SchemaVersionError) as e:
                # One State that cannot be read does not hide the others; its load says why.
                logger.warning("not listing State %r: %s: %s", name, type(e).__name__, e)
        saved.sort(key=lambda s: s.updated_at, reverse=True)
        return saved

    def delete(self, state_id: str) -> None:
        """Remove a State's folder; ``KeyError`` if there is none."""
        folder = self._folder(state_id)
        trash = self.path / f".{state_id}.{uuid.uuid4().hex[:12]}.deleted"
        try:
            os.rename(folder, trash)  # atomic: the State is gone at once, whole
        except FileNotFoundError:
            raise StateNotFoundError(f"no saved State with id {state_id!r} in {self!r}") from None
        shutil.rmtree(trash)

    def _folder(self, state_id: str) -> Path:
        return self.path / validate_id(state_id)


def _last_seq(fd: int, path: Path) -> tuple[int, int]:
    """The seq of the last complete line and the size up to its end (-1, 0 if none)."""
    size = os.fstat(fd).st_size
    end = _rfind_newline(fd, size)
    if end < 0:
        return -1, 0
    start = _rfind_newline(fd, end) + 1
    line = os.pread(fd, end - start, start)
    entry = loads(line, f"the last entry of {path}")
    if not isinstance(entry, dict) or not isinstance(entry.get("seq"), int):
        raise CorruptStateError(f"the last entry of {path} has no seq")
    return entry["seq"], end + 1


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
