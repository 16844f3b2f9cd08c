"""The ``alpineagents`` command: every command and its error paths, in-process through
``main(argv)``, and through a real subprocess of the console script for exit codes, a closed
pipe and the start-up time."""

from __future__ import annotations

import io
import json
import resource
import shutil
import stat
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest

from alpineagents import Agent, FileStore, State, Store, open_store
from alpineagents.cli import (
    EXIT_CONFLICT,
    EXIT_FAILURE,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_PIPE,
    EXIT_USAGE,
    main,
)
from alpineagents.model import ModelRequest
from alpineagents.state import HistoryEntry
from alpineagents.testing import FunctionModel, TestModel, call
from tests.helpers import AsyncOver, make_states

REPO = Path(__file__).resolve().parents[1]
SCRIPT = Path(sys.executable).with_name("alpineagents")


class Run:
    """``main(argv)``'s status and what it printed."""

    def __init__(self, capsys: pytest.CaptureFixture[str], *argv: str):
        self.status = main(list(argv))
        captured = capsys.readouterr()
        self.out, self.err = captured.out, captured.err

    def error_line(self) -> str:
        lines = self.err.splitlines()
        assert len(lines) == 1, self.err
        assert lines[0].startswith("alpineagents: error: ")
        assert "Traceback" not in self.err
        return lines[0]


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Any:
    return lambda *argv: Run(capsys, *argv)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A store with three finished States, updated in the order run-0, run-1, run-2."""
    make_states(FileStore(tmp_path / "runs"), 3)
    return tmp_path / "runs"


def booking_model() -> FunctionModel:
    """Text, a call with arguments, a failing call, then ask; after the answer, finish."""

    def respond(request: ModelRequest) -> Any:
        turns = sum(m["role"] == "assistant" for m in request.messages)
        if turns == 0:
            return [
                {"type": "text", "text": "Let me look that up."},
                call("lookup", city="Oslo", nights=2),
            ]
        if turns == 1:
            return [call("explode")]
        if turns == 2:
            return [call("ask", question="Which date?")]
        return [call("finish", answer="Booked for Friday")]

    return FunctionModel(respond)


def lookup(city: str, nights: int) -> str:
    """Find a hotel."""
    return f"Hotel Fjord in {city}, {nights} nights"


def explode() -> str:
    """Fail."""
    raise RuntimeError("the booking system is down")


def booked(store: Store) -> State:
    agent = Agent(booking_model(), tools=[lookup, explode], store=store)
    state = State("Book a hotel\nin Oslo", id="hotel", data={"user": "ada"})
    assert agent.run(state) == "Which date?"
    state.add_user_message("Friday")
    assert agent.run(state) == "Booked for Friday"
    return state


# ls ---------------------------------------------------------------------------------------


def test_ls_is_a_table_with_a_header_newest_first(cli: Any, folder: Path) -> None:
    run = cli("ls", str(folder))
    assert run.status == EXIT_OK and run.err == ""
    header, *rows = run.out.splitlines()
    assert header.split() == ["ID", "UPDATED", "(UTC)", "STOPPED_BY", "ENTRIES", "TASK"]
    assert [row.split()[0] for row in rows] == ["run-2", "run-1", "run-0"]
    assert rows[0].split()[3:] == ["finish", "5", "task", "2", "second", "line"]
    assert cli("list", str(folder)).out == run.out  # the old name still works


def test_ls_cuts_a_long_task_to_one_line(cli: Any, tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    Agent(TestModel(answer="x"), store=store).run(State("word " * 100 + "\n" * 5 + "end", id="a"))
    rows = cli("ls", str(tmp_path)).out.splitlines()
    assert len(rows) == 2
    task = rows[1][rows[0].index("TASK") :]
    assert task.startswith("word word") and task.endswith("…") and len(task) == 80


def test_ls_json_limit_and_filters(cli: Any, folder: Path) -> None:
    store = FileStore(folder)
    asking = State("ask me", id="asking")
    Agent(FunctionModel(lambda r: [call("ask", question="why?")]), store=store).run(asking)
    listed = json.loads(cli("ls", str(folder), "--json").out)
    assert [s["id"] for s in listed] == ["asking", "run-2", "run-1", "run-0"]
    assert listed[1] == {
        "id": "run-2",
        "updated_at": store.list()[1].updated_at.isoformat(),
        "stopped_by": "finish",
        "entries": 5,
        "task": "task 2\nsecond line",
    }
    assert [s["id"] for s in json.loads(cli("ls", str(folder), "--json", "--limit", "2").out)] == [
        "asking",
        "run-2",
    ]

    def ids(*options: str) -> list[str]:
        run = cli("ls", str(folder), "--json", *options)
        assert run.status == EXIT_OK, run.err
        return [s["id"] for s in json.loads(run.out)]

    assert ids("--stopped-by", "ask") == ["asking"]
    assert ids("--stopped-by", "none") == []
    assert ids("--stopped-by", "finish", "--limit", "1") == ["run-2"]
    middle = store.list()[2].updated_at  # run-1
    assert ids("--since", middle.isoformat()) == ["asking", "run-2", "run-1"]
    assert ids("--before", middle.isoformat()) == ["run-0"]
    assert ids("--since", "1h") == ["asking", "run-2", "run-1", "run-0"]
    assert ids("--before", "2d") == []
    later = (datetime.now(UTC) + timedelta(days=1)).date().isoformat()
    assert ids("--since", later) == []


def test_ls_counts_entries_of_a_state_stopped_mid_run(cli: Any, tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    state = State("unfinished", id="half")
    Agent(TestModel(), store=store).save(state)
    assert json.loads(cli("ls", str(tmp_path), "--json", "--stopped-by", "none").out) == [
        {
            "id": "half",
            "updated_at": store.list()[0].updated_at.isoformat(),
            "stopped_by": None,
            "entries": 1,
            "task": "unfinished",
        }
    ]
    assert cli("ls", str(tmp_path)).out.splitlines()[1].split()[3:5] == ["-", "1"]


@pytest.mark.parametrize(
    ("argv", "status", "message"),
    [
        (["ls", "{missing}"], EXIT_NOT_FOUND, "no store folder '{missing}': check the path"),
        (["ls", "{file}"], EXIT_USAGE, "{file} is a file, not a store folder"),
        (["ls", "{folder}", "--since", "yesterday"], EXIT_USAGE, "--since 'yesterday': give"),
        (["ls", "{folder}", "--limit", "-1"], EXIT_USAGE, "--limit must be 0 or more"),
        (["ls", "gs://bucket/runs"], EXIT_USAGE, "no store is registered for the scheme 'gs'"),
        (["show", "{folder}", "nope"], EXIT_NOT_FOUND, "no saved State with id 'nope' in"),
        (["show", "{folder}", "bad id"], EXIT_USAGE, "invalid State id 'bad id'"),
        (["show", "{missing}", "run-0"], EXIT_NOT_FOUND, "no store folder"),
        (["rm", "{folder}", "run-0", "nope", "--yes"], EXIT_NOT_FOUND, "id 'nope'"),
        (["export", "{folder}", "nope"], EXIT_NOT_FOUND, "no saved State with id 'nope'"),
        (["import", "{folder}", "{missing}"], EXIT_NOT_FOUND, "no file '{missing}' to import"),
        (["import", "{folder}", "{file}"], EXIT_FAILURE, "is not JSON"),
        (["cp", "{missing}", "{folder}"], EXIT_NOT_FOUND, "no store folder '{missing}'"),
        (["cp", "{folder}", "{folder}"], EXIT_USAGE, "onto itself"),
        (["cp", "{folder}", "{tmp}/copy", "nope"], EXIT_NOT_FOUND, "id 'nope'"),
        (["mv", "{folder}", "{tmp}/copy", "a/b"], EXIT_USAGE, "invalid State id 'a/b'"),
    ],
)
def test_expected_failures_are_one_line_with_a_status(
    cli: Any, folder: Path, tmp_path: Path, argv: list[str], status: int, message: str
) -> None:
    names = {
        "missing": str(tmp_path / "missing"),
        "file": str(tmp_path / "file.txt"),
        "folder": str(folder),
        "tmp": str(tmp_path),
    }
    Path(names["file"]).write_text("not a store")
    run = cli(*(a.format(**names) for a in argv))
    assert run.status == status
    assert message.format(**names) in run.error_line()
    assert [s.id for s in FileStore(folder).list()] == ["run-2", "run-1", "run-0"]  # untouched


def test_usage_errors_and_version(cli: Any) -> None:
    assert cli().status == EXIT_USAGE
    assert cli("frobnicate").status == EXIT_USAGE
    assert cli("show", "only-a-store").status == EXIT_USAGE
    run = cli("--version")
    assert run.status == EXIT_OK and run.out.startswith("alpineagents 0.")
    run = cli("--help")
    assert run.status == EXIT_OK
    assert "Exit status:" in run.out and "s3://BUCKET/PREFIX" in run.out


# show -------------------------------------------------------------------------------------


def test_show_is_a_readable_transcript(cli: Any, tmp_path: Path) -> None:
    booked(FileStore(tmp_path))
    run = cli("show", str(tmp_path), "hotel")
    assert run.status == EXIT_OK, run.err
    out = run.out
    assert out.startswith("State hotel\n  status   stopped by finish\n  answer   Booked for Friday")
    assert '  data     {"user": "ada"}' in out
    assert "[0] task" in out and "    Book a hotel\n    in Oslo" in out
    assert '    Let me look that up.\n    -> lookup(city="Oslo", nights=2)' in out
    assert "tool result lookup" in out and "    Hotel Fjord in Oslo, 2 nights" in out
    assert "tool result explode" in out and "ERROR" in out and "the booking system is down" in out
    assert '-> ask(question="Which date?")' in out
    assert "] user (answers call_" in out and "    Friday" in out
    assert '-> finish(answer="Booked for Friday")' in out
    assert "not saved" not in out


def test_show_json_is_the_whole_state(cli: Any, tmp_path: Path) -> None:
    state = booked(FileStore(tmp_path))
    shown = json.loads(cli("show", str(tmp_path), "hotel", "--json").out)
    assert {k: shown[k] for k in ("id", "task", "stopped_by", "answer", "data")} == {
        "id": "hotel",
        "task": "Book a hotel\nin Oslo",
        "stopped_by": "finish",
        "answer": "Booked for Friday",
        "data": {"user": "ada"},
    }
    assert [(e["seq"], e["kind"], e["text"], e["data"]) for e in shown["history"]] == [
        (e.seq, e.kind, e.text, e.data) for e in state.history
    ]
    assert all(e["saved"] for e in shown["history"]) and shown["saved_entries"] == 9


def test_show_marks_what_loading_added(cli: Any, tmp_path: Path) -> None:
    """A call without a saved result (a killed run) gets its "(unknown: …)" result on load."""
    store = FileStore(tmp_path)
    state = State("interrupted", id="cut")
    Agent(TestModel(), store=store).save(state)
    state.append("model", "", {"content": [call("lookup", city="Bergen")], "stop_reason": "x"})
    Agent(TestModel(), store=store).save(state)
    out = cli("show", str(tmp_path), "cut").out
    assert "not stopped" in out
    assert "entries  3 (1 added when loading)" in out
    assert "(not saved: added when loading)\n    (unknown: the run stopped" in out


def test_show_transcribes_compactions_notices_and_unknown_kinds(cli: Any, tmp_path: Path) -> None:
    state = State("t", id="x")
    state.append("compaction", "Summary: looked things up.")
    state.append("notice", "Steps are missing.", {"skipped": [1, 2]})
    future_kind: Any = "future_kind"  # a kind a newer alpineagents may write
    state.history.append(HistoryEntry(3, future_kind, "what is this", {"k": 1}))
    FileStore(tmp_path).save(state)
    lines = cli("show", str(tmp_path), "x").out
    assert "[1] compaction: older context replaced by this summary" in lines
    assert "    Summary: looked things up." in lines
    assert "[2] notice (entries 1-1 left out)" in lines
    assert "[3] future_kind" in lines and '    what is this\n    {"k": 1}' in lines


# rm ---------------------------------------------------------------------------------------


def test_rm_with_yes_reports_what_it_removed(cli: Any, folder: Path) -> None:
    run = cli("rm", str(folder), "run-0", "run-2", "--yes")
    assert run.status == EXIT_OK
    # What FileStore.delete reports (the str() of its result).
    assert run.out == (
        "removed State 'run-0': 2 files, 0 leftover folders\n"
        "removed State 'run-2': 2 files, 0 leftover folders\n"
    )
    assert [s.id for s in FileStore(folder).list()] == ["run-1"]
    assert cli("delete", str(folder), "run-1", "-y").out.startswith("removed State 'run-1': ")


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def test_rm_asks_on_a_terminal(cli: Any, folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", Terminal("n\n"))
    run = cli("rm", str(folder), "run-0")
    assert run.status == EXIT_USAGE and "nothing removed" in run.err
    assert "Remove 1 State(s) from FileStore" in run.err and "run-0? [y/N]" in run.err
    assert len(FileStore(folder).list()) == 3
    monkeypatch.setattr(sys, "stdin", Terminal("y\n"))
    run = cli("rm", str(folder), "run-0")
    assert run.status == EXIT_OK and run.out.startswith("removed State 'run-0': 2 files")
    assert len(FileStore(folder).list()) == 2


def test_rm_without_a_terminal_needs_yes(cli: Any, folder: Path) -> None:
    run = cli("rm", str(folder), "run-0")
    assert run.status == EXIT_USAGE
    assert "without confirmation: pass --yes" in run.error_line()
    assert len(FileStore(folder).list()) == 3


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
    assert cli("rm", url, "run-2", "--yes").out == "removed run-2\n"


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
    assert cli("rm", url, "run-2", "--yes").out == "removed run-2\n"
    assert isinstance(open_store(url), AsyncOnly)


# S3 failures ------------------------------------------------------------------------------


def test_s3_failures_are_one_line(
    cli: Any, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = cli("ls", "s3://no-such-bucket/runs")
    assert run.status == EXIT_NOT_FOUND
    assert "the bucket 'no-such-bucket' does not exist" in run.error_line()
    assert cli("show", "s3://no-such-bucket/runs", "x").status == EXIT_NOT_FOUND
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    run = cli("ls", "s3://no-such-bucket/runs")
    assert run.status == EXIT_FAILURE
    assert "no AWS credentials were found" in run.error_line()
    run = cli("ls", "s3://")
    assert run.status == EXIT_USAGE and "s3://bucket/prefix" in run.error_line()


def script(*argv: str, **popen: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), *argv], capture_output=True, text=True, timeout=60, **popen)


@pytest.mark.slow
def test_a_missing_boto3_names_what_to_install(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['boto3'] = None; sys.modules['aioboto3'] = None\n"
        "from alpineagents.cli import main; sys.exit(main(['ls', 's3://bucket/runs']))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert done.returncode == EXIT_FAILURE
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("alpineagents: error: ") and "pip install" in done.stderr


# The console script -----------------------------------------------------------------------

needs_script = pytest.mark.skipif(not SCRIPT.exists(), reason="no console script installed")


@pytest.mark.slow
@needs_script
def test_the_console_script_exit_codes(folder: Path, tmp_path: Path) -> None:
    done = script("ls", str(folder))
    assert done.returncode == EXIT_OK and done.stdout.startswith("ID ")
    done = script("ls", str(tmp_path / "typo"))
    assert (done.returncode, done.stdout) == (EXIT_NOT_FOUND, "")
    assert done.stderr.count("\n") == 1 and "no store folder" in done.stderr
    done = script("show", str(folder), "nope")
    assert done.returncode == EXIT_NOT_FOUND and "Traceback" not in done.stderr
    done = script("rm", str(folder), "run-0", stdin=subprocess.DEVNULL)
    assert done.returncode == EXIT_USAGE and "pass --yes" in done.stderr
    assert script("bogus").returncode == EXIT_USAGE


@pytest.mark.slow
@needs_script
@pytest.mark.parametrize("argv", [["ls", "--json"], ["export"]])
def test_a_closed_pipe_is_quiet(tmp_path: Path, argv: list[str]) -> None:
    store = FileStore(tmp_path / "big")
    for i in range(3):  # 1.5 MB each, past a pipe's buffer even where it is 1 MB
        Agent(TestModel(answer="x"), store=store).run(State("long " * 300_000, id=f"big-{i}"))
    command = [str(SCRIPT), argv[0], str(store.path), *argv[1:]]
    if argv[0] == "export":
        command.append("big-0")
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert child.stdout is not None and child.stderr is not None
    assert child.stdout.read(10)
    child.stdout.close()  # as `| head -c 10` does
    assert child.wait(timeout=60) == EXIT_PIPE
    with child.stderr:
        assert child.stderr.read() == b""


@pytest.mark.slow
@needs_script
def test_the_shell_pipe_into_head_is_quiet(folder: Path) -> None:
    if shutil.which("head") is None:
        pytest.skip("no head")
    done = subprocess.run(
        f"'{SCRIPT}' ls '{folder}' | head -1",
        shell=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.startswith("ID ") and done.stdout.count("\n") == 1
    assert done.stderr == ""


HEAVY = ("boto3", "botocore", "aioboto3", "alpineagents_s3", "moto", "alpineagents.transfer")


@pytest.mark.slow
def test_help_imports_nothing_heavy_beyond_the_package() -> None:
    code = (
        "import sys, alpineagents; before = set(sys.modules)\n"
        "from alpineagents.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        f"print(sorted(m for m in set(sys.modules) - before if m.startswith({HEAVY!r})))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.slow
def test_help_adds_little_to_importing_the_package() -> None:
    """What the CLI itself costs at start-up: --help minus `import alpineagents`, in CPU time
    (the machine may be busy)."""

    def best(code: str) -> float:
        times = []
        for _ in range(2):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run(
                [sys.executable, "-c", code], capture_output=True, timeout=60, check=True
            )
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            times.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        return min(times)

    package = best("import alpineagents")
    helped = best("from alpineagents.cli import main; main(['--help'])")
    assert helped - package < 0.15, (helped, package)


@pytest.mark.slow
@needs_script
def test_help_starts_in_well_under_a_second() -> None:
    # The CPU time the command uses, not the wall time: the machine may be busy with other work.
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([str(SCRIPT), "--help"], capture_output=True, timeout=60, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert cpu < 0.6, f"alpineagents --help used {cpu:.2f} s of CPU ({wall:.2f} s wall)"


# sweep ------------------------------------------------------------------------------------


def test_sweep_removes_what_killed_processes_left(cli: Any, folder: Path, bucket: str) -> None:
    create = folder / ".run-9.0123456789abcdef.new"  # a create killed before its rename
    create.mkdir()
    (create / "entries.jsonl").write_text("{}\n")
    run = cli("sweep", str(folder))
    assert run.status == EXIT_OK, run.err
    assert run.out == f"removed {create}\n"
    assert "1 leftover(s) removed" in run.err
    assert not create.exists()
    assert [s.id for s in FileStore(folder).list()] == ["run-2", "run-1", "run-0"]

    url = f"s3://{bucket}/runs"
    client = boto3.client("s3")
    key = f"runs/never-made/entries/{'ab' * 8}/0000000000.json"  # a create killed on S3
    client.put_object(Bucket=bucket, Key=key, Body=b'{"seq": 0}')
    assert cli("sweep", url).out == ""  # younger than a day: maybe a create under way
    run = cli("sweep", url, "--older-than", "0s")
    assert run.out == f"removed {key}\n"
    assert "Contents" not in client.list_objects_v2(Bucket=bucket, Prefix="runs/")
    assert cli("sweep", url, "--older-than", "soon").status == EXIT_USAGE
