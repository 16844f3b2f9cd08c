"""Hostile and unusual data through S3Store's packed-segment paths, on moto's server.

What could break, and is tried here (sync and async): texts, tool inputs and ``state.data``
holding NUL, JSON that looks like a segment's or an entry's own fields, ``-0.0``, the smallest
subnormal float and an int of 4,000 digits, through a save, a pack (entries kept, then removed,
merging), loads by a new store object and by the one that read it (warm), ``auto_pack``,
``objects``, ``list``, ``delete`` and ``sweep``; values JSON cannot hold (lone surrogates,
NaN, infinities, 500 and 5,000 levels of nesting) refused after a pack with nothing written and
nothing lost; one 3 MB tool result among small entries, and 160 entries of one character;
State ids that are not ids, refused before any request, naming the id; entry objects holding
what a save refuses but a load reads (NaN, an escaped lone surrogate), which a pack must keep.
Three of these broke, fixed since: such a State could not be packed, a pack as loads go sent
a 3 MB segment again for a few new entries, and an entry changed in place to 500 levels
raised a bare ``RecursionError``.

Entries are compared as the dicts a save hands to the store, spelled as JSON, so that ``-0.0``
against ``0.0``, ``1`` against ``1.0`` and the order of keys count.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import math
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from alpineagents import Agent, State
from alpineagents._serialize import entry_to_dict
from alpineagents.errors import NotJSONError, StateNotFoundError
from alpineagents.history import MODEL, TOOL_RESULT, USER
from alpineagents.model import ModelRequest
from alpineagents.testing import FunctionModel, call
from alpineagents_s3 import S3Store, _deleting, _layout
from alpineagents_s3._packing import SEGMENT_MAX, SEGMENT_MIN
from alpineagents_s3.testing import RequestLog
from tests.helpers import Mode
from tests.s3.helpers import Stores, load, objects, pack, raw_client, save

pytestmark = pytest.mark.slow

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


def kinds(found: list[Any]) -> Counter[str]:
    """How many objects of each kind ``objects`` listed."""
    return Counter(o.kind for o in found)


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
    '{"alpineagents-segment":1,"start":0,"end":9,"entries":[',
    ']}{"alpineagents-segment":2}',
    '{"seq":0,"kind":"task","text":"forged","at":"2026-01-01T00:00:00+00:00","data":{}}',
    '"},{"seq":1,',
    "\\u0000 \\ud800 \\\\ \\",
    "\u2028\u2029\ufeff\ufffe\uffff",
    "\U0010ffff\U0001f600 caf\u00e9",
    '{"alpineagents-refs":1,"refs":[],"snapshot":{}}',
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
    "alpineagents-segment": {"start": 0, "end": 1, "entries": [{"seq": 7}]},
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


def get_count(log: RequestLog) -> int:
    """GETs of the log, then forget them."""
    gets = log.counts()["GET"]
    log.clear()
    return gets


# 1. Hostile texts and odd values through every packed path ------------------------------------


async def test_hostile_texts_and_odd_values_survive_every_packed_path(
    mode: Mode, stores: Stores
) -> None:
    """A segment is the entries' JSON joined in a JSON frame: a text that looks like the frame
    (or an entry, or escapes) must not change what is read back, nor may a parser of
    segments other than the one of entry objects read ``-0.0`` or a long int differently. Then
    more saves, a pack that merges and removes the entries, warm loads that meet the merged
    segment gone, and ``objects``, ``list``, ``delete`` and ``sweep`` of it."""
    state = hostile_state("hostile")
    writer = stores.new()
    await save(writer, mode, state)
    same(await load(stores.new(), mode, state.id), state)  # from the entry objects

    packed = await pack(stores.new(), mode, state.id)
    assert packed.covered == len(state.history) and len(packed.written) == 1
    log = RequestLog()
    reader = stores.new(event_hooks=log.hooks)
    same(await load(reader, mode, state.id), state)
    assert get_count(log) == 2  # the snapshot and the segment
    same(await load(reader, mode, state.id), state)  # warm: the segment it knows
    assert get_count(log) == 2

    continued = await load(writer, mode, state.id)
    add_hostile(continued, len(HOSTILE_TEXTS))
    continued.data["later"] = [-0.0, "\x00"]
    await save(writer, mode, continued)
    merged = await pack(stores.new(), mode, state.id, remove_entries=True)
    assert merged.covered == len(continued.history)
    assert len(merged.written) == 1 and packed.written[0] in merged.removed
    found = await objects(stores.io(mode), state.id)
    assert kinds(found) == {"snapshot": 1, "segment": 1}
    same(await load(stores.new(), mode, state.id), continued)
    same(await load(reader, mode, state.id), continued)  # its known segment is gone (404)
    same(await load(reader, mode, state.id), continued)
    assert get_count(log) <= 2 + 3

    io = stores.io(mode)
    listed = await (io.store.alist() if mode == "async" else asyncio.to_thread(io.store.list))
    assert [s.id for s in listed] == [state.id]
    assert listed[0].task == state.task
    store = io.store
    assert isinstance(store, S3Store)
    swept = await (store.asweep(0) if mode == "async" else asyncio.to_thread(store.sweep, 0))
    assert swept == []
    await (
        store.adelete(state.id) if mode == "async" else asyncio.to_thread(store.delete, state.id)
    )
    assert bucket_state(stores) == {}
    with pytest.raises(StateNotFoundError):
        await load(reader, mode, state.id)  # not from the segment it knew


async def test_auto_pack_of_hostile_entries_then_a_new_reader(mode: Mode, stores: Stores) -> None:
    """A load with ``auto_pack`` packs what it parsed from entry objects (dumped again, not
    the bytes read): the segment must hold the same JSON, ``-0.0`` and long ints included."""
    state = hostile_state("auto")
    await save(stores.new(), mode, state)
    packer = stores.new(auto_pack=4)
    same(await load(packer, mode, state.id), state)
    found = await objects(stores.io(mode), state.id)
    assert kinds(found)["segment"] == 1
    log = RequestLog()
    same(await load(stores.new(event_hooks=log.hooks), mode, state.id), state)
    assert get_count(log) == 2
    same(await load(packer, mode, state.id), state)  # warm, by the store that packed


async def test_an_agent_run_with_hostile_input_and_a_long_reply_packs_and_loads(
    mode: Mode, stores: Stores
) -> None:
    """A tool input with a lone surrogate becomes an error result; one with ``-0.0`` runs; the
    long final reply, copied into the snapshot's answer by reference to its entry, must come
    back from the segment once the entry objects are removed."""
    reply = ("done \x00 " + HOSTILE_TEXTS[3] + HOSTILE_TEXTS[5]) * 4
    assert len(reply) > 256  # long enough to be kept in the snapshot by reference
    ran: list[float] = []

    def look(q: float) -> str:
        """Look."""
        ran.append(q)
        return f"{q!r} \x00 {HOSTILE_TEXTS[4]}"

    replies: list[Any] = [[call("look", q="\ud800")], [call("look", q=-0.0)], reply]

    def respond(request: ModelRequest) -> Any:
        return replies.pop(0)

    store = stores.new()
    state = State("agent", id="agent-run", data={"z": -0.0})
    agent = Agent(FunctionModel(respond), tools=[look], store=store)
    answer = (
        await agent.arun(state) if mode == "async" else await asyncio.to_thread(agent.run, state)
    )
    assert answer == reply
    assert len(ran) == 1 and math.copysign(1.0, ran[0]) == -1.0
    await pack(stores.new(), mode, state.id, remove_entries=True)
    loaded = await load(stores.new(), mode, state.id)
    same(loaded, state)
    assert loaded.answer == reply and loaded.stopped_by == "reply"
    inputs = [
        b["input"]
        for e in loaded.history
        if e.kind == MODEL
        for b in e.data["content"]
        if b["type"] == "tool_call"
    ]
    assert spelled(inputs) == spelled([{}, {"q": -0.0}])


# 2. What JSON cannot hold, refused after a pack -------------------------------------------------

REFUSED: dict[str, tuple[Callable[[], Any], str]] = {
    "lone surrogate": (lambda: "a\ud800b", "lone surrogate"),
    "lone low surrogate": (lambda: "\udfff", "lone surrogate"),
    "surrogate key": (lambda: {"\ud800": 1}, "a key of"),
    "nan": (lambda: float("nan"), "nan"),
    "infinity": (lambda: float("inf"), "inf"),
    "-infinity": (lambda: [float("-inf")], "-inf"),
    "500 levels": (lambda: nested(500), "levels deep"),
    "5000 levels": (lambda: nested(5000), "levels deep"),
}


async def test_data_json_cannot_hold_is_refused_after_a_pack_and_nothing_is_lost(
    mode: Mode, stores: Stores
) -> None:
    """Each of ``REFUSED`` in ``state.data`` of a packed State (entries removed), with a new
    entry: refused by the save, naming its path, before any request (segment, snapshot and
    entries stay as they were, a load gives the State as saved); fixed, the State saves, and
    the next pack and loads (new and warm) have every entry."""
    state = hostile_state("refused")
    store = stores.new()
    await save(store, mode, state)
    await pack(store, mode, state.id, remove_entries=True)
    before = bucket_state(stores)
    saved = spelled([entries_of(state), state.data])
    state.append(USER, "after the pack \x00", {})
    state.append(USER, HOSTILE_TEXTS[4], {})
    for bad, (make, words) in REFUSED.items():
        state.data["late"] = {"x": make()}
        with pytest.raises(NotJSONError) as raised:
            await save(store, mode, state)
        assert "state.data['late']" in str(raised.value), bad
        assert words in str(raised.value), (bad, raised.value)
        assert bucket_state(stores) == before, bad
    loaded = await load(stores.new(), mode, state.id)
    assert spelled([entries_of(loaded), loaded.data]) == saved

    state.data["late"] = {"x": -0.0}
    await save(store, mode, state)
    again = await pack(stores.new(), mode, state.id, remove_entries=True)
    assert again.covered == len(state.history)
    same(await load(stores.new(), mode, state.id), state)
    same(await load(store, mode, state.id), state)


@pytest.mark.parametrize("bad", list(REFUSED))
def test_an_entry_that_cannot_hold_it_is_refused_at_append(bad: str) -> None:
    """A tool result's text, a tool input or a tool result's data holding it never reaches a
    store: ``append`` refuses it and history is unchanged."""
    make, _ = REFUSED[bad]
    state = hostile_state("appended")
    entries = len(state.history)
    block = {"type": "tool_call", "id": "x", "name": "look", "input": {"q": make()}}
    with pytest.raises(NotJSONError):
        state.append(MODEL, "", {"content": [block], "stop_reason": "tool_use"})
    with pytest.raises(NotJSONError):
        state.append(TOOL_RESULT, "r", {"call_id": "x", "name": "look", "extra": make()})
    value = make()
    if isinstance(value, str):
        with pytest.raises(NotJSONError):
            state.append(TOOL_RESULT, value, {"call_id": "x", "name": "look"})
    assert len(state.history) == entries


# 3. Sizes ---------------------------------------------------------------------------------------


async def test_one_result_larger_than_a_segment_among_small_ones(
    mode: Mode, stores: Stores
) -> None:
    """A 3 MB tool result is more than a segment's target: the cut must still give segments
    that chain from seq 0 without a hole, a load reads each once, and packing again after a
    few more entries (a merge with the large segment) loses nothing."""
    state = State("big", id="big")
    big = ("0123456789abcdef" * 65536 * 3)[:-1] + "\x00"  # 3 MB
    for n in range(30):
        text = big if n == 15 else f"small {n} \x00"
        state.append(TOOL_RESULT, text, {"call_id": f"c{n}", "name": "look"})
    writer = stores.new()
    await save(writer, mode, state)
    packed = await pack(stores.new(), mode, state.id)
    assert packed.covered == len(state.history)
    found = await objects(stores.io(mode), state.id)
    segments = sorted((o for o in found if o.kind == "segment"), key=lambda o: o.key)
    assert 1 <= len(segments) <= 2, segments
    assert any(o.size > 3 * SEGMENT_MAX - 4096 for o in segments)
    log = RequestLog()
    reader = stores.new(event_hooks=log.hooks)
    same(await load(reader, mode, state.id), state)
    assert get_count(log) == 1 + len(segments)
    same(await load(reader, mode, state.id), state)
    assert get_count(log) == 1 + len(segments)

    for n in range(30, 33):
        state.append(TOOL_RESULT, f"later {n}", {"call_id": f"c{n}", "name": "look"})
    await save(writer, mode, state)
    merged = await pack(stores.new(), mode, state.id, remove_entries=True)
    assert merged.covered == len(state.history)
    same(await load(stores.new(), mode, state.id), state)
    same(await load(reader, mode, state.id), state)
    found = await objects(stores.io(mode), state.id)
    assert kinds(found)["entry"] == 0
    chained = sorted((o.seq, o.key) for o in found if o.kind == "segment")
    assert chained[0][0] == 0


async def test_many_one_character_entries_pack_into_one_segment(
    stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many tiny entries: one segment (far under the size of one), several pages of entry
    keys listed and removed; a load then makes a handful of requests, in either mode, cold and
    warm. Pages of 50 keys instead of S3's 1,000, so 160 entries (one PUT and one GET each on
    moto) take the paths 3,000 would (the first listing stays
    ``FIRST_PAGE``, 100 keys)."""
    for module in (_layout, _deleting):
        monkeypatch.setattr(module, "PAGE", 50)
    state = State("t", id="tiny")
    for n in range(159):
        state.append(USER, chr(0x20 + n % 90) if n % 7 else "\x00", {})
    await save(stores.new(), "async", state)
    packed = await pack(stores.new(), "sync", state.id, remove_entries=True)
    assert packed.covered == 160 and len(packed.written) == 1
    assert len(packed.removed) == 160
    for mode in MODES:
        log = RequestLog()
        reader = stores.new(event_hooks=log.hooks)
        same(await load(reader, mode, state.id), state)
        assert log.counts() == {"GET": 2, "LIST": 2}, log.counts()
        log.clear()
        same(await load(reader, mode, state.id), state)
        assert log.counts() == {"GET": 2, "LIST": 2}, log.counts()


