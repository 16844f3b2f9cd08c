"""The performance table: resume and write costs of every store, side by side, in one run.

    python bench/table.py                          # N = 10, 100: about a minute
    python bench/table.py --sizes 10,100,1000      # a few minutes
    python bench/table.py --full                   # N = 10, 100, 1,000, 10,000

For each history length N, a State of N entries (a model reply with a tool call, or a ~1.5 KB
tool result, as in a tool-using run) is saved by each store variant of ``VARIANTS`` and
loaded again, timed in this process, which does nothing else meanwhile:

* through ``bench/latency_proxy.py`` (a process of its own, with Nagle's algorithm off:
  +``--delay-ms`` per request, and GETs it answered once are answered
  from its memory, so that moto's CPU does not count), after one load that fills its memory;
* straight to moto's server (``ThreadedMotoServer``, a process of its own): moto's CPU
  counts there, as it shares this machine's cores with the client;
* FileStore from its folder (the page cache).

Columns: median wall time of a load; that over the floor (one GET of one object holding all
the history's bytes, through the same path; for FileStore, reading one file of those bytes
and one ``json.loads``), and over the baseline (S3Store, one object per entry, same path);
sequential round trips (wall / delay, through the proxy only); requests by kind and bytes
read, counted by botocore event hooks (``before-send``, and ``Content-Length`` of each
``after-call``); client CPU (process time of the loading process); peak Python memory of the
first load through the proxy, the one that fills its memory and is not timed (tracemalloc),
also as a multiple of the history's JSON size. Timed loads stop at ``--repeat`` or once they
took ``--budget`` seconds, so that N = 10,000 costs one load per row.

The closest peer, Strands Agents' ``S3SessionManager``, runs in its own virtualenv
(``bash bench/peer/setup.sh``) through ``bench/peer/strands_bench.py``, on the same moto
server and proxy; the table says "not installed" without that virtualenv.

Below the table: requests and bytes sent per tool-using turn (user message, model call, tool
result, model reply) of a real ``Agent`` run with ``FunctionModel`` and one tool, counted
by botocore event hooks (for FileStore: the bytes it was given to write), after a first turn
that creates the State, next to the bytes of the history entries the turn added (as compact
JSON); and the user metadata the requests sent (``x-amz-meta-`` names and values: S3Store's
keep the writer, the snapshot an entry was saved on, and the changes entries commit alone).
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import boto3
import botocore.exceptions
import bound  # bench/bound.py: this script's folder is on sys.path, as for its importers
from bound import Bound

from alpineagents import FileStore, State
from alpineagents._serialize import entry_to_dict
from alpineagents.model import ModelRequest
from alpineagents.state import MODEL, TOOL_RESULT
from alpineagents.store import Store
from alpineagents.testing import FunctionModel, call
from alpineagents_s3 import S3Store
from alpineagents_s3.testing import RequestLog

BUCKET = "bench-table"
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
REPLY = "Let me look that up. " * 20  # ~420 B of model text
RESULT = "row,value\n" + "alpha,1\nbeta,2\ngamma,3\n" * 60  # ~1.4 KB of tool result
NOT_INSTALLED = "not installed (bash bench/peer/setup.sh)"
QUICK_SIZES = "10,100"
FULL_SIZES = "10,100,1000,10000"
KINDS = ("GET", "LIST", "HEAD", "PUT", "DELETE")
MOTO = (
    "import sys, time\n"
    "from moto.server import ThreadedMotoServer\n"
    "server = ThreadedMotoServer(ip_address='127.0.0.1', port=int(sys.argv[1]), verbose=False)\n"
    "server.start()\n"
    "while True:\n"
    "    time.sleep(3600)\n"
)

began = time.monotonic()


def progress(text: str) -> None:
    """A line on stderr, so that stdout holds the table alone."""
    print(f"[{time.monotonic() - began:6.1f}s] {text}", file=sys.stderr, flush=True)


# The store variants ---------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """A store under test: a new one is one more entry of ``VARIANTS``.

    Attributes:
        name: As printed.
        s3: An S3Store (else a FileStore).
        pack: Call ``S3Store.pack(state_id)`` after saving (packed segments).
        remove_entries: ``pack(state_id, remove_entries=True)``: the entry objects go.
        auto_pack: ``S3Store(auto_pack=...)``, measured at its worst: a load packed the
            State when it was ``auto_pack - 1`` entries shorter, and those were saved since
            (one fewer than the next load would pack), so a load fetches them one by one.
        first_load: Each load is the first of the State by its store object: the store
            object forgets the chain of segments its last load read (``Ledger.chains``),
            which a load of a store object that read the State before GETs with the
            snapshot. The other S3 variants load through one store object again and again.
    """

    name: str
    s3: bool
    pack: bool = False
    remove_entries: bool = False
    auto_pack: int | None = None
    first_load: bool = False

    def missing(self) -> str | None:
        """Why this variant cannot run in this checkout, or None."""
        if self.pack and not callable(getattr(S3Store, "pack", None)):
            return "S3Store has no pack() in this checkout"
        if self.auto_pack and "auto_pack" not in inspect.signature(S3Store).parameters:
            return "S3Store has no auto_pack in this checkout"
        return None

    @property
    def prefix(self) -> str:
        return "-".join(re.findall(r"[a-z0-9]+", self.name.lower()))


BASELINE = "S3Store"
VARIANTS = (
    Variant("FileStore", s3=False),
    Variant(BASELINE, s3=True),
    Variant("S3Store packed", s3=True, pack=True),
    Variant("S3Store packed, first load", s3=True, pack=True, first_load=True),
    Variant("S3Store packed, entries removed", s3=True, pack=True, remove_entries=True),
    Variant("S3Store auto_pack=16, 15 entries since", s3=True, auto_pack=16, first_load=True),
)


def first_load(store: Store, state_id: str) -> Any:
    """A load of ``state_id`` by ``store`` as if it had not read the State before."""
    ledger = getattr(store, "_ledger", None)
    chains = getattr(ledger, "chains", None)  # none in a checkout before they were kept
    if isinstance(chains, dict):
        chains.pop(state_id, None)
    return store.load(state_id)


class Meter:
    """Requests by kind, bytes sent and bytes read of the stores it is attached to."""

    def __init__(self) -> None:
        self.log = RequestLog()
        self.read = 0
        self._lock = threading.Lock()

    @property
    def hooks(self) -> dict[str, Callable[..., Any]]:
        """For ``S3Store(event_hooks=...)``."""
        return {**self.log.hooks, "after-call.s3": self._after_call}

    def _after_call(self, http_response: Any = None, **kwargs: Any) -> None:
        length = http_response.headers.get("content-length") if http_response else None
        with self._lock:
            self.read += int(length or 0)

    def clear(self) -> None:
        self.log.clear()
        with self._lock:
            self.read = 0


class CountingFileStore(FileStore):
    """A FileStore that adds up the bytes of the entries and snapshots it is given to write."""

    written = 0

    def write(self, *args: Any, **kwargs: Any) -> None:
        super().write(*args, **kwargs)
        entries, snapshot = args[1], args[2] if len(args) > 2 else kwargs.get("snapshot")
        self.written += sum(len(json.dumps(e).encode()) + 1 for e in entries)
        if snapshot is not None:
            self.written += len(json.dumps(snapshot).encode())


# Processes ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def answers(url: str) -> bool:
    try:
        boto3.client("s3", endpoint_url=url).list_buckets()
    except (OSError, botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError):
        return False
    return True


@contextlib.contextmanager
def child(args: list[str], ready: Callable[[], bool]) -> Iterator[None]:
    """A child process, once ``ready()``; terminated (then killed) at the end."""
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not ready():
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError(f"{args[:3]} did not start")
            time.sleep(0.2)
        yield
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def peer_python() -> Path | None:
    """The peer's virtualenv interpreter ($PEER_VENV, else bench/peer/.venv), if it exists."""
    venv = Path(os.environ.get("PEER_VENV") or HERE / "peer" / ".venv")
    python = venv / "bin" / "python"
    return python if python.exists() else None


