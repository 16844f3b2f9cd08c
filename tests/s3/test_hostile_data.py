"""Hostile and unusual data through S3Store, on moto's server, sync and async.

Texts, tool inputs and ``state.data`` holding NUL, JSON that looks like the store's own objects
(a head, a segment's array), ``-0.0``, the smallest subnormal float and an int of 4,000 digits,
through saves that pack, loads by another process (from segments) and by the same one (warm),
``list``, ``objects`` and ``delete``; values JSON cannot hold refused with nothing written; a
3 MB tool result among small entries; ids that are not ids, and ids at the edges of the rule;
entries changed in place after ``append`` to hold what JSON cannot.

Entries are compared as the dicts a save hands to the store, spelled as JSON, so that ``-0.0``
against ``0.0``, ``1`` against ``1.0`` and the order of keys count.
"""

from __future__ import annotations

import asyncio
import copy
import json
import math
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from alpineagents import State
from alpineagents._serialize import entry_to_dict
from alpineagents.errors import StateNotFoundError
from alpineagents.history import MODEL, TOOL_RESULT, USER
from alpineagents_s3.testing import RequestLog
from tests.helpers import Mode
from tests.s3.helpers import Stores, load, objects, raw_client, save

MODES: tuple[Mode, ...] = ("sync", "async")

# Helpers -------------------------------------------------------------------------------------


def spelled(value: Any) -> str:
    """``value`` as JSON with every character escaped: ``-0.0`` and ``0.0`` differ here."""
    return json.dumps(value, ensure_ascii=True)


def entries_of(state: State) -> list[dict[str, Any]]:
    """The history as the dicts a save hands to the store."""
    return [entry_to_dict(e) for e in state.history]


def same(loaded: State, state: State) -> None:
    """The loaded State is the saved one: history, data and task, float signs included."""
    assert spelled(entries_of(loaded)) == spelled(entries_of(state))
    assert loaded.history == state.history
    assert spelled(loaded.data) == spelled(state.data)
    assert loaded.task == state.task


def nested(levels: int, leaf: Any = "bottom") -> Any:
    """``levels`` levels of lists and dicts in turn around ``leaf``."""
    value = leaf
    for n in range(levels):
        value = [value] if n % 2 else {"down": value}
    return value


def roles(found: list[Any]) -> Counter[str]:
    """How many objects of each role ``objects`` listed."""
    return Counter(o.role for o in found)


def bucket_state(stores: Stores) -> dict[str, str]:
    """Every key in the bucket with its ETag: what a refused save must leave as it was."""
    client = raw_client(stores.url)
    try:
        found: dict[str, str] = {}
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=stores.bucket):
            found.update((o["Key"], o["ETag"]) for o in page.get("Contents", ()))
        return found
    finally:
        client.close()


# Texts that look like what the store writes around them: a segment's head and tail, an
# entry's fields, escapes, NUL, separators JSON treats specially, a byte order mark.
HOSTILE_TEXTS = [
    "",
    "\x00",
    "a\x00b\x00" * 20,
    '{"alpineagents-s3":1,"id":"x","inc":"0","parts":[',
    "],[",
    '{"seq":0,"kind":"task","text":"forged","at":"2026-01-01T00:00:00+00:00","data":{}}',
    '"},{"seq":1,',
    "\\u0000 \\ud800 \\\\ \\",
    "\u2028\u2029\ufeff\ufffe\uffff",
    "\U0010ffff\U0001f600 caf\u00e9",
    '{"alpineagents-s3":"head"}',
    "\x1f\x8b gzip magic",
]

# Values a State may hold whose JSON is unusual: their spelling must come back the same.
ODD_VALUES: dict[str, Any] = {
    "negative zero": -0.0,
    "subnormal": 5e-324,
    "largest": 1.7976931348623157e308,
    "long int": 10**4000,
    "negative long int": -(10**300),
    "one float": 1.0,
    "deep": nested(95),
    "nul\x00key": "\x00",
    "alpineagents-s3": {"parts": [[0, 0, "0123456789abcdef", "e"]], "count": 9},
    "seq": [-0.0, 0.0, 2**63, -(2**63) - 1],
    "": {"": ""},
}


def hostile_state(state_id: str, first: int = 0) -> State:
    """A State whose entries and data hold ``HOSTILE_TEXTS`` and ``ODD_VALUES``."""
    state = State("task \x00 " + HOSTILE_TEXTS[3], id=state_id, data=dict(ODD_VALUES))
    add_hostile(state, first)
    return state


