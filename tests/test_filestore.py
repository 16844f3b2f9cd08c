"""FileStore on its own: the layout on disk, permissions, torn appends, racing creators,
processes killed while writing, and the snapshot replaced by one rename (only when changed).

Its list is in test_filestore_list.py, its doctor in test_filestore_doctor.py, its load in
test_filestore_load.py; more than one writer in test_filestore_writers.py and
test_filestore_copies.py, the leftovers of killed writers in test_filestore_leftovers.py,
damaged and foreign files in test_filestore_foreign.py.
"""

from __future__ import annotations

import json
import os
import random
import signal
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from alpineagents import CorruptStateError, FileStore, State, StateExistsError
from tests.helpers import agent_state

REPO = Path(__file__).resolve().parents[1]


def _modes(root: Path) -> dict[str, int]:
    return {
        str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in [root, *root.rglob("*")]
    }


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o077])
def test_files_are_0600_and_folders_0700_whatever_the_umask(tmp_path: Path, umask: int) -> None:
    old = os.umask(umask)
    try:
        store = FileStore(tmp_path / "runs")
        state = State("secret task", id="s")
        store.save(state)
        state.add_user_message("more")
        store.save(state)
    finally:
        os.umask(old)
    modes = _modes(tmp_path / "runs")
    assert modes == {".": 0o700, "s": 0o700, "s/entries.jsonl": 0o600, "s/snapshot.json": 0o600}


def test_layout_is_a_folder_per_state(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    for state_id in ("one", "two"):
        store.save(State("t", id=state_id))
    assert sorted(os.listdir(tmp_path)) == ["one", "two"]
    assert sorted(os.listdir(tmp_path / "one")) == ["entries.jsonl", "snapshot.json"]


def test_torn_last_entry_is_dropped_and_cut_before_the_next_append(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    state = State("t", id="torn")
    state.add_user_message("whole")
    store.save(state)
    entries = tmp_path / "torn" / "entries.jsonl"
    with entries.open("ab") as f:
        f.write(b'{"v":1,"seq":2,"kind":"user","text":"half wri')  # a killed append
    loaded = store.load("torn")
    assert [e.text for e in loaded.history] == ["t", "whole"]
    loaded.add_user_message("after")
    store.save(loaded)
    assert [e.text for e in store.load("torn").history] == ["t", "whole", "after"]
    assert b"half wri" not in entries.read_bytes()


def test_a_damaged_line_in_the_middle_is_an_error_naming_the_file(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    state = State("t", id="bad")
    state.add_user_message("x")
    store.save(state)
    entries = tmp_path / "bad" / "entries.jsonl"
    lines = entries.read_bytes().split(b"\n")
    entries.write_bytes(b"\n".join([b"garbage", *lines[1:]]))
    with pytest.raises(
        CorruptStateError, match=r"line 1 of .*entries\.jsonl \(State 'bad'\) is not valid JSON"
    ):
        store.load("bad")


def test_a_refused_create_leaves_nothing_behind(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    store.save(State("first", id="x"))
    with pytest.raises(StateExistsError, match=r"store\.load\('x'\)"):
        store.save(State("second", id="x"))
    assert os.listdir(tmp_path) == ["x"]
    assert store.load("x").task == "first"


def test_fsync_mode_writes_the_same(tmp_path: Path) -> None:
    store = FileStore(tmp_path, fsync=True)
    state = State("t", id="durable")
    state.add_user_message("m")
    store.save(state)
    assert [e.text for e in FileStore(tmp_path).load("durable").history] == ["t", "m"]


# Several processes -------------------------------------------------------------------------

CREATOR = """
import sys, time
from alpineagents import FileStore, State
store = FileStore(sys.argv[1])
state = State(f"writer {sys.argv[2]}", id="contested")
start = float(sys.argv[3])
while time.time() < start:
    pass
try:
    store.save(state)
except ValueError:
    print("refused")
else:
    print("won")
"""


@pytest.mark.slow
def test_create_is_exclusive_between_processes(tmp_path: Path) -> None:
    import time

    for round_ in range(5):
        root = tmp_path / f"round{round_}"
        start = time.time() + 1.0
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", CREATOR, str(root), str(n), str(start)],
                stdout=subprocess.PIPE,
                text=True,
                cwd=REPO,
            )
            for n in range(4)
        ]
        outputs = [p.communicate(timeout=60)[0].strip() for p in procs]
        assert sorted(outputs) == ["refused", "refused", "refused", "won"], outputs
        winner = outputs.index("won")
        assert FileStore(root).load("contested").task == f"writer {winner}"
        assert os.listdir(root) == ["contested"]


WRITER = """
import sys
from alpineagents import FileStore, State
from alpineagents import _saving
from alpineagents.state import TOOL_RESULT
store = FileStore(sys.argv[1])
try:
    state = store.load("k")
except KeyError:
    state = State("killed writer", id="k")
    store.save(state)
print("ready", len(state.history), flush=True)
while True:
    n = len(state.history)
    state.append(TOOL_RESULT, f"entry {n} " + "x" * (n * 997 % 20000), {"call_id": f"c{n}"})
    state.data["last"] = n
    _saving.save(store, state, entries_only=n % 3 == 0)
"""


def _expected_text(n: int) -> str:
    return f"entry {n} " + "x" * (n * 997 % 20000)


@pytest.mark.slow
@pytest.mark.crash
def test_killed_writer_never_leaves_a_half_read_entry(tmp_path: Path) -> None:
    rng = random.Random(42)
    store = FileStore(tmp_path)
    saved = 0
    for _ in range(25):
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tmp_path)],
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("ready")
        import time

        time.sleep(rng.uniform(0, 0.05))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdout.close()
        state = store.load("k")
        texts = [e.text for e in state.history]
        assert texts[0] == "killed writer"
        assert texts[1:] == [_expected_text(n) for n in range(1, len(texts))]
        assert len(texts) >= saved  # nothing saved is ever lost
        assert state.data.get("last", 0) <= len(texts) - 1
        saved = len(texts)
    assert saved > 25  # the writers did write


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("task", 5, "task must be a str"),
        ("task", "caf\udce9", "surrogate"),
    ],
)
def test_a_snapshot_field_of_the_wrong_type_is_corrupt_at_load(
    tmp_path: Path, field: str, value: Any, says: str
) -> None:
    store = FileStore(tmp_path)
    store.save(State("t", id="damaged"))
    path = tmp_path / "damaged" / "snapshot.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), field: value}))
    with pytest.raises(CorruptStateError, match=rf"State 'damaged' in FileStore.*{says}"):
        store.load("damaged")


