"""The closest peer, measured like alpineagents: Strands Agents' ``S3SessionManager``.

Runs in the peer's own virtualenv (``bash bench/peer/setup.sh``), never in the project's;
``bench/table.py`` starts it and reads the one JSON line it prints. Three commands:

    python bench/peer/strands_bench.py populate --endpoint URL --bucket B --session S --n N
    python bench/peer/strands_bench.py restore --endpoint URL --bucket B --session S [--repeat 3]
    python bench/peer/strands_bench.py turns --endpoint URL --bucket B --session S [--turns 5]

``populate`` writes a session of N messages (a user message, then tool-using turns: an
assistant message with text and a tool call, a user message with a ~1.5 KB tool result) the
way the session manager writes them, one ``create_message`` each, 16 at a time. ``restore``
builds a new Agent on that session, which reads the session, the agent and every message
(the client is opened before the clock starts, as for S3Store). ``turns`` runs an Agent with
an offline model and one tool for ``--turns`` tool-using turns (user message, model call, tool
result, model reply) and counts the requests and bytes each turn sends after the first.
Requests are counted by botocore event hooks on the session manager's client.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
import tracemalloc
from collections import Counter
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import boto3
from strands import Agent, tool  # type: ignore[import-not-found, unused-ignore]
from strands.models.model import Model  # type: ignore[import-not-found, unused-ignore]
from strands.session.s3_session_manager import (  # type: ignore[import-not-found, unused-ignore]
    S3SessionManager,
)
from strands.types.session import SessionMessage  # type: ignore[import-not-found, unused-ignore]

AGENT_ID = "bench"
REPLY = "Let me look that up. " * 20
RESULT = "row,value\n" + "alpha,1\nbeta,2\ngamma,3\n" * 60
KINDS = {
    "PutObject": "PUT",
    "GetObject": "GET",
    "HeadObject": "HEAD",
    "ListObjectsV2": "LIST",
    "DeleteObject": "DELETE",
    "DeleteObjects": "DELETE",
}


class Meter:
    """Requests by kind, bytes sent (request bodies) and read (response bodies)."""

    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()
        self.sent = 0
        self.metadata = 0  # user metadata sent: x-amz-meta- names (without it) and values
        self.read = 0
        self._lock = threading.Lock()

    def attach(self, client: Any) -> None:
        client.meta.events.register("before-send.s3", self._before_send)
        client.meta.events.register("after-call.s3", self._after_call)

    def _before_send(self, request: Any, event_name: str = "", **kwargs: Any) -> None:
        operation = event_name.rsplit(".", 1)[-1]
        body = request.body
        size = len(body) if isinstance(body, bytes | bytearray | str) else 0
        length = request.headers.get("Content-Length")
        metadata = 0
        for name, value in request.headers.items():
            name = name.decode() if isinstance(name, bytes) else str(name)
            if name.lower().startswith("x-amz-meta-"):
                text = value.decode() if isinstance(value, bytes) else str(value)
                metadata += len(name) - len("x-amz-meta-") + len(text.encode())
        with self._lock:
            self.requests[KINDS.get(operation, str(request.method))] += 1
            self.sent += int(length) if length is not None else size
            self.metadata += metadata

    def _after_call(self, http_response: Any, **kwargs: Any) -> None:
        length = http_response.headers.get("content-length")
        with self._lock:
            self.read += int(length or 0)

    def clear(self) -> None:
        with self._lock:
            self.requests.clear()
            self.sent = self.read = self.metadata = 0


class OpenClient:
    """Stands in for a boto3 Session: hands S3SessionManager a client opened beforehand."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def client(self, *args: Any, **kwargs: Any) -> Any:
        return self._client