def run_peer(python: Path, command: str, endpoint: str, *extra: str) -> dict[str, Any]:
    """One command of bench/peer/strands_bench.py; its JSON answer."""
    args = [str(python), str(HERE / "peer" / "strands_bench.py"), command]
    args += ["--endpoint", endpoint, "--bucket", BUCKET, *extra]
    done = subprocess.run(args, capture_output=True, text=True, timeout=1800, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"strands_bench.py {command} failed:\n{done.stderr[-3000:]}")
    answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


# Measuring ------------------------------------------------------------------------------


@dataclass
class Row:
    """One line of the table."""

    n: int
    store: str
    via: str
    wall: float | None = None
    cpu: float | None = None
    requests: Mapping[str, int] = field(default_factory=dict)
    read: int | None = None
    peak: int | None = None
    note: str = ""


def timed(load: Callable[[], Any], repeat: int, budget: float) -> tuple[float, float, int]:
    """Median wall and CPU seconds of ``load`` over up to ``repeat`` runs (fewer past
    ``budget`` seconds), and how many runs."""
    walls, cpus = [], []
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        load()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
        if sum(walls) > budget:
            break
    return statistics.median(walls), statistics.median(cpus), len(walls)


def get_all(client: Any, key: str) -> bytes:
    """The floor's one GET."""
    body: bytes = client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    return body


