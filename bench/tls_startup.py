"""What TLS costs a cold load: the first load of a new store, over HTTPS, with the CA bundle
loaded once (alpineagents_s3/_tls.py) and as botocore and aiobotocore load it.

    python bench/tls_startup.py                 # N = 10 and 100, 5 loads of each kind
    python bench/tls_startup.py --sizes 10,1000 --repeat 9

moto's server, bench/latency_proxy.py (+20 ms a request, connections kept alive as S3 keeps
them) and bench/tls_proxy.py (TLS, a CA made for it) run in a process of their own, so only
the client's CPU is counted. The client trusts a bundle of botocore's CA certificates with that
CA added, as a machine whose ``AWS_CA_BUNDLE`` names its own bundle would. Each load is a new
``S3Store`` (a sync one, or an async one in a new event loop: a serverless handler's
``asyncio.run`` per event); "as botocore" turns off the store's TLS set-up in this process.
Printed: the median client CPU and wall time of a load, and the CA bundle loads it made.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BUCKET = "tls-startup"


def serve(folder: Path) -> None:
    """The servers (in the child process): print the URLs and the CA bundle, then wait."""
    from latency_proxy import LatencyProxy
    from moto.server import ThreadedMotoServer
    from tls_proxy import TLSProxy, make_ca_and_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    host, port = moto.get_host_and_port()
    bundle, cert, key = make_ca_and_server(folder, "bench")
    with LatencyProxy(f"http://{host}:{port}", 0.02) as latency:
        with TLSProxy(latency.url, cert, key) as tls:
            print(f"http://{host}:{port}", tls.url, bundle, flush=True)
            sys.stdin.read()  # until the parent closes it


@contextmanager
def servers() -> Iterator[tuple[str, str, Path]]:
    folder = Path(tempfile.mkdtemp(prefix="tls-startup-"))
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(folder)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdin is not None
    moto, tls, bundle = child.stdout.readline().split()
    try:
        yield moto, tls, Path(bundle)
    finally:
        child.stdin.close()
        child.wait(10)


class Loads:
    """Counts the CA bundle loads of this process (``SSLContext.load_verify_locations``)."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()
        original = ssl.SSLContext.load_verify_locations

        def counted(context: ssl.SSLContext, *args: Any, **kwargs: Any) -> None:
            with self._lock:
                self.count += 1
            original(context, *args, **kwargs)

        setattr(ssl.SSLContext, "load_verify_locations", counted)  # noqa: B010 - counted


def measure(load: Callable[[], None], loads: Loads, repeat: int) -> tuple[float, float, float]:
    """Median client CPU (ms), wall (ms) and CA loads of ``repeat`` cold loads."""
    cpu, wall, counts = [], [], []
    for _ in range(repeat):
        before = loads.count
        started, clock = time.process_time(), time.perf_counter()
        load()
        cpu.append((time.process_time() - started) * 1000)
        wall.append((time.perf_counter() - clock) * 1000)
        counts.append(loads.count - before)
    return statistics.median(cpu), statistics.median(wall), statistics.median(counts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,100", help="entries of the State, by commas")
    parser.add_argument("--repeat", type=int, default=5, help="cold loads of each kind")
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    if args.serve:
        serve(args.serve)
        return
    for name, value in {
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    }.items():
        os.environ[name] = value

    import boto3
    from botocore.httpsession import get_cert_path

    from alpineagents_s3 import S3Store, _clients, _tls

    sizes = [int(n) for n in args.sizes.split(",")]
    with servers() as (moto, tls, ca):
        bundle = ca.with_name("bundle.pem")
        botocores = Path(str(get_cert_path(True)))
        bundle.write_bytes(botocores.read_bytes() + ca.read_bytes())
        os.environ["AWS_CA_BUNDLE"] = str(bundle)
        print(
            f"CA bundle: botocore's {botocores.stat().st_size:,} B + the proxy's CA; moto, "
            "the latency proxy (+20 ms) and TLS in a process of their own"
        )
        boto3.client("s3", endpoint_url=moto).create_bucket(Bucket=BUCKET)
        writer = S3Store(BUCKET, endpoint_url=moto)
        for n in sizes:
            entries = [{"seq": s, "kind": "user", "text": f"entry {s} " * 40} for s in range(n)]
            writer.write(f"n{n}", entries, {"task": "tls", "stopped_by": None}, create=True)
        writer.close()

        def cold_sync(n: int) -> None:
            store = S3Store(BUCKET, endpoint_url=tls)
            record = store.read(f"n{n}")
            assert record is not None and len(record.entries) == n
            store.close()

        def cold_async(n: int) -> None:
            async def go() -> None:
                store = S3Store(BUCKET, endpoint_url=tls)
                record = await store.aread(f"n{n}")
                assert record is not None and len(record.entries) == n
                await store.aclose()

            asyncio.run(go())

        loads = Loads()
        for n in sizes:  # the models loaded, the proxy's cache filled
            cold_sync(n)
            cold_async(n)
        session_class = _tls.session_class

        def as_botocore(on: bool) -> None:
            """The store's TLS set-up off (``on``) or on again, in this process."""
            from aiobotocore.httpsession import AIOHTTPSession

            # Module functions replaced for the runs, and put back after them.
            share = (lambda client: None) if on else _tls.share_sync_tls
            setattr(_clients, "share_sync_tls", share)  # noqa: B010
            made = (lambda c: AIOHTTPSession) if on else session_class
            setattr(_clients, "session_class", made)  # noqa: B010

        print()
        print("| N | API | CA loaded | CPU | wall | CA loads |")
        print("|---|---|---|---|---|---|")
        for n in sizes:
            for api, load in (("sync", cold_sync), ("async", cold_async)):
                for botocore_way in (True, False):
                    as_botocore(botocore_way)
                    cpu, wall, count = measure(partial(load, n), loads, args.repeat)
                    how = "as botocore" if botocore_way else "once"
                    print(f"| {n:,} | {api} | {how} | {cpu:.0f} ms | {wall:.0f} ms | {count:.0f} |")
        as_botocore(False)


if __name__ == "__main__":
    main()
