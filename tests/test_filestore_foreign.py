"""Damaged and foreign objects in a FileStore: each is refused with a documented error.

A snapshot or entries file that is a symbolic link, a fifo, a folder, empty, binary, cut
short, not UTF-8, a JSON array, a number too long to read, NaN, nested too deeply or of a
newer schema; a State folder that is a file or a link; a store path that is a file. ``load``
raises ``CorruptStateError`` or ``SchemaVersionError`` (never ``OSError``, ``KeyError`` or a
hang), naming the State and the path; a save of a copy loaded before the damage raises a store
error and writes nothing; ``list`` leaves the State out and lists the others; a create of the
id refuses without touching what is there. Permissions: tests/scripts/fs_denied.py, run as
another user than root where the test runs as root.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from alpineagents import (
    ConcurrentWriteError,
    CorruptStateError,
    FileStore,
    SchemaVersionError,
    State,
    StateExistsError,
    StoreError,
)
from alpineagents.filestore import ENTRIES, SNAPSHOT
from alpineagents.history import MAX_DEPTH
from tests.helpers import Mode
from tests.scripts.harness import REPO, SCRIPTS, child_env

DIGITS = 5000  # more digits than json.loads reads in an int


def _json_edit(path: Path, change: Callable[[dict[str, object]], None], line: int = 0) -> None:
    """Change one JSON line of ``path`` (the snapshot has one line)."""
    lines = path.read_bytes().split(b"\n")
    value = json.loads(lines[line])
    change(value)
    lines[line] = json.dumps(value).encode()
    path.write_bytes(b"\n".join(lines))


def _symlink(path: Path) -> None:
    # The same bytes, elsewhere: a link is refused for what it is, not for what it holds.
    elsewhere = path.parent.parent.parent / f"elsewhere-{path.name}"
    shutil.copyfile(path, elsewhere)
    path.unlink()
    path.symlink_to(elsewhere)


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path, 0o600)


def _folder(path: Path) -> None:
    path.unlink()
    path.mkdir()
    (path / "inside").write_text("{}")


def _replace(data: bytes) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        path.write_bytes(data)

    return write


def _cut(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _not_utf8(path: Path) -> None:
    # Valid JSON structure with a byte that is not UTF-8 inside a string.
    path.write_bytes(path.read_bytes().replace(b'"task"', b'"t\xffsk"', 1))


def _deep(path: Path) -> None:
    path.write_bytes(b"[" * 200_000 + b"]" * 200_000 + b"\n")


def _last(path: Path, change: Callable[[dict[str, object]], None]) -> None:
    lines = path.read_bytes().split(b"\n")
    _json_edit(path, change, line=len(lines) - 2)  # the last line (the file ends with \n)


# Damage to one file: (how, where) -> the error class a load raises and words of its message.
FILE_DAMAGE: dict[str, tuple[Callable[[Path], None], type[StoreError], str | None]] = {
    "symlink": (_symlink, CorruptStateError, "is a symbolic link"),
    "fifo": (_fifo, CorruptStateError, "is a fifo"),
    "folder": (_folder, CorruptStateError, "is a folder"),
    "empty": (_replace(b""), CorruptStateError, None),
    "binary": (_replace(bytes(range(256)) * 4), CorruptStateError, "not valid JSON"),
    "cut short": (_cut, CorruptStateError, None),
    "not UTF-8": (_not_utf8, CorruptStateError, None),
    "JSON array": (_replace(b"[1, 2, 3]\n"), CorruptStateError, "not"),
    "huge int": (_replace(b"1" * DIGITS + b"\n"), CorruptStateError, "not valid JSON"),
    "NaN": (_replace(b"NaN\n"), CorruptStateError, None),
    "deeply nested": (_deep, CorruptStateError, None),
    "missing": (lambda path: path.unlink(), CorruptStateError, "has no"),
}

# Damage to a field: (file, change) -> error class and words.
FIELD_DAMAGE: dict[str, tuple[str, Callable[[Path], None], type[StoreError], str | None]] = {
    "snapshot of a newer schema": (
        SNAPSHOT,
        lambda p: _json_edit(p, lambda v: v.update(v=99)),
        SchemaVersionError,
        "schema version 99",
    ),
    "entry of a newer schema": (
        ENTRIES,
        lambda p: _last(p, lambda v: v.update(v=99)),
        SchemaVersionError,
        "schema version 99",
    ),
    "NaN in data": (
        SNAPSHOT,
        lambda p: _json_edit(p, lambda v: v.update(data={"x": float("nan")})),
        CorruptStateError,
        "nan",
    ),
    "huge int count": (
        SNAPSHOT,
        lambda p: _replace(p.read_bytes().replace(b'"entries":2', b'"entries":' + b"9" * DIGITS))(
            p
        ),
        CorruptStateError,
        "not valid JSON",
    ),
    "huge seq": (
        ENTRIES,
        lambda p: _last(p, lambda v: v.update(seq=10**30)),
        CorruptStateError,
        None,
    ),
    "entry that is a list": (
        ENTRIES,
        lambda p: _replace(p.read_bytes().split(b"\n")[0] + b"\n[1]\n")(p),
        CorruptStateError,
        "a dict",
    ),
    "data nested too deeply": (
        SNAPSHOT,
        lambda p: _json_edit(
            p,
            lambda v: v.update(
                data={"x": json.loads("[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5))}
            ),
        ),
        CorruptStateError,
        "levels",
    ),
}

# Damage to fields that list() does not read (it reads the summary: id, task, times, stop).
NOT_READ_BY_LIST = {"NaN in data", "data nested too deeply"}

CASES = [
    pytest.param(name, target, how, error, words, target == ENTRIES, id=f"{target}-{name}")
    for name, (how, error, words) in FILE_DAMAGE.items()
    for target in (SNAPSHOT, ENTRIES)
] + [
    pytest.param(
        name, target, how, error, words, target == ENTRIES or name in NOT_READ_BY_LIST, id=name
    )
    for name, (target, how, error, words) in FIELD_DAMAGE.items()
]


@pytest.fixture
def no_hang() -> Iterator[None]:
    """Fail a test that blocks (a fifo opened for reading waits for a writer) instead of hanging."""

    def timeout(signum: int, frame: object) -> None:
        raise TimeoutError("blocked for 20 s")

    previous = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(20)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def saved(root: Path) -> tuple[FileStore, State]:
    """A store with State ``s`` (2 entries) and a bystander ``other``; a copy of ``s``."""
    store = FileStore(root / "runs")
    state = State("task", id="s", data={"n": 1})
    state.add_user_message("hello")
    store.save(state)
    store.save(State("a bystander", id="other"))
    return store, store.load("s")


def files(root: Path) -> dict[str, bytes | str]:
    """Every entry under ``root``: a file's bytes, else what it is."""
    found: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        name = str(path.relative_to(root))
        if path.is_symlink():
            found[name] = f"link to {os.readlink(path)}"
        elif path.is_fifo():
            found[name] = "fifo"
        elif path.is_dir():
            found[name] = "folder"
        else:
            found[name] = path.read_bytes()
    return found