def peak_memory(load: Callable[[], Any]) -> int:
    tracemalloc.start()
    try:
        load()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def make_state(n: int, state_id: str, state: State | None = None) -> State:
    """A State of ``n`` history entries: model replies with a tool call, and tool results.

    Given ``state``, its history grows to ``n`` entries of the same kinds.
    """
    if state is None:
        state = State("Summarise the quarterly numbers", id=state_id)
    while len(state.history) < n:
        k = len(state.history)
        if k % 2:
            use = {"type": "tool_call", "id": f"c{k}", "name": "query", "input": {"q": k}}
            data = {"content": [{"type": "text", "text": REPLY}, use], "stop_reason": "tool_use"}
            state.append(MODEL, REPLY, data)
        else:
            state.append(TOOL_RESULT, RESULT, {"call_id": f"c{k - 1}", "name": "query"})
    return state


@dataclass
class Bench:
    """Everything one run of the table shares."""

    moto: str
    proxy: str
    delay: float
    repeat: int
    budget: float
    folder: Path
    session: boto3.Session
    peer: Path | None
    no_peer: str  # what the table says without the peer
    meter: Meter = field(default_factory=Meter)
    stores: dict[tuple[str, str], Store] = field(default_factory=dict)

    def store(self, variant: Variant, via: str) -> Store:
        """The variant's store on ``via`` ("proxy", "direct", "disk"), opened once."""
        key = (variant.name, via)
        if key not in self.stores:
            if not variant.s3:
                self.stores[key] = CountingFileStore(self.folder / variant.prefix)
            else:
                url = self.proxy if via == "proxy" else self.moto
                # Only when asked for: a checkout without auto_pack runs the other variants.
                options: dict[str, Any] = {}
                if variant.auto_pack:
                    options["auto_pack"] = variant.auto_pack
                s3 = S3Store(
                    BUCKET,
                    variant.prefix,
                    endpoint_url=url,
                    session=self.session,
                    event_hooks=self.meter.hooks,
                    **options,
                )
                # The client opens here, and botocore loads what a load uses (a State that
                # does not exist: one LIST), so that no measured load pays for it.
                s3.get("warm-up")
                self.stores[key] = s3
        return self.stores[key]

    def close(self) -> None:
        for store in self.stores.values():
            store.close()


