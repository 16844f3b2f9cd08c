"""The ``alpineagents`` command moving States, in-process through ``main(argv)``: export and
import through stdout and files, cp and mv between a folder, a bucket and a store of a plugin,
conflicts, and the progress drawn on a terminal."""

from __future__ import annotations

import io
import json
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from alpineagents import Agent, FileStore, State, open_store
from alpineagents.cli import (
    EXIT_CONFLICT,
    EXIT_OK,
    EXIT_USAGE,
)
from alpineagents.testing import TestModel
from tests.helpers import AsyncOver, Terminal

# export / import --------------------------------------------------------------------------


def test_export_import_through_stdout_and_files(
    cli: Any, folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = cli("export", str(folder), "run-1").out
    document = json.loads(out)
    assert (document["format"], document["id"], len(document["entries"])) == (
        "alpineagents.state",
        "run-1",
        5,
    )
    target = tmp_path / "exported.json"
    run = cli("export", str(folder), "run-1", "-o", str(target))
    assert run.out == "" and "exported run-1 (5 entries) to" in run.err
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert json.loads(target.read_text())["entries"] == document["entries"]

    other = tmp_path / "other"
    run = cli("import", str(other), str(target))
    assert (run.status, run.out) == (EXIT_OK, "copied run-1 (5 entries)\n")
    assert FileStore(other).load("run-1").answer == "answer 1"
    assert cli("import", str(other), str(target)).out == "run-1 is already there, identical\n"

    document["snapshot"]["data"] = {"changed": True}
    changed = json.dumps(document)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(changed.encode())))
    run = cli("import", str(other), "-")
    assert run.status == EXIT_CONFLICT
    assert "'run-1'" in run.error_line() and "--overwrite" in run.err
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(changed.encode())))
    assert cli("import", str(other), "-", "--skip-existing").out.startswith("kept the different")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(changed.encode())))
    assert cli("import", str(other), "-", "--overwrite").out == "replaced run-1 (5 entries)\n"
    assert FileStore(other).load("run-1").data == {"changed": True}
    assert cli("import", str(other), "-", "--overwrite", "--skip-existing").status == EXIT_USAGE


# cp / mv ----------------------------------------------------------------------------------


def test_cp_and_mv_between_a_folder_and_a_bucket(cli: Any, folder: Path, bucket: str) -> None:
    url = f"s3://{bucket}/archive"
    run = cli("cp", str(folder), url)
    assert run.status == EXIT_OK, run.err
    assert sorted(run.out.splitlines()) == [f"copied run-{i} (5 entries)" for i in range(3)]
    assert "3 State(s)" in run.err and "3 copied" in run.err and "\r" not in run.err
    assert cli("cp", str(folder), url).out.count("already there, identical") == 3
    listed = json.loads(cli("ls", url, "--json").out)
    assert [(s["id"], s["entries"]) for s in listed] == [("run-2", 5), ("run-1", 5), ("run-0", 5)]
    assert '-> finish(answer="answer 1")' in cli("show", url, "run-1").out

    back = folder.parent / "back"
    run = cli("mv", url, str(back), "run-0", "run-1")
    assert run.status == EXIT_OK, run.err
    assert run.out.splitlines() == [
        "copied run-0 (5 entries), removed from the source",
        "copied run-1 (5 entries), removed from the source",
    ]
    assert "2 removed from" in run.err
    assert [s["id"] for s in json.loads(cli("ls", url, "--json").out)] == ["run-2"]
    assert sorted(s.id for s in FileStore(back).list()) == ["run-0", "run-1"]
    # S3Store's delete reports what it removed: the head and the 5 entry objects.
    assert cli("rm", url, "run-2", "--yes").out == "deleted State 'run-2': 6 objects\n"


def test_cp_conflict_skip_overwrite_and_quiet(cli: Any, folder: Path, tmp_path: Path) -> None:
    dst = tmp_path / "dst"
    Agent(TestModel(answer="mine"), store=FileStore(dst)).run(State("other", id="run-1"))
    run = cli("cp", str(folder), str(dst))
    assert run.status == EXIT_CONFLICT
    line = run.error_line()
    assert "different State with id 'run-1'" in line and "--skip-existing" in line
    assert f"FileStore({str(folder)!r})" in line and f"FileStore({str(dst)!r})" in line
    run = cli("cp", str(folder), str(dst), "--skip-existing", "-q")
    assert (run.status, run.out, run.err) == (EXIT_OK, "", "")
    assert FileStore(dst).load("run-1").answer == "mine"
    run = cli("mv", str(folder), str(dst), "--overwrite")
    assert run.status == EXIT_OK
    assert "replaced run-1 (5 entries), removed from the source" in run.out
    assert FileStore(folder).list() == []


def test_cp_draws_progress_on_a_terminal(
    cli: Any, folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    run = cli("cp", str(folder), str(tmp_path / "dst"))
    assert run.status == EXIT_OK
    drawn = terminal.getvalue()
    assert "\r[##########....................] 1/3 " in drawn
    assert "\r[##############################] 3/3 " in drawn
    assert "\r\x1b[K3 State(s)" in drawn  # the bar is cleared before the summary


class AsyncOnly(AsyncOver):
    """A store with only the async methods, over a FileStore."""

    def __init__(self, path: Path):
        super().__init__(FileStore(path))

    @classmethod
    def from_url(cls, url: str) -> AsyncOnly:
        """``async:///path/to/folder``."""
        return cls(Path(url.removeprefix("async://")))


def test_an_async_only_store_works_too(
    cli: Any, folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Registered for the ``async`` scheme through an entry point, as a plugin would be."""
    plugin = tmp_path / "plugin"
    info = plugin / "asynconly-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: asynconly\nVersion: 0\n")
    (info / "entry_points.txt").write_text(f"[alpineagents.stores]\nasync = {__name__}:AsyncOnly\n")
    monkeypatch.syspath_prepend(str(plugin))
    url = f"async://{tmp_path / 'dst'}"
    assert cli("cp", str(folder), url).status == EXIT_OK
    listed = json.loads(cli("ls", url, "--json").out)
    assert [(s["id"], s["entries"]) for s in listed] == [("run-2", 5), ("run-1", 5), ("run-0", 5)]
    assert "answer 2" in cli("show", url, "run-2").out
    assert cli("rm", url, "run-2", "--yes").out == "removed run-2\n"  # its delete returns None
    assert isinstance(open_store(url), AsyncOnly)