# The snapshot ------------------------------------------------------------------------------


@pytest.mark.usefixtures("compact_entries")
def test_a_save_replaces_the_snapshot_by_one_rename_onto_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStore(tmp_path)
    agent_state(store, steps=1)
    renames: list[tuple[str, bool]] = []
    real = os.replace

    def replace(src: Any, dst: Any) -> None:
        renames.append((Path(dst).name, os.path.exists(dst)))
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    state = store.load("run")
    state.add_user_message("next")
    store.save(state)
    # Onto the old file: ext4 then writes the new data first, so a power cut leaves a whole
    # snapshot, the old or the new one (renaming onto no file would skip that).
    assert renames == [("snapshot.json", True)]
    assert sorted(os.listdir(tmp_path / "run")) == ["entries.jsonl", "snapshot.json"]
    assert FileStore(tmp_path).load("run").history[-1].text == "next"


@pytest.mark.usefixtures("compact_entries")
def test_an_unchanged_snapshot_is_not_rewritten(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    state = State("t", id="s")
    store.save(state)
    path = tmp_path / "s" / "snapshot.json"
    snapshot = json.loads(path.read_bytes())
    before = os.stat(path)
    store.write("s", [], snapshot)  # byte for byte what is on disk
    after = os.stat(path)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    # The store object's view is still right: a changed snapshot replaces it.
    store.write("s", [], {**snapshot, "data": {"k": 1}})
    assert os.stat(path).st_ino != before.st_ino
    assert store.load("s").data == {"k": 1}
