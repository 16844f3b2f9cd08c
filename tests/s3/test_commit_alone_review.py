"""Review of layout 3 (saves committed by their entry alone) on moto's HTTP server.

What only a server shows: the metadata a change rides in as real headers, and the real core's
State (``Store.save``/``load``/``list``) on the paths the review found at protocol level in
``tests/plugin/test_commit_alone_review.py`` (mended since, and pinned here).
"""

from __future__ import annotations

from alpineagents import State
from alpineagents.history import USER
from alpineagents_s3._layout import ALONE_META
from tests.helpers import Mode
from tests.s3.helpers import Stores, load, raw_client
from tests.s3.test_commit_alone import entry_metadata


async def test_a_change_with_every_ascii_character_comes_back_the_same(
    mode: Mode, stores: Stores
) -> None:
    io = stores.io(mode)
    state = State("ascii", id="ascii")
    await io.save(state)
    state.data["all"] = "".join(chr(c) for c in range(128))
    state.data["del"] = "\x7f\x7f end \x7f"
    state.append(USER, "one", {})
    await io.save(state)
    meta = entry_metadata(raw_client(stores.url), stores.bucket, "ascii", 1)
    assert ALONE_META in meta
    loaded = await load(stores.new(), mode, "ascii")
    assert loaded.data == state.data and loaded.history == state.history


LONG_TASK = "Summarise the quarterly numbers of every region, then compare them. " * 5


async def test_a_message_repeating_a_long_task_is_saved_without_an_error(
    mode: Mode, stores: Stores
) -> None:
    io = stores.io(mode)
    state = State(LONG_TASK, id="repeat")
    await io.save(state)
    state.append(USER, "first", {})
    await io.save(state)  # the snapshot this store object wrote: the next commits alone
    state.append(USER, LONG_TASK, {})
    await io.save(state)
    loaded = await load(stores.new(), mode, "repeat")
    assert loaded.history == state.history


async def test_list_shows_the_long_task_of_a_state_just_created(mode: Mode, stores: Stores) -> None:
    io = stores.io(mode)
    await io.save(State(LONG_TASK, id="listed"))
    (summary,) = await stores.io(mode).list()
    assert summary.task == LONG_TASK


async def test_a_save_of_data_alone_through_an_equal_store_object_is_what_loads_read(
    mode: Mode, stores: Stores
) -> None:
    io = stores.io(mode)
    state = State("data", id="equal")
    await io.save(state)
    for n in range(1, 4):
        state.data["n"] = n
        state.append(USER, f"message {n}", {})
        await io.save(state)  # committed alone (but maybe the first after the create)
    other = stores.io(mode)  # an equal store object (one per request, say)
    state.data["n"] = 99
    await other.save(state)
    loaded = await load(stores.new(), mode, "equal")
    assert loaded.data == {"n": 99}
