"""A process saving a State whose snapshot keeps its context's texts in entries, SIGKILLed.

tests/s3/_refs_child.py makes three saves of alpineagents 0.4's shape (a create, a tool result
saved alone, two entries and a snapshot) and kills itself with SIGKILL at its k-th request,
before it is sent or once its answer came back, for every k of the run. After each kill, a
new process (store object) must read a State that is what a save that returned left (or a
later save's, never half of one), with every text of its context back; it then saves the
rest of the history on top, and the State reads whole.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.forked import Forker
from tests.helpers import Mode
from tests.s3._refs_child import HISTORY
from tests.s3.helpers import Stores, saves_of_a_killed_child
from tests.s3.test_refs import entries, snapshot_of

pytestmark = [pytest.mark.slow, pytest.mark.crash]

# The requests of the run killed nowhere: 3 of the create (2 entries, the snapshot), 1 of the
# result saved alone (its PUT, which commits it), 3 of the last save; the first store object
# also makes none before. Checked below, so a change of the count shows.
REQUESTS = 7


@pytest.fixture(scope="module")
def forker(moto_url: str) -> Iterator[Forker]:
    """tests.s3._refs_child's processes, forked from one that imported it (tests/forked.py)."""
    server = Forker("tests.s3._refs_child", endpoint=moto_url)
    yield server
    server.close()


# Each driver once and each kill point once (all four pairs cost the suite ~25 s more; the
# protocol's steps are the same in both drivers, tests/plugin checks them batch by batch).
@pytest.mark.parametrize(("mode", "event"), [("sync", "before-send"), ("async", "after-call")])
async def test_a_kill_at_any_request_leaves_a_state_that_loads_and_goes_on(
    mode: Mode, stores: Stores, event: str, forker: Forker
) -> None:
    whole = HISTORY + entries(5, 7)
    unkilled = forker.run(stores.url, stores.bucket, "whole", mode, event, "0")
    assert unkilled.returncode == 0, unkilled.stderr
    expected = ["saved", "2", "saved", "3", "saved", "5", "requests", str(REQUESTS)]
    assert unkilled.stdout.split() == expected, unkilled.stdout
    for k in range(1, REQUESTS + 1):
        state_id = f"k{k}"
        returned = saves_of_a_killed_child(forker, stores, state_id, mode, event, k)
        record = await stores.io(mode).read(state_id)
        if record is None:
            assert returned == [], (k, returned)
            continue
        n = len(record.entries)
        assert record.entries == HISTORY[:n], k
        # The snapshot is that of the last save with one (the entry saved alone is read
        # beyond its count); a save that returned is never lost.
        counted = 5 if n == 5 else 2
        assert record.snapshot == snapshot_of(HISTORY[:counted]), (k, n)
        assert n >= max(returned, default=0), (k, n, returned)

        # Another process goes on from there, and the State reads whole.
        resumer = stores.io(mode)
        assert (await resumer.read(state_id)) is not None
        await resumer.write(state_id, whole[n:], snapshot_of(whole))
        final = await stores.io(mode).read(state_id)
        assert final is not None and final.entries == whole, k
        assert final.snapshot == snapshot_of(whole), k
