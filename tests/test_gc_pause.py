"""The core's pause of the cyclic garbage collector during a load (``alpineagents._gc``).

What could break, and is tried here: collections during FileStore's parse of the entries
file or during the rebuild of the entries all the same; the collector left off after a load,
after a load of a damaged State, or after two pauses in two threads; a program's own choice to
turn it off undone by a load.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from alpineagents import CorruptStateError, FileStore, _gc, _serialize
from alpineagents._filestore import reading as filestore_reading
from tests.helpers import big_state, paused_in_a_thread


def counted(
    monkeypatch: pytest.MonkeyPatch, module: Any, name: str, collections: list[int]
) -> list[int]:
    """How many collections each call of ``module.name`` saw, call by call."""
    during: list[int] = []
    original: Callable[..., Any] = getattr(module, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        before = len(collections)
        try:
            return original(*args, **kwargs)
        finally:
            during.append(len(collections) - before)

    monkeypatch.setattr(module, name, wrapped)
    return during


def test_a_filestore_load_parses_and_rebuilds_without_a_collection(
    tmp_path: Path, collections: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStore(tmp_path)
    state = big_state(2001)
    store.save(state)
    # The control: a load's own work, not paused, is collected in at these thresholds.
    with monkeypatch.context() as m:
        m.setattr(_gc, "paused", _not_paused)
        m.setattr(filestore_reading, "paused", _not_paused)
        m.setattr(_serialize, "paused", _not_paused)
        control = counted(m, filestore_reading, "_parse_file", collections)
        rebuilt = counted(m, _serialize, "entry_from_dict", collections)
        FileStore(tmp_path).load(state.id)
    assert control[0] > 10 and sum(rebuilt) > 10

    parsed = counted(monkeypatch, filestore_reading, "_parse_file", collections)
    rebuilt = counted(monkeypatch, _serialize, "entry_from_dict", collections)
    loaded = FileStore(tmp_path).load(state.id)
    assert len(loaded.history) == 2001
    assert parsed == [0]
    assert len(rebuilt) == 2001 and sum(rebuilt) == 0
    assert gc.isenabled()


def _not_paused() -> contextlib.nullcontext[None]:
    return contextlib.nullcontext()


def test_a_damaged_state_leaves_the_collector_running(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    state = big_state(41)
    store.save(state)
    entries = next((tmp_path / state.id).glob("entries*"))
    lines = entries.read_bytes().split(b"\n")
    lines[7] = lines[7].replace(b'"seq":7', b'"seq":"7"')
    entries.write_bytes(b"\n".join(lines))
    assert gc.isenabled()
    with pytest.raises(CorruptStateError, match="seq"):
        FileStore(tmp_path).load(state.id)
    assert gc.isenabled()


def test_a_collector_turned_off_stays_off_after_a_load(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    state = big_state(41)
    store.save(state)
    was_on = gc.isenabled()
    gc.disable()
    try:
        assert len(FileStore(tmp_path).load(state.id).history) == 41
        assert not gc.isenabled()
    finally:
        if was_on:
            gc.enable()


def test_two_pauses_at_once_leave_the_collector_running() -> None:
    with paused_in_a_thread(_gc.paused) as release:
        with _gc.paused():  # begins with the collector off: leaves it as it finds it at the end
            release()
    assert gc.isenabled()