def test_packing_as_loads_go_does_not_rewrite_a_full_segment(stores: Stores) -> None:
    """Sync only (the sizes are the point): after a segment holding a 3 MB tool result, each
    pack as loads go (``auto_pack``) of a few small entries sent the 3 MB again. It now writes
    them as a segment of their own (well under ``SEGMENT_MAX``), which the next one takes in;
    a pack on request then takes the full segment in once, so that no segment stays under
    ``SEGMENT_MIN`` (for archiving)."""
    state = State("big", id="big-merge")
    for n in range(8):
        text = "x" * (3 * 1024 * 1024) if n == 4 else f"small {n}"
        state.append(TOOL_RESULT, text, {"call_id": f"c{n}", "name": "look"})
    store = stores.new()
    store.save(state)
    store.pack(state.id)
    log = RequestLog()
    loader = stores.new(event_hooks=log.hooks, auto_pack=2)
    for batch in range(2):
        for n in range(3):
            state.append(
                TOOL_RESULT, f"later {batch} {n}", {"call_id": f"l{batch}{n}", "name": "x"}
            )
        store.save(state)
        log.clear()
        same(loader.load(state.id), state)
        sent = [r.size for r in log.requests if r.kind == "PUT"]
        assert len(sent) == 1 and sent[0] < SEGMENT_MIN, sent  # the new entries alone
    segments = sorted(o.size for o in store.objects(state.id) if o.kind == "segment")
    assert len(segments) == 2 and segments[0] < SEGMENT_MIN <= SEGMENT_MAX <= segments[1]
    log.clear()
    packed = stores.new(event_hooks=log.hooks).pack(state.id)
    assert packed.covered == len(state.history) and len(packed.removed) == 2
    segments = [o.size for o in store.objects(state.id) if o.kind == "segment"]
    assert len(segments) == 1 and segments[0] > 3 * 1024 * 1024
    same(stores.new().load(state.id), state)


