"""Child processes forked from one that has imported their module: real processes, fast to start.

A crash test runs its child once per kill point, and most of a fresh interpreter's second is
spent importing alpineagents, boto3 and aioboto3 and loading the S3 service model. ``Forker``
starts ``python -m tests.forked MODULE`` once; that process imports ``MODULE`` and loads the
model, then, for each ``run(*args)``, forks a process that runs ``MODULE`` as ``__main__``
with those arguments (as ``python -m MODULE *args`` would), its stdout and stderr in files of
their own. The forked process is a process like any other: it is killed by its own SIGKILL, and
what it leaves is what a killed process leaves.

The protocol on the server's stdin and stdout: one JSON list of arguments a line in, one JSON
object (``returncode``, ``stdout``, ``stderr``) a line out; ``returncode`` is ``-N`` for a
process ended by signal N, as ``subprocess`` has it. A process still running after the
timeout is killed, and ``run`` raises ``subprocess.TimeoutExpired``.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[1]


class Forker:
    """A server forking processes that run ``module`` (see the module docstring)."""

    def __init__(self, module: str, *, endpoint: str | None = None):
        self.module = module
        args = [sys.executable, "-m", "tests.forked", module]
        if endpoint:
            args.append(endpoint)
        self.process = subprocess.Popen(
            args, cwd=ROOT, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self._stdin: IO[str] = self.process.stdin
        self._stdout: IO[str] = self.process.stdout
        ready = self._stdout.readline().strip()
        assert ready == "ready", f"tests.forked {module} did not start (exit {self.process.poll()})"

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run the module in a forked process with ``args``; how it ended, as ``subprocess.run``."""
        self._stdin.write(json.dumps([*args, timeout]) + "\n")
        self._stdin.flush()
        line = self._stdout.readline()
        assert line, f"the fork server ended (exit {self.process.poll()})"
        done = json.loads(line)
        if "timeout" in done:
            raise subprocess.TimeoutExpired([self.module, *args], timeout, done["stdout"])
        return subprocess.CompletedProcess(
            list(args), done["returncode"], done["stdout"], done["stderr"]
        )

    def close(self) -> None:
        """End the server (it ends when its stdin does)."""
        self._stdin.close()
        self.process.wait(timeout=30)
        self._stdout.close()


def _fork(module: str, args: list[str], timeout: float) -> dict[str, Any]:
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the forked process: runs the module, never returns
            code = 0
            try:
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # not the server's requests
                sys.argv = [module, *args]
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                if not isinstance(e.code, int | None):
                    print(e.code, file=sys.stderr)
            except BaseException:  # noqa: BLE001 - reported as python would
                traceback.print_exc()
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)
        returncode = _wait(pid, timeout)
        out.seek(0)
        err.seek(0)
        done: dict[str, Any] = {"stdout": out.read(), "stderr": err.read()}
        if returncode is None:
            done["timeout"] = True
        else:
            done["returncode"] = returncode
        return done


def _wait(pid: int, timeout: float) -> int | None:
    """The forked process's return code; ``None`` if it ran ``timeout`` s (it is killed)."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None
        time.sleep(0.005)


def main() -> None:
    module, *endpoint = sys.argv[1:]
    importlib.import_module(module)
    import aioboto3  # noqa: F401 - imported once here, for every forked process
    import boto3

    from alpineagents_s3._clients import MODELS

    session = boto3.Session()
    url = endpoint[0] if endpoint else "http://127.0.0.1:9"
    # The S3 models, loaded once here: the stores of the forked processes share them.
    MODELS.make_client(
        session, lambda: session.client("s3", endpoint_url=url, region_name="us-east-1")
    )
    print("ready", flush=True)
    for line in sys.stdin:
        *args, timeout = json.loads(line)
        print(json.dumps(_fork(module, args, timeout)), flush=True)


if __name__ == "__main__":
    main()
