"""A snapshot's model context keeps its long texts in the history entries that hold them.

alpineagents 0.2-0.4 put the model context in the snapshot, so without this each snapshot PUT
sends the conversation again. Written here through the Store contract (``write``/``read``, as
those cores call it) with entries and snapshots of their shape, on moto's server, sync and
async. What could break, and is tried here: a text put back wrong or from the wrong entry;
an entry damaged after the snapshot referred to it; a snapshot read by a store object that
did not write it; a save that failed leaving references to entries another writer replaced;
a packed State whose entry objects are gone; odd texts (non-BMP, escapes, a text that looks
like a reference); a snapshot nested too deep to walk; ``list()``; a newer format.
"""

from __future__ import annotations

import gzip
import json
from typing import Any

import pytest

from alpineagents.testing import StoreIO
from alpineagents_s3 import ConcurrentWriteError, CorruptStateError, SchemaVersionError
from alpineagents_s3._layout import LAYOUT_META
from alpineagents_s3._refs import MIN_LENGTH
from alpineagents_s3.testing import RequestLog
from tests.helpers import Mode, _saved
from tests.s3.helpers import Stores, killed_save, pack, raw_client

LONG = "row,value\n" + "alpha,1\nbeta,2\ngamma,3\n" * 40  # ~900 characters
LONG_JSON = json.dumps(LONG)[1:-1].encode()  # as it stands in a body
ODD = '\U0001f600 \u00e9\u0000"quoted"\\ \u2028 ' * 30 + "end"  # non-BMP, NUL, escapes


def entries(first: int, stop: int, text: str = LONG) -> list[dict[str, Any]]:
    """Entries of alpineagents 0.4's shape: replies and tool results holding long texts."""
    made = []
    for seq in range(first, stop):
        if seq % 2:
            message = {"role": "assistant", "content": [{"type": "text", "text": f"{text}{seq}"}]}
            made.append({"seq": seq, "kind": "reply", "content": {"message": message}})
        else:
            made.append({"seq": seq, "kind": "tool_result", "content": f"{text}{seq}"})
    return made


def context(history: list[dict[str, Any]], *extra: Any) -> list[Any]:
    """The model context alpineagents 0.4 keeps in its snapshot: the messages of ``history``."""
    messages: list[Any] = []
    for entry in history:
        if entry["kind"] == "reply":
            messages.append({**entry["content"]["message"], "tokens": None})
        else:
            block = {
                "type": "tool_result",
                "call_id": f"c{entry['seq']}",
                "content": entry["content"],
            }
            messages.append({"role": "user", "content": [block], "tokens": None})
    return messages + list(extra)


def snapshot_of(history: list[dict[str, Any]], *extra: Any, **fields: Any) -> dict[str, Any]:
    return {
        "v": 3,
        "task": "t",
        "history_len": len(history),
        "context": context(history, *extra),
    } | fields


def stored(stores: Stores, state_id: str) -> tuple[dict[str, str], bytes]:
    """The snapshot object's metadata and body (a layout 2 body: the JSON it holds)."""
    got = raw_client(stores.url).get_object(
        Bucket=stores.bucket, Key=f"runs/{state_id}/snapshot.json"
    )
    body: bytes = got["Body"].read()
    return got["Metadata"], gzip.decompress(body) if body.startswith(b"\x1f\x8b") else body


def put_snapshot(stores: Stores, state_id: str, meta: dict[str, str], value: Any) -> None:
    """Put a snapshot object of layout 2 holding ``value`` behind the store's back."""
    raw_client(stores.url).put_object(
        Bucket=stores.bucket,
        Key=f"runs/{state_id}/snapshot.json",
        Body=gzip.compress(json.dumps(value).encode()),
        Metadata=meta,
    )


async def test_long_texts_of_the_context_are_kept_once_and_come_back_the_same(
    mode: Mode, stores: Stores
) -> None:
    await kept_once(mode, stores)


@pytest.mark.integration
async def test_long_texts_are_kept_once_on_localstack(mode: Mode, localstack: Stores) -> None:
    await kept_once(mode, localstack)


