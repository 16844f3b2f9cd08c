"""Objects the store cannot read, changed behind its back: damaged, of a newer schema or layout,
not written by S3Store, under the wrong key, or missing. Each is refused, naming it."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

import pytest

import tests.corrupt_cases as table
from alpineagents import State
from alpineagents.errors import CorruptStateError, SchemaVersionError
from alpineagents.testing import StoreIO
from alpineagents_s3 import IncompleteListError
from tests.corrupt_cases import CASES, ID, Case, case_id, damage
from tests.helpers import Mode
from tests.s3.helpers import Stores

if TYPE_CHECKING:
    from types_boto3_s3 import S3Client


async def saved_state(mode: Mode, stores: Stores) -> StoreIO:
    """Save State ``s`` (a task and a message) through one store object; another one."""
    state = State("task", id="s")
    state.add_user_message("hello")
    await stores.io(mode).save(state)
    return stores.io(mode)


HEAD = "runs/heads/s.json"


def key_of(moto: S3Client, bucket: str, part: str) -> str:
    keys = [o["Key"] for o in moto.list_objects_v2(Bucket=bucket)["Contents"]]
    return next(k for k in keys if part in k)


def change_snapshot(moto: S3Client, bucket: str, change: Any, key: str = HEAD) -> None:
    """Rewrite the snapshot held in a head, behind the store's back (its metadata kept)."""
    metadata = moto.head_object(Bucket=bucket, Key=key)["Metadata"]
    head = json.loads(moto.get_object(Bucket=bucket, Key=key)["Body"].read())
    head["snapshot"] = change(head["snapshot"])
    # Padded as the store pads a head (a smaller object in heads/ is no head of a State).
    moto.put_object(
        Bucket=bucket, Key=key, Body=json.dumps(head).encode().ljust(512), Metadata=metadata
    )


@pytest.mark.parametrize(
    ("target", "body", "error", "words"),
    [
        ("/heads/", b"{not json", CorruptStateError, "not valid JSON"),
        ("/e0000000001.", b"\xff\xfe", CorruptStateError, "not valid JSON"),
        ("/e0000000001.", b"[1, 2]", CorruptStateError, "holds 'list' where history entry 1"),
        ("/e0000000001.", b'{"seq": 2}', CorruptStateError, "holds 2 where history entry 1"),
        # What is inside an entry or snapshot is the core's to judge, at load; the message
        # names the State, a note names where it is stored.
        ("/e0000000001.", b'{"seq": 1}', CorruptStateError, "no schema version"),
        ("/e0000000000.", b'{"v": 99, "seq": 0}', SchemaVersionError, "schema version 99"),
    ],
)
async def test_a_damaged_or_future_object_is_named(
    mode: Mode,
    target: str,
    body: bytes,
    error: type[Exception],
    words: str,
    stores: Stores,
    moto: S3Client,
) -> None:
    io = await saved_state(mode, stores)
    bucket = stores.bucket
    key = key_of(moto, bucket, target)
    metadata = moto.head_object(Bucket=bucket, Key=key)["Metadata"]
    moto.put_object(Bucket=bucket, Key=key, Body=body, Metadata=metadata)

    with pytest.raises(error, match=words) as raised:
        await io.load("s")
    told = "\n".join([str(raised.value), *getattr(raised.value, "__notes__", [])])
    assert f"s3://{bucket}/{key}" in told or f"s3://{bucket}/{HEAD}" in told


async def test_a_snapshot_of_a_newer_schema_is_named(
    mode: Mode, stores: Stores, moto: S3Client
) -> None:
    io = await saved_state(mode, stores)
    change_snapshot(moto, stores.bucket, lambda snapshot: {**snapshot, "v": 99})
    with pytest.raises(SchemaVersionError, match="upgrade alpineagents") as raised:
        await io.load("s")
    told = "\n".join([str(raised.value), *getattr(raised.value, "__notes__", [])])
    assert f"s3://{stores.bucket}/{HEAD}" in told


async def test_an_object_of_a_newer_layout_is_refused_naming_it(
    mode: Mode, stores: Stores, moto: S3Client
) -> None:
    io = await saved_state(mode, stores)
    bucket = stores.bucket
    metadata = moto.head_object(Bucket=bucket, Key=HEAD)["Metadata"]
    head = json.loads(moto.get_object(Bucket=bucket, Key=HEAD)["Body"].read())
    body = json.dumps({**head, "alpineagents-s3": 2}).encode().ljust(512)  # a head of a State
    moto.put_object(Bucket=bucket, Key=HEAD, Body=body, Metadata=metadata)

    with pytest.raises(SchemaVersionError, match="upgrade alpineagents-s3") as raised:
        await io.load("s")
    assert f"s3://{bucket}/{HEAD}" in str(raised.value)
    with pytest.raises(IncompleteListError) as listed:  # named by the listing too
        await io.list()
    assert listed.value.states == [] and isinstance(listed.value.failed["s"], SchemaVersionError)


@pytest.mark.parametrize(
    ("changes", "error", "words"),
    [
        ({"task": 5}, CorruptStateError, "not an alpineagents snapshot"),
        ({"updated_at": "2026-01-01T00:00:00"}, CorruptStateError, "not an alpineagents snapshot"),
        ({"updated_at": None}, CorruptStateError, "not an alpineagents snapshot"),
        ({"v": 99}, SchemaVersionError, "upgrade alpineagents"),
    ],
)
async def test_a_list_that_cannot_summarise_a_state_names_it_and_holds_the_others(
    mode: Mode,
    changes: dict[str, Any],
    error: type[Exception],
    words: str,
    stores: Stores,
    moto: S3Client,
) -> None:
    io = await saved_state(mode, stores)
    await io.save(State("another", id="fine"))
    change_snapshot(moto, stores.bucket, lambda snapshot: dict(snapshot, **changes))

    with pytest.raises(IncompleteListError) as raised:
        await io.list()
    assert [s.id for s in raised.value.states] == ["fine"]  # the others are listed
    failure = raised.value.failed["s"]
    assert isinstance(failure, error) and re.search(words, str(failure))
    assert f"s3://{stores.bucket}/{HEAD}" in str(raised.value)


