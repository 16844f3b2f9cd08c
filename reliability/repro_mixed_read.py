"""A load made while two saves of one State race must read neither's pending entries.

    python reliability/repro_mixed_read.py [--endpoint URL] [--third]

Found by two_writers.py, fixed since (issue 9). Two writers A and B load a State (task only).
B saves one message (seq 1) and is held by an event hook just before its snapshot PUT. A saves
two messages and meets B's entry at seq 1; A is held at its next conditional entry PUT. A
reader loads now. It used to get ``task, B: 0, A: 1`` (both entries based on the stored
snapshot were replayed); now a save's entries are pending until its snapshot PUT lands, and A
claims the snapshot before replacing B's entry, so the reader gets ``task`` and, at the end,
exactly one writer's history.

With ``--third``, the reader continues from what it loaded and saves too. Exit status 1 when
a refused writer's entry was read.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import boto3

from alpineagents import State
from alpineagents_s3 import S3Store
from alpineagents_s3.testing import embedded_moto

BUCKET = "mixed-read"


def hold(when: Callable[[Any], bool], reached: threading.Event, go: threading.Event) -> Any:
    """Botocore hooks that hold a PutObject matching ``when`` until ``go`` is set."""

    def hook(request: Any, **kwargs: Any) -> None:
        if when(request):
            reached.set()
            go.wait(30)

    return {"before-send.s3.PutObject": hook}


def play(url: str, third: bool) -> bool:
    """Play the interleaving; whether a refused writer's entry was read."""
    state_id = f"mixed-{uuid.uuid4().hex[:8]}"
    b_held, b_go, a_held, a_go = (threading.Event() for _ in range(4))
    b_hooks = hold(lambda r: r.url.endswith("/snapshot.json"), b_held, b_go)
    # A's first PUT with If-Match on an entry: its disowning (refused) or a replacement (claimed).
    a_hooks = hold(lambda r: "/entries/" in r.url and "If-Match" in r.headers, a_held, a_go)
    setup, reader = (S3Store(BUCKET, "runs", endpoint_url=url) for _ in range(2))
    a = S3Store(BUCKET, "runs", endpoint_url=url, event_hooks=a_hooks)
    b = S3Store(BUCKET, "runs", endpoint_url=url, event_hooks=b_hooks)
    setup.save(State("task", id=state_id))
    state_a, state_b = a.load(state_id), b.load(state_id)
    state_a.add_user_message("A: 0")
    state_a.add_user_message("A: 1")
    state_b.add_user_message("B: 0")
    outcomes: dict[str, str] = {}

    def save(who: str, store: S3Store, state: State) -> None:
        try:
            store.save(state)
            outcomes[who] = "saved"
        except Exception as e:
            outcomes[who] = type(e).__name__

    thread_b = threading.Thread(target=save, args=("B", b, state_b))
    thread_b.start()
    assert b_held.wait(30), "B never reached its snapshot PUT"
    thread_a = threading.Thread(target=save, args=("A", a, state_a))
    thread_a.start()
    assert a_held.wait(30), "A never sent a conditional entry PUT"
    seen: State = reader.load(state_id)
    print("loaded while A settles:", [e.text for e in seen.history])
    if third:
        seen.add_user_message("C: 0")
        save("C", reader, seen)
    a_go.set()
    b_go.set()
    thread_a.join()
    thread_b.join()
    final: State = setup.load(state_id)
    print("outcomes:", outcomes)
    print("loaded at the end:", [e.text for e in final.history])
    refused = [who for who, outcome in outcomes.items() if outcome != "saved"]
    read = [e.text for e in seen.history] + [e.text for e in final.history]
    return any(text.startswith(f"{who}:") for who in refused for text in read)


@contextlib.contextmanager
def endpoint(url: str | None) -> Iterator[str]:
    """``url`` (with a bucket made there), or moto's server started here."""
    if url is None:
        with embedded_moto(BUCKET) as started:
            yield started
        return
    client = boto3.client("s3", endpoint_url=url, region_name="us-east-1")
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket=BUCKET)
    yield url


def main() -> int:
    """Play it once; 1 if a refused writer's entry was read."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoint", help="an S3 endpoint (default: moto, started here)")
    parser.add_argument("--third", action="store_true", help="the reader saves too")
    args = parser.parse_args()
    dummy = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    for key, value in dummy.items():
        os.environ.setdefault(key, value)
    with endpoint(args.endpoint) as url:
        return 1 if play(url, args.third) else 0


if __name__ == "__main__":
    sys.exit(main())
