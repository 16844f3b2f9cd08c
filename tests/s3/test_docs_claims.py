"""docs/s3.md, checked sentence by sentence: "Packed segments", "Lifecycle rules", "What it
costs", "Two processes, one State", "Serverless and event loops", "Errors" and "Limits".

Each test names the sentence it checks, and asserts what it says: the number and kinds of
requests (``RequestLog``), the rounds of requests (``Rounds``, tests/s3/test_packed.py), the
warning on the ``alpineagents_s3`` logger, the error and what its message names. The claims
that other tests already pin closely are left to them. Where the review found the code doing
something other than the sentence said, the sentence or the code was corrected (an archived
object was reported as a permission problem; the sizes of segments, the warm load's 32
entries, the first save's LIST and the unknown id's message were not as written).

On moto's HTTP server; through the sync API unless a path differs in the async one.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from alpineagents import Agent, ModelRequest, State
from alpineagents import StateNotFoundError as CoreStateNotFoundError
from alpineagents.errors import StoreError
from alpineagents.history import TOOL_RESULT, USER
from alpineagents.testing import FunctionModel, call
from alpineagents_s3 import (
    BucketNotFoundError,
    ConcurrentWriteError,
    ConditionalWritesUnsupportedError,
    CorruptStateError,
    S3AccessDeniedError,
    S3Store,
    S3StoreError,
    SchemaVersionError,
    StateExistsError,
    StateNotFoundError,
    StoreClosedError,
)
from alpineagents_s3._codec import dumps, dumps_segment
from alpineagents_s3._layout import ENTRIES_META, GENERATION_META
from alpineagents_s3._packing import SEGMENT_MAX
from alpineagents_s3._segments import Known, Segment
from alpineagents_s3._versions import Ledger
from alpineagents_s3.testing import RequestLog
from tests.helpers import Mode, entry_dicts, snapshot_dict, tool_turn
from tests.s3.helpers import Refuse, Stores, entry_key, killed_save, load, run, save
from tests.s3.test_packed import Rounds

if TYPE_CHECKING:
    from types_boto3_s3 import S3Client

pytestmark = pytest.mark.slow

LOGGER = "alpineagents_s3"
KIB = 1024
# One tool result of ~400 KB: three of them are over a segment's 1 MiB cut.
HUGE = "x" * 400_000


def keys_under(moto: S3Client, bucket: str, prefix: str) -> list[str]:
    """Every key under ``prefix``, all pages."""
    keys: list[str] = []
    for page in moto.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys += [item["Key"] for item in page.get("Contents", [])]
    return keys


def segment_keys(moto: S3Client, bucket: str, state_id: str) -> list[str]:
    return keys_under(moto, bucket, f"runs/{state_id}/packed/")


def span(key: str) -> tuple[int, int]:
    start, end = key.rsplit("/", 1)[1].removesuffix(".json").split("-")
    return int(start), int(end)


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING
    ]


def results(state: State, count: int, text: str = "since", first: int = 0) -> None:
    """Append ``count`` tool results (short ones unless ``text`` is long)."""
    for n in range(first, first + count):
        state.append(TOOL_RESULT, f"{text} {n}", {"call_id": f"c{n}", "name": "lookup"})


# Packed segments ---------------------------------------------------------------------------


def test_pack_costs_a_load_one_put_per_segment_and_one_head(stores: Stores) -> None:
    """ "`pack` costs a load of the State, one PUT per new segment, one HEAD of the snapshot
    (...), and, with `remove_entries`, one LIST and one `DeleteObjects` per 1,000 entries";
    "Each segment is written once with `If-None-Match: *`"; entries are removed "after the
    segment that covers them is stored"."""
    state = State("cost of a pack", id="pack-cost")
    run(state, 5)  # 11 entries, one segment
    stores.new().save(state)
    log = RequestLog()
    reader = stores.new(event_hooks=log.hooks)
    reader.load(state.id)
    a_load = log.counts()
    assert a_load == {"GET": 12, "LIST": 2}, a_load

    for remove, extra in ((False, {}), (True, {"LIST": 1, "DELETE": 1})):
        other = State("cost of a pack", id=f"pack-cost-{remove:d}")
        run(other, 5)
        stores.new().save(other)
        log = RequestLog()
        packed = stores.new(event_hooks=log.hooks).pack(other.id, remove_entries=remove)
        assert len(packed.written) == 1
        expected = a_load + Counter({"PUT": 1, "HEAD": 1}) + Counter(extra)
        assert log.counts() == expected, (remove, log.counts())
        (put,) = [r for r in log.requests if r.kind == "PUT"]
        assert "/packed/" in put.path and put.condition == "If-None-Match: *"
        order = [r.kind for r in log.requests if r.kind in ("PUT", "HEAD", "DELETE")]
        assert order == (["PUT", "HEAD", "DELETE"] if remove else ["PUT", "HEAD"]), order