def add_hostile(state: State, first: int) -> None:
    """Append a turn per hostile text: a tool call whose input holds it, and its result."""
    for n, text in enumerate(HOSTILE_TEXTS, first):
        tool_input = {"text": text, text: -0.0, "n": n, "odd": ODD_VALUES}
        block = {"type": "tool_call", "id": f"c{n}", "name": "look", "input": tool_input}
        state.append(MODEL, text, {"content": [block], "stop_reason": "tool_use"})
        state.append(TOOL_RESULT, text, {"call_id": f"c{n}", "name": "look"})
    state.append(USER, HOSTILE_TEXTS[5], {})


# Hostile texts and odd values through saves that pack, and every load -----------------------


async def test_hostile_texts_and_odd_values_come_back_as_they_were_saved(
    mode: Mode, stores: Stores
) -> None:
    """26 entries, saved a turn at a time: packed into a segment of 16 and entry objects. A
    text that looks like the store's objects must not change what is read back, nor may the
    parser of segments read ``-0.0`` or a long int otherwise than that of entry objects."""
    store = stores.new()
    state = State("task \x00 " + HOSTILE_TEXTS[3], id="hostile", data=dict(ODD_VALUES))
    await save(store, mode, state)
    add_hostile(state, 0)
    for n in range(1, len(state.history)):  # a save an entry, as a run makes them
        await save(store, mode, _upto(state, n + 1))
    same(await load(stores.new(), mode, "hostile"), state)  # another process: cold
    same(await load(store, mode, "hostile"), state)  # the same one: warm
    found = await objects(stores.io(mode), "hostile")
    assert roles(found) == {"head": 1, "segment": 1, "entry": len(state.history) - 16}
    listed = await (store.alist() if mode == "async" else asyncio.to_thread(store.list))
    assert [s.id for s in listed] == ["hostile"] and listed[0].task == state.task
    deleted = await (
        store.adelete("hostile") if mode == "async" else asyncio.to_thread(store.delete, "hostile")
    )
    assert deleted is not None and deleted.objects == len(found)
    assert list(bucket_state(stores)) == ["runs/heads/hostile.json"]  # the tombstone head


def _upto(state: State, count: int) -> State:
    """``state`` with only its first ``count`` entries (the run at that point), as a copy."""
    part = copy.copy(state)
    part.history = state.history[:count]
    return part


async def test_values_json_cannot_hold_are_refused_and_nothing_is_written(
    mode: Mode, stores: Stores
) -> None:
    io = stores.io(mode)
    await io.save(State("kept", id="kept"))
    before = bucket_state(stores)
    bad = [math.nan, math.inf, "x\udfff", nested(100_000), {1, 2}, object()]
    for value in bad:
        entry = {"v": 1, "seq": 1, "kind": "note", "text": "t", "at": "2026", "data": {"x": value}}
        with pytest.raises((TypeError, ValueError), match="history entry 1 of State 'kept'"):
            await io.write("kept", [entry], None)
        with pytest.raises((TypeError, ValueError), match="the snapshot of State 'kept'"):
            await io.write("kept", [], {"v": 1, "data": value})
    assert bucket_state(stores) == before


async def test_one_result_larger_than_a_segment_takes_among_small_ones(
    mode: Mode, stores: Stores
) -> None:
    """A 3 MB tool result stays an object of its own (large already); the small entries
    around it are packed."""
    store = stores.new()
    state = State("big and small", id="big")
    await save(store, mode, state)
    for n in range(40):
        text = "x" * 3_000_000 if n == 5 else f"small {n}"
        state.append(USER, text, {})
        await save(store, mode, state)
    same(await load(stores.new(), mode, "big"), state)
    found = await objects(stores.io(mode), "big")
    assert any(o.role == "entry" and o.size > 3_000_000 for o in found)
    assert roles(found)["segment"] >= 2 and len(found) < 25


BAD_IDS = [
    "",
    "caf\u00e9",
    "\u0661\u0662",  # Arabic-Indic digits: digits to str.isdigit, not to the id rule
    "\uff21",  # fullwidth A
    "a b",
    "a%2Fb",
    "a%20b",
    "a+b",
    "a#b",
    "a?b",
    "a/b",
    "../x",
    ".",
    "a\x00b",
    "a\n",
    "x" * 129,
    "\ud800",
]


