"""Where a packed load's time goes: phases of one ``S3Store.load``, and a cProfile of it.

    python -m moto.server -H 127.0.0.1 -p 5123 &
    python bench/latency_proxy.py --upstream http://127.0.0.1:5123 --port 5124 &
    python bench/load_profile.py --moto http://127.0.0.1:5123 --proxy http://127.0.0.1:5124

The first run saves a State of ``--n`` entries (the entries of ``bench/table.py``) and packs
it, keeping the entry objects (``kept``) and removing them (``removed``); later runs find them
on the same server. Each load is timed through the proxy (``--proxy``) after one that fills
its memory. For each, the script prints the wall time and the client CPU of the load, and the
CPU spent on the way in: the segment bodies' parse (``loads_segment``, of which the JSON
parser), the rebuild of the State (``state_from_record``) and what is left (botocore, the
drivers, the listing). With ``--profile``, the cumulative cProfile of one load follows.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import statistics
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import table  # noqa: E402  (the State and bucket of the table)

from alpineagents import _saving  # noqa: E402
from alpineagents.store import Store  # noqa: E402
from alpineagents_s3 import S3Store, _codec, _segments  # noqa: E402

PREFIX = "profile"


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


def ensure_states(moto: str, n: int) -> None:
    """Save and pack the two States once; a later run finds them."""
    store = S3Store(table.BUCKET, PREFIX, endpoint_url=moto)
    try:
        for state_id, remove in (("kept", False), ("removed", True)):
            if store.get(state_id) is not None:
                continue
            print(f"saving {n} entries as {state_id!r}", flush=True)
            store.save(table.make_state(n, state_id))
            store.pack(state_id, remove_entries=remove)
    finally:
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--moto", required=True, help="moto's server URL (saves)")
    parser.add_argument("--proxy", required=True, help="the latency proxy's URL (loads)")
    parser.add_argument("--n", type=int, default=10_000, help="history entries")
    parser.add_argument("--repeat", type=int, default=5, help="timed loads per State")
    parser.add_argument("--profile", action="store_true", help="cProfile one load")
    parser.add_argument(
        "--parse-after",
        action="store_true",
        help="parse the segments once all have arrived, in the loading thread",
    )
    args = parser.parse_args()
    if args.parse_after:
        _segments.replace = lambda call, then: call  # type: ignore[assignment]

    session = boto3.Session(
        aws_access_key_id="bench", aws_secret_access_key="bench", region_name="us-east-1"
    )
    with contextlib.suppress(Exception):
        session.client("s3", endpoint_url=args.moto).create_bucket(Bucket=table.BUCKET)
    ensure_states(args.moto, args.n)
    store = S3Store(table.BUCKET, PREFIX, endpoint_url=args.proxy, session=session)
    store.get("warm-up")
    phases = Phases()
    for state_id in ("kept", "removed"):
        store.load(state_id)  # fills the proxy's memory
        walls, cpus = [], []
        phases.cpu.clear()
        every = time.process_time
        with (
            phases.wrap(S3Store, "read", "S3Store.read (all threads)", every),
            phases.wrap(_segments, "loads_segment", "  loads_segment (threads)"),
            phases.wrap(_codec, "_loads_large", "    of which the JSON parse"),
            phases.wrap(Store, "_loaded", "Store._loaded (rebuild)", every),
            phases.wrap(_saving, "state_from_record", "  of which state_from_record", every),
        ):
            for _ in range(args.repeat):
                began, cpu = time.perf_counter(), time.process_time()
                store.load(state_id)
                walls.append(time.perf_counter() - began)
                cpus.append(time.process_time() - cpu)
        print(
            f"{state_id}: wall {statistics.median(walls) * 1000:.1f} ms (min "
            f"{min(walls) * 1000:.1f}), client CPU {statistics.median(cpus) * 1000:.1f} ms"
        )
        total = statistics.mean(cpus)
        named = 0.0
        for label, cpu in phases.cpu.items():
            each = cpu / args.repeat
            if not label.startswith(" "):
                named += each
            print(f"  {label:<30} {each * 1000:7.1f} ms CPU per load")
        print(f"  {'the rest (botocore, drivers)':<30} {(total - named) * 1000:7.1f} ms CPU per load")
        if args.profile:
            profile = cProfile.Profile(time.process_time)
            profile.enable()
            store.load(state_id)
            profile.disable()
            out = io.StringIO()
            pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(25)
            print(out.getvalue())
    store.close()


if __name__ == "__main__":
    main()
