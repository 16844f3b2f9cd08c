"""``sweep``: what saves, creates and deletes that died left behind is removed, and nothing a
store did not write (issue 34, item 1), nothing a save under way still needs."""

from __future__ import annotations

import asyncio
import math
import uuid
from typing import TYPE_CHECKING

import pytest

from alpineagents import State
from alpineagents_s3 import Deleted, S3Store
from tests.helpers import MakeBucket, Mode
from tests.s3.helpers import Stores, objects

if TYPE_CHECKING:
    from types_boto3_s3 import S3Client

MARK = {"alpineagents-s3": "entry"}


async def sweep(store: S3Store, mode: Mode, older_than: float = 0, **options: bool) -> list[str]:
    if mode == "async":
        return await store.asweep(older_than, **options)
    return await asyncio.to_thread(store.sweep, older_than, **options)


async def test_sweep_removes_what_a_killed_save_left_and_keeps_the_state(
    mode: Mode, stores: Stores, moto: S3Client
) -> None:
    io = stores.io(mode)
    state = State("swept", id="s")
    await io.save(state)
    found = await objects(io, "s")
    inc = found[1].key.split("/")[3]
    orphan = f"runs/states/s/{inc}/e0000000001.{uuid.uuid4().hex[:16]}.json"  # a killed save
    dead = uuid.uuid4().hex[:16]  # a create that died before its head
    dead_key = f"runs/states/s/{dead}/e0000000000.{dead}.json"
    for key in (orphan, dead_key):
        moto.put_object(Bucket=stores.bucket, Key=key, Body=b'{"seq":1}', Metadata=MARK)
    store = io.store
    assert isinstance(store, S3Store)

    assert await sweep(store, mode, older_than=3600) == []  # too young: it may be under way
    assert sorted(await sweep(store, mode)) == sorted([orphan, dead_key])
    assert [o.role for o in await objects(io, "s")] == ["head", "entry"]
    assert (await io.load("s")).history == state.history


async def test_sweep_never_touches_objects_it_did_not_write(
    mode: Mode, stores: Stores, moto: S3Client
) -> None:
    io = stores.io(mode)
    await io.save(State("mine", id="s"))
    inc = (await objects(io, "s"))[1].key.split("/")[3]
    strangers = [
        f"runs/states/s/{inc}/e0000000001.0123456789abcdef.json",  # named as ours, no mark
        "runs/states/other/0123456789abcdef/s0000000000-0000000002.0123456789abcdef.json",
        "runs/probes/00000000000000aa.json",
        "runs/heads/s.json.bak",
        "runs/notes.txt",
    ]
    for key in strangers:
        moto.put_object(Bucket=stores.bucket, Key=key, Body=b"{}")
    store = io.store
    assert isinstance(store, S3Store)
    assert await sweep(store, mode) == []
    keys = await stores.keys()
    assert all(key in keys for key in strangers)


def test_sweep_at_the_bucket_root_is_refused_unless_asked(
    moto_url: str, moto_bucket: MakeBucket, moto: S3Client
) -> None:
    """Objects of another application at the root that look like the old layouts' names."""
    bucket = moto_bucket()
    theirs = [
        "cache/packed/ff00/0000000000-0000000002.json",
        "logs/entries/0123abcd/0000000001.json",
    ]
    for key in theirs:
        moto.put_object(Bucket=bucket, Key=key, Body=b'{"seq": 1}')
    with S3Store(bucket, endpoint_url=moto_url) as store:
        store.save(State("at the root", id="root"))
        with pytest.raises(ValueError, match=r"empty prefix.*at_bucket_root=True"):
            store.sweep(0)
        assert store.sweep(0, at_bucket_root=True) == []
    keys = [o["Key"] for o in moto.list_objects_v2(Bucket=bucket)["Contents"]]
    assert all(key in keys for key in theirs)


@pytest.mark.parametrize("age", [math.inf, 1e300, -1, math.nan, 200 * 365 * 24 * 3600.0], ids=str)
def test_sweep_refuses_an_age_that_is_not_a_time(stores: Stores, age: float) -> None:
    with pytest.raises(ValueError, match="older_than must be a number of seconds"):
        stores.new().sweep(age)
    with pytest.raises(TypeError, match="older_than is a number of seconds"):
        stores.new().sweep("1 day")  # type: ignore[arg-type]


async def test_delete_removes_only_what_the_store_wrote_and_names_what_it_kept(
    mode: Mode, stores: Stores, moto: S3Client
) -> None:
    """In the deleted incarnation's folder: a leftover with the store's mark goes, an object
    named as the store names its own but without the mark stays; another incarnation's folder
    (a create under way, say) is left to ``sweep``. ``Deleted.kept`` names what stayed."""
    io = stores.io(mode)
    await io.save(State("mine", id="d"))
    inc = (await objects(io, "d"))[1].key.split("/")[3]
    leftover = f"runs/states/d/{inc}/e0000000005.00000000000000ee.json"
    stranger = f"runs/states/d/{inc}/e0000000006.00000000000000ff.json"
    other_inc = "runs/states/d/0123456789abcdef/e0000000000.0123456789abcdef.json"
    moto.put_object(Bucket=stores.bucket, Key=leftover, Body=b"{}", Metadata=MARK)
    moto.put_object(Bucket=stores.bucket, Key=stranger, Body=b"{}")
    moto.put_object(Bucket=stores.bucket, Key=other_inc, Body=b"{}", Metadata=MARK)
    deleted = await io.delete_with("d")
    assert isinstance(deleted, Deleted)
    assert deleted.objects == 3  # the head, the save's entry, the marked leftover
    assert deleted.kept == tuple(sorted([stranger, other_inc]))
    assert f"kept 2 objects: {', '.join(sorted([stranger, other_inc]))}" in str(deleted)
    keys = await stores.keys()
    assert stranger in keys and other_inc in keys and leftover not in keys
    assert await io.read("d") is None