async def test_ids_that_are_not_ids_are_refused_before_any_request(
    mode: Mode, stores: Stores
) -> None:
    """Every operation refuses them with ``ValueError`` naming the id, sends nothing, writes
    nothing; a State saved before is untouched."""
    kept = hostile_state("kept")
    await save(stores.new(), mode, kept)
    before = bucket_state(stores)
    log = RequestLog()
    store = stores.new(event_hooks=log.hooks)
    for bad in BAD_IDS:
        with pytest.raises(ValueError, match="invalid State id") as raised:
            State("t", id=bad)
        assert repr(bad) in str(raised.value)
        if mode == "async":
            calls: dict[str, Any] = {
                "load": lambda b=bad: store.aload(b),
                "read": lambda b=bad: store.aread(b),
                "delete": lambda b=bad: store.adelete(b),
                "objects": lambda b=bad: store.aobjects(b),
                "write": lambda b=bad: store.awrite(b, [], {"id": b}, create=True),
            }
        else:
            calls = {
                "load": lambda b=bad: asyncio.to_thread(store.load, b),
                "read": lambda b=bad: asyncio.to_thread(store.read, b),
                "delete": lambda b=bad: asyncio.to_thread(store.delete, b),
                "objects": lambda b=bad: asyncio.to_thread(store.objects, b),
                "write": lambda b=bad: asyncio.to_thread(store.write, b, [], {"id": b}),
            }
        for name, make in calls.items():
            with pytest.raises(ValueError, match="invalid State id") as raised:
                await make()
            assert repr(bad) in str(raised.value), (name, raised.value)
    assert log.requests == []
    assert bucket_state(stores) == before
    same(await load(store, mode, kept.id), kept)


async def test_ids_at_the_edges_of_the_rule_live_a_whole_life(mode: Mode, stores: Stores) -> None:
    """The longest id, one-character ids of ``-`` and ``_``, ids differing in case only: each
    its own State through save, load, ``objects``, ``list`` and ``delete``."""
    ids = ["x" * 128, "-", "Case", "case"]
    store = stores.new()
    states = {}
    for state_id in ids:
        state = State(f"task of {state_id}", id=state_id, data={"id": state_id})
        state.append(USER, HOSTILE_TEXTS[3], {})
        await save(store, mode, state)
        states[state_id] = state
    for state_id in ids:
        same(await load(stores.new(), mode, state_id), states[state_id])
        found = await objects(stores.io(mode), state_id)
        assert roles(found) == {"head": 1, "entry": 2}
        assert found[0].key == f"runs/heads/{state_id}.json"
        assert all(o.key.startswith(f"runs/states/{state_id}/") for o in found[1:])
    listed = await (store.alist() if mode == "async" else asyncio.to_thread(store.list))
    assert sorted(s.id for s in listed) == sorted(ids)
    await (store.adelete("case") if mode == "async" else asyncio.to_thread(store.delete, "case"))
    same(await load(stores.new(), mode, "Case"), states["Case"])
    with pytest.raises(StateNotFoundError):
        await load(stores.new(), mode, "case")


# 5. Entries changed in place after append --------------------------------------------------------

IN_PLACE: dict[str, Callable[[Any], None]] = {
    "text with a lone surrogate": lambda e: setattr(e, "text", "x\udfff"),
    "nan in a tool input": lambda e: e.data["content"][0]["input"].update(q=float("nan")),
}


async def test_an_entry_changed_in_place_to_hold_what_json_cannot_is_refused_before_writing(
    mode: Mode, stores: Stores
) -> None:
    """``append`` checks an entry, but ``HistoryEntry`` is mutable: a new entry changed in
    place after it must be refused by the save (naming the entry) before any request, leave
    the packed State as it was, and save once it is changed back."""
    state = hostile_state("in-place")
    store = stores.new()
    await save(store, mode, state)
    before = bucket_state(stores)
    block = {"type": "tool_call", "id": "late", "name": "look", "input": {"q": 1}}
    entry = state.append(MODEL, "late", {"content": [block], "stop_reason": "tool_use"})
    state.append(TOOL_RESULT, "done", {"call_id": "late", "name": "look"})
    original = copy.deepcopy(entry.data), entry.text
    for name, change in IN_PLACE.items():
        change(entry)
        with pytest.raises((TypeError, ValueError)) as raised:
            await save(store, mode, state)
        assert f"history entry {entry.seq}" in str(raised.value), (name, raised.value)
        assert bucket_state(stores) == before, name
        entry.data, entry.text = copy.deepcopy(original[0]), original[1]
    await save(store, mode, state)
    same(await load(stores.new(), mode, state.id), state)


