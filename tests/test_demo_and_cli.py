"""The README's demo and the command line, run as a person would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from alpineagents import Agent, FileStore, State
from alpineagents.cli import main
from alpineagents.testing import TestModel

REPO = Path(__file__).resolve().parents[1]


def test_demo_kills_and_resumes_without_booking_twice() -> None:
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    done = subprocess.run(
        [sys.executable, "-m", "alpineagents.demo"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "process 1 killed (exit -9); bookings in the airline's ledger: 1" in out
    assert "tool_result (unknown: the run stopped before this result was saved" in out
    assert "check_booking" in out
    assert "book_flight ran 1 time(s)" in out


def test_cli_lists_shows_and_deletes(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    store = FileStore(tmp_path)
    Agent(TestModel(answer="ok"), store=store).run(State("first task", id="one"))
    assert main(["list", str(tmp_path)]) == 0
    assert "one\t" in capsys.readouterr().out
    assert main(["show", str(tmp_path), "one"]) == 0
    assert "first task" in capsys.readouterr().out
    assert main(["delete", str(tmp_path), "one"]) == 0
    assert main(["show", str(tmp_path), "one"]) == 1
    assert "no saved State with id 'one'" in capsys.readouterr().err
