"""FileStore's doctor: whether the store can work where it is, one check per promise."""

from __future__ import annotations

import builtins
import contextlib
import logging
import os
import stat
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

from alpineagents._filestore.base import _DIR_MODE, _FILE_MODE, _Base, _remove_tree

if sys.platform != "win32":
    import fcntl

logger = logging.getLogger("alpineagents.filestore")


@dataclass(frozen=True)
class Check:
    """One check of :meth:`FileStore.doctor`: what it checked, whether it passed, and how."""

    name: str
    ok: bool
    detail: str

    def __str__(self) -> str:
        return f"{'ok' if self.ok else 'FAILED'}  {self.name}: {self.detail}"


class _Doctor(_Base):
    """The checks of ``doctor``."""

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
