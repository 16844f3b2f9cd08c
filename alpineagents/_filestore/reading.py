"""FileStore's reads: ``read`` and ``list``.

A State's entries are parsed a chunk at a time while its folder is locked; ``list`` with a
limit ranks the States by the end of each snapshot.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import os
import re
from datetime import datetime
from functools import partial
from typing import Any, BinaryIO, Final

import pydantic_core

from alpineagents._filestore.base import ENTRIES, SNAPSHOT, _Base, _digest, _Seen
from alpineagents._gc import paused
from alpineagents._serialize import check_stored, loads
from alpineagents.errors import (
    CorruptStateError,
    SchemaVersionError,
    StateNotFoundError,
    StoreError,
    StorePermissionError,
)
from alpineagents.state import validate_id
from alpineagents.store import Record, SavedState

logger = logging.getLogger("alpineagents.filestore")

# How much of entries.jsonl a load reads and parses at a time.
_READ_CHUNK = 1 << 18


# A snapshot ends with its updated_at (the serialiser writes it last): the end of the file
# ranks it for list(limit=...) without reading it all.
_TAIL = 128


_UPDATED_AT_AT_END: Final = re.compile(rb'"updated_at":"([0-9T:.+\-]{10,40})"\}\s*\Z')


class _Reading(_Base):
    """Reading States: ``read`` and ``list``."""

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
# some lines json.loads takes it refuses, and those go to json.loads.
# tests/test_filestore_load.py pins that on edge cases and on 30,000 damaged lines.
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
