"""What a tool-using turn sends to S3 with a published alpineagents, as its conversation grows.

    .venv-core-0.4.0/bin/python bench/published_turns.py --turns 1,10,20,40

Run with the Python of a virtualenv holding a published alpineagents (``scripts/test.sh`` makes
``.venv-core-0.4.0`` and ``.venv-core-0.7.1``) and alpineagents-s3. An embedded moto server;
the core's own Agent and offline model (``FakeModel``); each turn is a user message, a model
reply that calls one tool (~420 B of text), the tool's result (~1.4 KB) and a model reply.
For each turn asked for, the requests and request bytes that turn sent (and how many of
those bytes were the history entries' objects), and the size of the snapshot object after
it; last, what a load of the conversation by a new store object costs (each a new client:
its first request pays the connection). alpineagents 0.2-0.4 keep the model context in the
snapshot, so their snapshot PUTs grow with the conversation; this shows by how much.
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import sys
import time
from importlib import metadata
from typing import Any

import boto3

import alpineagents
import alpineagents.testing
from alpineagents_s3 import S3Store
from alpineagents_s3.testing import RequestLog, embedded_moto

REPLY = "Let me look that up. " * 20
RESULT = "row,value\n" + "alpha,1\nbeta,2\ngamma,3\n" * 60
BUCKET = "published-turns"


def query(q: int) -> str:
    """Look a number up."""
    return f"{RESULT}{q}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", default="1,10,20,40", help="turns to print, comma-separated")
    args = parser.parse_args(argv)
    shown = sorted({int(t) for t in args.turns.split(",")})
    published: Any = alpineagents
    if not hasattr(published.testing, "FakeModel"):
        print("this script needs a published alpineagents (FakeModel, @tool)", file=sys.stderr)
        return 2
    fake_model, tool_call = published.testing.FakeModel, published.testing.tool_call

    replies: list[Any] = []
    for k in range(shown[-1] + 1):
        replies += [[f"{REPLY}{k}", tool_call("query", q=k)], f"{REPLY}!{k}"]
    versions = f"alpineagents {metadata.version('alpineagents')}, "
    versions += f"alpineagents-s3 {metadata.version('alpineagents-s3')}"
    print(f"{versions}; moto's server, embedded")
    print("| turn | requests | bytes sent | of which entries | snapshot object after it |")
    print("|---|---|---|---|---|")
    with embedded_moto() as url:
        client = boto3.client("s3", endpoint_url=url)
        client.create_bucket(Bucket=BUCKET)
        log = RequestLog()
        store = S3Store(BUCKET, endpoint_url=url, event_hooks=log.hooks)
        agent = published.Agent(
            model=fake_model(replies), tools=[published.tool(query)], store=store, reporter=None
        )
        state = _state(published, "Summarise the quarterly numbers")
        agent.run(state)
        for turn in range(1, shown[-1] + 1):
            log.clear()
            _add_user_message(published, state, f"And the numbers of quarter {turn}?")
            agent.run(state)
            if turn in shown:
                counts = ", ".join(f"{n} {k}" for k, n in sorted(log.counts().items()))
                size = client.head_object(Bucket=BUCKET, Key="turns/snapshot.json")
                entries = sum(r.size for r in log.requests if "/entries/" in r.path)
                print(
                    f"| {turn} | {counts} | {log.sent_bytes():,} B | {entries:,} B "
                    f"| {size['ContentLength']:,} B |"
                )
        # The resume of the conversation by another process: a new store object's load.
        loads = []
        for _ in range(5):
            log.clear()
            reader = S3Store(BUCKET, endpoint_url=url, event_hooks=log.hooks)
            wall, cpu = time.perf_counter(), time.process_time()
            reader.load("turns")
            loads.append((time.perf_counter() - wall, time.process_time() - cpu))
            reader.close()
        counts = ", ".join(f"{n} {k}" for k, n in sorted(log.counts().items()))
        wall, cpu = (statistics.median(x) * 1000 for x in zip(*loads, strict=True))
        print(
            f"\nload by a new store object: {counts}; median of 5: {wall:.0f} ms, {cpu:.0f} ms CPU"
        )
        store.close()
    return 0


def _state(published: Any, task: str) -> Any:
    if "messages" in inspect.signature(published.State).parameters:  # 0.5+
        return published.State(id="turns", messages=[published.Message.user(task)])
    return published.State(task, id="turns")


def _add_user_message(published: Any, state: Any, text: str) -> None:
    if hasattr(state, "add_user_message"):
        state.add_user_message(text)
    else:
        state.add_message(published.Message.user(text))


if __name__ == "__main__":
    sys.exit(main())