def test_remove_entries_lists_and_deletes_per_1000_entries(stores: Stores, moto: S3Client) -> None:
    """ "with `remove_entries`, one LIST and one `DeleteObjects` per 1,000 entries": a State of
    1,501 entries already packed (entry objects kept) costs 2 of each to strip."""
    from tests.s3.test_store_object import _seed

    total = 1501
    entries = entry_dicts(0, total)
    store = stores.new()
    store.write("big", entries[:1], snapshot_dict("big", 1), create=True)
    generation = moto.head_object(Bucket=stores.bucket, Key="runs/big/snapshot.json")["Metadata"][
        GENERATION_META
    ]
    bodies = [dumps(e, f"entry {n}") for n, e in enumerate(entries)]
    seeded: dict[str, tuple[bytes, dict[str, str]]] = {
        f"runs/big/entries/{generation}/{n:010d}.json": (bodies[n], {}) for n in range(1, total)
    }
    seeded[f"runs/big/packed/{generation}/{0:010d}-{total:010d}.json"] = (
        dumps_segment(0, bodies),
        {},
    )
    _seed(stores.bucket, seeded)
    head = moto.head_object(Bucket=stores.bucket, Key="runs/big/snapshot.json")
    snap = moto.get_object(Bucket=stores.bucket, Key="runs/big/snapshot.json")["Body"].read()
    extra: dict[str, Any] = {}
    if head.get("ContentEncoding"):
        extra["ContentEncoding"] = head["ContentEncoding"]
    moto.put_object(
        Bucket=stores.bucket,
        Key="runs/big/snapshot.json",
        Body=snap,
        Metadata={**head["Metadata"], ENTRIES_META: str(total)},
        **extra,
    )
    log = RequestLog()
    reader = stores.new(event_hooks=log.hooks)
    assert reader.read("big") is not None
    a_load = log.counts()
    log = RequestLog()
    packed = stores.new(event_hooks=log.hooks).pack("big", remove_entries=True)
    assert packed.written == () and len(packed.removed) == total
    assert log.counts() == a_load + Counter({"HEAD": 1, "LIST": 2, "DELETE": 2}), log.counts()
    assert keys_under(moto, stores.bucket, "runs/big/entries/") == []


def test_what_was_saved_since_the_last_pack_is_cut_in_segments_of_about_1_mib(
    stores: Stores, moto: S3Client
) -> None:
    """ "`pack` writes what was saved since the last pack as new segments of about 1 MiB each
    (one, when less)": ~1.6 MB of entries, two segments, the first of 1 MiB or more."""
    state = State("large", id="one-segment")
    results(state, 4, HUGE)  # ~1.6 MB
    stores.new().save(state)
    packed = stores.new().pack(state.id)
    sizes = [o.size for o in stores.new().objects(state.id) if o.kind == "segment"]
    assert len(packed.written) == 2 and max(sizes) >= SEGMENT_MAX > min(sizes), sizes


def test_the_last_segment_under_1_mib_no_larger_than_the_new_ones_is_taken_in(
    stores: Stores, moto: S3Client
) -> None:
    """ "taking in the last segments under 1 MiB when they are no larger than what it writes":
    a segment of ~0.8 MB, then ~1.2 MB saved since: the next pack takes it in; a full
    segment (1 MiB or more) is kept."""
    state = State("large", id="taken-in")
    results(state, 2, HUGE)  # ~0.8 MB
    writer = stores.new()
    writer.save(state)
    (first,) = stores.new().pack(state.id).written
    results(state, 3, HUGE, first=2)  # ~1.2 MB more
    writer.save(state)
    packed = stores.new().pack(state.id)
    assert first in packed.removed, ([span(k) for k in packed.written], packed.removed)
    full = [k for k in packed.written if span(k)[0] == 0]
    results(state, 3, HUGE, first=5)
    writer.save(state)
    again = stores.new().pack(state.id)
    assert full and not set(full) & set(again.removed), again.removed


