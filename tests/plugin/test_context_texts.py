"""The installed core's Agent, with long tool results and replies: the snapshot keeps no copy.

alpineagents 0.2-0.4 keep the model context in the snapshot; S3Store keeps each long text of
it once, in the history entry that holds it (docs/s3.md, "What is stored"). With any core, a
run's State must load back the same through another store object, and a core whose snapshot
holds a context must not find the run's long texts in the stored snapshot object.
"""

from __future__ import annotations

import asyncio
import gzip
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from alpineagents_s3 import S3Store
from alpineagents_s3.testing import RequestLog

_spec = importlib.util.spec_from_file_location("plugin_cores", Path(__file__).with_name("cores.py"))
assert _spec is not None and _spec.loader is not None
cores: Any = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cores)

RESULTS = [f"row,value\n{'alpha,1;beta,2;gamma,3;' * 30}end of table {k}" for k in range(3)]
REPLY = "The three tables are read: " + "alpha beta gamma " * 20


def lookup(k: int) -> str:
    """Look up table k."""
    return RESULTS[k]


@pytest.fixture(params=["sync", "async"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_a_run_with_long_texts_loads_back_the_same_and_its_snapshot_holds_no_copy(
    make_store: Any, s3: Any, bucket: str, mode: str
) -> None:
    log = RequestLog()
    store: S3Store = make_store(event_hooks=log.hooks)
    script = [("call", "lookup", {"k": k}) for k in range(3)] + [("text", REPLY)]
    agent = cores.make_agent(cores.make_model(script), [lookup], store)
    state = cores.make_state("Read the three tables", "tables")
    cores.run(agent, state, mode)
    ran = cores.history(state)
    assert [h["text"] for h in ran if h["kind"] == "result"] == RESULTS

    loaded = cores.load(make_store(), "tables", mode)
    assert cores.history(loaded) == ran

    got = s3.get_object(Bucket=bucket, Key="runs/tables/snapshot.json")
    body = got["Body"].read()
    if body.startswith(b"\x1f\x8b"):  # layout 2: compressed
        body = gzip.decompress(body)
    snapshot = json.loads(body)
    if "alpineagents-refs" in snapshot:  # the context's texts, or the answer, in entries
        assert got["Metadata"]["alpineagents-layout"] == "3"
        kept = snapshot["snapshot"]
        assert "context" in kept or kept.get("answer") == "", kept
    for text in RESULTS:
        assert json.dumps(text)[1:-1].encode() not in body, "a tool result copied in the snapshot"
    # A snapshot holding a copy of the context holds every result and the reply (twice, with
    # the last answer): each snapshot PUT is smaller than the run's texts.
    puts = [r for r in log.requests if r.kind == "PUT" and r.path.endswith("snapshot.json")]
    texts = sum(map(len, RESULTS)) + len(REPLY)
    assert puts and max(r.size for r in puts) < texts, ([r.size for r in puts], texts)
    asyncio.run(store.aclose())