async def test_a_snapshot_field_of_the_wrong_type_is_corrupt_at_load_naming_the_objects(
    mode: Mode, stores: Stores, moto: S3Client
) -> None:
    io = await saved_state(mode, stores)
    bucket = stores.bucket
    change_snapshot(moto, bucket, lambda snapshot: dict(snapshot, task=5))

    with pytest.raises(CorruptStateError, match="snapshot: task must be a str, not 5") as raised:
        await io.load("s")
    assert str(raised.value).startswith(f"State 's' in S3Store('s3://{bucket}/runs/'")


async def test_a_head_not_written_by_s3store_is_refused(
    mode: Mode, stores: Stores, moto: S3Client
) -> None:
    io = await saved_state(mode, stores)
    bucket = stores.bucket
    snapshot = json.loads(moto.get_object(Bucket=bucket, Key=HEAD)["Body"].read())["snapshot"]
    moto.put_object(Bucket=bucket, Key=HEAD, Body=json.dumps(snapshot).encode())  # a snapshot

    with pytest.raises(CorruptStateError, match=r"s3://.*/runs/heads/s\.json is not the head"):
        await io.load("s")


async def test_an_entry_under_the_wrong_key_is_refused(
    mode: Mode, stores: Stores, moto: S3Client
) -> None:
    io = await saved_state(mode, stores)
    bucket = stores.bucket
    key = key_of(moto, bucket, "/e0000000001.")
    entry = json.loads(moto.get_object(Bucket=bucket, Key=key)["Body"].read())
    moto.put_object(Bucket=bucket, Key=key, Body=json.dumps(dict(entry, seq=7)).encode())

    with pytest.raises(CorruptStateError, match=r"holds 7 where history entry 1 belongs"):
        await io.load("s")


async def test_a_missing_entry_object_is_named(mode: Mode, stores: Stores, moto: S3Client) -> None:
    io = await saved_state(mode, stores)
    key = key_of(moto, stores.bucket, "/e0000000001.")
    moto.delete_object(Bucket=stores.bucket, Key=key)

    with pytest.raises(CorruptStateError, match=r"is missing, but the head .* names it") as e:
        await io.load("s")
    assert f"s3://{stores.bucket}/{key}" in str(e.value)


# The table of tests/test_corrupt_load.py, on S3 objects, each case once, through the sync and
# the async API in turn (the checks are the core's; both load paths reach them). An entry whose
# seq differs from its key is refused by the store itself (test_an_entry_under_the_wrong_key_…).
S3_CASES = [
    pytest.param(mode, case, id=f"{mode}-{case_id(case)}")
    for i, case in enumerate(c for c in CASES if c[1] != ("seq",))
    for mode in [("sync", "async")[i % 2]]
]


@pytest.mark.parametrize(("mode", "case"), S3_CASES)
async def test_a_damaged_object_is_refused_at_load_naming_the_field(
    mode: Mode, case: Case, stores: Stores, moto: S3Client
) -> None:
    what, path, value, words = case
    io = stores.io(mode)
    await io.save(table.saved_state())
    bucket = stores.bucket
    if what == "snapshot":
        change = lambda snapshot: damage(snapshot, path, value)  # noqa: E731
        change_snapshot(moto, bucket, change, key=f"runs/heads/{ID}.json")
    else:
        key = key_of(moto, bucket, f"/e{what:010d}.")
        head = moto.head_object(Bucket=bucket, Key=key)
        stored = json.loads(moto.get_object(Bucket=bucket, Key=key)["Body"].read())
        body = json.dumps(damage(stored, path, value)).encode()
        moto.put_object(Bucket=bucket, Key=key, Body=body, Metadata=head["Metadata"])

    with pytest.raises(CorruptStateError) as raised:
        await stores.io(mode).load(ID)
    message = str(raised.value)
    assert message.startswith(f"State {ID!r} in S3Store('s3://{bucket}/runs/'"), message
    assert re.search(words, message), message


async def test_a_small_object_in_heads_is_no_state_to_list_but_an_empty_one_is_read(
    mode: Mode, stores: Stores, moto: S3Client
) -> None:
    # Every head of a State is at least 512 bytes; a smaller object there is a tombstone head or
    # a stranger's, which list() passes over without a GET (docs/protocol.md, invariant 13).
    # Size 0 is no tombstone's: it is read (an engine that gave 0 for every size would
    # otherwise make every list silently empty).
    io = await saved_state(mode, stores)
    moto.put_object(Bucket=stores.bucket, Key="runs/heads/note.json", Body=b'{"a": 1}')
    assert [s.id for s in await io.list()] == ["s"]
    with pytest.raises(CorruptStateError, match=r"runs/heads/note\.json is not the head"):
        await io.load("note")
    moto.put_object(Bucket=stores.bucket, Key="runs/heads/empty.json", Body=b"")
    with pytest.raises(IncompleteListError) as raised:
        await io.list()
    assert [s.id for s in raised.value.states] == ["s"] and list(raised.value.failed) == ["empty"]
