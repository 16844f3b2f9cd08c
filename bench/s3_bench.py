"""What S3Store costs, in requests, round trips and time, with its default settings.

    python bench/s3_bench.py                                  # 1,000 entries, 1,000 States
    python bench/s3_bench.py --entries 1000,10000 --states 1000,10000 --peer

Everything runs against moto's server (a process of its own) through ``bench/latency_proxy.py``
(another process: +``--delay-ms`` per request, GETs it answered before answered from its
memory, so moto's CPU does not count). Requests are counted by botocore event hooks on the
store's clients; *rounds* are sequential round trips: how many times a request began while
none of the operation's was in flight.

- **Resume**: a State of N entries built by a real Agent run (a model that calls a tool, ~1.4
  KB results), saved as the run goes. ``cold``: a process that never read it (its own memory,
  its client already open); ``warm``: the same process again, nothing changed since. The
  ``bound`` row is the least any layout can do: one GET of one object holding all the
  entries, parsed, and the State rebuilt by the same core code as a load.
- **Writes**: a tool-using turn of a real Agent run (a user message, a model call, the tool
  result saved alone, the reply), after a first turn that made the State: requests and bytes
  sent, next to the bytes of the entries the turn added; and the saves of the N-entry build
  (packing included). ``--peer``: the same turn by Strands Agents' S3SessionManager
  (``bash bench/peer/setup.sh`` first).
- **List**: ``list()`` and ``list(limit=20)`` of S States, each made by a save, in a burst;
  then ``list(limit=20)`` again after 25 more States saved a second apart (S3 dates a head to
  the second, so a burst makes the newest 20 uncertain among all of their second).
- **Delete, sweep**: a 1,067-entry State deleted; a sweep over 51 States.

``--json`` prints the figures as one JSON object instead of the tables.
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
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import botocore.exceptions
from pydantic_core import from_json

from alpineagents import Agent, State
from alpineagents.model import ModelRequest
from alpineagents.store import Record, Store
from alpineagents.testing import FunctionModel, call
from alpineagents_s3 import S3Store
from alpineagents_s3.testing import separate_process

HERE = Path(__file__).resolve().parent
BUCKET = "bench-s3"
RESULT = "row,value\n" + "alpha,1\nbeta,2\ngamma,3\n" * 60  # ~1.4 KB of tool result
KINDS = ("GET", "PUT", "LIST", "HEAD", "DELETE")
_KIND = {
    "GetObject": "GET",
    "PutObject": "PUT",
    "ListObjectsV2": "LIST",
    "HeadObject": "HEAD",
    "DeleteObject": "DELETE",
    "DeleteObjects": "DELETE",
}
MOTO = (
    "import sys, time\n"
    "from moto.server import ThreadedMotoServer\n"
    "server = ThreadedMotoServer(ip_address='127.0.0.1', port=int(sys.argv[1]), verbose=False)\n"
    "server.start()\n"
    "while True:\n"
    "    time.sleep(3600)\n"
)
# Dummy credentials moto accepts, unless the environment has its own.
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_DEFAULT_REGION": "us-east-1",
}
began = time.monotonic()


def progress(text: str) -> None:
    """A line on stderr: stdout holds the figures alone."""
    print(f"[{time.monotonic() - began:6.1f}s] {text}", file=sys.stderr, flush=True)


# Counting --------------------------------------------------------------------------------


@dataclass
class Meter:
    """Requests by kind, bytes sent and rounds, from botocore hooks (``hooks``)."""

    requests: Counter[str] = field(default_factory=Counter)
    sent: int = 0
    rounds: int = 0
    _in_flight: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def hooks(self) -> dict[str, Callable[..., Any]]:
        return {"before-send.s3": self._sent, "needs-retry.s3": self._answered}

    def _sent(self, request: Any, event_name: str = "", **_: Any) -> None:
        kind = _KIND.get(event_name.rsplit(".", 1)[-1], request.method)
        size = request.headers.get("Content-Length") or 0
        with self._lock:
            self.requests[kind] += 1
            self.sent += int(size)
            if self._in_flight == 0:
                self.rounds += 1
            self._in_flight += 1

    def _answered(self, **_: Any) -> None:
        with self._lock:
            self._in_flight -= 1

    def clear(self) -> None:
        with self._lock:
            self.requests.clear()
            self.sent = self.rounds = 0

    def shown(self) -> str:
        return " + ".join(f"{self.requests[k]} {k}" for k in KINDS if self.requests[k]) or "-"


# Servers ---------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def child(args: list[str], url: str) -> Iterator[str]:
    """A server process, once it answers at ``url``; stopped at the end."""
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = boto3.client("s3", endpoint_url=url)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                client.list_buckets()
                break
            except (OSError, botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError):
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError(f"{args[:3]} did not start") from None
                time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()


@contextlib.contextmanager
def servers(delay_ms: float) -> Iterator[tuple[str, str]]:
    """moto's server and the latency proxy in front of it: (moto URL, proxy URL)."""
    moto_port, proxy_port = free_port(), free_port()
    moto = [sys.executable, "-c", MOTO, str(moto_port)]
    with child(moto, f"http://127.0.0.1:{moto_port}") as moto_url:
        boto3.client("s3", endpoint_url=moto_url).create_bucket(Bucket=BUCKET)
        proxy = [sys.executable, str(HERE / "latency_proxy.py"), "--upstream", moto_url]
        proxy += ["--delay-ms", str(delay_ms), "--port", str(proxy_port)]
        with child(proxy, f"http://127.0.0.1:{proxy_port}") as proxy_url:
            yield moto_url, proxy_url