async def kept_once(mode: Mode, stores: Stores) -> None:
    io = stores.io(mode)
    history = entries(0, 6)
    short = {"role": "user", "content": "short text", "tokens": None}
    elsewhere = {"role": "user", "content": "x" * MIN_LENGTH, "tokens": None}  # in no entry
    # The answers copy the last reply; the task (read by list()) is kept as it is.
    snapshot = snapshot_of(history, short, elsewhere, last_answer=f"{LONG}5", task=f"{LONG}3")
    snapshot["finish_answer"] = {"not": f"{LONG}5"}  # a structured answer: its texts too
    await io.write("s", history, snapshot, create=True)

    meta, body = stored(stores, "s")
    assert meta[LAYOUT_META] == "3"
    plain = json.dumps(snapshot, separators=(",", ":")).encode()
    assert len(body) < len(plain) / 3, (len(body), len(plain))
    sent = raw_client(stores.url).head_object(Bucket=stores.bucket, Key="runs/s/snapshot.json")
    assert sent["ContentLength"] < len(body) / 2  # compressed
    assert body.count(LONG_JSON) == 1  # the task's
    assert json.loads(body)["snapshot"]["task"] == f"{LONG}3"
    assert body.count(b"x" * MIN_LENGTH) == 1

    for reader in (io, stores.io(mode)):  # the writer, and another process
        record = await reader.read("s")
        assert record is not None
        assert record.snapshot == snapshot
        assert record.entries == history


async def test_a_snapshot_without_context_is_stored_as_it_is_one_with_short_texts_whole(
    mode: Mode, stores: Stores
) -> None:
    io = stores.io(mode)
    await io.write("plain", entries(0, 2), {"v": 5, "turn": 1}, create=True)
    meta, body = stored(stores, "plain")
    assert meta[LAYOUT_META] == "3" and json.loads(body) == {"v": 5, "turn": 1}

    short = entries(0, 2, text="short ")
    await io.write("short", short, snapshot_of(short), create=True)
    meta, body = stored(stores, "short")
    assert meta[LAYOUT_META] == "3"
    assert json.loads(body) == {"alpineagents-refs": 1, "refs": [], "snapshot": snapshot_of(short)}
    record = await stores.io(mode).read("short")
    assert record is not None and record.snapshot == snapshot_of(short)


async def test_later_saves_refer_to_texts_of_earlier_saves_and_of_what_was_loaded(
    mode: Mode, stores: Stores
) -> None:
    io = stores.io(mode)
    history = entries(0, 4)
    await io.write("grow", history, snapshot_of(history), create=True)
    history += entries(4, 6)
    await io.write("grow", history[4:], snapshot_of(history))
    _, body = stored(stores, "grow")
    assert LONG_JSON not in body  # every text of the context, from both saves

    # Another process loads it, and saves more: the texts its load saw stay referred to.
    other = stores.io(mode)
    assert (await other.read("grow")) is not None
    history += entries(6, 8)
    await other.write("grow", history[6:], snapshot_of(history))
    _, body = stored(stores, "grow")
    assert LONG_JSON not in body
    record = await stores.io(mode).read("grow")
    assert record is not None and record.snapshot == snapshot_of(history)


async def test_a_text_saved_alone_then_counted_is_referred_to(mode: Mode, stores: Stores) -> None:
    """alpineagents 0.4 saves a tool result alone, then the snapshot that counts it."""
    io = stores.io(mode)
    history = entries(0, 2)
    await io.write("alone", history, snapshot_of(history), create=True)
    history += entries(2, 3)
    await io.write("alone", history[2:], None)
    await io.write("alone", [], snapshot_of(history))
    _, body = stored(stores, "alone")
    assert LONG_JSON not in body
    # The same, by a process that loaded the State first.
    other = stores.io(mode)
    record = await other.read("alone")
    assert record is not None and record.snapshot == snapshot_of(history)
    history += entries(3, 4)
    await other.write("alone", history[3:], None)
    await other.write("alone", [], snapshot_of(history))
    _, body = stored(stores, "alone")
    assert LONG_JSON not in body
    record = await stores.io(mode).read("alone")
    assert record is not None and record.snapshot == snapshot_of(history)


async def test_odd_texts_and_lookalikes_come_back_the_same(mode: Mode, stores: Stores) -> None:
    io = stores.io(mode)
    history = entries(0, 4, text=ODD)
    lookalike = {"alpineagents-refs": 1, "refs": [], "snapshot": {}}
    snapshot = snapshot_of(history, lookalike, "", [f"{ODD}1", f"{ODD}1"], {"": f"{ODD}2"})
    snapshot = {"alpineagents-refs": "a field of the core's own"} | snapshot
    await io.write("odd", history, snapshot, create=True)
    record = await stores.io(mode).read("odd")
    assert record is not None and record.snapshot == snapshot
    assert stored(stores, "odd")[0][LAYOUT_META] == "3"

    # Snapshots of the core's own that look like what a layout 2 body holds.
    for state_id, plain in [
        ("like", {"alpineagents-refs": 1, "refs": [], "snapshot": {}, "context": []}),
        ("like-plain", {"alpineagents-refs": 1, "refs": [], "snapshot": {}}),
    ]:
        await io.write(state_id, entries(0, 1), plain, create=True)
        record = await stores.io(mode).read(state_id)
        assert record is not None and record.snapshot == plain
    assert stored(stores, "like-plain")[0][LAYOUT_META] == "3"


