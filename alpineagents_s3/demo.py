"""What ``python -m alpineagents.demo --store s3`` needs of the plugin, found through the store.

The core's demo knows no store by name: for a store URL (or the bare scheme ``s3``) it asks the
store class registered for the scheme for ``demo_support()``, and gets this module. It serves
an embedded S3 server for ``--store s3``, has the demo's processes log their requests to a
file, and prints the State's objects with the requests that made them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from alpineagents_s3._store import S3Store
from alpineagents_s3.testing import RequestLog, embedded_moto

__all__ = ["options", "report", "serve"]

BUCKET = "alpineagents-demo"


@contextlib.contextmanager
def serve() -> Iterator[str]:
    """An embedded S3 server (moto) for the demo's processes; yields the store URL."""
    with embedded_moto(BUCKET) as endpoint:
        os.environ["AWS_ENDPOINT_URL_S3"] = endpoint  # the demo's processes inherit it
        print(f"Embedded S3 server (moto) on {endpoint}")
        yield f"s3://{BUCKET}/runs/"


def options(requests: Path) -> dict[str, Any]:
    """Store options for a demo process: each of its S3 requests appended to ``requests``."""
    log, lock = RequestLog(), threading.Lock()
    (record,) = log.hooks.values()

    def persist(**kwargs: Any) -> None:
        with lock:
            record(**kwargs)
            with requests.open("a") as out:
                out.write(json.dumps(dataclasses.asdict(log.requests[-1])) + "\n")

    return {"event_hooks": {"before-send.s3": persist}}


def report(store: S3Store, state_id: str, requests: Path) -> None:
    """Print the State's objects in the bucket, and the requests of the demo's processes."""
    sent = [json.loads(line) for line in requests.read_text().splitlines()]
    puts: dict[str, list[str]] = {}
    for request in sent:
        if request["kind"] == "PUT":
            key = request["path"].split("/", 2)[2]  # /bucket/key, path-style
            puts.setdefault(key, []).append((request["condition"] or "-").split(":")[0])
    print("\n== the State's objects in the bucket (store.objects) ==")
    for obj in store.objects(state_id):
        conditions = puts.get(obj.key, [])
        how = "created with If-None-Match: *" if conditions[:1] == ["If-None-Match"] else "-"
        if conditions.count("If-Match"):
            how += f", then replaced {conditions.count('If-Match')} x with If-Match: <its ETag>"
        print(f"   {obj.key:<66} {obj.size:>5} B  {obj.role:<7}  {how}")
    kinds: dict[str, int] = {}
    for request in sent:
        kinds[request["kind"]] = kinds.get(request["kind"], 0) + 1
    conditional = sum(1 for r in sent if r["kind"] == "PUT" and r["condition"])
    counted = ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items()))
    print(f"\n   requests of both processes: {counted}; {conditional} of the PUTs conditional")
    print(
        "   (the head names the State's objects; a save PUTs its entries, then the head with "
        "If-Match on the one it last saw; every 16 entries become one segment)"
    )
