"""The ``alpineagents`` command in-process, through ``main(argv)``: ls, show, rm, sweep,
usage errors and the one-line errors of stores that fail (S3 included).

Moving States (export, import, cp, mv) is in test_cli_transfer.py; the console script as a
process (exit codes, a closed pipe, the start-up time) in test_cli_process.py; what the
command asks of any store in test_cli_stores.py.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest

from alpineagents import Agent, FileStore, State, Store
from alpineagents.cli import (
    EXIT_FAILURE,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_USAGE,
)
from alpineagents.model import ModelRequest
from alpineagents.state import HistoryEntry
from alpineagents.testing import FunctionModel, TestModel, call
from tests.helpers import Terminal


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
    inc = "ab" * 8
    key = f"runs/states/never-made/{inc}/e0000000000.{inc}.json"  # a create killed on S3
    mark = {"alpineagents-s3": "entry"}
    client.put_object(Bucket=bucket, Key=key, Body=b'{"seq": 0}', Metadata=mark)
    stranger = f"runs/states/never-made/{inc}/e0000000001.{inc}.json"  # not the store's
    client.put_object(Bucket=bucket, Key=stranger, Body=b'{"seq": 1}')
    assert cli("sweep", url).out == ""  # younger than a day: maybe a create under way
    run = cli("sweep", url, "--older-than", "0s")
    assert run.out == f"removed {key}\n"
    listed = client.list_objects_v2(Bucket=bucket, Prefix="runs/")["Contents"]
    assert [item["Key"] for item in listed] == [stranger]
    assert cli("sweep", url, "--older-than", "soon").status == EXIT_USAGE