def assert_names_the_state(error: BaseException, path: Path) -> None:
    message = str(error)
    assert "'s'" in message, message
    assert str(path) in message, message


@pytest.mark.usefixtures("no_hang")
@pytest.mark.parametrize(("name", "target", "how", "error", "words", "listed_too"), CASES)
def test_a_damaged_file_is_refused_naming_the_state_and_nothing_is_lost(
    tmp_path: Path,
    mode: Mode,
    name: str,
    target: str,
    how: Callable[[Path], None],
    error: type[StoreError],
    words: str | None,
    listed_too: bool,
) -> None:
    store, copy = saved(tmp_path)
    folder = tmp_path / "runs" / "s"
    how(folder / target)
    before = files(tmp_path)

    def call(
        sync: Callable[..., object], run_async: Callable[..., object], *args: object
    ) -> object:
        if mode == "async":
            return asyncio.run(run_async(*args))  # type: ignore[arg-type]
        return sync(*args)

    fresh = FileStore(tmp_path / "runs")
    with pytest.raises(error, match=words) as refused:
        call(fresh.load, fresh.aload, "s")
    assert_names_the_state(refused.value, folder)

    # A save of a copy loaded before the damage is refused by a store error, writing nothing;
    # or, when the damage is in an entry the save does not read (it appends), it saves, and
    # the file it appended to begins as before.
    copy.add_user_message("after the damage")
    copy.data["n"] = 2
    entries = str(Path("runs", "s", ENTRIES))
    refusal: StoreError | None = None
    try:
        call(store.save, store.asave, copy)
    except (CorruptStateError, SchemaVersionError, ConcurrentWriteError) as e:
        refusal = e
    if refusal is not None:
        assert "'s'" in str(refusal)
        assert files(tmp_path) == before
    else:
        assert target == ENTRIES, f"a save over a damaged {target} was not refused"
        appended, kept = files(tmp_path)[entries], before[entries]
        assert isinstance(appended, bytes) and isinstance(kept, bytes)
        assert appended.startswith(kept)
        before = files(tmp_path)

    # The others are listed (the State too when its snapshot is readable: list reads no
    # entries); a create of the id is refused and touches nothing.
    listed = [saved.id for saved in call(fresh.list, fresh.alist)]  # type: ignore[attr-defined]
    assert sorted(listed) == (["other", "s"] if listed_too else ["other"])
    with pytest.raises((StateExistsError, CorruptStateError)):
        call(fresh.save, fresh.asave, State("new", id="s"))
    assert files(tmp_path) == before
    assert fresh.load("other").task == "a bystander"


