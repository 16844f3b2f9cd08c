"""What a save and a load cost on FileStore and on S3Store (moto's S3 server on 127.0.0.1).

    python bench/store_bench.py [--turns 30] [--repeat 5] [--in-process]

Saves are made the way the Agent makes them (``alpineagents._saving.save``): after each model
response (the response and the snapshot), after each tool result (that entry alone,
``entries_only=True``), after the tools of a turn (the snapshot), and before the next model
request (nothing changed, nothing written). S3 requests are counted by botocore event hooks
on the store's own clients (every HTTP request, retries included).

moto's server runs in a process of its own (``python -m moto.server``; ``--in-process`` uses
``alpineagents_s3.embedded_moto()`` instead). moto is CPU-bound: absolute times are moto's on
this machine, not S3's; the line "moto baseline" says what one request costs here. The request
counts and sizes are the store's own and hold on any S3.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import boto3

from alpineagents import FileStore, _saving
from alpineagents._serialize import dumps
from alpineagents.state import MODEL, TOOL_RESULT, State
from alpineagents.store import Store
from alpineagents_s3 import S3Store
from alpineagents_s3.testing import RequestLog, embedded_moto

BUCKET = "bench"
KINDS = ("PUT", "GET", "LIST", "HEAD", "DELETE")
MODEL_TEXT = "Let me look that up. " * 20  # ~420 bytes of reply
TOOL_TEXT = "row,value\n" + "alpha,1\nbeta,2\ngamma,3\n" * 90  # ~2 KB of tool result


def model_turn(state: State, n: int) -> None:
    call = {"type": "tool_call", "id": f"call-{n}", "name": "query", "input": {"sql": f"q{n}"}}
    state.append(
        MODEL,
        MODEL_TEXT,
        {"content": [{"type": "text", "text": MODEL_TEXT}, call], "stop_reason": "tool_use"},
    )


def tool_result(state: State, n: int) -> None:
    state.append(TOOL_RESULT, TOOL_TEXT, {"call_id": f"call-{n}", "name": "query"})


class CountingFileStore(FileStore):
    """A FileStore that counts the bytes it is given to write (entry lines and snapshot)."""

    written = 0

    def write(
        self,
        state_id: str,
        entries: Sequence[dict[str, Any]],
        snapshot: dict[str, Any] | None,
        *,
        create: bool = False,
    ) -> None:
        super().write(state_id, entries, snapshot, create=create)
        self.written += sum(len(dumps(e)) + 1 for e in entries)
        if snapshot is not None:
            self.written += len(dumps(snapshot))


class Meter:
    """Requests and bytes of one store between two points."""

    def __init__(self, store: Store, log: RequestLog | None):
        self.store, self.log = store, log

    def start(self) -> None:
        if self.log is not None:
            self.log.clear()
        if isinstance(self.store, CountingFileStore):
            self.store.written = 0

    def stop(self) -> tuple[Counter[str], int]:
        if self.log is not None:
            return self.log.counts(), self.log.sent_bytes()
        assert isinstance(self.store, CountingFileStore)
        return Counter(), self.store.written


@contextlib.contextmanager
def moto_server(in_process: bool) -> Iterator[str]:
    """moto's S3 server on 127.0.0.1 with the bench bucket; yields its endpoint URL."""
    if in_process:
        with embedded_moto(BUCKET) as endpoint:
            yield endpoint
        return
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = dict(os.environ, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench")
    env.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    os.environ.update(
        {k: env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}
    )
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        client = boto3.client("s3", endpoint_url=endpoint)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    client.create_bucket(Bucket=BUCKET)
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
        finally:
            client.close()
        yield endpoint
    finally:
        server.terminate()
        server.wait(timeout=10)


def baseline(endpoint: str) -> str:
    """What one small GET costs on this moto, alone and 16 at once."""
    client = boto3.client("s3", endpoint_url=endpoint)
    try:
        client.put_object(Bucket=BUCKET, Key="baseline", Body=b"x" * 200)
        began = time.perf_counter()
        for _ in range(50):
            client.get_object(Bucket=BUCKET, Key="baseline")["Body"].read()
        one = (time.perf_counter() - began) / 50
    finally:
        client.close()
    return f"moto baseline: one 200 B GET at a time takes {one * 1000:.1f} ms ({1 / one:.0f}/s)"


def bench_saves(name: str, store: Store, meter: Meter, turns: int) -> dict[str, Any]:
    """Save ``turns`` tool-using turns; per kind of save: requests, bytes, latency."""
    steps: dict[str, list[tuple[Counter[str], int, float]]] = {}

    def save(step: str, state: State, entries_only: bool = False) -> None:
        meter.start()
        began = time.perf_counter()
        _saving.save(store, state, entries_only=entries_only)
        took = time.perf_counter() - began
        counts, sent = meter.stop()
        steps.setdefault(step, []).append((counts, sent, took))

    state = State("Summarise the sales table", id=f"saves-{name}")
    save("create (run start)", state)
    for n in range(turns):
        save("before think (nothing new)", state)
        model_turn(state, n)
        save("after think: response + snapshot", state)
        tool_result(state, n)
        save("tool result, alone", state, entries_only=True)
        save("after use_tools: snapshot", state)
    return steps


def build_state(store: Store, state_id: str, entries: int) -> None:
    """A saved State of ``entries`` history entries, saved turn by turn."""
    state = State("A long conversation", id=state_id)
    _saving.save(store, state)
    n = 0
    while len(state.history) < entries:
        model_turn(state, n)
        if len(state.history) < entries:
            tool_result(state, n)
        n += 1
        if n % 50 == 0 or len(state.history) >= entries:
            _saving.save(store, state)


def time_loads(
    store: Store, state_id: str, log: RequestLog | None, repeat: int
) -> tuple[float, Counter[str]]:
    """Median sync load time, and the requests of one load."""
    times = []
    counts: Counter[str] = Counter()
    for _ in range(repeat):
        if log is not None:
            log.clear()
        began = time.perf_counter()
        store.load(state_id)
        times.append(time.perf_counter() - began)
        if log is not None:
            counts = log.counts()
    return statistics.median(times), counts


def time_async_loads(store: S3Store, state_id: str, repeat: int) -> float:
    """Median async load time (aioboto3), the client opened beforehand."""

    async def main() -> float:
        # The client opened here closes with this event loop (aclose() would close the store).
        await store.aload(state_id)  # opens the async client
        times = []
        for _ in range(repeat):
            began = time.perf_counter()
            await store.aload(state_id)
            times.append(time.perf_counter() - began)
        return statistics.median(times)

    return asyncio.run(main())


def fmt_counts(counts: Mapping[str, float]) -> str:
    """``PUT 2 GET 1``: requests by kind (fractions for averages)."""
    shown = " ".join(f"{kind} {counts[kind]:g}" for kind in KINDS if counts.get(kind))
    return shown or "-"


def ms(seconds: float) -> str:
    return f"{seconds * 1000:7.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=30, help="tool-using turns to save")
    parser.add_argument("--repeat", type=int, default=5, help="loads per State size")
    parser.add_argument("--in-process", action="store_true", help="moto in this process")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp, moto_server(args.in_process) as endpoint:
        folder = Path(tmp) / "runs"
        log = RequestLog()
        stores: dict[str, tuple[Store, RequestLog | None]] = {
            "FileStore": (CountingFileStore(folder), None),
            "S3Store": (
                S3Store(BUCKET, "runs", endpoint_url=endpoint, event_hooks=log.hooks),
                log,
            ),
        }
        where = "in this process" if args.in_process else "in its own process"
        print(
            f"python {sys.version.split()[0]}, {os.cpu_count()} cores; moto's S3 server "
            f"{where} at {endpoint}"
        )
        print(baseline(endpoint))
        print(
            f"{args.turns} tool-using turns (model response ~{len(MODEL_TEXT)} B of text, "
            f"tool result ~{len(TOOL_TEXT)} B); S3Store max_concurrency="
            f"{inspect.signature(S3Store).parameters['max_concurrency'].default}\n"
        )

        print("== Saves, by kind: S3 requests per save, bytes sent per save, median latency ==")
        for name, (store, store_log) in stores.items():
            if isinstance(store, S3Store):
                assert store.client  # open the client first: not part of any save
            steps = bench_saves(name, store, Meter(store, store_log), args.turns)
            print(f"-- {name}")
            turn_counts: Counter[str] = Counter()
            turn_bytes = 0.0
            for step, samples in steps.items():
                counts: Counter[str] = sum((c for c, _, _ in samples), Counter())
                per_save = {k: v / len(samples) for k, v in counts.items()}
                sent = statistics.mean(s for _, s, _ in samples)
                latency = statistics.median(t for _, _, t in samples)
                shown = fmt_counts(per_save) if store_log else "(files)"
                print(f"   {step:36} {shown:16} {sent:8.0f} B {ms(latency)}  (x{len(samples)})")
                if not step.startswith("create"):
                    turn_counts.update(counts)
                    turn_bytes += sent
            per_turn = {k: v / args.turns for k, v in turn_counts.items()}
            shown = fmt_counts(per_turn) if store_log else "(files)"
            print(f"   {'= one tool-using turn':36} {shown:16} {turn_bytes:8.0f} B")
        print()

        print("== States of 10, 100 and 1,000 entries: snapshot size, load time, requests ==")
        for name, (store, store_log) in stores.items():
            print(f"-- {name}")
            for size in (10, 100, 1000):
                state_id = f"load-{size}"
                build_state(store, state_id, size)
                if isinstance(store, S3Store):
                    snapshot = next(o for o in store.objects(state_id) if o.kind == "snapshot")
                    snapshot_size = snapshot.size
                else:
                    snapshot_size = (folder / state_id / "snapshot.json").stat().st_size
                took, counts = time_loads(store, state_id, store_log, args.repeat)
                line = (
                    f"   {size:5} entries: snapshot {snapshot_size:4} B, "
                    f"load {ms(took)}  {fmt_counts(counts)}"
                )
                if isinstance(store, S3Store):
                    line += f";  async load {ms(time_async_loads(store, state_id, args.repeat))}"
                print(line)
            if isinstance(store, S3Store):
                one_by_one = S3Store(BUCKET, "runs", endpoint_url=endpoint, max_concurrency=1)
                took, _ = time_loads(one_by_one, "load-1000", None, 1)
                print(
                    f"   1000 entries with max_concurrency=1 (one request at a time): "
                    f"load {ms(took)}"
                )
                one_by_one.close()
            store.close()


if __name__ == "__main__":
    main()
