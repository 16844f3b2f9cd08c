"""The README's demo, run as a person would (the command line: tests/test_cli.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]

# Every test here runs the demo in a child process.
pytestmark = pytest.mark.slow


def run_demo(*args: str, env: dict[str, str]) -> str:
    """Run the demo as the README does; its output."""
    done = subprocess.run(
        [sys.executable, "-m", "alpineagents.demo", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_demo_kills_and_resumes_without_booking_twice() -> None:
    out = run_demo(env={k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"})
    assert "process 1 killed (exit -9); bookings in the airline's ledger: 1" in out
    assert "tool_result (unknown: the run stopped before this result was saved" in out
    assert "check_booking" in out
    assert "book_flight ran 1 time(s)" in out


def test_demo_with_an_api_key_talks_to_the_messages_api() -> None:
    """With ANTHROPIC_API_KEY set the demo uses the SDK; here the API is a loopback server."""
    import itertools

    from tests.loopback_anthropic import loopback, message, tool_use

    ids = itertools.count(1)

    def assistant(body: dict[str, Any]) -> dict[str, Any]:
        results = [
            block["content"]
            for m in body["messages"]
            if m["role"] == "user" and isinstance(m["content"], list)
            for block in m["content"]
            if block.get("type") == "tool_result"
        ]
        if not results:
            return message(
                tool_use(
                    f"toolu_{next(ids)}", "search_flights", destination="Oslo", date="2026-12-12"
                )
            )
        last = results[-1]
        if "price_eur" in last:
            return message(
                tool_use(
                    f"toolu_{next(ids)}", "book_flight", flight="SK4711", passenger="Ada Lovelace"
                )
            )
        if last.startswith("(unknown:"):
            return message(
                tool_use(f"toolu_{next(ids)}", "check_booking", passenger="Ada Lovelace")
            )
        return message(tool_use(f"toolu_{next(ids)}", "finish", answer="Booked once."))

    with loopback(assistant) as api:
        out = run_demo(env={**os.environ, **api.env()})
    assert "Model: Claude" in out
    assert "answer: Booked once." in out
    assert "book_flight ran 1 time(s)" in out
    assert all(r["model"] == "claude-sonnet-5" for r in api.requests)
    assert [t["name"] for t in api.requests[0]["tools"]][:3] == [
        "search_flights",
        "book_flight",
        "check_booking",
    ]


def test_demo_on_an_embedded_s3_server_shows_the_objects() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "AWS_"))}
    out = run_demo("--store", "s3", env=env)
    assert "Store: s3://alpineagents-demo/runs/" in out
    assert "book_flight ran 1 time(s)" in out
    assert "runs/heads/book-oslo-trip.json" in out
    assert "head     created with If-None-Match: *, then replaced" in out
    assert out.count("entry    created with If-None-Match: *") == 9