class ScriptedModel(Model):  # type: ignore[misc, unused-ignore]
    """An offline model: a tool call when the last message is the person's, else a reply."""

    def __init__(self) -> None:
        self.calls = 0

    def update_config(self, **model_config: Any) -> None:
        pass

    def get_config(self) -> dict[str, Any]:
        return {}

    def structured_output(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def stream(
        self, messages: list[dict[str, Any]], *args: Any, **kwargs: Any
    ) -> AsyncIterator[dict[str, Any]]:
        return self._events(messages)

    async def _events(self, messages: list[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
        self.calls += 1
        last = messages[-1]["content"]
        yield {"messageStart": {"role": "assistant"}}
        yield {"contentBlockStart": {"start": {}}}
        yield {"contentBlockDelta": {"delta": {"text": REPLY}}}
        yield {"contentBlockStop": {}}
        if any("toolResult" in block for block in last):
            yield {"messageStop": {"stopReason": "end_turn"}}
            return
        start = {"toolUse": {"toolUseId": f"c{self.calls}", "name": "query"}}
        yield {"contentBlockStart": {"start": start}}
        yield {"contentBlockDelta": {"delta": {"toolUse": {"input": json.dumps({"q": 1})}}}}
        yield {"contentBlockStop": {}}
        yield {"messageStop": {"stopReason": "tool_use"}}


@tool  # type: ignore[untyped-decorator, unused-ignore]
def query(q: int) -> str:
    """Look a number up.

    Args:
        q: what to look up
    """
    return RESULT


def open_client(endpoint: str) -> Any:
    client = boto3.client("s3", endpoint_url=endpoint)
    client.list_buckets()  # connected before any clock starts
    return client


def manager(session_id: str, bucket: str, client: Any) -> Any:
    return S3SessionManager(session_id, bucket, boto_session=OpenClient(client))


def make_agent(session: Any) -> Any:
    return Agent(
        model=ScriptedModel(),
        tools=[query],
        session_manager=session,
        agent_id=AGENT_ID,
        callback_handler=None,
    )


def message(k: int) -> dict[str, Any]:
    """The k-th message of a populated session: a tool-using conversation."""
    if k == 0:
        return {"role": "user", "content": [{"text": "Summarise the quarterly numbers"}]}
    if k % 2:
        use = {"toolUse": {"toolUseId": f"c{k}", "name": "query", "input": {"q": k}}}
        return {"role": "assistant", "content": [{"text": REPLY}, use]}
    result = {"toolUseId": f"c{k - 1}", "status": "success", "content": [{"text": RESULT}]}
    return {"role": "user", "content": [{"toolResult": result}]}


def populate(args: argparse.Namespace) -> dict[str, Any]:
    client = open_client(args.endpoint)
    session = manager(args.session, args.bucket, client)
    make_agent(session)  # writes the session and the agent
    n = args.n
    with ThreadPoolExecutor(16) as pool:
        done = pool.map(
            lambda k: session.create_message(
                args.session, AGENT_ID, SessionMessage.from_message(message(k), k)
            ),
            range(n),
        )
        list(done)
    return {"messages": n}


def measure(run: Callable[[], Any], repeat: int, budget: float) -> dict[str, float]:
    walls, cpus = [], []
    spent = 0.0
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        run()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
        spent += walls[-1]
        if spent > budget:
            break
    return {"wall": statistics.median(walls), "cpu": statistics.median(cpus), "runs": len(walls)}


def restore(args: argparse.Namespace) -> dict[str, Any]:
    client = open_client(args.endpoint)
    meter = Meter()
    meter.attach(client)
    restored: list[int] = []

    def run() -> None:
        agent = make_agent(manager(args.session, args.bucket, client))
        restored.append(len(agent.messages))

    # With --memory, a first restore, traced and untimed, gives the peak memory (which does
    # not depend on who answers) and fills the memory of a proxy in between.
    # Whatever strands and botocore do once per process or client (the operations' models,
    # the paginator), on a session that does not exist, before anything is measured.
    make_agent(None)
    warm = manager(args.session, args.bucket, client)
    warm.read_session("warm-up")
    warm.list_messages("warm-up", AGENT_ID)
    peak = None
    if args.memory:
        tracemalloc.start()
        run()
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    meter.clear()
    figures: dict[str, Any] = measure(run, args.repeat, args.budget)
    runs = int(figures["runs"])
    figures["requests"] = {k: v // runs for k, v in meter.requests.items()}
    figures["read"] = meter.read // runs
    if peak is not None:
        figures["peak"] = peak
    figures["messages"] = restored[-1]
    return figures


def turns(args: argparse.Namespace) -> dict[str, Any]:
    client = open_client(args.endpoint)
    meter = Meter()
    meter.attach(client)
    agent = make_agent(manager(args.session, args.bucket, client))
    agent("Summarise the quarterly numbers")  # the first turn creates what later ones update
    meter.clear()
    for k in range(args.turns):
        agent(f"And the numbers of quarter {k}?")
    return {
        "turns": args.turns,
        "requests": {k: v / args.turns for k, v in meter.requests.items()},
        "sent": meter.sent / args.turns,
        "metadata": meter.metadata / args.turns,
        "messages": len(agent.messages),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=("populate", "restore", "turns"))
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--session", required=True)
    parser.add_argument("--n", type=int, default=100, help="messages to populate")
    parser.add_argument("--repeat", type=int, default=3, help="restores to time, at most")
    parser.add_argument("--budget", type=float, default=10.0, help="seconds of timed restores")
    parser.add_argument("--memory", action="store_true", help="first a traced, untimed restore")
    parser.add_argument("--turns", type=int, default=5)
    args = parser.parse_args()
    commands = {"populate": populate, "restore": restore, "turns": turns}
    result = commands[args.command](args)
    json.dump(result, sys.stdout)
    print()


if __name__ == "__main__":
    main()
