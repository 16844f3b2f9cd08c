"""The parent's side of the crash tests: start child processes, wait for them, kill them.

Children run this folder's scripts with ``sys.executable``; ``import alpineagents`` and
``import tests.loopback_anthropic`` work in them (PYTHONPATH holds the repository). Every
wait has a timeout, and a child is never left running: ``child()`` kills it on the way out.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent
TIMEOUT = 30.0

# The seed's words for a call whose result was not saved, verbatim.
UNKNOWN = (
    "(unknown: the run stopped before this result was saved, so the tool may or may not "
    "have run. Check whether it took effect before relying on it or running it again)"
)


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The test's environment without ANTHROPIC_*, with the repository importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env["NO_PROXY"] = "127.0.0.1,localhost"
    env.update(extra or {})
    return env


def command(script: str | Path, *args: object) -> list[str]:
    return [sys.executable, str(SCRIPTS / script), *map(str, args)]


@contextmanager
def child(
    script: str | Path,
    *args: object,
    env: dict[str, str] | None = None,
    cwd: Path = REPO,
    stdin: int = subprocess.DEVNULL,
) -> Iterator[subprocess.Popen[str]]:
    """A running child; killed (if still running) and reaped, its pipes closed, on exit."""
    proc = subprocess.Popen(
        command(script, *args),
        cwd=cwd,
        env=child_env(env),
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=TIMEOUT)
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                try:
                    pipe.close()
                except BrokenPipeError:
                    pass


def run_child(
    script: str, *args: object, env: dict[str, str] | None = None, cwd: Path = REPO
) -> subprocess.CompletedProcess[str]:
    """Run a child to its end; fails the test unless it exits with 0."""
    done = subprocess.run(
        command(script, *args),
        cwd=cwd,
        env=child_env(env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 0, f"{script} exited with {done.returncode}:\n{done.stderr}"
    return done


def answer_of(done: subprocess.CompletedProcess[str]) -> Any:
    """The answer a child printed with ``print_answer``."""
    return json.loads(done.stdout.strip().splitlines()[-1])["answer"]


def wait_until(
    ready: Callable[[], bool], proc: subprocess.Popen[str], what: str, timeout: float = TIMEOUT
) -> None:
    """Poll ``ready`` until it holds; fail if the child exits first or time runs out."""
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None:
            _, err = proc.communicate(timeout=TIMEOUT)
            raise AssertionError(f"the child exited ({proc.returncode}) before {what}:\n{err}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def wait_for_file(path: Path, proc: subprocess.Popen[str]) -> None:
    wait_until(path.exists, proc, f"{path.name} exists")


def sigkill(proc: subprocess.Popen[str]) -> None:
    """Kill the child with SIGKILL and reap it."""
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=TIMEOUT) == -signal.SIGKILL


def ended(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    """Wait for a child that is ending by itself: (exit code, stdout, stderr)."""
    out, err = proc.communicate(timeout=TIMEOUT)
    return proc.returncode, out, err


def runs(work: Path, tool: str) -> list[str]:
    """In which phases (``first``, ``resumed``) a tool of the child scripts ran."""
    path = work / f"{tool}.count"
    return path.read_text().splitlines() if path.exists() else []


def logged_requests(work: Path, phase: str) -> list[dict[str, Any]]:
    """The model requests a child logged in one phase: ``{"purpose", "messages"}``."""
    path = work / f"requests-{phase}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


class LineReader:
    """Reads a child's stdout on a thread, so a test can wait for a line with a timeout."""

    def __init__(self, proc: subprocess.Popen[str]):
        assert proc.stdout is not None
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._stdout = proc.stdout
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self._stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def line(self, timeout: float = TIMEOUT) -> str:
        got = self._lines.get(timeout=timeout)
        assert got is not None, "the child closed its stdout"
        return got

    def rest(self) -> list[str]:
        """The remaining lines, once the child has ended."""
        self._thread.join(TIMEOUT)
        lines = []
        while (got := self._lines.get_nowait()) is not None:
            lines.append(got)
        return lines
