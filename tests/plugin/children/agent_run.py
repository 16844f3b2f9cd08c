"""A child process of test_agent_e2e.py: runs the installed core's Agent on an S3Store.

Usage: python -P agent_run.py COMMAND --endpoint URL --bucket B --id ID [options]

Commands:
    first   create State ID and run it: the model calls book_flight(flight="AA100"), then
            answers. The tool appends a line to --ledger, creates --marker, then blocks: forever
            (until killed) unless --release names a file, whose appearance lets it return
    resume  load State ID (store.load, or store.aload in async mode) and run it on: the model
            answers at once. With --after: wait for that file before loading (so the process
            can start up while the parent still waits for the first one). With --loaded/--go:
            create --loaded after the load, then wait for --go before running

With --long, the first run calls lookup_fares (a ~600-character result) before book_flight,
and both runs have the tool.

``first`` with --release, and ``resume``, print one JSON object on stdout: the core's
description, the answer (or the error the run raised), the history in cores.history form, the
warnings that were issued, and what a new S3Store then reads from the bucket (``reloaded``: the
State loaded again; ``list``: ``store.list()``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/plugin, for cores.py

import cores

from alpineagents_s3 import S3Store

ANSWER = "Booked AA100."
TASK = "Book flight AA100."
WAIT_SECONDS = 60  # longer than any test waits: the parent kills or releases before

args = argparse.Namespace()


def touch(path: str, content: str = "") -> None:
    """Create ``path`` at once (write, then rename)."""
    temp = f"{path}.{os.getpid()}.tmp"
    with open(temp, "w") as f:
        f.write(content)
    os.replace(temp, path)


def wait_for(path: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear in {WAIT_SECONDS} s")
        time.sleep(0.02)


# With --long: what lookup_fares returns, long enough for the snapshot of a core that keeps
# the model context (0.2-0.4) to keep it in its history entry (docs/s3.md).
LONG_RESULT = "fare,price\n" + "".join(f"AA{n},{100 + n}\n" for n in range(60))


def lookup_fares(route: str) -> str:
    """Look up the fares of a route.

    Args:
        route: The route, e.g. "JFK-LAX".
    """
    return LONG_RESULT


def book_flight(flight: str) -> str:
    """Book a flight.

    Args:
        flight: The flight number.
    """
    with open(args.ledger, "a") as ledger:
        ledger.write(f"{args.command} {os.getpid()} {flight}\n")
    if args.command == "first":
        touch(args.marker, str(os.getpid()))
        if args.release:
            wait_for(args.release)
        else:
            time.sleep(WAIT_SECONDS * 2)  # the parent kills us long before
    return f"booked {flight}"


def report(state: Any, **extra: Any) -> None:
    """Print the run's outcome, and the State as a new store object reads it from the bucket."""
    out = dict(cores.describe(), **extra)
    out["history"] = cores.history(state)
    fresh = S3Store(args.bucket, args.prefix, endpoint_url=args.endpoint)
    try:
        out["reloaded"] = cores.history(cores.load(fresh, args.id, "sync"))
        out["list"] = cores.summaries(fresh)
    finally:
        fresh.close()
    print(json.dumps(out), flush=True)


def run_reporting(agent: Any, state: Any, caught: list[warnings.WarningMessage]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    try:
        result["answer"] = cores.run(agent, state, args.mode)
    except Exception as e:  # noqa: BLE001 - reported to the parent
        result["error"] = {
            "type": type(e).__name__,
            "module": type(e).__module__,
            "mro": [f"{c.__module__}.{c.__qualname__}" for c in type(e).__mro__],
            "message": str(e),
            "traceback": traceback.format_exc(),
        }
    result["warnings"] = [
        {"category": w.category.__name__, "message": str(w.message)} for w in caught
    ]
    return result


def main() -> None:
    global args
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["first", "resume"])
    parser.add_argument("--endpoint")
    parser.add_argument("--bucket")
    parser.add_argument("--prefix", default="runs")
    parser.add_argument("--id")
    parser.add_argument("--mode", choices=["sync", "async"], default="sync")
    parser.add_argument("--ledger")
    parser.add_argument("--marker")
    parser.add_argument("--release")
    parser.add_argument("--after")
    parser.add_argument("--loaded")
    parser.add_argument("--go")
    parser.add_argument("--long", action="store_true")
    args = parser.parse_args()

    store = S3Store(args.bucket, args.prefix, endpoint_url=args.endpoint)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            tools = [lookup_fares, book_flight] if args.long else [book_flight]
            if args.command == "first":
                script = [("call", "book_flight", {"flight": "AA100"}), ("answer", ANSWER)]
                if args.long:
                    script.insert(0, ("call", "lookup_fares", {"route": "JFK-LAX"}))
                model = cores.make_model(script)
                agent = cores.make_agent(model, tools, store)
                state = cores.make_state(TASK, args.id)
                result = run_reporting(agent, state, caught)
                report(state, **result)
            else:  # resume
                if args.after:
                    wait_for(args.after)
                state = cores.load(store, args.id, args.mode)
                if args.loaded:
                    touch(args.loaded)
                    wait_for(args.go)
                model = cores.make_model([("answer", ANSWER)])
                agent = cores.make_agent(model, tools, store)
                result = run_reporting(agent, state, caught)
                report(state, **result)
    finally:
        store.close()


if __name__ == "__main__":
    main()