async def test_a_context_nested_too_deep_to_walk_is_stored_whole(
    mode: Mode, stores: Stores
) -> None:
    io = stores.io(mode)
    history = entries(0, 2)
    deep: Any = f"{LONG}1"
    for _ in range(200):
        deep = [deep]
    snapshot = snapshot_of(history, deep)
    await io.write("deep", history, snapshot, create=True)
    record = await stores.io(mode).read("deep")
    assert record is not None and record.snapshot == snapshot


async def test_a_bad_value_in_the_context_is_refused_before_any_request(
    mode: Mode, stores: Stores
) -> None:
    log = RequestLog()
    io = stores.io(mode, event_hooks=log.hooks)
    history = entries(0, 2)
    with pytest.raises(ValueError, match="the snapshot of 'nan' cannot be saved"):
        await io.write("nan", history, snapshot_of(history, {"x": float("nan")}), create=True)
    with pytest.raises(ValueError, match="lone surrogate"):
        await io.write("nan", history, snapshot_of(history, "\ud800"), create=True)
    assert log.requests == []


async def test_an_entry_damaged_after_the_snapshot_referred_to_it_fails_the_load_by_name(
    mode: Mode, stores: Stores
) -> None:
    io = stores.io(mode)
    history = entries(0, 4)
    await io.write("dmg", history, snapshot_of(history), create=True)
    client = raw_client(stores.url)
    meta = stored(stores, "dmg")[0]
    key = f"runs/dmg/entries/{meta['alpineagents-generation']}/{2:010d}.json"
    head = client.head_object(Bucket=stores.bucket, Key=key)
    damaged = {**history[2], "content": f"{LONG}other"}
    client.put_object(
        Bucket=stores.bucket, Key=key, Body=json.dumps(damaged).encode(), Metadata=head["Metadata"]
    )
    with pytest.raises(
        CorruptStateError, match=r"snapshot\.json keeps the text at context/2/.* history entry 2"
    ):
        await stores.io(mode).read("dmg")


async def test_a_damaged_or_newer_reference_format_is_named(mode: Mode, stores: Stores) -> None:
    io = stores.io(mode)
    history = entries(0, 2)
    await io.write("fmt", history, snapshot_of(history), create=True)
    client = raw_client(stores.url)
    meta, body = stored(stores, "fmt")
    key = "runs/fmt/snapshot.json"
    parsed = json.loads(body)

    put_snapshot(stores, "fmt", meta, {**parsed, "alpineagents-refs": 2})
    with pytest.raises(SchemaVersionError, match="references of format 2, newer"):
        await stores.io(mode).read("fmt")

    for refs in ([["context", 0]], [[["context"], -1, [], "x"]], "x"):
        put_snapshot(stores, "fmt", meta, {**parsed, "refs": refs})
        with pytest.raises(CorruptStateError, match=r"fmt/snapshot\.json"):
            await stores.io(mode).read("fmt")

    ref = [["context", 0, "content", 0, "content"], 9, ["content"], "0" * 16]
    put_snapshot(stores, "fmt", meta, {**parsed, "refs": [ref]})
    with pytest.raises(CorruptStateError, match="history entry 9, but the State's history has 2"):
        await stores.io(mode).read("fmt")

    # Layout 2 bodies that do not inflate, or are not compressed at all.
    whole = gzip.compress(json.dumps(parsed).encode())
    for damaged, words in [
        (whole[:-6], "cut short"),
        (whole + b"more", "followed by more"),
        (whole[:12] + bytes(20) + whole[32:], "damaged compressed snapshot"),
        (json.dumps(parsed).encode(), "layout 2, but not compressed"),
    ]:
        # (Layout 3 reads an uncompressed body as the core's own snapshot, as it is.)
        layout = "2" if words.startswith("layout 2") else meta[LAYOUT_META]
        metadata = {**meta, LAYOUT_META: layout}
        client.put_object(Bucket=stores.bucket, Key=key, Body=damaged, Metadata=metadata)
        with pytest.raises(CorruptStateError, match=words):
            await stores.io(mode).read("fmt")