def test_the_next_pack_writes_a_damaged_segment_again_with_if_match(
    stores: Stores, moto: S3Client, caplog: pytest.LogCaptureFixture
) -> None:
    """ "A damaged segment is skipped with a warning on the `alpineagents_s3` logger, and its
    entries are read from their own objects. The next pack writes it again from them (over
    the damaged object, `If-Match` on its ETag)." Through ``pack()``, not ``auto_pack``."""
    state = State("damaged", id="damaged")
    run(state, 6)
    stores.new().save(state)
    (key,) = stores.new().pack(state.id).written
    whole = moto.get_object(Bucket=stores.bucket, Key=key)["Body"].read()
    etag = moto.put_object(Bucket=stores.bucket, Key=key, Body=whole[:-40])["ETag"]
    with caplog.at_level(logging.WARNING, LOGGER):
        assert stores.new().load(state.id).history == state.history
    (warned,) = warnings_of(caplog)
    assert key in warned and "own objects instead" in warned
    caplog.clear()
    log = RequestLog()
    with caplog.at_level(logging.WARNING, LOGGER):
        packed = stores.new(event_hooks=log.hooks).pack(state.id)
    assert packed.written == (key,)
    puts = [(r.path, r.condition) for r in log.requests if r.kind == "PUT"]
    assert puts[-1] == (f"/{stores.bucket}/{key}", f"If-Match: {etag}"), puts
    assert moto.get_object(Bucket=stores.bucket, Key=key)["Body"].read() == whole
    assert any(key in m and "packed again" in m for m in warnings_of(caplog))
    caplog.clear()
    with caplog.at_level(logging.WARNING, LOGGER):
        assert stores.new().load(state.id).history == state.history
    assert warnings_of(caplog) == []


def test_deleting_a_packed_state_removes_its_segments(stores: Stores, moto: S3Client) -> None:
    """ "**Deleting a State** removes its segments with everything else"."""
    state = State("gone", id="packed-gone")
    run(state, 4)
    store = stores.new()
    store.save(state)
    store.pack(state.id)
    run(state, 1, first=4)
    store.save(state)
    assert segment_keys(moto, stores.bucket, state.id)
    stores.new().delete(state.id)
    assert keys_under(moto, stores.bucket, f"runs/{state.id}/") == []


def test_up_to_100_entries_since_the_pack_are_fetched_by_key_in_2_rounds(stores: Stores) -> None:
    """ "then the segments, with ... the entries the snapshot counts after them (up to 100 of
    those, fetched by key ...)"; "2 rounds of requests when the snapshot counts every entry
    saved since the pack, 3 otherwise": 100 entries since is 2 rounds, 101 is 3."""
    state = State("since", id="since-100")
    run(state, 2)  # 5 entries
    writer = stores.new()
    writer.save(state)
    stores.new().pack(state.id, remove_entries=True)
    results(state, 100)
    writer.save(state)
    for since, rounds in ((100, 2), (101, 3)):
        if since == 101:
            results(state, 1, first=100)
            writer.save(state)
        log = RequestLog()
        reader = stores.new(event_hooks=log.hooks)
        counted = Rounds(reader)
        assert reader.load(state.id).history == state.history
        assert len(counted.batches) == rounds, (since, counted.batches)
        # Round 2: the segment and (up to) 100 entries by key, and a listing when the first
        # page of the entries was truncated.
        assert 1 + 100 <= counted.batches[1] <= 1 + 100 + 1, counted.batches
        gets = Counter(r.path for r in log.requests if r.kind == "GET")
        assert len(gets) == 1 + 1 + since and set(gets.values()) == {1}


async def warm_with_own_saves(stores: Stores, since: int) -> tuple[S3Store, RequestLog, State]:
    """A store object that loaded a packed State, then saved ``since`` entries itself."""
    state = State("warm", id=f"warm-{since}")
    run(state, 5)
    stores.new().save(state)
    stores.new().pack(state.id)
    log = RequestLog()
    store = stores.new(event_hooks=log.hooks)
    loaded = store.load(state.id)
    results(loaded, since)
    store.save(loaded)
    log.clear()
    return store, log, loaded


async def test_a_warm_load_gets_up_to_32_final_entries_with_the_snapshot(
    stores: Stores,
) -> None:
    """ "Its next load GETs those segments and up to 32 entries it knows are final (below that
    count, or below the count of the last snapshot it saved itself) together with the
    snapshot, and lists the segments and the entries after the known ones in the same
    round"."""
    store, log, loaded = await warm_with_own_saves(stores, 40)
    counted = Rounds(store)
    assert store.load(loaded.id).history == loaded.history
    # The segment, the snapshot, two listings, and 32 of the 40 entries.
    assert counted.batches[0] == 1 + 1 + 2 + 32, counted.batches
    gets = Counter(r.path for r in log.requests if r.kind == "GET" and "/entries/" in r.path)
    assert len(gets) == 40 and set(gets.values()) == {1}, gets  # the other 8 after
    # 32 of them: all in round 1, the only round.
    store, _, loaded = await warm_with_own_saves(stores, 32)
    counted = Rounds(store)
    assert store.load(loaded.id).history == loaded.history
    assert counted.batches == [1 + 1 + 2 + 32], counted.batches