@pytest.mark.parametrize("what", ["file", "symlink to a folder", "symlink to nothing"])
def test_a_state_folder_that_is_not_a_folder_is_refused_and_kept(
    tmp_path: Path, mode: Mode, what: str
) -> None:
    saved(tmp_path)
    place = tmp_path / "runs" / "x"
    if what == "file":
        place.write_text("notes of my own\n")
    elif what == "symlink to a folder":
        shutil.copytree(tmp_path / "runs" / "s", tmp_path / "copy-of-s")
        place.symlink_to(tmp_path / "copy-of-s")
    else:
        place.symlink_to(tmp_path / "nowhere")
    before = files(tmp_path)
    fresh = FileStore(tmp_path / "runs")

    def call(method: str, *args: object) -> object:
        if mode == "async":
            return asyncio.run(getattr(fresh, "a" + method)(*args))
        return getattr(fresh, method)(*args)

    for method, args in (("load", ("x",)), ("read", ("x",)), ("delete", ("x",))):
        with pytest.raises(CorruptStateError, match="not a State folder") as refused:
            call(method, *args)
        assert "'x'" in str(refused.value) and str(place) in str(refused.value)
    with pytest.raises(CorruptStateError, match="not a State folder"):
        call("save", State("new", id="x"))
    assert sorted(s.id for s in call("list")) == ["other", "s"]  # type: ignore[attr-defined]
    assert files(tmp_path) == before


def test_a_store_path_that_is_a_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "runs"
    path.write_text("not a folder")
    store = FileStore(path)
    for call in (lambda: store.load("s"), store.list, lambda: store.save(State("t", id="s"))):
        with pytest.raises(CorruptStateError, match="is not a folder") as refused:
            call()
        assert str(path) in str(refused.value)
    assert path.read_text() == "not a folder"


# Permissions ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="POSIX modes")
@pytest.mark.parametrize("target", ["snapshot", "entries", "state folder", "store folder"])
def test_a_file_this_user_may_not_open_is_a_permission_error_naming_it(target: str) -> None:
    # Root opens any file: the child then runs as another user (see the script), in a folder
    # that user can reach (pytest's tmp_path is under a folder of root's alone).
    place = Path(tempfile.mkdtemp(prefix="alpineagents-denied-"))
    try:
        os.chmod(place, 0o755)
        done = subprocess.run(
            [sys.executable, str(SCRIPTS / "fs_denied.py"), str(place), target],
            capture_output=True,
            text=True,
            env=child_env(),
            cwd=REPO,
            timeout=60,
            check=False,
        )
    finally:
        shutil.rmtree(place, ignore_errors=True)
    assert done.returncode == 0, done.stderr
    outcomes = json.loads(done.stdout)
    for op, outcome in outcomes["ops"].items():
        assert outcome["error"] == "StorePermissionError", (op, outcome)
        assert outcome["is_permission_error"], (op, outcome)
        assert outcome["denied_path"] in outcome["message"], (op, outcome)
        if target != "store folder":
            assert "'s'" in outcome["message"], (op, outcome)
    assert outcomes["unchanged"], outcomes