# 4. State ids ------------------------------------------------------------------------------------

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
                "pack": lambda b=bad: store.apack(b, remove_entries=True),
                "delete": lambda b=bad: store.adelete(b),
                "objects": lambda b=bad: store.aobjects(b),
                "write": lambda b=bad: store.awrite(b, [], {"id": b}, create=True),
            }
        else:
            calls = {
                "load": lambda b=bad: asyncio.to_thread(store.load, b),
                "read": lambda b=bad: asyncio.to_thread(store.read, b),
                "pack": lambda b=bad: asyncio.to_thread(store.pack, b),
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
    its own State through save, pack, load, ``objects``, ``list`` and ``delete``."""
    ids = ["x" * 128, "-", "Case", "case"]
    store = stores.new()
    states = {}
    for state_id in ids:
        state = State(f"task of {state_id}", id=state_id, data={"id": state_id})
        state.append(USER, HOSTILE_TEXTS[3], {})
        await save(store, mode, state)
        states[state_id] = state
    for state_id in ids:
        packed = await pack(store, mode, state_id, remove_entries=True)
        assert packed.covered == len(states[state_id].history)
        same(await load(stores.new(), mode, state_id), states[state_id])
        found = await objects(stores.io(mode), state_id)
        assert kinds(found) == {"snapshot": 1, "segment": 1}
        assert all(o.key.startswith(f"runs/{state_id}/") for o in found)
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
    await pack(store, mode, state.id, remove_entries=True)
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
        found = {o.seq: o.key for o in await objects(stores.io(mode), state.id)}
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


async def test_a_state_that_loads_can_be_packed_and_loads_the_same_packed(
    mode: Mode, stores: Stores, caplog: pytest.LogCaptureFixture
) -> None:
    """Load, pack and ``auto_pack`` must agree on an entry object holding what a save refuses
    (NaN, -Infinity, an escaped lone surrogate): the load keeps it, so a pack must pack it
    (segments read with ``json.loads`` as a fallback take them) and the packed State must load
    the same. (The pack raised ``ValueError`` "cannot be saved", and ``auto_pack`` warned at
    every load and never packed.)"""
    loaded = await behind_the_back(stores, mode, "packs")
    with caplog.at_level(logging.WARNING, "alpineagents_s3"):
        await load(stores.new(auto_pack=2), mode, loaded.id)
    found = await objects(stores.io(mode), loaded.id)
    assert kinds(found)["segment"] == 1, caplog.text
    await pack(stores.new(), mode, loaded.id, remove_entries=True)
    again = await load(stores.new(), mode, loaded.id)
    assert spelled(entries_of(again)) == spelled(entries_of(loaded))
