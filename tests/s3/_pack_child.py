"""The process of tests/s3/test_pack_crash.py that packs States and is killed doing it.

``python -m tests.s3._pack_child ENDPOINT`` imports boto3, aioboto3 and alpineagents_s3 once,
loads the S3 service model once, prints ``ready``, then reads one job a line on stdin (JSON)::

    {"bucket": ..., "prefix": ..., "id": ..., "remove_entries": bool, "mode": "sync"|"async",
     "on_load": bool, "kill": null | {"event": "before-send"|"after-call", "at": k}}

For each job it forks a process (this one has no threads, so a fork is safe) that makes a new
S3Store and packs the State (``on_load``: loads it through ``S3Store(auto_pack=1)``, which
packs it as it loads it). With ``kill``, that process sends itself SIGKILL at the k-th
request: in the ``before-send`` hook (the request is not sent) or in the ``after-call`` hook
(its answer came back). Every request it makes is noted on a pipe before the hook may kill,
and the packed result once ``pack`` returns (the history's length once ``load`` does). When
the forked process has ended, one line of JSON goes to stdout: how it ended (``signal`` or
``exit``), the requests noted (``before``, ``after``: ``[operation, n]`` each), the ``Packed``
result (or ``loaded``) or the error, if any.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
import traceback
from typing import Any

import aioboto3  # noqa: F401 - imported once here, not in every forked process
import boto3

from alpineagents_s3 import S3Store
from alpineagents_s3._clients import MODELS

EVENTS = ("before-send", "after-call")


class Hooks:
    """Counts requests per event, notes each on ``fd``, and kills at the ``at``-th ``event``."""

    def __init__(self, fd: int, kill: dict[str, Any] | None):
        self.fd = fd
        self.kill_event = kill["event"] if kill else None
        self.kill_at = kill["at"] if kill else None
        self.counts = dict.fromkeys(EVENTS, 0)
        self.lock = threading.Lock()

    def hook(self, event: str) -> Any:
        """The botocore handler for ``event`` (``before-send`` or ``after-call``)."""

        def noted(event_name: str = "", **kwargs: Any) -> None:
            operation = event_name.rsplit(".", 1)[-1]
            with self.lock:  # held while killing: no other request gets past its hook
                self.counts[event] += 1
                n = self.counts[event]
                note(self.fd, {"event": event, "n": n, "operation": operation})
                if event == self.kill_event and n == self.kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)

        return noted


def note(fd: int, value: dict[str, Any]) -> None:
    """One line of JSON on the pipe to the parent (one write: lines never interleave)."""
    os.write(fd, (json.dumps(value) + "\n").encode())


# A forked process still running after this long is stuck: SIGALRM ends it (the parent sees
# that signal, not SIGKILL, and fails).
STUCK_SECONDS = 60


def pack(endpoint: str, job: dict[str, Any], fd: int) -> None:
    """Pack the job's State with a new S3Store; note the result on ``fd``."""
    signal.alarm(STUCK_SECONDS)
    hooks = Hooks(fd, job["kill"])
    store = S3Store(
        job["bucket"],
        job["prefix"],
        endpoint_url=endpoint,
        event_hooks={f"{event}.s3": hooks.hook(event) for event in EVENTS},
        auto_pack=1 if job["on_load"] else None,
    )
    if job["on_load"]:
        load_it(store, job, fd)
        return
    if job["mode"] == "async":

        async def packed_async() -> Any:
            try:
                return await store.apack(job["id"], remove_entries=job["remove_entries"])
            finally:
                await store.aclose()

        packed = asyncio.run(packed_async())
    else:
        packed = store.pack(job["id"], remove_entries=job["remove_entries"])
    store.close()
    note(fd, {"packed": {"covered": packed.covered, "written": list(packed.written)}})


def load_it(store: S3Store, job: dict[str, Any], fd: int) -> None:
    """Load the job's State through ``store`` (which packs it); note its history's length."""
    if job["mode"] == "async":

        async def loaded_async() -> Any:
            try:
                return await store.aload(job["id"])
            finally:
                await store.aclose()

        state = asyncio.run(loaded_async())
    else:
        state = store.load(job["id"])
    store.close()
    note(fd, {"loaded": len(state.history)})


def forked(endpoint: str, job: dict[str, Any]) -> dict[str, Any]:
    """Pack in a forked process; how it ended and what it noted."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the forked process: never returns
        os.close(read_fd)
        code = 0
        try:
            pack(endpoint, job, write_fd)
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            note(
                write_fd, {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
            )
            code = 1
        os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        lines = [json.loads(line) for line in pipe.read().splitlines()]
    _, status = os.waitpid(pid, 0)
    report: dict[str, Any] = {
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "exit": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        "before": [[n["operation"], n["n"]] for n in lines if n.get("event") == "before-send"],
        "after": [[n["operation"], n["n"]] for n in lines if n.get("event") == "after-call"],
    }
    for line in lines:
        if "packed" in line or "loaded" in line or "error" in line:
            report.update(line)
    return report


def main() -> None:
    """Fork a packing process per job read on stdin; print how each ended."""
    (endpoint,) = sys.argv[1:]
    # The S3 models, loaded once here: each forked process's store shares them.
    session = boto3.Session()
    MODELS.make_client(
        session, lambda: session.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    )
    print("ready", flush=True)
    for line in sys.stdin:
        print(json.dumps(forked(endpoint, json.loads(line))), flush=True)


if __name__ == "__main__":
    main()