async def test_a_refused_save_leaves_no_reference_to_the_winners_entries(
    mode: Mode, stores: Stores
) -> None:
    """Two processes save entry 4 on; the loser loads the winner's State and saves on it."""
    first, second = stores.io(mode), stores.io(mode)
    history = entries(0, 4)
    await first.write("race", history, snapshot_of(history), create=True)
    assert (await second.read("race")) is not None
    won = history + entries(4, 6, text="winner ")
    await first.write("race", won[4:], snapshot_of(won))
    lost = history + entries(4, 6)
    with pytest.raises(ConcurrentWriteError):
        await second.write("race", lost[4:], snapshot_of(lost))
    # The loser loads again and continues: its snapshot names only what the history holds.
    record = await second.read("race")
    assert record is not None and record.entries == won
    more = won + entries(6, 8)
    await second.write("race", more[6:], snapshot_of(more))
    record = await stores.io(mode).read("race")
    assert record is not None and record.snapshot == snapshot_of(more)


async def test_a_packed_state_without_its_entry_objects_loads_the_same(
    mode: Mode, stores: Stores
) -> None:
    io = stores.io(mode)
    history = entries(0, 40)
    await io.write("packed", history, snapshot_of(history), create=True)
    await pack(stores.new(), mode, "packed", remove_entries=True)
    record = await stores.io(mode).read("packed")
    assert record is not None and record.snapshot == snapshot_of(history)


async def test_list_reads_snapshots_with_references(mode: Mode, stores: Stores) -> None:
    io = stores.io(mode)
    from alpineagents import State

    state = State("listed task", id="listed")
    core = _saved(state).snapshot
    history = entries(0, 4)
    await io.write("listed", history, {**core, "context": context(history)}, create=True)
    assert stored(stores, "listed")[0][LAYOUT_META] == "3"
    (summary,) = await stores.io(mode).list()
    assert (summary.id, summary.task) == ("listed", "listed task")


async def test_a_claim_puts_the_snapshot_with_references_again_and_it_still_loads(
    mode: Mode, stores: Stores
) -> None:
    await claimed(mode, stores)


@pytest.mark.integration
async def test_a_claim_of_a_layout_2_snapshot_on_localstack(mode: Mode, localstack: Stores) -> None:
    await claimed(mode, localstack)


async def claimed(mode: Mode, stores: Stores) -> None:
    """A process killed mid-save left entry 5 (not 4): the next save claims, then fills."""
    io = stores.io(mode)
    history = entries(0, 4)
    await io.write("claim", history, snapshot_of(history), create=True)
    killed_save(raw_client(stores.url), stores.bucket, "claim", 5)
    log = RequestLog()
    resumed = stores.io(mode, event_hooks=log.hooks)
    record = await resumed.read("claim")
    assert record is not None and record.snapshot == snapshot_of(history)
    log.clear()
    more = history + entries(4, 7)
    await resumed.write("claim", more[4:], snapshot_of(more))
    puts = [r for r in log.requests if r.kind == "PUT" and r.path.endswith("snapshot.json")]
    assert len(puts) == 2, log.requests  # the claim, then the save's own
    record = await stores.io(mode).read("claim")
    assert record is not None and record.entries == more
    assert record.snapshot == snapshot_of(more)


async def test_what_a_store_object_keeps_of_the_texts_is_bounded(
    mode: Mode, stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a compaction it keeps only what the context holds; and only the last States'."""
    from alpineagents_s3 import _versions

    log = RequestLog()
    store = stores.new(event_hooks=log.hooks)
    io = StoreIO(store, mode)
    ledger = store._ledger
    history = entries(0, 20)
    await io.write("long", history, snapshot_of(history), create=True)
    assert len(ledger.texts["long"].where) == 20
    # A compaction: the context is a summary and the last two messages.
    history += entries(20, 22)
    summary = {"role": "user", "content": "summary " * 50, "tokens": None}
    await io.write("long", history[20:], snapshot_of(history[20:], summary))
    assert sorted(seq for seq, _ in ledger.texts["long"].where.values()) == [20, 21]
    record = await stores.io(mode).read("long")
    assert record is not None and record.snapshot == snapshot_of(history[20:], summary)

    monkeypatch.setattr(_versions, "TEXT_STATES", 3)
    for k in range(5):
        await io.write(f"s{k}", entries(0, 2), snapshot_of(entries(0, 2)), create=True)
    assert list(ledger.texts) == ["s2", "s3", "s4"]
    # A State whose texts were forgotten: its save GETs the snapshot first, which says what
    # the history holds, and refers to every text all the same.
    log.clear()
    more = entries(0, 4)
    await io.write("s0", more[2:], snapshot_of(more))
    assert log.counts() == {"GET": 1, "PUT": 3}, log.requests
    record = await stores.io(mode).read("s0")
    assert record is not None and record.snapshot == snapshot_of(more)
    _, body = stored(stores, "s0")
    assert len(json.loads(body)["refs"]) == 4 and body.count(LONG_JSON) == 0
