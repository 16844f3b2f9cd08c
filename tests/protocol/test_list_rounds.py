"""``list(limit=k)``: how many rounds of requests it takes, on the model bucket (no network).

S3 gives ``LastModified`` to the second, so every head saved in the same second as the k-th
newest may be newer than it; they are fetched in one wave, not one a round.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from alpineagents_s3 import _contract, _list, _save
from alpineagents_s3._memory import LISTS_LIMIT, Ctx, Memory
from alpineagents_s3._steps import Batch, Steps
from tests.protocol.bucket import EPOCH, Bucket
from tests.protocol.world import LAYOUT, SCOPE, counted_wids

# (seconds after EPOCH of the head's LastModified, how many States saved in that second)
SECONDS = [(1, 30), (2, 30), (4, 40)]


def _snapshot(state_id: str, at: float) -> dict[str, Any]:
    stamp = (EPOCH + timedelta(seconds=at)).isoformat()
    return {
        "v": 1,
        "id": state_id,
        "task": "t",
        "entries": 0,
        "data": {},
        "stopped_by": None,
        "created_at": stamp,
        "updated_at": stamp,
    }


def _run(bucket: Bucket, steps: Steps[Any]) -> tuple[Any, int]:
    """Run ``steps`` on ``bucket``; its value and how many batches (rounds) it sent."""
    rounds = 0
    try:
        step = next(steps)
        while True:
            calls = step.calls if isinstance(step, Batch) else []
            rounds += bool(calls)
            step = steps.send([getattr(bucket, c.method)(**c.params) for c in calls])
    except StopIteration as done:
        return done.value, rounds


def _saved(bucket: Bucket, ctx: Ctx) -> list[str]:
    """The States of SECONDS saved by ``ctx``; their ids, newest first."""
    with counted_wids():
        for second, count in SECONDS:
            for n in range(count):
                state_id = f"s{second}-{n}"
                # A save's updated_at is taken before its head's PUT, within the same second.
                snapshot = _snapshot(state_id, second + n / (2 * count))
                _run(bucket, _save.write(ctx, state_id, [], snapshot, True))
                bucket.objects[LAYOUT.head_key(state_id)][-1].tick = second
    stamps = {f"s{sec}-{n}": sec + n / (2 * count) for sec, count in SECONDS for n in range(count)}
    return sorted(stamps, key=stamps.__getitem__, reverse=True)


def test_the_heads_of_the_kth_newest_second_come_in_one_wave() -> None:
    bucket = Bucket(random.Random(1), page=1000)
    ctx = Ctx(LAYOUT, Memory(), SCOPE, trust=True)
    by_time = _saved(bucket, ctx)
    for limit in (1, 5, 40, 41, 75):
        lister = Ctx(LAYOUT, Memory(), SCOPE, trust=True)  # another process: it holds no head
        found, rounds = _run(bucket, _list.list_states(lister, limit))
        assert [s.id for s in found] == by_time[:limit]
        # The LIST, the first k heads, then at most one wave of every head that may be newer
        # than the k-th (one a round, before: 40 rounds for limit=1).
        assert rounds <= 3, (limit, rounds)
    lister = Ctx(LAYOUT, Memory(), SCOPE, trust=True)
    everything, rounds = _run(bucket, _list.list_states(lister))
    assert len(everything) == 100 and rounds == 2
    # It lists again for the LIST alone: every head has the ETag of the summary it made.
    again, rounds = _run(bucket, _list.list_states(lister))
    assert again == everything and rounds == 1
    assert [s.id for s in _run(bucket, _list.list_states(lister, 5))[0]] == by_time[:5]
    # The process that wrote them holds every head: the LIST alone.
    everything, rounds = _run(bucket, _list.list_states(ctx))
    assert len(everything) == 100 and rounds == 1


def test_a_head_listed_without_its_time_may_be_the_newest(monkeypatch: pytest.MonkeyPatch) -> None:
    # An engine that gives no LastModified: nothing tells which heads are old, so none is
    # passed over (a head taken as oldest would be left out of the newest k).
    bucket = Bucket(random.Random(2), page=1000)
    by_time = _saved(bucket, Ctx(LAYOUT, Memory(), SCOPE, trust=True))
    listing = bucket.list_objects_v2

    def without_times(**params: Any) -> dict[str, Any]:
        page = listing(**params)
        for obj in page["Contents"]:
            del obj["LastModified"]
        return page

    monkeypatch.setattr(bucket, "list_objects_v2", without_times)
    for limit in (1, 40):
        found, _ = _run(bucket, _list.list_states(Ctx(LAYOUT, Memory(), SCOPE), limit))
        assert [s.id for s in found] == by_time[:limit]


def test_a_kth_summary_without_a_time_leaves_every_head_possibly_newer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A 0.5+ summary may have no updated_at; it sorts last. When the k-th newest found is one,
    # every head not yet read may be newer than it (the list used to fail: OverflowError).
    bucket = Bucket(random.Random(3), page=1000)
    by_time = _saved(bucket, Ctx(LAYOUT, Memory(), SCOPE, trust=True))
    untimed = {state_id for state_id in by_time if state_id.startswith("s4-")}  # the newest 40

    def summary(state_id: str, small: dict[str, Any]) -> Any:
        found = _contract.summarize(state_id, small)
        at = None if state_id in untimed else found.updated_at
        return SimpleNamespace(id=state_id, updated_at=at)

    monkeypatch.setattr(_list, "summarize", summary)
    for limit in (1, 5, 60):
        found, _ = _run(bucket, _list.list_states(Ctx(LAYOUT, Memory(), SCOPE), limit))
        assert [s.id for s in found] == by_time[40 : 40 + limit]  # those with a time first
    found, _ = _run(bucket, _list.list_states(Ctx(LAYOUT, Memory(), SCOPE), 70))
    assert [s.id for s in found[:60]] == by_time[40:]
    assert {s.id for s in found[60:]} <= untimed


@dataclass(frozen=True)
class _Mutable:
    """A summary as alpineagents 0.2-0.4 make some: frozen, with a dict inside."""

    id: str
    updated_at: Any
    args: dict[str, Any]


def test_a_summary_a_caller_changes_changes_no_later_list_nor_the_head_held(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def summary(state_id: str, small: dict[str, Any]) -> Any:
        found = _contract.summarize(state_id, small)
        return _Mutable(state_id, found.updated_at, small["data"])  # shares the snapshot's

    monkeypatch.setattr(_list, "summarize", summary)
    bucket = Bucket(random.Random(4), page=1000)
    writer = Ctx(LAYOUT, Memory(), SCOPE, trust=True)
    by_time = _saved(bucket, writer)
    lister = Ctx(LAYOUT, Memory(), SCOPE, trust=True)
    for ctx in (writer, lister):  # from the heads the writer holds; from the lister's GETs
        for _ in range(2):  # and again, from the last list's summaries
            found, _ = _run(bucket, _list.list_states(ctx))
            assert [s.id for s in found] == by_time and all(s.args == {} for s in found)
            for s in found:
                s.args["changed"] = True
    head = writer.seen(by_time[0]).head
    assert head is not None and head.snapshot is not None and head.snapshot["data"] == {}


def test_the_memory_keeps_the_last_lists_of_the_stores_listed_last() -> None:
    memory = Memory()
    scopes = [("endpoint", "bucket", f"tenant-{n}/") for n in range(LISTS_LIMIT + 1)]
    for scope in scopes[:LISTS_LIMIT]:
        memory.listed(scope, {"a": ("etag", object())})
    memory.listed(scopes[0], {"a": ("etag", object())})  # listed again: the most recent
    memory.listed(scopes[LISTS_LIMIT], {"a": ("etag", object())})  # one store too many
    assert not memory.last_list(scopes[1])  # the one listed longest ago is forgotten
    assert all(memory.last_list(s) for s in [scopes[0], *scopes[2:]])