@pytest.mark.parametrize(("since", "rounds"), [(32, 1), (40, 2)])
async def test_a_state_saved_since_only_through_this_store_object_loads_in_1_round(
    stores: Stores, since: int, rounds: int
) -> None:
    """ "a State packed and saved since only through this store object (up to 32 entries since
    the pack) loads in 1 round, and ... more than 32, add one"."""
    store, _, loaded = await warm_with_own_saves(stores, since)
    counted = Rounds(store)
    assert store.load(loaded.id).history == loaded.history
    assert len(counted.batches) == rounds, counted.batches


def test_a_store_object_keeps_the_chains_of_the_256_states_it_read_last() -> None:
    """ "It keeps the chain of segments its last load read ..., for the 256 States it read
    last"."""
    ledger = Ledger()
    chain = (Segment("k", 0, 1, 1),)
    for n in range(257):
        ledger.know_chain(f"s{n}", Known("g", chain, 1))
    assert len(ledger.chains) == 256
    assert "s0" not in ledger.chains and "s1" in ledger.chains and "s256" in ledger.chains


async def rounds_of_an_auto_pack(
    stores: Stores, state_id: str
) -> tuple[list[int], list[int], list[str], S3Store]:
    """The rounds of a plain load, those of a load with ``auto_pack=16`` after it, the kinds
    of the latter's requests, and its store."""
    reader = stores.new()
    plain = Rounds(reader)
    await load(reader, "async", state_id)
    log = RequestLog()
    packing = stores.new(auto_pack=16, event_hooks=log.hooks)
    counted = Rounds(packing)
    await load(packing, "async", state_id)
    return plain.batches, counted.batches, [r.kind for r in log.requests], packing


async def test_the_load_that_packs_takes_2_rounds_more_and_3_when_it_merges(
    stores: Stores,
) -> None:
    """ "The load that packs takes 2 round trips more (the segment, then the HEAD), and 3 when
    it merges segments (removing the merged ones)"."""
    state = State("auto", id="auto-rounds")
    run(state, 8)  # 17 entries
    writer = stores.new()
    writer.save(state)
    plain, counted, kinds, packing = await rounds_of_an_auto_pack(stores, state.id)
    assert len(counted) == len(plain) + 2, (plain, counted)
    assert counted[-2:] == [1, 1]  # the segment PUT, then the HEAD
    assert kinds[-2:] == ["PUT", "HEAD"]
    (small,) = segment_keys_of(packing, state.id)

    run(state, 8, first=8)  # 16 more: the small segment is taken in
    writer.save(state)
    plain, counted, kinds, packing = await rounds_of_an_auto_pack(stores, state.id)
    assert stores.new().load(state.id).history == state.history
    assert len(counted) == len(plain) + 3, (plain, counted)
    assert kinds[-3:] == ["PUT", "HEAD", "DELETE"]
    assert small not in segment_keys_of(packing, state.id)


def segment_keys_of(store: S3Store, state_id: str) -> list[str]:
    return [o.key for o in store.objects(state_id) if o.kind == "segment"]


async def test_a_pack_failing_because_the_state_was_deleted_is_a_warning(
    mode: Mode, stores: Stores, moto: S3Client, caplog: pytest.LogCaptureFixture
) -> None:
    """ "The load returns the State it read whatever the pack does: a pack that fails (...,
    the State deleted meanwhile) is logged as a warning on the `alpineagents_s3` logger and
    leaves the State as it was": here, nothing (the State is gone, and so is its segment)."""
    state = State("deleted meanwhile", id="auto-deleted")
    run(state, 10)
    stores.new().save(state)
    deleter = stores.new()
    deleted: list[bool] = []

    def delete_first(**kwargs: Any) -> None:  # between the segment PUT and the HEAD
        if not deleted:
            deleted.append(True)
            deleter.delete(state.id)

    reader = stores.new(auto_pack=16, event_hooks={"before-call.s3.HeadObject": delete_first})
    with caplog.at_level(logging.WARNING, LOGGER):
        loaded = await load(reader, mode, state.id)
    assert deleted and loaded.history == state.history
    (warned,) = warnings_of(caplog)
    assert "could not pack" in warned and f"s3://{stores.bucket}/runs/{state.id}/" in warned
    assert "deleted" in warned
    assert keys_under(moto, stores.bucket, f"runs/{state.id}/") == []


# Lifecycle rules ---------------------------------------------------------------------------


def copy_to_class(moto: S3Client, bucket: str, key: str, storage_class: str) -> None:
    """What a lifecycle transition does to one object: its class changes, nothing else."""
    moto.copy_object(
        Bucket=bucket,
        Key=key,
        CopySource={"Bucket": bucket, "Key": key},
        StorageClass=storage_class,  # type: ignore[arg-type]
        MetadataDirective="COPY",
    )


