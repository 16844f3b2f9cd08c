"""Packing is how S3Store keeps a State few objects, with no setting, on any alpineagents.

A long State saved one entry at a time (through the Store contract, and through the installed
core's own save path) must read back exactly, through a process that never saw it, from a
head and a few segments: two rounds of requests whatever its length, and no object left over
that the head does not name (docs/protocol.md, "Packing").
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable
from typing import Any

import pytest

import alpineagents
import alpineagents.store
import alpineagents.testing
from alpineagents_s3 import S3Store, _pack
from alpineagents_s3.testing import RequestLog, separate_process

GENERATION = "info" if hasattr(alpineagents.store, "StateInfo") else "snapshot"
MakeStore = Callable[..., S3Store]

# Values a JSON round trip could change.
ODD = {
    "float": 0.1 + 0.2,
    "big": 2**63 + 1,
    "text": 'caf\u00e9 \u2603 \U0001f600 \\ "',
    "nil": None,
}


@pytest.fixture(params=["sync", "async"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def call(store: S3Store, mode: str, name: str, *args: Any, **kwargs: Any) -> Any:
    """``store.name(...)``, or ``asyncio.run(store.aname(...))`` in mode ``async``."""
    if mode == "sync":
        return getattr(store, name)(*args, **kwargs)
    return asyncio.run(getattr(store, "a" + name)(*args, **kwargs))


def entry(seq: int, size: int = 40) -> dict[str, Any]:
    return {"seq": seq, "kind": "note", "text": f"{seq}: " + "x" * size, "data": dict(ODD, n=[seq])}


def roles(store: S3Store, state_id: str) -> dict[str, int]:
    found: dict[str, int] = {}
    for obj in store.objects(state_id):
        found[obj.role] = found.get(obj.role, 0) + 1
    return found


def small_of(record: Any) -> Any:
    return getattr(record, "info" if GENERATION == "info" else "snapshot")


@pytest.mark.parametrize("count", [15, 16, 17, 300])
def test_a_state_saved_entry_by_entry_is_a_few_objects_and_reads_back_whole(
    make_store: MakeStore, mode: str, count: int
) -> None:
    store = make_store()
    call(store, mode, "write", "long", [entry(0)], {"n": 1}, create=True)
    for seq in range(1, count):
        call(store, mode, "write", "long", [entry(seq)], {"n": seq + 1})
    found = roles(store, "long")
    assert "unnamed" not in found  # the objects packed away were deleted after each commit
    singles = found.get("entry", 0)
    assert singles == count % 16 and singles < 16
    # 300 = 256 + 2 * 16 + 12: one segment of 256 entries, two of 16, twelve entries.
    assert found.get("segment", 0) == {15: 0, 16: 1, 17: 1, 300: 3}[count]

    log = RequestLog()
    reader = separate_process(make_store(event_hooks=log.hooks))
    record = call(reader, mode, "read", "long")
    assert list(record.entries) == [entry(seq) for seq in range(count)]
    assert small_of(record) == {"n": count}
    assert log.counts() == {"GET": 1 + singles + found.get("segment", 0)}


def test_a_packing_save_costs_one_put_more_and_a_delete(make_store: MakeStore, mode: str) -> None:
    log = RequestLog()
    store = make_store(event_hooks=log.hooks)
    call(store, mode, "write", "counted", [entry(0)], {"n": 1}, create=True)
    per_save = []
    for seq in range(1, 33):
        log.clear()
        call(store, mode, "write", "counted", [entry(seq)], {"n": seq + 1})
        per_save.append(dict(log.counts()))
    packing = [i + 1 for i, counts in enumerate(per_save) if counts != {"PUT": 2}]
    assert packing == [15, 31]  # the saves of entries 15 and 31 make the 16th entry object
    assert per_save[14] == {"PUT": 3, "DELETE": 1}


def test_a_packing_save_of_entries_this_process_never_read_records_the_segments_size(
    make_store: MakeStore, mode: str
) -> None:
    # The head records each segment's size, which later merges add up against SEGMENT_MAX.
    # A process that did not write or read the entries it packs holds none of their bodies: it
    # must fetch them before it plans, not count them as empty.
    store = make_store()
    sizes = [40 + 300 * (seq % 3) for seq in range(16)]
    call(store, mode, "write", "packed", [entry(0, sizes[0])], {"n": 1}, create=True)
    for seq in range(1, 15):
        call(store, mode, "write", "packed", [entry(seq, sizes[seq])], {"n": seq + 1})
    other = separate_process(make_store())
    again = [entry(14, sizes[14]), entry(15, sizes[15])]  # the last stored entry, sent again
    call(other, mode, "write", "packed", again, {"n": 16})

    (segment,) = [o for o in store.objects("packed") if o.role == "segment"]
    head = json.loads(
        store.client.get_object(Bucket=store.bucket, Key="runs/heads/packed.json")["Body"].read()
    )
    assert head["parts"] == [[0, 15, head["write"], "s", segment.size]]
    record = call(separate_process(make_store()), mode, "read", "packed")
    assert list(record.entries) == [entry(seq, sizes[seq]) for seq in range(16)]


def test_a_save_plans_its_packing_from_the_head_reading_no_body(
    make_store: MakeStore, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Entries larger than LARGE are never packed; they stay after the last segment, so every
    # save plans over them. The head records each part's size: no body is read to plan.
    monkeypatch.setattr(_pack, "LARGE", 1000)
    store = make_store()
    call(store, mode, "write", "large", [entry(0, 2000)], {"n": 1}, create=True)
    for seq in range(1, 20):
        call(store, mode, "write", "large", [entry(seq, 2000)], {"n": seq + 1})
    assert roles(store, "large") == {"head": 1, "entry": 20}
    log = RequestLog()
    # Another process, which holds no body (and skips the engine check, counted elsewhere).
    other = separate_process(make_store(event_hooks=log.hooks, trust_conditional_writes=True))
    call(other, mode, "write", "large", [entry(19, 2000), entry(20, 2000)], {"n": 21})
    # The head, and the last stored entry sent again (compared); then the entry and the head.
    assert log.counts() == {"GET": 2, "PUT": 2}


def test_a_long_state_the_core_saved_loads_the_same_and_saves_on(
    make_store: MakeStore, mode: str
) -> None:
    core: Any = alpineagents  # the 0.5+ calls are not this repository's core's
    store = make_store()
    add: Callable[[str], Any]
    if "messages" in inspect.signature(core.State).parameters:  # 0.5+
        state = core.State(id="chat", messages=[core.Message.user("hello")])
        add = lambda text: state.add_message(core.Message.user(text))  # noqa: E731
    else:
        state = core.State("hello", id="chat")
        add = state.add_user_message
    if GENERATION == "info":
        saver: Any = store
    elif hasattr(core.testing, "FakeModel"):  # published 0.2-0.4
        saver = core.Agent(model=core.testing.FakeModel([]), store=store, reporter=None)
    else:  # this repository's core
        saver = core.Agent(model=core.testing.TestModel(), store=store)
    save: Callable[[Any], Any] = (
        saver.save if mode == "sync" else lambda s: asyncio.run(saver.asave(s))
    )
    save(state)
    for n in range(40):
        add(f"message {n}: " + "\u00e9" * 50)
        save(state)
    assert roles(store, "chat").get("segment", 0) >= 2

    other = separate_process(make_store())
    loaded = call(other, mode, "load", "chat")
    assert loaded.history == state.history
    record = call(make_store(), mode, "read", "chat")
    assert [e["seq"] for e in record.entries] == list(range(len(state.history)))
