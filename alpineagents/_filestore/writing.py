"""FileStore's writes, and the check that refuses a second writer.

A new State is created all or nothing; a write appends what the folder lacks and replaces the
snapshot atomically, after checking it against its basis (:class:`_Basis`,
``_Writing._check``: the rule stated in :mod:`alpineagents.filestore`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alpineagents import _saving
from alpineagents._filestore.base import (
    _DIR_MODE,
    _FILE_MODE,
    ENTRIES,
    SNAPSHOT,
    _digest,
    _fsync_dir,
    _rfind_newline,
    _Seen,
)
from alpineagents._filestore.leftovers import _Leftovers
from alpineagents._serialize import check_stored, dumps, loads
from alpineagents.errors import (
    ConcurrentWriteError,
    CorruptStateError,
    NotJSONError,
    StateExistsError,
    StateNotFoundError,
)

logger = logging.getLogger("alpineagents.filestore")


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


class _Writing(_Leftovers):
    """Writing a State: create, append, replace the snapshot, after the check."""

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


def _same_entry(line: bytes, entry: dict[str, Any], where: str) -> bool:
    """Whether a stored line holds ``entry`` (the same bytes, or the same JSON)."""
    sent = dumps(entry)
    return line == sent or bool(loads(line, where) == loads(sent, where))


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