def test_infrequent_access_and_instant_retrieval_objects_stay_readable(
    stores: Stores, moto: S3Client
) -> None:
    """ "S3 Standard-IA, One Zone-IA, Glacier Instant Retrieval and Intelligent-Tiering stay
    readable": every object of a packed State moved to one of them, in turn."""
    state = State("transitioned", id="transitioned")
    run(state, 3)
    store = stores.new()
    store.save(state)
    store.pack(state.id)
    results(state, 2)
    store.save(state)
    classes = ["STANDARD_IA", "ONEZONE_IA", "GLACIER_IR", "INTELLIGENT_TIERING"]
    keys = keys_under(moto, stores.bucket, f"runs/{state.id}/")
    for n, key in enumerate(keys):
        copy_to_class(moto, stores.bucket, key, classes[n % len(classes)])
    loaded = stores.new().load(state.id)
    assert loaded.history == state.history and loaded.data == state.data


def test_an_archived_object_fails_the_load_with_s3storeerror_naming_it(
    stores: Stores, moto: S3Client
) -> None:
    """ "Glacier Flexible Retrieval and Deep Archive objects must be restored before a `load`
    can read them (until then it fails with `S3StoreError`)"; every error "names the bucket
    and key"."""
    for storage_class in ("GLACIER", "DEEP_ARCHIVE"):
        state = State("archived", id=f"archived-{storage_class.lower()}")
        results(state, 2)
        stores.new().save(state)
        key = entry_key(moto, stores.bucket, state.id, 2)
        copy_to_class(moto, stores.bucket, key, storage_class)
        with pytest.raises(S3StoreError) as raised:
            stores.new().load(state.id)
        assert f"s3://{stores.bucket}/{key}" in str(raised.value)
        assert "InvalidObjectState" in str(raised.value)


def test_an_archived_object_is_not_reported_as_a_permission_problem(
    stores: Stores, moto: S3Client
) -> None:
    """ "must be restored before a `load` can read them"; "Every error ... says what to do".
    S3 answers 403 ``InvalidObjectState``: it was an ``S3AccessDeniedError`` telling to check
    the credentials and policies."""
    state = State("archived", id="archived-advice")
    results(state, 1)
    stores.new().save(state)
    copy_to_class(moto, stores.bucket, entry_key(moto, stores.bucket, state.id, 1), "GLACIER")
    with pytest.raises(S3StoreError) as raised:
        stores.new().load(state.id)
    assert not isinstance(raised.value, PermissionError), raised.value
    assert "must be restored" in str(raised.value) and "restore-object" in str(raised.value)


def test_a_state_whose_snapshot_expired_first_is_not_listed(stores: Stores, moto: S3Client) -> None:
    """ "once its snapshot is gone the State is no longer listed" (and its `load` fails):
    a lifecycle rule removed the snapshot before the entries."""
    for state_id in ("expiring", "kept"):
        stores.new().save(State("archive", id=state_id))
    moto.delete_object(Bucket=stores.bucket, Key="runs/expiring/snapshot.json")
    store = stores.new()
    assert [s.id for s in store.list()] == ["kept"]
    with pytest.raises(CoreStateNotFoundError, match="expiring"):
        store.load("expiring")


def test_early_entries_expired_first_fail_the_load_with_corruptstateerror(
    stores: Stores, moto: S3Client
) -> None:
    """ "the early entries of a long-running conversation would expire first and its `load`
    then fail with `CorruptStateError` (the snapshot accounts for entries that are gone)"."""
    state = State("long", id="expired-early")
    results(state, 4)
    stores.new().save(state)
    for seq in (0, 1):
        moto.delete_object(Bucket=stores.bucket, Key=entry_key(moto, stores.bucket, state.id, seq))
    with pytest.raises(CorruptStateError) as raised:
        stores.new().load(state.id)
    message = str(raised.value)
    assert f"s3://{stores.bucket}/runs/{state.id}/snapshot.json accounts for 5" in message
    assert "holds 0 in a row" in message


# What it costs -----------------------------------------------------------------------------

REPLY = "Here is what I found."


def query(q: int) -> str:
    """Look a number up."""
    return f"value {q}"


def calling(tools: int) -> FunctionModel:
    """A model that calls ``query`` ``tools`` times in one response, then replies."""
    turn = [False]

    def respond(request: ModelRequest) -> str | list[dict[str, Any]]:
        turn[0] = not turn[0]
        if turn[0]:
            return [
                {"type": "text", "text": "Looking."},
                *(call("query", q=n) for n in range(tools)),
            ]
        return REPLY

    return FunctionModel(respond)


