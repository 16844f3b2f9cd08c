"""Where a packed load's time goes: phases of one ``S3Store.load``, and a cProfile of it.

    python bench/load_profile.py --n 1000       # its own moto and proxy, for one run
    python -m moto.server -H 127.0.0.1 -p 5123 &
    python bench/latency_proxy.py --upstream http://127.0.0.1:5123 --port 5124 &
    python bench/load_profile.py --moto http://127.0.0.1:5123 --proxy http://127.0.0.1:5124

A State of ``--n`` entries (the entries of ``bench/table.py``) is saved and packed, keeping
the entry objects (``kept``) and removing them (``removed``), and with ``--unpacked`` saved
and left unpacked (``unpacked``, one GET an entry); with ``--moto`` and ``--proxy``,
later runs find them on the same server, which saves the minutes of saving 10,000 entries.
Each load is timed through the proxy after one that fills its memory. For each State, the
script prints the wall time and the client CPU of a load, and the CPU spent on the way: the
read (``S3Store.read``, every thread), of which the segment bodies' parse (``loads_segment``
in the drivers' threads, of which the JSON parser), the rebuild of the State
(``Store._loaded``, of which ``state_from_record``) and what is left. ``--parse-after``
parses the segments in the loading thread once all have arrived, to compare, and
``--botocore-timestamps`` leaves the store's clients botocore's timestamp parser (see
``alpineagents_s3._timestamps``), ``--botocore-endpoints`` botocore's endpoint resolution
for each key (see ``alpineagents_s3._endpoints``). Then the client CPU of ``objects()``, a
listing of every object of the State. With ``--profile``, a cProfile (CPU time, loading
thread only) of one load follows. ``--first-load`` makes each load the first of the State by
its store object (``bench/table.py``'s "first load": the chain of segments it read last is
forgotten, so the segments are listed before they are fetched). Each State's figures end with
the cyclic garbage collector's collections during the timed loads (``gc.callbacks``): how
many, and the wall time spent in them, per load and by generation.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import io
import os
import pstats
import statistics
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import boto3

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import table  # noqa: E402  (the State and bucket of the table)

from alpineagents import _saving  # noqa: E402
from alpineagents.store import Store  # noqa: E402
from alpineagents_s3 import S3Store, _clients, _codec, _segments  # noqa: E402
from alpineagents_s3._steps import Call  # noqa: E402

PREFIX = "profile"
# The phases printed, in this order; indented ones are part of the one above them.
LABELS = (
    "S3Store.read (all threads)",
    "  loads_segment (threads)",
    "    of which the JSON parse",
    "Store._loaded (rebuild)",
    "  of which state_from_record",
)


class Phases:
    """Thread CPU time spent in named functions, summed over every thread of the process."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = defaultdict(float)
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def wrap(
        self, owner: Any, name: str, label: str, clock: Callable[[], float] = time.thread_time
    ) -> Iterator[None]:
        """Count the ``clock`` time of ``owner.name`` under ``label`` while inside.

        ``time.thread_time`` (the default) counts the calling thread's CPU alone;
        ``time.process_time``, every thread's meanwhile.
        """
        original: Callable[..., Any] = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            began = clock()
            try:
                return original(*args, **kwargs)
            finally:
                took = clock() - began
                with self._lock:
                    self.cpu[label] += took

        setattr(owner, name, timed)
        try:
            yield
        finally:
            setattr(owner, name, original)


class Collections:
    """The cyclic garbage collector's collections while counting: how many, how long."""

    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self._began = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.count[info["generation"]] += 1
            self.seconds[info["generation"]] += time.perf_counter() - self._began

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        """Count the collections of the block (from zero)."""
        self.count, self.seconds = [0, 0, 0], [0.0, 0.0, 0.0]
        gc.callbacks.append(self._callback)
        try:
            yield
        finally:
            gc.callbacks.remove(self._callback)

    def summary(self, loads: int) -> str:
        """A line of the collections per load, by generation."""
        ms = sum(self.seconds) / loads * 1000
        by = ", ".join(
            f"gen {g}: {self.count[g] / loads:.1f} in {self.seconds[g] / loads * 1000:.1f} ms"
            for g in range(3)
        )
        return f"garbage collections     {ms:7.1f} ms per load ({by})"


def _without_then(call: Call, then: object) -> Call:
    """The segment GET ``call`` as it is: the driver returns its bytes, the read parses them."""
    return call


# The States loaded: whether each is packed, and whether its pack removes the entry objects.
STATES = {"kept": (True, False), "removed": (True, True), "unpacked": (False, False)}


