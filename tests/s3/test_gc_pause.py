"""The pause of the cyclic garbage collector while a packed segment is parsed (``_gc``).

What could break, and is tried here: a collection during a parse all the same (the pause not
applied); the collector left off after a parse, after a parse that raised, or after two
parses in two threads that end in either order; a program's own choice to turn it off undone;
a child forked in the middle of a parse left with it off for good; a load of a packed State,
sync or async, through moto's server, leaving it other than as it found it.
"""

from __future__ import annotations

import gc
import json
import os
import threading
from typing import Any

import pytest

from alpineagents import State
from alpineagents_s3 import CorruptStateError, _codec, _gc
from alpineagents_s3._codec import dumps, dumps_segment, loads_segment
from tests.helpers import Mode, paused_in_a_thread
from tests.s3.helpers import Stores, load, pack, run, save


def segment_body(entries: int) -> bytes:
    bodies = [
        dumps({"v": 2, "seq": seq, "kind": "user", "data": {"rows": [[seq, "a"], [seq, "b"]]}}, "e")
        for seq in range(entries)
    ]
    return dumps_segment(0, bodies)


def test_a_segment_parses_without_a_collection(
    collections: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    body = segment_body(3000)
    json.loads(body)  # the control: the same parse, not paused, is collected in
    assert len(collections) > 10, "the thresholds set make collections during a parse"
    during: list[int] = []
    parse = _codec._loads_large

    def parsing(body: bytes, where: str) -> Any:
        before = len(collections)
        try:
            return parse(body, where)
        finally:
            during.append(len(collections) - before)

    monkeypatch.setattr(_codec, "_loads_large", parsing)
    entries = loads_segment(body, "s3://b/seg", 0, 3000)
    assert len(entries) == 3000
    assert during == [0]
    assert gc.isenabled()
    assert _gc._PAUSE.depth == 0
    collections.clear()
    [{} for _ in range(200)]  # the collector runs again at once
    assert collections


def test_a_damaged_segment_leaves_the_collector_running(collections: list[int]) -> None:
    with pytest.raises(CorruptStateError, match="s3://b/seg is not valid JSON"):
        loads_segment(segment_body(50)[:-3], "s3://b/seg", 0, 50)
    with pytest.raises(CorruptStateError, match="does not hold entries 0 to 50"):
        loads_segment(segment_body(50), "s3://b/seg", 0, 51)
    assert gc.isenabled()
    assert _gc._PAUSE.depth == 0


def test_a_collector_turned_off_stays_off() -> None:
    was_on = gc.isenabled()
    gc.disable()
    try:
        loads_segment(segment_body(20), "s3://b/seg", 0, 20)
        with _gc.paused():
            pass
        assert not gc.isenabled()
    finally:
        if was_on:
            gc.enable()


@pytest.mark.parametrize("first_to_end", ["first", "second"])
def test_two_pauses_in_two_threads_resume_once_both_ended(first_to_end: str) -> None:
    assert gc.isenabled()
    began = [threading.Event(), threading.Event()]
    end = [threading.Event(), threading.Event()]
    ended = [threading.Event(), threading.Event()]

    def parse(i: int) -> None:
        with _gc.paused():
            began[i].set()
            end[i].wait(10)
        ended[i].set()

    threads = [threading.Thread(target=parse, args=(i,)) for i in (0, 1)]
    threads[0].start()
    assert began[0].wait(10)
    threads[1].start()
    assert began[1].wait(10)
    order = (0, 1) if first_to_end == "first" else (1, 0)
    end[order[0]].set()
    assert ended[order[0]].wait(10)
    assert not gc.isenabled(), "one parse is still under way"
    end[order[1]].set()
    for thread in threads:
        thread.join(10)
    assert gc.isenabled()
    assert _gc._PAUSE.depth == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="a platform that does not fork")
def test_a_child_forked_during_a_parse_has_the_collector_running() -> None:
    with paused_in_a_thread(_gc.paused):
        assert not gc.isenabled()
        pid = os.fork()
        if pid == 0:  # the child: no thread is parsing here
            code = 0 if gc.isenabled() and _gc._PAUSE.depth == 0 else 1
            with _gc.paused():
                code |= 0 if not gc.isenabled() else 2
            code |= 0 if gc.isenabled() else 4
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status)
        assert os.WEXITSTATUS(status) == 0
    assert gc.isenabled()


@pytest.mark.parametrize("collector", ["on", "off"])
async def test_a_packed_load_parses_paused_and_leaves_the_collector_as_it_found_it(
    stores: Stores, mode: Mode, collector: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = State("gc", id=f"gc-{mode}-{collector}")
    run(state, 70)  # over 128 KiB: a segment of its own, and one entry after it
    store = stores.new()
    await save(store, mode, state)
    await pack(store, mode, state.id)
    parses: list[bool] = []  # whether the collector ran, at each segment parse
    parse = _codec._loads_large

    def seen(body: bytes, where: str) -> Any:
        parses.append(gc.isenabled())
        return parse(body, where)

    monkeypatch.setattr(_codec, "_loads_large", seen)
    was_on = gc.isenabled()
    if collector == "off":
        gc.disable()
    try:
        loaded = await load(stores.new(), mode, state.id)
        assert gc.isenabled() == (collector == "on")
    finally:
        (gc.enable if was_on else gc.disable)()
    assert [e.seq for e in loaded.history] == [e.seq for e in state.history]
    assert parses and not any(parses)
    assert _gc._PAUSE.depth == 0