def put_targets(log: RequestLog) -> list[str]:
    return [
        "snapshot" if r.path.endswith("/snapshot.json") else "entry"
        for r in log.requests
        if r.kind == "PUT"
    ]


@pytest.mark.parametrize("tools", [1, 2])
def test_a_tool_using_turn_save_by_save(stores: Stores, tools: int) -> None:
    """The table: the person's message "2 PUT (entry, then snapshot)", a model response that
    calls a tool "1 PUT", a tool result "1 PUT", after the tools "none", the reply "2 PUT
    (entry, then snapshot)"; "**6 PUT, 2 of them the snapshot (1 more PUT per further tool
    call); no GET, HEAD or LIST**"."""
    log = RequestLog()
    agent = Agent(model=calling(tools), tools=[query], store=stores.new(event_hooks=log.hooks))
    state = State("Look it up", id=f"turn-{tools}")
    agent.run(state)
    log.clear()
    state.add_user_message("And again?")
    assert agent.run(state) == REPLY
    assert log.counts() == {"PUT": 5 + tools}, log.counts()
    expected = ["entry", "snapshot", "entry", *["entry"] * tools, "entry", "snapshot"]
    assert put_targets(log) == expected
    assert stores.new().load(state.id).history == state.history


async def test_the_first_save_of_a_store_object_that_never_read_the_state(
    mode: Mode, stores: Stores
) -> None:
    """ "The first save of a State through a store object that has neither loaded nor saved it
    adds 1 GET (the snapshot) and, with entries, 1 LIST, both in one round"."""
    state = State("first save", id="first-save")
    stores.new().save(state)
    copy = stores.new().load(state.id)
    tool_turn(copy, 1)
    log = RequestLog()
    writer = stores.new(event_hooks=log.hooks)
    counted = Rounds(writer)
    await save(writer, mode, copy)
    assert log.counts() == {"GET": 1, "LIST": 1, "PUT": 3}, log.counts()
    assert counted.batches[0] == 2, counted.batches  # the GET and the LIST together


def test_the_first_save_without_entries_of_a_store_object_adds_a_get_and_a_list(
    stores: Stores,
) -> None:
    """ "adds 1 GET (the snapshot) and 1 LIST: ... for a save of `data` alone, of the entries
    committed alone after that snapshot, a round after it"."""
    state = State("first save", id="first-save-data")
    stores.new().save(state)
    copy = stores.new().load(state.id)
    copy.data = {"only": "data"}
    log = RequestLog()
    stores.new(event_hooks=log.hooks).save(copy)
    assert [r.kind for r in log.requests] == ["GET", "LIST", "PUT"], log.requests


def test_a_load_lists_orphans_and_does_not_fetch_them(stores: Stores, moto: S3Client) -> None:
    """ "A load of a State with *n* entries, never packed, is 1 LIST of the segments, 1 LIST of
    the first 100 entries ..., and *n* + 1 GETs (...) (orphans are listed, not fetched)"."""
    state = State("orphans", id="orphans")
    results(state, 2)  # 3 entries
    stores.new().save(state)
    killed_save(moto, stores.bucket, state.id, 5, 6)  # beyond a gap at 3-4
    log = RequestLog()
    assert stores.new(event_hooks=log.hooks).load(state.id).history == state.history
    assert log.counts() == {"GET": 3 + 1, "LIST": 2}, log.counts()
    assert not [
        r for r in log.requests if r.kind == "GET" and r.path.endswith(("5.json", "6.json"))
    ]


# Two processes, one State ------------------------------------------------------------------


def test_a_save_of_data_alone_from_an_older_copy_after_a_load_replaces_the_snapshot(
    stores: Stores,
) -> None:
    """The limit: "after a load through the same store object, such a save of the older copy
    replaces the other process's snapshot" (a save that adds no history entry)."""
    ours = stores.new()
    older = State("limit", id="limit")
    ours.save(older)
    theirs = stores.new().load(older.id)
    theirs.data = {"by": "them"}
    stores.new().save(theirs)  # another process: data alone
    ours.load(older.id)  # a monitor on our store object
    older.data = {"by": "us"}
    assert ours.save(older) is True  # not refused: the documented limit
    assert stores.new().load(older.id).data == {"by": "us"}


def test_list_and_objects_never_change_a_version(stores: Stores) -> None:
    """ "`list()` and `objects()` never change a version": after them, an older copy's save is
    still refused with `ConcurrentWriteError`."""
    ours = stores.new()
    older = State("versions", id="versions")
    ours.save(older)
    theirs_store = stores.new()
    theirs = theirs_store.load(older.id)
    theirs.add_user_message("from the other process")
    theirs_store.save(theirs)
    assert [s.id for s in ours.list()] == ["versions"]
    assert ours.objects(older.id)
    older.data = {"stale": True}
    with pytest.raises(ConcurrentWriteError, match="'versions'"):
        ours.save(older)