def bench_size(bench: Bench, n: int, variants: list[Variant]) -> list[Row]:
    """Every row of history length ``n``."""
    rows: list[Row] = []
    state = make_state(n, f"resume-{n}")
    entries = [entry_to_dict(e) for e in state.history]
    whole = json.dumps(entries).encode()

    # The floors: one object (one file) of all the history's bytes.
    raw = bench.session.client("s3", endpoint_url=bench.moto)
    key = f"floor/{n}.json"
    raw.put_object(Bucket=BUCKET, Key=key, Body=whole)
    for via, url in (("proxy", bench.proxy), ("direct", bench.moto)):
        client = bench.session.client("s3", endpoint_url=url)
        client.get_object(Bucket=BUCKET, Key=key)["Body"].read()  # opens; fills the proxy
        wall, cpu, _ = timed(partial(get_all, client, key), bench.repeat, bench.budget)
        rows.append(Row(n, "floor: 1 GET of all", via, wall, cpu, {"GET": 1}, len(whole)))
        client.close()
    raw.close()
    whole_file = bench.folder / f"floor-{n}.json"
    whole_file.write_bytes(whole)
    wall, cpu, _ = timed(lambda: json.loads(whole_file.read_bytes()), bench.repeat, bench.budget)
    rows.append(Row(n, "floor: read + json.loads", "disk", wall, cpu, {}, len(whole)))
    rows += bench_bound(bench, n, entries)

    for variant in variants:
        if not variant.s3:
            files = bench.store(variant, "disk")
            files.save(make_state(n, state.id))
            folder = bench.folder / variant.prefix / state.id
            size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
            wall, cpu, _ = timed(partial(files.load, state.id), bench.repeat, bench.budget)
            used = peak_memory(partial(files.load, state.id))
            rows.append(Row(n, variant.name, "disk", wall, cpu, {}, size, used))
            continue
        progress(f"N={n} {variant.name}: saving {n} entries")
        writer = bench.store(variant, "direct")
        if variant.auto_pack and n >= 2 * variant.auto_pack - 1:
            # Its worst case: packed by a load one entry short of the next pack ago.
            grown = make_state(n - variant.auto_pack + 1, state.id)
            writer.save(grown)
            writer.load(state.id)  # fetches them all one by one: packs them
            writer.save(make_state(n, state.id, grown))
        else:
            writer.save(make_state(n, state.id))
        if variant.pack:
            assert isinstance(writer, S3Store)
            writer.pack(state.id, remove_entries=variant.remove_entries)
        for via in ("proxy", "direct"):
            store = bench.store(variant, via)
            loading = partial(store.load, state.id)
            if variant.first_load:
                loading = partial(first_load, store, state.id)
            peak: int | None = None
            if via == "proxy":
                # The first load fills the proxy's memory; traced, it gives the peak memory
                # (the same whoever answers), so no load is spent on that alone.
                progress(f"N={n} {variant.name}: a first load, traced, fills the proxy's memory")
                peak = peak_memory(loading)
            progress(f"N={n} {variant.name}: loads {via}")
            bench.meter.clear()
            wall, cpu, runs = timed(loading, bench.repeat, bench.budget)
            counts = {k: v // runs for k, v in bench.meter.log.counts().items()}
            read = bench.meter.read // runs
            rows.append(Row(n, variant.name, via, wall, cpu, counts, read, peak))

    rows += bench_peer_size(bench, n)
    return rows


def bench_bound(bench: Bench, n: int, entries: list[dict[str, Any]]) -> list[Row]:
    """The bound rows of history length ``n`` (see ``bench/bound.py``): proxy, then direct."""
    raw = bench.session.client("s3", endpoint_url=bench.moto)
    layouts = [  # the objects, and the rows of their loads: (name, Bound's load method)
        (
            Bound.put(raw, BUCKET, f"bound/{n}/parts/", entries),
            [(bound.FIRST_LOAD, Bound.first_load), (bound.KNOWN_KEYS, Bound.known_load)],
        ),
        (
            Bound.put(raw, BUCKET, f"bound/{n}/one/", entries, one_object=True),
            [(bound.ONE_OBJECT, Bound.known_load)],
        ),
    ]
    raw.close()
    rows = []
    for via, url in (("proxy", bench.proxy), ("direct", bench.moto)):
        client = bench.session.client("s3", endpoint_url=url)
        for event, handler in bench.meter.hooks.items():
            client.meta.events.register(event, handler)
        for stored, named in layouts:
            loads = stored.through(client)
            for name, method in named:
                load = partial(method, loads)
                if len(load()) != n:  # opens the connections; fills the proxy's memory
                    raise SystemExit(f"{name}: did not load {n} entries")
                bench.meter.clear()
                wall, cpu, runs = timed(load, bench.repeat, bench.budget)
                counts = {k: v // runs for k, v in bench.meter.log.counts().items()}
                rows.append(Row(n, name, via, wall, cpu, counts, bench.meter.read // runs))
            loads.close()
        client.close()
    for stored, _ in layouts:
        stored.close()
    return rows


def bench_peer_size(bench: Bench, n: int) -> list[Row]:
    """The peer's rows for history length ``n`` (one "not installed" row without it)."""
    name = "Strands S3SessionManager"
    if bench.peer is None:
        return [Row(n, name, "-", note=bench.no_peer)]
    session = f"peer-{n}"
    progress(f"N={n} {name}: saving {n} messages")
    run_peer(bench.peer, "populate", bench.moto, "--session", session, "--n", str(n))
    rows = []
    for via, url in (("proxy", bench.proxy), ("direct", bench.moto)):
        progress(f"N={n} {name}: restores {via}")
        extra = ["--session", session, "--repeat", str(bench.repeat)]
        extra += ["--budget", str(bench.budget)] + (["--memory"] if via == "proxy" else [])
        got = run_peer(bench.peer, "restore", url, *extra)
        note = "" if got["messages"] == n else f"restored {got['messages']} messages"
        rows.append(
            Row(
                n, name, via, got["wall"], got["cpu"], got["requests"], got["read"],
                got.get("peak"), note,
            )
        )  # fmt: skip
    return rows


# Writes per tool-using turn -------------------------------------------------------------


@dataclass
class TurnFigures:
    """What one tool-using turn sends, on average."""

    store: str
    requests: Mapping[str, float]
    sent: float
    entries: float | None  # bytes of the history entries the turn added
    note: str = ""
    metadata: float | None = None  # user metadata sent (x-amz-meta- names and values)


def query(q: int) -> str:
    """Look a number up."""
    return RESULT


def turns_of(bench: Bench, variant: Variant, turns: int) -> TurnFigures:
    """Requests and bytes of ``turns`` tool-using turns of a real Agent run."""
    from alpineagents import Agent  # the Anthropic SDK comes with it: only here

    answered = [False]

    def model(request: ModelRequest) -> str | list[dict[str, Any]]:
        answered[0] = not answered[0]
        if answered[0]:
            return [{"type": "text", "text": REPLY}, call("query", q=1)]
        return REPLY

    store = bench.store(variant, "disk" if not variant.s3 else "proxy")
    agent = Agent(model=FunctionModel(model), tools=[query], store=store)
    state = State("Summarise the quarterly numbers", id=f"turns-{variant.prefix}")
    agent.run(state)  # the first turn creates the State
    bench.meter.clear()
    if isinstance(store, CountingFileStore):
        store.written = 0
    first = len(state.history)
    for k in range(turns):
        state.add_user_message(f"And the numbers of quarter {k}?")
        agent.run(state)
    # The entries' bytes as compact JSON, as a store writes them (no spaces after separators).
    added = sum(
        len(json.dumps(entry_to_dict(e), separators=(",", ":"), ensure_ascii=False).encode())
        for e in state.history[first:]
    )
    if isinstance(store, CountingFileStore):
        return TurnFigures(variant.name, {}, store.written / turns, added / turns)
    counts = bench.meter.log.counts()
    per_turn = {k: v / turns for k, v in counts.items()}
    log = bench.meter.log
    return TurnFigures(
        variant.name,
        per_turn,
        log.sent_bytes() / turns,
        added / turns,
        metadata=log.sent_metadata_bytes() / turns,
    )


def peer_turns(bench: Bench, turns: int) -> TurnFigures:
    name = "Strands S3SessionManager"
    if bench.peer is None:
        return TurnFigures(name, {}, 0, None, bench.no_peer)
    extra = ["--session", "peer-turns", "--turns", str(turns)]
    got = run_peer(bench.peer, "turns", bench.proxy, *extra)
    return TurnFigures(name, got["requests"], got["sent"], None, "", got.get("metadata"))


# Printing -------------------------------------------------------------------------------


def fmt_counts(counts: Mapping[str, float]) -> str:
    shown = [f"{counts[k]:g} {k}" for k in KINDS if counts.get(k)]
    shown += [f"{v:g} {k}" for k, v in counts.items() if k not in KINDS and v]
    return " + ".join(shown) or "-"


def fmt_time(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds >= 10:
        return f"{seconds:.1f} s"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    return f"{seconds * 1000:.1f} ms" if seconds < 0.1 else f"{seconds * 1000:.0f} ms"


def fmt_bytes(size: float | None) -> str:
    if size is None:
        return "-"
    if size >= 1e6:
        return f"{size / 1e6:.2f} MB"
    if size >= 1e3:
        return f"{size / 1e3:.1f} KB"
    return f"{size:.0f} B"


def ratio(a: float | None, b: float | None, digits: int = 1) -> str:
    return "-" if a is None or not b else f"{a / b:.{digits}f}x"


def table(rows: list[Row], delay: float, json_sizes: Mapping[int, int]) -> list[str]:
    """The rows as a Markdown table."""
    head = [
        "N",
        "store",
        "via",
        "wall",
        "/floor",
        "/baseline",
        "round trips",
        "requests",
        "read",
        "client CPU",
        "peak mem (/JSON)",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    floors = {(r.n, r.via): r.wall for r in rows if r.store.startswith("floor")}
    bases = {(r.n, r.via): r.wall for r in rows if r.store == BASELINE}
    for r in rows:
        if r.wall is None:
            cells = [f"{r.n:,}", r.store, r.via, r.note] + ["-"] * (len(head) - 4)
        else:
            floor = floors.get((r.n, r.via))
            trips = f"{r.wall / delay:.1f}" if r.via == "proxy" and delay else "-"
            peak = "-"
            if r.peak is not None:
                peak = f"{fmt_bytes(r.peak)} ({r.peak / json_sizes[r.n]:.1f}x)"
            cells = [
                f"{r.n:,}",
                r.store + (f" ({r.note})" if r.note else ""),
                r.via,
                fmt_time(r.wall),
                "1x" if r.store.startswith("floor") else ratio(r.wall, floor),
                ratio(r.wall, bases.get((r.n, r.via))) if r.via != "disk" else "-",
                trips,
                fmt_counts(r.requests),
                fmt_bytes(r.read),
                fmt_time(r.cpu),
                peak,
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def turn_table(figures: list[TurnFigures]) -> list[str]:
    head = [
        "store",
        "requests per turn",
        "bytes sent per turn",
        "entry bytes",
        "sent/entries",
        "+ metadata",
        "(sent + metadata)/entries",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for f in figures:
        if f.note:
            cells = [f.store, f.note] + ["-"] * 5
        else:
            written = " (written to files)" if not f.requests else ""
            both = None if f.metadata is None else f.sent + f.metadata
            cells = [
                f.store,
                fmt_counts(f.requests),
                fmt_bytes(f.sent) + written,
                fmt_bytes(f.entries),
                ratio(f.sent, f.entries, 2),
                "-" if f.metadata is None else fmt_bytes(f.metadata),
                "-" if both is None else ratio(both, f.entries, 2),
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def commit() -> str:
    try:
        done = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    dirty = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return done.stdout.strip() + (" (modified)" if dirty else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default=QUICK_SIZES, help=f"by commas (default {QUICK_SIZES})")
    parser.add_argument("--full", action="store_true", help=f"--sizes {FULL_SIZES}")
    parser.add_argument("--delay-ms", type=float, default=20.0, help="the proxy's, per request")
    parser.add_argument("--repeat", type=int, default=5, help="timed loads per row, at most")
    parser.add_argument("--budget", type=float, default=10.0, help="seconds of timed loads a row")
    parser.add_argument("--turns", type=int, default=5, help="tool-using turns to count")
    parser.add_argument("--no-peer", action="store_true", help="leave the peer out")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    names = ", ".join(repr(v.name) for v in VARIANTS)
    parser.add_argument(
        "--variant",
        action="append",
        choices=[v.name for v in VARIANTS],
        metavar="NAME",
        help=f"only this store variant (repeatable; default all: {names})",
    )
    args = parser.parse_args()
    sizes = [int(s) for s in (FULL_SIZES if args.full else args.sizes).split(",")]
    for name, value in (("AWS_ACCESS_KEY_ID", "bench"), ("AWS_SECRET_ACCESS_KEY", "bench")):
        os.environ.setdefault(name, value)
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    chosen = [v for v in VARIANTS if args.variant is None or v.name in args.variant]
    variants = [v for v in chosen if v.missing() is None]
    left_out = [f"{v.name}: {v.missing()}" for v in chosen if v.missing() is not None]
    left_out += [f"{v.name}: not asked for (--variant)" for v in VARIANTS if v not in chosen]
    peer = None if args.no_peer else peer_python()
    no_peer = "left out (--no-peer)" if args.no_peer else NOT_INSTALLED
    revision = commit()  # before the run: files edited meanwhile do not count

    moto_port, proxy_port = free_port(), free_port()
    moto = f"http://127.0.0.1:{moto_port}"
    proxy = f"http://127.0.0.1:{proxy_port}"
    proxy_args = [sys.executable, str(HERE / "latency_proxy.py"), "--upstream", moto]
    proxy_args += ["--delay-ms", str(args.delay_ms), "--port", str(proxy_port)]
    progress(f"moto at {moto}, proxy at {proxy}; sizes {sizes}")
    with (
        tempfile.TemporaryDirectory() as tmp,
        child([sys.executable, "-c", MOTO, str(moto_port)], lambda: answers(moto)),
        child(proxy_args, lambda: answers(proxy)),
    ):
        session = boto3.Session()
        session.client("s3", endpoint_url=moto).create_bucket(Bucket=BUCKET)
        bench = Bench(
            moto,
            proxy,
            args.delay_ms / 1000,
            args.repeat,
            args.budget,
            Path(tmp),
            session,
            peer,
            no_peer,
        )
        try:
            rows: list[Row] = []
            json_sizes = {}
            for n in sizes:
                json_sizes[n] = len(
                    json.dumps([entry_to_dict(e) for e in make_state(n, "x").history]).encode()
                )
                rows += bench_size(bench, n, variants)
            progress(f"{args.turns} tool-using turn(s) per store")
            turn_figures = [turns_of(bench, v, args.turns) for v in variants]
            turn_figures.append(peer_turns(bench, args.turns))
        finally:
            bench.close()
    load = os.getloadavg()
    peer_note = f"peer venv {peer}" if peer else f"peer {no_peer}"
    print(
        f"alpineagents {revision}; python {platform.python_version()}, {os.cpu_count()} cores, "
        f"load average {load[0]:.2f} at the end; moto's ThreadedMotoServer and the proxy "
        f"(+{args.delay_ms:g} ms per request) in processes of their own; {peer_note}"
    )
    print(f"median of up to {args.repeat} loads ({args.budget:g} s at most a row)")
    if left_out:
        print("left out: " + "; ".join(left_out))
    print()
    print("\n".join(table(rows, args.delay_ms / 1000, json_sizes)))
    print()
    print(f"Per tool-using turn (user message, model call, tool result, model reply), mean of "
          f"{args.turns} turn{'s' if args.turns != 1 else ''} after the first:")  # fmt: skip
    print()
    print("\n".join(turn_table(turn_figures)))
    if args.json is not None:
        figures = {
            "delay": args.delay_ms / 1000,
            "json_sizes": json_sizes,
            "left_out": left_out,
            "rows": [asdict(r) for r in rows],
            "turns": [asdict(t) for t in turn_figures],
        }
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
