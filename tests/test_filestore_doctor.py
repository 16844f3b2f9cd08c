"""FileStore's doctor: a check per promise (the folder, writing, the modes, the locks), and
nothing left behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from alpineagents import FileStore, State


def test_doctor_passes_on_a_local_folder_and_leaves_nothing(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "runs")
    checks = store.doctor()
    assert [(c.name, c.ok) for c in checks] == [
        ("folder", True),
        ("writable", True),
        ("modes", True),
        ("locks", True),
    ]
    assert "does not exist yet" in checks[0].detail
    assert os.listdir(tmp_path) == []  # the store's folder is not made, the probe is gone
    store.save(State("t", id="s"))
    assert all(c.ok for c in store.doctor())
    assert sorted(os.listdir(tmp_path / "runs")) == ["s"]
    assert str(checks[2]) == "ok  modes: a folder made 0700 is 0700, a file made 0600 is 0600"


def test_doctor_fails_a_store_path_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "runs").write_text("x")
    checks = FileStore(tmp_path / "runs").doctor()
    assert [(c.name, c.ok) for c in checks] == [
        ("folder", False),
        ("writable", False),
        ("modes", False),
        ("locks", False),
    ]
    assert "is not a folder" in checks[0].detail


def test_doctor_fails_modes_that_are_not_kept_and_locks_that_do_not_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As on a file system that ignores chmod and refuses flock (a mounted share, say).
    import fcntl

    def no_lock(fd: int, how: int) -> None:
        raise OSError(37, "No locks available")

    old = os.umask(0o022)
    try:
        real_mkdir = os.mkdir
        monkeypatch.setattr(os, "mkdir", lambda path, mode=0o777: real_mkdir(path))
        monkeypatch.setattr(os, "chmod", lambda *a, **k: None)
        monkeypatch.setattr(fcntl, "flock", no_lock)
        checks = {c.name: c for c in FileStore(tmp_path).doctor()}
    finally:
        os.umask(old)
    assert checks["writable"].ok
    assert not checks["modes"].ok and "0755" in checks["modes"].detail
    assert not checks["locks"].ok and "refuses flock" in checks["locks"].detail
