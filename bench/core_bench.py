"""What the core costs without a network: the stored entry form, a FileStore load and saves.

    python bench/core_bench.py [--entries 10000] [--steps 300] [--repeat 5]

Four figures, each printed as measured (run it on two commits to compare them):

* **bytes per entry**: the stored form (``entries.jsonl`` lines) of the entries a real Agent
  run makes: model responses (a ~420 B reply and a tool call), tool results (~1.5 KB), and a
  tool-using turn (one of each);
* **load time**: ``FileStore.load`` of a State of ``--entries`` entries of that shape (read
  from the page cache), next to one ``json.loads`` of the same entries as one JSON array (the
  same bytes, joined by commas), as a ratio; ``FileStore.read`` alone too (the store's part).
  Each is the least CPU time over ``--repeat`` rounds in which they take turns;
* **peak memory**: the highest Python memory (tracemalloc) during one such load, next to the
  size of the entries' JSON, as a ratio;
* **saving**: an Agent run of ``--steps`` steps (an offline ``FunctionModel`` that calls a
  tool at every step) on a FileStore: the time spent in the store's ``write`` at every save
  point, how many writes carried a snapshot, and how many of those replaced ``snapshot.json``
  on disk (its inode changed).

Absolute times depend on the machine and its load; the ratios are what to compare.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from alpineagents import Agent, FileStore, State
from alpineagents.history import MODEL, TOOL_RESULT, ModelData
from alpineagents.model import ModelRequest
from alpineagents.testing import FunctionModel, call

REPLY = "Let me look that up. " * 20  # ~420 B of reply text
RESULT = "row,value\n" + "alpha,1\nbeta,2\ngamma,3\n" * 60  # ~1.4 KB of tool result
USAGE = {"input_tokens": 1834, "output_tokens": 96}


def query(q: int) -> str:
    """Run a query and return its rows as CSV."""
    return RESULT


class TimedFileStore(FileStore):
    """A FileStore that times its writes and notices when ``snapshot.json`` is replaced."""

    def __init__(self, path: Path):
        super().__init__(path)
        self.seconds = 0.0
        self.writes = 0
        self.with_snapshot = 0
        self.replaced = 0

    def write(
        self,
        state_id: str,
        entries: Sequence[dict[str, Any]],
        snapshot: dict[str, Any] | None,
        *,
        create: bool = False,
    ) -> None:
        path = self.path / state_id / "snapshot.json"
        before = _inode(path)
        start = time.perf_counter()
        super().write(state_id, entries, snapshot, create=create)
        self.seconds += time.perf_counter() - start
        self.writes += 1
        self.with_snapshot += snapshot is not None
        self.replaced += before is not None and _inode(path) != before


def _inode(path: Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


def agent_run(root: Path, steps: int) -> tuple[TimedFileStore, State, float]:
    """Run an Agent for ``steps`` tool-using steps on a timed FileStore."""
    made = 0

    def respond(request: ModelRequest) -> list[dict[str, Any]]:
        nonlocal made
        made += 1
        if made > steps:
            return [{"type": "text", "text": "Done: the numbers are in."}]
        return [{"type": "text", "text": REPLY}, call("query", q=made)]

    store = TimedFileStore(root / "saves")
    agent = Agent(FunctionModel(respond), tools=[query], store=store, max_steps=steps + 5)
    state = State("Summarise the quarterly numbers", id="saves")
    start = time.perf_counter()
    agent.run(state)
    return store, state, time.perf_counter() - start


def big_state(n: int) -> State:
    """A State of ``n`` entries shaped like an Agent's: model responses and tool results."""
    state = State("Summarise the quarterly numbers", id=f"load-{n}")
    while len(state.history) < n:
        k = len(state.history)
        if k % 2:
            content = [{"type": "text", "text": REPLY}, call("query", q=k)]
            data = ModelData(content, "tool_use", dict(USAGE), "claude-sonnet-5").to_data()
            state.append(MODEL, REPLY, data)
        else:
            last = state.history[-1].as_model().tool_calls[0]["id"] if k > 1 else "c0"
            state.append(TOOL_RESULT, RESULT, {"call_id": last, "name": "query"})
    return state