def test_a_value_changed_by_both_is_the_running_processs(stores: Stores) -> None:
    """ "The entries the running process commits alone after it are still the State's, with
    their changes applied after that snapshot's (so a change of the same value by both is the
    running process's, in seq order)"."""
    running = stores.new()
    state = State("both", id="both")
    running.save(state)
    other = stores.new()
    copy = other.load(state.id)
    copy.data = {"k": "other", "theirs": 1}
    other.save(copy)  # data alone: a snapshot PUT
    state.data["k"] = "running"
    state.append(USER, "from the run", {})
    log = RequestLog()
    running.client.meta.events.register("before-send.s3", log.hooks["before-send.s3"])
    running.save(state)
    assert log.counts() == {"PUT": 1}  # committed alone
    loaded = stores.new().load(state.id)
    assert loaded.data == {"k": "running", "theirs": 1}
    assert [e.text for e in loaded.history] == ["both", "from the run"]


def test_a_model_response_that_calls_a_tool_is_committed_before_the_tool_starts(
    stores: Stores, moto: S3Client
) -> None:
    """ "the other process's save is refused there, before its tool runs (a model response
    that calls a tool is committed before the tool starts)"."""
    seen: list[list[str]] = []

    def lookup(q: int) -> str:
        """Look a number up."""
        seen.append(keys_under(moto, stores.bucket, "runs/committed/entries/"))
        return "found"

    responses: Iterator[str | list[dict[str, Any]]] = iter([[call("lookup", q=1)], REPLY])
    agent = Agent(
        model=FunctionModel(lambda request: next(responses)), tools=[lookup], store=stores.new()
    )
    state = State("Look it up", id="committed")
    agent.run(state)
    (keys,) = seen
    assert len(keys) == 2, keys  # the task and the response calling the tool
    loaded = stores.new().load(state.id)
    assert loaded.history == state.history


def test_a_state_deleted_and_created_again_while_it_runs(stores: Stores, moto: S3Client) -> None:
    """ "If the id was created again meanwhile, that PUT raises `ConcurrentWriteError` instead
    (the new State is another writer's) and removes the same objects; the new State never
    reads them"."""
    run_store = stores.new()
    state = State("running", id="again")
    run_store.save(state)
    state.append(USER, "before", {})
    run_store.save(state)  # committed alone
    old = moto.head_object(Bucket=stores.bucket, Key="runs/again/snapshot.json")["Metadata"][
        GENERATION_META
    ]
    other = stores.new()
    other.delete(state.id)
    new = State("created again", id=state.id)
    other.save(new)
    for n in range(2):
        state.append(USER, f"after {n}", {})
        run_store.save(state)  # committed alone, under the old generation
    assert len(keys_under(moto, stores.bucket, f"runs/again/entries/{old}/")) == 2
    state._stop("reply", "done")
    with pytest.raises(ConcurrentWriteError, match="'again'"):
        run_store.save(state)
    assert keys_under(moto, stores.bucket, f"runs/again/entries/{old}/") == []
    loaded = stores.new().load(state.id)
    assert loaded.task == "created again" and loaded.history == new.history


# Errors --------------------------------------------------------------------------------------


def test_every_error_derives_from_store_error_and_its_builtin() -> None:
    """The table's builtins, and "All derive from `alpineagents.errors.StoreError`"."""
    table: dict[type[Exception], type[BaseException] | None] = {
        StateExistsError: ValueError,
        StateNotFoundError: KeyError,
        ConcurrentWriteError: None,
        BucketNotFoundError: FileNotFoundError,
        S3AccessDeniedError: PermissionError,
        ConditionalWritesUnsupportedError: None,
        CorruptStateError: None,
        SchemaVersionError: None,
        StoreClosedError: RuntimeError,
        S3StoreError: None,
    }
    for error, builtin in table.items():
        assert issubclass(error, StoreError), error
        assert issubclass(error, S3StoreError), error
        if builtin is not None:
            assert issubclass(error, builtin), error


async def test_an_endpoint_refusing_if_match_is_named(mode: Mode, stores: Stores) -> None:
    """ "`ConditionalWritesUnsupportedError` | the endpoint refuses `If-None-Match`/`If-Match`
    on PUT (501 `NotImplemented`)": the snapshot's `If-Match` PUT, naming its key."""
    state = State("if-match", id="if-match")
    stores.new().save(state)
    refuse = Refuse(501, "NotImplemented", when=lambda url, headers: "If-Match" in headers)
    io = stores.io(mode, event_hooks={"before-call.s3.PutObject": refuse})
    loaded = await io.load(state.id)
    loaded.data = {"x": 1}
    with pytest.raises(ConditionalWritesUnsupportedError) as raised:
        await io.save(loaded)
    message = str(raised.value)
    assert f"s3://{stores.bucket}/runs/if-match/snapshot.json" in message
    assert "If-Match" in message and "does not support conditional writes" in message