def store(url: str, prefix: str, meter: Meter | None = None, **options: Any) -> S3Store:
    """A store with the default settings, as another process (a memory of its own)."""
    hooks = meter.hooks if meter is not None else None
    made = separate_process(S3Store(BUCKET, prefix, endpoint_url=url, event_hooks=hooks, **options))
    made.client  # noqa: B018 - the client is made before any clock starts
    return made


# Building States by real runs --------------------------------------------------------------


def query(q: int) -> str:
    """Look up a row of the quarterly numbers."""
    return RESULT


def run_agent(agent_store: Store, state: State, steps: int) -> None:
    """Run ``state`` for ``steps`` tool calls, then a reply (two history entries a call)."""
    left = [steps]

    def decide(request: ModelRequest) -> Any:
        if left[0] <= 0:
            return "Here are the numbers."
        left[0] -= 1
        return [{"type": "text", "text": "Let me look that up."}, call("query", q=left[0])]

    agent = Agent(
        FunctionModel(decide),
        tools=[query],
        store=agent_store,
        max_steps=steps + 2,
        compact_at=None,
    )
    agent.run(state)


def build(url: str, state_id: str, entries: int, meter: Meter) -> None:
    """A State of about ``entries`` entries, saved by a run as it goes; ``meter`` counts it."""
    writer = store(url, "runs", meter)
    state = State("Summarise the quarterly numbers", id=state_id)
    run_agent(writer, state, max((entries - 2) // 2, 1))
    writer.close()


# Measuring -------------------------------------------------------------------------------


def timed(run: Callable[[], Any], repeat: int) -> tuple[float, float]:
    """Median wall and client CPU seconds of ``run`` over ``repeat`` runs."""
    walls, cpus = [], []
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        run()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus)


def resume(moto: str, proxy: str, n: int, repeat: int) -> list[dict[str, Any]]:
    """The resume rows for a State of ``n`` entries."""
    state_id = f"resume-{n}"
    progress(f"building a State of {n} entries by an Agent run")
    built = Meter()
    build(moto, state_id, n, built)
    rows: list[dict[str, Any]] = []
    meter = Meter()
    fresh = [store(proxy, "runs", meter) for _ in range(repeat + 1)]  # clients made beforehand
    loaded: list[State] = []

    def cold() -> None:
        loaded.append(fresh.pop().load(state_id))

    cold()  # the proxy's memory is filled: moto's CPU does not count below
    count = len(loaded[0].history)
    record = store(moto, "runs").read(state_id)
    assert record is not None
    size = sum(len(json.dumps(e)) for e in record.entries)
    meter.clear()
    wall, cpu = timed(cold, repeat)
    rows.append(row(n, count, "S3Store, cold", wall, cpu, meter, repeat, size))
    warm_store = store(proxy, "runs", meter)
    warm_store.load(state_id)
    meter.clear()
    wall, cpu = timed(lambda: warm_store.load(state_id), repeat)
    rows.append(row(n, count, "S3Store, warm", wall, cpu, meter, repeat, size))
    rows.append(bound(moto, proxy, state_id, n, count, repeat, size))
    rows[-1]["build"] = {"requests": dict(built.requests), "sent": built.sent, "saves": None}
    return rows


def row(
    n: int, count: int, name: str, wall: float, cpu: float, meter: Meter, repeat: int, size: int
) -> dict[str, Any]:
    return {
        "entries": count,
        "row": name,
        "wall_ms": wall * 1000,
        "cpu_ms": cpu * 1000,
        "rounds": meter.rounds / repeat,
        "requests": {k: v / repeat for k, v in meter.requests.items()},
        "shown": " + ".join(
            f"{meter.requests[k] / repeat:g} {k}" for k in KINDS if meter.requests[k]
        ),
        "bytes": size,
    }


def bound(
    moto: str, proxy: str, state_id: str, n: int, count: int, repeat: int, size: int
) -> dict[str, Any]:
    """One GET of one object of all the entries, parsed, and the State rebuilt by the core."""
    record = store(moto, "runs").read(state_id)
    assert record is not None
    key = f"bound/{state_id}.json"
    body = json.dumps({"entries": list(record.entries), "snapshot": record.snapshot}).encode()
    boto3.client("s3", endpoint_url=moto).put_object(Bucket=BUCKET, Key=key, Body=body)
    meter = Meter()
    client = boto3.client("s3", endpoint_url=proxy)
    for event, hook in meter.hooks.items():
        client.meta.events.register(event, hook)
    rebuild = Store()

    def load() -> None:
        got = from_json(client.get_object(Bucket=BUCKET, Key=key)["Body"].read())
        rebuild._loaded(state_id, Record(got["entries"], got["snapshot"]))

    load()
    meter.clear()
    wall, cpu = timed(load, repeat)
    return row(n, count, "bound: 1 GET, no checks", wall, cpu, meter, repeat, size)


def turns(moto: str, k: int) -> dict[str, Any]:
    """Requests and bytes a tool-using turn sends, after a first turn that made the State."""
    meter = Meter()
    writer = store(moto, "turns", meter)
    state = State("Summarise the quarterly numbers", id="turns")
    run_agent(writer, state, 1)
    meter.clear()
    before = len(state.history)
    for q in range(k):
        state.add_user_message(f"And quarter {q}?")
        run_agent(writer, state, 1)
    added = state.history[before:]
    from alpineagents._serialize import entry_to_dict

    entries = sum(len(json.dumps(entry_to_dict(e), separators=(",", ":"))) for e in added)
    writer.close()
    return {
        "turns": k,
        "requests": {kind: v / k for kind, v in meter.requests.items()},
        "sent": meter.sent / k,
        "entries": entries / k,
        "shown": " + ".join(f"{meter.requests[x] / k:g} {x}" for x in KINDS if meter.requests[x]),
    }


def build_cost(moto: str, n: int) -> dict[str, Any]:
    """What the saves of an N-entry run send, packing included, a save at a time."""
    meter = Meter()
    saves = Counter[str]()

    def count_save(params: dict[str, Any], **_: Any) -> None:
        if "/heads/" in params["url"]:
            saves["head"] += 1

    writer = store(moto, "build", meter)
    writer.client.meta.events.register("before-call.s3.PutObject", count_save)
    state = State("Summarise the quarterly numbers", id=f"build-{n}")
    run_agent(writer, state, max((n - 2) // 2, 1))
    from alpineagents._serialize import entry_to_dict

    entries = sum(len(json.dumps(entry_to_dict(e), separators=(",", ":"))) for e in state.history)
    heads = saves["head"]
    writer.close()
    return {
        "entries": len(state.history),
        "saves": heads,
        "per_save": {kind: v / heads for kind, v in meter.requests.items()},
        "sent_over_entries": meter.sent / entries,
    }


def listing(moto: str, proxy: str, states: int, limit: int, spaced: int) -> list[dict[str, Any]]:
    """``list()`` and ``list(limit=...)`` of ``states`` States, through the proxy; then again
    after ``spaced`` more States saved a second apart."""
    prefix = f"list-{states}"
    progress(f"making {states} States")
    maker = store(moto, prefix)
    snapshot = {"v": 1, "task": "t", "entries": 1, "data": {}, "stopped_by": None}

    def make(i: int, name: str = "s", through: S3Store = maker) -> None:
        stamp = datetime.now(UTC).isoformat()  # as a core sets it: the time of the save
        small = {**snapshot, "id": f"{name}{i}", "created_at": stamp, "updated_at": stamp}
        entry = {"v": 1, "seq": 0, "kind": "task", "text": "t", "at": stamp, "data": {}}
        through.write(f"{name}{i}", [entry], small, create=True)

    def measure(
        newest: int | None, name: str, count: int = states, again: str = ""
    ) -> list[dict[str, Any]]:
        """A list by a new process; with ``again``, the same process's second list too."""
        store(proxy, prefix).list(limit=newest)  # fills the proxy's memory
        meter = Meter()
        lister = store(proxy, prefix, meter)
        rows = []
        for row in [name, again] if again else [name]:
            meter.clear()
            wall, _ = timed(lambda: lister.list(limit=newest), 1)
            rows.append(
                {
                    "states": count,
                    "row": row,
                    "wall_ms": wall * 1000,
                    "rounds": meter.rounds,
                    "requests": dict(meter.requests),
                    "shown": meter.shown(),
                }
            )
        return rows

    with ThreadPoolExecutor(16) as pool:  # a burst: S3 dates a head to the second
        list(pool.map(make, range(states)))
    rows = measure(None, "list()", again="list() again, by the same process")
    rows += measure(limit, f"list(limit={limit}), all saved in a burst")
    if spaced:  # the newest, as the States a few runs are updating would be
        progress(f"making {spaced} more States, a second apart")
        late = store(proxy, prefix)  # through the proxy: its memory of the listing goes
        for i in range(spaced):
            time.sleep(1.05)
            make(i, "late-", late)
        rows += measure(
            limit, f"list(limit={limit}), the newest {spaced} saved a second apart", states + spaced
        )
    return rows


def tidy(moto: str, proxy: str) -> list[dict[str, Any]]:
    """A delete of a 1,067-entry State; a sweep over 51 States."""
    rows = []
    writer = store(moto, "tidy")
    records = [
        {
            "v": 1,
            "seq": i,
            "kind": "note",
            "text": "x" * 200,
            "at": "2026-01-01T00:00:00+00:00",
            "data": {},
        }
        for i in range(1067)
    ]
    small = {
        "v": 1,
        "id": "big",
        "task": "t",
        "entries": 1067,
        "data": {},
        "stopped_by": None,
        "created_at": "2026-01-01T00:00:00+00:00",
        "updated_at": "2026-01-01T00:00:00+00:00",
    }
    writer.write("big", records[:1], small, create=True)
    for start in range(1, 1067, 10):
        writer.write("big", records[start : start + 10], small)
    for i in range(50):
        writer.write(f"small-{i}", records[:1], {**small, "id": f"small-{i}"}, create=True)
    meter = Meter()
    admin = store(proxy, "tidy", meter)
    wall, _ = timed(lambda: admin.delete("big"), 1)
    rows.append(
        {
            "row": "delete(), 1,067 entries",
            "wall_ms": wall * 1000,
            "rounds": meter.rounds,
            "shown": meter.shown(),
            "requests": dict(meter.requests),
        }
    )
    meter.clear()
    wall, _ = timed(lambda: admin.sweep(), 1)
    rows.append(
        {
            "row": "sweep(), 50 States",
            "wall_ms": wall * 1000,
            "rounds": meter.rounds,
            "shown": meter.shown(),
            "requests": dict(meter.requests),
        }
    )
    return rows


def peer_turns(moto: str, k: int) -> dict[str, Any] | None:
    """The peer's tool-using turn, from bench/peer/strands_bench.py (None: not installed)."""
    python = HERE / "peer" / ".venv" / "bin" / "python"
    if not python.exists():
        return None
    args = [
        str(python),
        str(HERE / "peer" / "strands_bench.py"),
        "turns",
        "--endpoint",
        moto,
        "--bucket",
        BUCKET,
        "--session",
        "peer-turns",
        "--turns",
        str(k),
    ]
    done = subprocess.run(args, capture_output=True, text=True, timeout=600, check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# Printing --------------------------------------------------------------------------------


def tables(figures: dict[str, Any]) -> str:
    lines = [
        f"delay {figures['delay_ms']:g} ms a request through the proxy; medians of "
        f"{figures['repeat']} loads",
        "",
        "## Resume",
        "",
        "| entries | load | wall | x bound | rounds | requests | client CPU |",
        "|---:|---|---:|---:|---:|---|---:|",
    ]
    for group in figures["resume"]:
        bound_wall = next(r["wall_ms"] for r in group if r["row"].startswith("bound"))
        for r in group:
            lines.append(
                f"| {r['entries']:,} | {r['row']} | {r['wall_ms']:.1f} ms | "
                f"{r['wall_ms'] / bound_wall:.2f}x | {r['rounds']:g} | {r['shown']} | "
                f"{r['cpu_ms']:.1f} ms |"
            )
    lines += [
        "",
        "## Writes",
        "",
        "| what | requests | bytes sent | entries' bytes | ratio |",
        "|---|---|---:|---:|---:|",
    ]
    turn = figures["turn"]
    lines.append(
        f"| S3Store, a tool-using turn | {turn['shown']} | {turn['sent']:.0f} | "
        f"{turn['entries']:.0f} | {turn['sent'] / turn['entries']:.2f}x |"
    )
    peer = figures.get("peer")
    if peer:
        shown = " + ".join(f"{v:g} {k}" for k, v in sorted(peer["requests"].items()))
        lines.append(
            f"| Strands S3SessionManager, a tool-using turn | {shown} | "
            f"{peer['sent']:.0f} | - | - |"
        )
    for cost in figures["build"]:
        per = " + ".join(
            f"{cost['per_save'].get(k, 0):.2f} {k}" for k in KINDS if cost["per_save"].get(k)
        )
        lines.append(
            f"| S3Store, the {cost['saves']:,} saves of a {cost['entries']:,}-entry run, "
            f"a save | {per} | - | - | {cost['sent_over_entries']:.2f}x |"
        )
    lines += [
        "",
        "## List",
        "",
        "| States | what | wall | rounds | requests |",
        "|---:|---|---:|---:|---|",
    ]
    for r in figures["list"]:
        lines.append(
            f"| {r['states']:,} | {r['row']} | {r['wall_ms']:.0f} ms | {r['rounds']} | "
            f"{r['shown']} |"
        )
    lines += [
        "",
        "## Delete, sweep",
        "",
        "| what | wall | rounds | requests |",
        "|---|---:|---:|---|",
    ]
    for r in figures["tidy"]:
        lines.append(f"| {r['row']} | {r['wall_ms']:.0f} ms | {r['rounds']} | {r['shown']} |")
    return "\n".join(lines)


def stale_plugin() -> list[str]:
    """The modules of the imported alpineagents_s3 that differ from this checkout's."""
    import alpineagents_s3

    installed = Path(alpineagents_s3.__file__).parent
    checkout = HERE.parent / "alpineagents_s3"
    if installed == checkout or not checkout.is_dir():
        return []
    return [
        mine.name
        for mine in sorted(checkout.glob("*.py"))
        if not (installed / mine.name).is_file()
        or (installed / mine.name).read_bytes() != mine.read_bytes()
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entries", default="1000", help="history lengths, comma-separated")
    parser.add_argument("--states", default="1000", help="how many States to list")
    parser.add_argument("--limit", type=int, default=20, help="the newest States to list")
    parser.add_argument("--spaced", type=int, default=25, help="States saved a second apart")
    parser.add_argument("--delay-ms", type=float, default=20.0)
    parser.add_argument("--repeat", type=int, default=5, help="loads timed a row")
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--peer", action="store_true", help="the peer's turn too")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    stale = stale_plugin()
    if stale:
        sys.exit(
            "s3_bench.py: the installed alpineagents_s3 is not this checkout's (it differs in "
            f"{', '.join(stale)}): run bash scripts/setup.sh, which installs it from here"
        )
    for name, value in CREDENTIALS.items():
        os.environ.setdefault(name, value)
    sizes = [int(n) for n in args.entries.split(",") if n]
    counts = [int(n) for n in args.states.split(",") if n]
    with servers(args.delay_ms) as (moto, proxy):
        figures: dict[str, Any] = {"delay_ms": args.delay_ms, "repeat": args.repeat}
        figures["resume"] = [resume(moto, proxy, n, args.repeat) for n in sizes]
        progress("writes")
        figures["turn"] = turns(moto, args.turns)
        figures["build"] = [build_cost(moto, n) for n in sizes]
        figures["peer"] = peer_turns(moto, args.turns) if args.peer else None
        figures["list"] = [
            row for n in counts for row in listing(moto, proxy, n, args.limit, args.spaced)
        ]
        progress("delete and sweep")
        figures["tidy"] = tidy(moto, proxy)
    print(json.dumps(figures) if args.json else tables(figures))


if __name__ == "__main__":
    main()