def ensure_states(moto: str, n: int, names: list[str]) -> None:
    """Save (and pack) the States ``names`` once; a later run finds them."""
    store = S3Store(table.BUCKET, PREFIX, endpoint_url=moto)
    try:
        for state_id in names:
            packed, remove = STATES[state_id]
            if store.get(state_id) is not None:
                continue
            print(f"saving {n} entries as {state_id!r}", flush=True)
            store.save(table.make_state(n, state_id))
            if packed:
                store.pack(state_id, remove_entries=remove)
    finally:
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--moto", help="moto's server URL (default: one of its own)")
    parser.add_argument("--proxy", help="the latency proxy's URL (default: one of its own)")
    parser.add_argument("--n", type=int, default=10_000, help="history entries")
    parser.add_argument("--repeat", type=int, default=5, help="timed loads per State")
    parser.add_argument("--profile", action="store_true", help="cProfile one load")
    parser.add_argument(
        "--parse-after",
        action="store_true",
        help="parse the segments once all have arrived, in the loading thread",
    )
    parser.add_argument(
        "--botocore-timestamps",
        action="store_true",
        help="the store's clients parse timestamps with botocore's parser (dateutil)",
    )
    parser.add_argument(
        "--unpacked",
        action="store_true",
        help="load a third State, never packed: one GET an entry",
    )
    parser.add_argument(
        "--first-load",
        action="store_true",
        help="each load as the store object's first of the State (segments listed first)",
    )
    parser.add_argument(
        "--botocore-endpoints",
        action="store_true",
        help="the store's clients resolve each key's endpoint as botocore does (no cache hit)",
    )
    args = parser.parse_args()
    if args.parse_after:
        setattr(_segments, "replace", _without_then)  # noqa: B010 - no public name for it
    if args.botocore_timestamps:
        setattr(_clients, "fast_timestamps", lambda client: None)  # noqa: B010 - as above
    if args.botocore_endpoints:
        setattr(_clients, "cache_endpoints", lambda client: None)  # noqa: B010 - as above
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(name, "bench")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    with contextlib.ExitStack() as stack:
        moto, proxy = args.moto, args.proxy
        if moto is None or proxy is None:
            moto = f"http://127.0.0.1:{table.free_port()}"
            proxy_port = table.free_port()
            proxy = f"http://127.0.0.1:{proxy_port}"
            up = [sys.executable, "-c", table.MOTO, moto.rsplit(":", 1)[1]]
            stack.enter_context(table.child(up, partial(table.answers, moto)))
            forward = [sys.executable, str(HERE / "latency_proxy.py"), "--upstream", moto]
            forward += ["--port", str(proxy_port)]
            stack.enter_context(table.child(forward, partial(table.answers, proxy)))
        profile_loads(args, moto, proxy)


def profile_loads(args: argparse.Namespace, moto: str, proxy: str) -> None:
    """Save the States if they are not there yet, and print the phases of their loads."""
    session = boto3.Session()
    with contextlib.suppress(Exception):  # made by an earlier run on the same server
        session.client("s3", endpoint_url=moto).create_bucket(Bucket=table.BUCKET)
    names = ["kept", "removed", *(["unpacked"] if args.unpacked else [])]
    ensure_states(moto, args.n, names)
    store = S3Store(table.BUCKET, PREFIX, endpoint_url=proxy, session=session)
    store.get("warm-up")
    phases = Phases()
    collections = Collections()
    for state_id in names:
        load = partial(table.first_load if args.first_load else S3Store.load, store, state_id)
        loaded = load()  # fills the proxy's memory
        # (A load may add one: the result of a tool call the saved history ends with.)
        if len(loaded.history) < args.n:
            raise SystemExit(f"{state_id!r} loaded {len(loaded.history)} entries, not {args.n}")
        walls, cpus = [], []
        phases.cpu.clear()
        every = time.process_time
        with (
            phases.wrap(S3Store, "read", LABELS[0], every),
            phases.wrap(_segments, "loads_segment", LABELS[1]),
            phases.wrap(_codec, "_loads_large", LABELS[2]),
            phases.wrap(Store, "_loaded", LABELS[3], every),
            phases.wrap(_saving, "state_from_record", LABELS[4], every),
            collections.counting(),
        ):
            for _ in range(args.repeat):
                began, cpu = time.perf_counter(), time.process_time()
                load()
                walls.append(time.perf_counter() - began)
                cpus.append(time.process_time() - cpu)
        print(
            f"{state_id}: wall {statistics.median(walls) * 1000:.1f} ms (min "
            f"{min(walls) * 1000:.1f}), client CPU {statistics.median(cpus) * 1000:.1f} ms "
            f"(mean {statistics.mean(cpus) * 1000:.1f}, which the phases below divide)"
        )
        total = statistics.mean(cpus)
        named = 0.0
        for label in LABELS:
            each = phases.cpu[label] / args.repeat
            if not label.startswith(" "):
                named += each
            print(f"  {label:<32} {each * 1000:7.1f} ms CPU per load")
        print(f"  {'the rest of the load':<32} {(total - named) * 1000:7.1f} ms CPU per load")
        print(f"  {collections.summary(args.repeat)}")
        cpus = []
        for _ in range(args.repeat):
            cpu = time.process_time()
            listed = store.objects(state_id)
            cpus.append(time.process_time() - cpu)
        print(
            f"  objects(): {len(listed)} keys listed, client CPU "
            f"{statistics.median(cpus) * 1000:.1f} ms (median)"
        )
        if args.profile:
            profile = cProfile.Profile(time.process_time)
            profile.enable()
            load()
            profile.disable()
            out = io.StringIO()
            pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(25)
            print(out.getvalue())
    store.close()


if __name__ == "__main__":
    main()
