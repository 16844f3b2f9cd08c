"""The process of tests/s3/test_refs_crash.py: saves a State of alpineagents 0.4's shape, killed.

``python -m tests.s3._refs_child ENDPOINT BUCKET ID MODE EVENT K`` saves, through the Store
contract and ``MODE`` (``sync`` or ``async``), the saves of :data:`SAVES` (a create, a tool
result saved alone, a save of two entries and a snapshot that counts them all), each snapshot
holding a model context whose long texts its entries hold. It sends itself SIGKILL at its
``K``-th request, in the botocore hook ``EVENT`` (``before-send``: not sent;
``after-call``: its answer came back); ``K`` = 0 kills nothing. Prints one line per save
that returned: ``saved N`` (the history's length), and ``requests N`` once all have.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

from alpineagents_s3 import S3Store
from tests.s3.test_refs import entries, snapshot_of

HISTORY = entries(0, 5)
# (first seq, stop seq, whether the save carries a snapshot): what each save sends.
SAVES = [(0, 2, True), (2, 3, False), (3, 5, True)]


def main(endpoint: str, bucket: str, state_id: str, mode: str, event: str, kill_at: int) -> None:
    seen = [0]

    def hook(**kwargs: Any) -> None:
        seen[0] += 1
        if seen[0] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    store = S3Store(bucket, "runs", endpoint_url=endpoint, event_hooks={f"{event}.s3": hook})
    if mode == "async":
        asyncio.run(_asaves(store, state_id))
    else:
        for first, stop, snapshot in _saves():
            store.write(state_id, HISTORY[first:stop], snapshot, create=first == 0)
            print(f"saved {stop}", flush=True)
        store.close()
    print(f"requests {seen[0]}", flush=True)


def _saves() -> list[tuple[int, int, dict[str, Any] | None]]:
    return [
        (a, b, snapshot_of(HISTORY[:b]) if with_snapshot else None) for a, b, with_snapshot in SAVES
    ]


async def _asaves(store: S3Store, state_id: str) -> None:
    try:
        for first, stop, snapshot in _saves():
            await store.awrite(state_id, HISTORY[first:stop], snapshot, create=first == 0)
            print(f"saved {stop}", flush=True)
    finally:
        await store.aclose()


if __name__ == "__main__":
    endpoint, bucket, state_id, mode, event, k = sys.argv[1:]
    main(endpoint, bucket, state_id, mode, event, int(k))