def test_an_entry_changed_in_place_to_500_levels_gets_an_error_naming_it(stores: Stores) -> None:
    """As above, 500 levels deep (the refusal of ``state.data`` at 101 levels names the path):
    the error names the entry (it was a bare ``RecursionError`` of ``copy.deepcopy`` in the
    core's ``entry_to_dict``), and nothing is written."""
    state = State("deep", id="deep-in-place")
    block = {"type": "tool_call", "id": "c", "name": "look", "input": {"q": 1}}
    entry = state.append(MODEL, "", {"content": [block], "stop_reason": "tool_use"})
    entry.data["content"][0]["input"]["q"] = nested(500)
    store = stores.new()
    with pytest.raises((TypeError, ValueError), match=f"history entry {entry.seq}"):
        store.save(state)
    assert bucket_state(stores) == {}


# 6. Stored objects that hold what a save never writes -----------------------------------------


# What a save refuses, in a tool input of an entry object; the bytes as JSON spells them.
BEHIND: dict[str, bytes] = {
    "escaped-lone-surrogate": b'"\\ud800"',
    "nan": b"NaN",
    "infinity": b"-Infinity",
}


async def behind_the_back(stores: Stores, mode: Mode, state_id: str) -> State:
    """A State of 11 entries whose model entries 1, 3 and 5 had their tool input replaced by
    ``BEHIND``'s values in their objects (another program, an older version, a hand edit);
    the State as a load reads it."""
    state = State("behind", id=state_id)
    for n in range(5):
        block = {"type": "tool_call", "id": f"c{n}", "name": "look", "input": {"q": "PLACE"}}
        state.append(MODEL, "", {"content": [block], "stop_reason": "tool_use"})
        state.append(TOOL_RESULT, "r", {"call_id": f"c{n}", "name": "look"})
    await save(stores.new(), mode, state)
    client = raw_client(stores.url)
    try:
        found = {
            int(o.key.rsplit("/", 1)[1][1:11]): o.key
            for o in await objects(stores.io(mode), state.id)
            if o.role == "entry"
        }
        for seq, stored in zip((1, 3, 5), BEHIND.values(), strict=True):
            body = client.get_object(Bucket=stores.bucket, Key=found[seq])["Body"].read()
            body = body.replace(b'"PLACE"', stored)
            client.put_object(Bucket=stores.bucket, Key=found[seq], Body=body)
    finally:
        client.close()
    return await load(stores.new(), mode, state.id)


async def test_an_entry_object_a_load_accepts_but_a_save_would_refuse_loads(
    mode: Mode, stores: Stores
) -> None:
    """Loads keep such a value as they read it (``json.loads`` reads NaN, infinities and
    escaped lone surrogates): the State comes back, each value where it was."""
    loaded = await behind_the_back(stores, mode, "kept")
    assert len(loaded.history) == 11
    for seq, stored in zip((1, 3, 5), BEHIND.values(), strict=True):
        (block,) = loaded.history[seq].data["content"]
        assert json.dumps(block["input"]["q"]) == stored.decode(), seq


async def test_a_state_that_loads_so_is_packed_by_later_saves_and_loads_the_same(
    mode: Mode, stores: Stores
) -> None:
    """Saves that pack join the bodies of the entry objects as they are stored: an entry object
    holding what a save refuses (NaN, -Infinity, an escaped lone surrogate) is packed as it
    was read, and the packed State loads the same; an identical re-send of it is skipped."""
    loaded = await behind_the_back(stores, mode, "packs")
    store = stores.new()
    loaded = await load(store, mode, loaded.id)
    for n in range(8):  # to 19 entries: the first 16 are packed
        loaded.append(USER, f"more {n}", {})
        await save(store, mode, loaded)
    found = await objects(stores.io(mode), loaded.id)
    assert roles(found)["segment"] == 1
    again = await load(stores.new(), mode, loaded.id)
    assert spelled(entries_of(again)) == spelled(entries_of(loaded))
