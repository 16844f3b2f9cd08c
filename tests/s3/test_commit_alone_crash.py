"""Saves that commit by their entry alone (layout 3), their process SIGKILLed at each request.

tests/s3/_alone_child.py makes the saves of a run through this repository's core: a create, a
model response committed alone, its result saved alone, a change of ``data`` carried by the next
response's entry, that result, and the reply that stops the run (a snapshot PUT). It kills
itself at its k-th request, before it is sent or once its answer came back, for every k. After
each kill a new process must read what some save left whole (never half of one, never less
than the last save that returned): the history, ``data`` and the stop as they were after that
save. It then makes the saves that are left, and the State reads whole.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from alpineagents import State
from alpineagents._resume import UNKNOWN_RESULT
from tests.forked import Forker
from tests.helpers import Mode
from tests.s3._alone_child import build, steps
from tests.s3.helpers import Stores, load, save, saves_of_a_killed_child

pytestmark = [pytest.mark.slow, pytest.mark.crash]

# The create (its entry, the snapshot), four saves of one PUT each, the reply (its entry, the
# snapshot): checked below, so a change of the protocol's count shows.
REQUESTS = 8


@pytest.fixture(scope="module")
def forker(moto_url: str) -> Iterator[Forker]:
    """tests.s3._alone_child's processes, forked from one that imported it (tests/forked.py)."""
    server = Forker("tests.s3._alone_child", endpoint=moto_url)
    yield server
    server.close()


def shape(state: State) -> tuple[list[tuple[str, str]], dict[str, object], str | None]:
    return [(e.kind, e.text) for e in state.history], state.data, state.stopped_by


# Each driver once and each kill point once (all four pairs cost the suite ~25 s more; the
# protocol's steps are the same in both drivers, tests/plugin checks them batch by batch).
@pytest.mark.parametrize(("mode", "event"), [("sync", "before-send"), ("async", "after-call")])
async def test_a_kill_at_any_request_leaves_what_a_save_left_and_the_run_goes_on(
    mode: Mode, stores: Stores, event: str, forker: Forker
) -> None:
    unkilled = forker.run(stores.url, stores.bucket, "whole", mode, event, "0")
    assert unkilled.returncode == 0, unkilled.stderr
    printed = [f"saved {n}" for n in range(1, 7)] + [f"requests {REQUESTS}"]
    assert unkilled.stdout.splitlines() == printed, unkilled.stdout
    whole = build(len(steps()))
    for k in range(1, REQUESTS + 1):
        state_id = f"k{k}"
        returned = saves_of_a_killed_child(forker, stores, state_id, mode, event, k)
        reader = stores.new()
        record = await reader.aread(state_id)
        if record is None:
            assert returned == [], (k, returned)
            continue
        n = len(record.entries)
        assert n >= max(returned, default=0), (k, n, returned)
        built = build(n)
        assert [(e["kind"], e["text"]) for e in record.entries] == shape(built)[0], (k, n)
        assert (record.snapshot["data"], record.snapshot["stopped_by"]) == shape(built)[1:], k

        # Another process loads it (a call without its result gets "(unknown: ...)"), makes
        # the saves that are left, and the State reads whole.
        loaded = await load(reader, mode, state_id)
        expected = shape(whole)[0]
        if len(loaded.history) > n:
            assert loaded.history[n].text == UNKNOWN_RESULT, k
            expected[n] = ("tool_result", UNKNOWN_RESULT)
        for add, _ in steps()[len(loaded.history) :]:
            add(loaded)
            await save(reader, mode, loaded)
        again = await load(stores.new(), mode, state_id)
        assert shape(again) == (expected, *shape(whole)[1:]), k
        assert [e.seq for e in again.history] == list(range(len(whole.history)))
