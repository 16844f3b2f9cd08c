"""How long a resume takes, by history length, through a proxy that adds S3's round-trip time.

    python bench/resume_bench.py [--sizes 10,100,1000] [--delay-ms 20] [--repeat 3]

For each size N, a State of N history entries (a model reply or a ~1.5 KB tool result, as in
a tool-using run) is saved in moto's S3 server and in a FileStore folder. Then it is loaded
again and again, and the median load is reported:

* S3Store through ``bench/latency_proxy.py`` (a process of its own: +``delay`` per request,
  repeated GETs answered from its memory so that moto's CPU does not count), sync;
* FileStore, from the page cache;
* the floor: one GET, through the same proxy, of one object holding all the State's bytes.

Printed per row: wall time, requests by kind (counted by botocore event hooks), wall time in
round trips (wall / delay: what the load cost in delays), client CPU (this process), and peak
Python memory during the load (tracemalloc), next to the size of the State's history as JSON
(what every store reads).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import botocore.exceptions

from alpineagents import FileStore, State
from alpineagents._serialize import entry_to_dict
from alpineagents.state import MODEL, TOOL_RESULT
from alpineagents_s3 import S3Store
from alpineagents_s3.testing import RequestLog

BUCKET = "resume-bench"
HERE = Path(__file__).resolve().parent
REPLY = "Let me look that up. " * 20
RESULT = "row,value\n" + "alpha,1\nbeta,2\ngamma,3\n" * 60


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def process(args: list[str], ready: Callable[[], bool]) -> Iterator[None]:
    """A child process, once ``ready()``; terminated at the end."""
    child = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not ready():
            if time.monotonic() > deadline or child.poll() is not None:
                raise RuntimeError(f"{args[:3]} did not start")
            time.sleep(0.1)
        yield
    finally:
        child.terminate()
        child.wait(10)


def answers(url: str) -> bool:
    try:
        boto3.client("s3", endpoint_url=url).list_buckets()
    except (OSError, botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError):
        return False
    return True


def make_state(n: int) -> State:
    state = State("Summarise the quarterly numbers", id=f"resume-{n}")
    while len(state.history) < n:
        k = len(state.history)
        if k % 2:
            call = {"type": "tool_call", "id": f"c{k}", "name": "query", "input": {"q": k}}
            content = {"content": [{"type": "text", "text": REPLY}, call]}
            state.append(MODEL, REPLY, {**content, "stop_reason": "tool_use"})
        else:
            state.append(TOOL_RESULT, RESULT, {"call_id": f"c{k - 1}", "name": "query"})
    return state


def measure(load: Callable[[], Any], repeat: int) -> dict[str, float]:
    """Median wall and CPU seconds of ``load``, and the peak Python memory of one more."""
    walls, cpus = [], []
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        load()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    tracemalloc.start()
    load()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {"wall": statistics.median(walls), "cpu": statistics.median(cpus), "peak": peak}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10,100,1000", help="history lengths, by commas")
    parser.add_argument("--delay-ms", type=float, default=20.0)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    delay = args.delay_ms / 1000
    for key, value in (("AWS_ACCESS_KEY_ID", "bench"), ("AWS_SECRET_ACCESS_KEY", "bench")):
        os.environ.setdefault(key, value)
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    moto_port, proxy_port = free_port(), free_port()
    moto = f"http://127.0.0.1:{moto_port}"
    proxy = f"http://127.0.0.1:{proxy_port}"
    moto_args = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(moto_port)]
    proxy_args = [
        sys.executable,
        str(HERE / "latency_proxy.py"),
        "--upstream",
        moto,
        "--delay-ms",
        str(args.delay_ms),
        "--port",
        str(proxy_port),
    ]
    with (
        tempfile.TemporaryDirectory() as tmp,
        process(moto_args, lambda: answers(moto)),
        process(proxy_args, lambda: answers(proxy)),
    ):
        boto3.client("s3", endpoint_url=moto).create_bucket(Bucket=BUCKET)
        session = boto3.Session()
        print(
            f"python {sys.version.split()[0]}, {os.cpu_count()} cores; moto behind a proxy "
            f"adding {args.delay_ms:g} ms per request; median of {args.repeat} loads\n"
        )
        header = (
            f"{'N':>6}  {'store':<24} {'wall':>9} {'/delay':>7} {'requests':<20} "
            f"{'CPU':>9} {'peak mem':>9}  (JSON size)"
        )
        print(header)
        for n in sizes:
            bench_size(n, moto, proxy, session, Path(tmp), args.repeat, delay)


def bench_size(
    n: int, moto: str, proxy: str, session: boto3.Session, tmp: Path, repeat: int, delay: float
) -> None:
    """Save a State of ``n`` entries in both stores, load it, print three rows."""
    state = make_state(n)
    size = sum(len(json.dumps(entry_to_dict(e))) for e in state.history)
    S3Store(BUCKET, "runs", endpoint_url=moto, session=session).save(state)
    files = FileStore(tmp / "runs")
    files.save(make_state(n))
    whole = b"[" + b",".join(json.dumps(entry_to_dict(e)).encode() for e in state.history) + b"]"
    raw = boto3.client("s3", endpoint_url=proxy)
    key = f"floor/{n}.json"
    raw.put_object(Bucket=BUCKET, Key=key, Body=whole)
    log = RequestLog()
    store = S3Store(BUCKET, "runs", endpoint_url=proxy, session=session, event_hooks=log.hooks)
    store.load(state.id)  # the client opens, the proxy's cache fills
    log.clear()
    s3 = measure(lambda: store.load(state.id), repeat)
    counts = {k: v // (repeat + 1) for k, v in log.counts().items()}
    raw.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    floor = measure(lambda: raw.get_object(Bucket=BUCKET, Key=key)["Body"].read(), repeat)
    fs = measure(lambda: files.load(state.id), repeat)
    rows = [
        ("S3Store (one per entry)", s3, counts),
        ("one GET of all (floor)", floor, {"GET": 1}),
        ("FileStore", fs, {}),
    ]
    for name, figures, requests in rows:
        shown = " ".join(f"{k} {v}" for k, v in sorted(requests.items())) or "-"
        print(
            f"{n:>6}  {name:<24} {figures['wall'] * 1000:>7.0f}ms "
            f"{figures['wall'] / delay:>7.1f} {shown:<20} "
            f"{figures['cpu'] * 1000:>7.0f}ms {figures['peak'] / 1e6:>7.1f}MB"
            f"  ({size / 1e6:.2f} MB)"
        )
    store.close()
    raw.close()


if __name__ == "__main__":
    main()