@pytest.mark.parametrize(
    ("status", "code"),
    [(403, "InvalidAccessKeyId"), (403, "SignatureDoesNotMatch"), (400, "ExpiredToken")],
)
def test_bad_or_expired_credentials_are_s3_access_denied(
    stores: Stores, status: int, code: str
) -> None:
    """ "`S3AccessDeniedError` (`PermissionError`) | 403, bad or expired credentials", naming
    the key."""
    stores.new().save(State("credentials", id="creds"))
    store = stores.new(event_hooks={"before-call.s3.GetObject": Refuse(status, code)})
    with pytest.raises(S3AccessDeniedError) as raised:
        store.load("creds")
    assert f"s3://{stores.bucket}/runs/creds/snapshot.json" in str(raised.value)
    assert code in str(raised.value)


async def test_an_exception_from_an_event_hook_is_s3storeerror_with_it_as_cause(
    mode: Mode, stores: Stores
) -> None:
    """ "`S3StoreError` | ... or from an event hook, kept as `__cause__`; the async path raises
    it plainly too, never as an `ExceptionGroup`"."""
    broken = ValueError("the hook broke")

    def hook(**kwargs: Any) -> None:
        raise broken

    io = stores.io(mode, event_hooks={"before-call.s3.PutObject": hook})
    with pytest.raises(S3StoreError) as raised:
        await io.write("hooked", entry_dicts(0, 3), snapshot_dict("hooked", 3), create=True)
    assert raised.value.__cause__ is broken
    assert not isinstance(raised.value, BaseExceptionGroup)
    assert f"s3://{stores.bucket}/runs/hooked/" in str(raised.value)


async def test_errors_of_unknown_and_taken_ids_name_the_bucket_and_key(
    mode: Mode, stores: Stores
) -> None:
    """ "Every error names the bucket and key (`s3://bucket/key`)": `StateNotFoundError` of
    `load`/`load`/`delete` (the store's root and the id), `StateExistsError` of a create."""
    io = stores.io(mode)
    where = f"s3://{stores.bucket}/runs/"
    for call_ in (lambda: io.load("nobody"), lambda: io.delete("nobody")):
        with pytest.raises(CoreStateNotFoundError) as raised:
            await call_()
        assert isinstance(raised.value, KeyError)
        assert where in str(raised.value) and "'nobody'" in str(raised.value), raised.value
    await io.save(State("taken", id="taken"))
    with pytest.raises(StateExistsError) as taken:
        await stores.io(mode).save(State("taken", id="taken"))
    assert isinstance(taken.value, ValueError) and f"{where}taken" in str(taken.value)


async def test_load_and_delete_of_an_unknown_id_name_the_bucket_prefix_and_id(
    mode: Mode, stores: Stores
) -> None:
    """ "Every error names the bucket and key (`s3://bucket/key`), or for an unknown id the
    store's bucket and prefix and the id"; `load`'s is the core's `StateNotFoundError`,
    `delete`'s the store's, which subclasses it."""
    io = stores.io(mode)
    for call_ in (lambda: io.load("nobody"), lambda: io.delete("nobody")):
        with pytest.raises(CoreStateNotFoundError) as raised:
            await call_()
        message = str(raised.value)
        assert f"s3://{stores.bucket}/runs/" in message and "'nobody'" in message, message
    assert isinstance(raised.value, StateNotFoundError)


# Limits --------------------------------------------------------------------------------------


def test_delete_removes_a_store_nested_in_the_states_folder(stores: Stores) -> None:
    """ "`delete(id)` removes every object under it. ... (a store at `runs` and one at
    `runs/a/` ...): deleting State `a` would remove the second store's States. Prefixes side
    by side (`runs/` and `archive/`) are fine.\""""
    outer = stores.new()
    outer.save(State("outer", id="a"))

    def at(prefix: str) -> S3Store:
        store = S3Store(stores.bucket, prefix, endpoint_url=stores.url, session=stores.session)
        stores.made.append(store)
        return store

    nested, beside = at("runs/a/"), at("archive/")
    nested.save(State("nested", id="inner"))
    beside.save(State("beside", id="a"))
    outer.delete("a")
    assert nested.list() == []
    with pytest.raises(CoreStateNotFoundError):
        nested.load("inner")
    assert beside.load("a").task == "beside"