def timed(functions: dict[str, Callable[[], Any]], repeat: int) -> dict[str, float]:
    """The least CPU time of each function over ``repeat`` rounds, in seconds.

    The functions take turns in each round, so that a busy spell of the machine falls on all
    of them; the least time is the one least disturbed (the machine may be shared).
    """
    times: dict[str, list[float]] = {name: [] for name in functions}
    for _ in range(repeat):
        for name, function in functions.items():
            start = time.process_time()
            function()
            times[name].append(time.process_time() - start)
    return {name: min(values) for name, values in times.items()}


def peak_memory(function: Callable[[], Any]) -> int:
    """The highest Python memory (tracemalloc) while ``function`` runs, above what it started at."""
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    result = function()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    del result
    return peak - base


def lines_of(store: FileStore, state_id: str) -> list[bytes]:
    return (store.path / state_id / "entries.jsonl").read_bytes().splitlines()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entries", type=int, default=10_000, help="entries of the loaded State")
    parser.add_argument("--steps", type=int, default=300, help="steps of the saving run")
    parser.add_argument("--repeat", type=int, default=9, help="rounds of loads")
    args = parser.parse_args()
    import alpineagents

    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} cores; "
        f"alpineagents from {Path(alpineagents.__file__).parent}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)

        # Saving, and the stored form of what the Agent made.
        store, state, wall = agent_run(root, args.steps)
        lines = lines_of(store, state.id)
        kinds = [json.loads(line)["kind"] for line in lines]
        model = [len(line) + 1 for line, k in zip(lines, kinds, strict=True) if k == MODEL]
        result = [len(line) + 1 for line, k in zip(lines, kinds, strict=True) if k == TOOL_RESULT]
        print("\nstored form (entries.jsonl, newline included)")
        print(f"  model entry (reply + tool call)   {statistics.mean(model):8.0f} B")
        print(f"  tool result entry                 {statistics.mean(result):8.0f} B")
        turn = statistics.mean(model) + statistics.mean(result)
        print(f"  tool-using turn (one of each)     {turn:8.0f} B")

        print(f"\nsaving: an Agent run of {args.steps} steps on FileStore ({wall:.2f} s in all)")
        print(f"  time in FileStore.write           {store.seconds:8.3f} s")
        print(f"  writes                            {store.writes:8d}")
        per = store.seconds / store.writes * 1e3
        print(f"  per write                         {per:8.3f} ms")
        print(f"  writes with a snapshot            {store.with_snapshot:8d}")
        print(f"  snapshot.json replaced on disk    {store.replaced:8d}")

        # Loading.
        files = FileStore(root / "loads")
        big = big_state(args.entries)
        files.save(big)
        del big
        stored = lines_of(files, f"load-{args.entries}")
        size = sum(len(line) for line in stored)
        whole = b"[" + b",".join(stored) + b"]"
        del stored
        state_id = f"load-{args.entries}"
        best = timed(
            {
                "floor": lambda: json.loads(whole),
                "read": lambda: files.read(state_id),
                "load": lambda: files.load(state_id),
            },
            args.repeat,
        )
        floor, read, load = best["floor"], best["read"], best["load"]
        whole = b""
        peak = peak_memory(lambda: files.load(state_id))
        print(
            f"\nload of {args.entries} entries from FileStore ({size / 1e6:.2f} MB of JSON); "
            f"least CPU time of {args.repeat} rounds"
        )
        print(f"  json.loads of the same entries    {floor * 1e3:8.1f} ms")
        print(f"  FileStore.read                    {read * 1e3:8.1f} ms  {read / floor:5.2f}x")
        print(f"  FileStore.load                    {load * 1e3:8.1f} ms  {load / floor:5.2f}x")
        print(f"  peak memory of a load             {peak / 1e6:8.1f} MB  {peak / size:5.2f}x")


if __name__ == "__main__":
    main()
