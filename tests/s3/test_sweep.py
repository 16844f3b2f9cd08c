"""``S3Store.sweep``: the entries of creates that died are removed, nothing else.

Leftovers are put behind the store's back, as a create killed before its snapshot PUT leaves
them: entries under a generation no snapshot names.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import pytest

from alpineagents import State
from alpineagents_s3 import S3Store
from tests.helpers import Mode, entry_dicts
from tests.s3.helpers import Stores, body, raw_client

if TYPE_CHECKING:
    from types_boto3_s3 import S3Client


def abandoned(client: S3Client, bucket: str, state_id: str, count: int) -> list[str]:
    """Entries of a create of ``state_id`` that died before its snapshot PUT; their keys."""
    generation = uuid.uuid4().hex[:16]
    keys = []
    for entry in entry_dicts(0, count, "a create that died"):
        key = f"runs/{state_id}/entries/{generation}/{entry['seq']:010d}.json"
        client.put_object(Bucket=bucket, Key=key, Body=body(entry))
        keys.append(key)
    return keys


async def sweep(store: S3Store, mode: Mode, **options: float) -> list[str]:
    if mode == "async":
        return await store.asweep(**options)
    return store.sweep(**options)


async def test_sweep_removes_abandoned_generations_only(mode: Mode, stores: Stores) -> None:
    client = raw_client(stores.url)
    store = stores.new()
    state = State("kept", id="kept")
    state.add_user_message("hello")
    store.save(state)
    lost_race = abandoned(client, stores.bucket, "kept", 2)  # a create that lost, then died
    no_state = abandoned(client, stores.bucket, "never-made", 3)  # died before its snapshot
    foreign = "runs/kept/notes.txt"
    client.put_object(Bucket=stores.bucket, Key=foreign, Body=b"not the store's")
    before = {o["Key"] for o in client.list_objects_v2(Bucket=stores.bucket)["Contents"]}

    assert await sweep(store, mode) == []  # younger than a day: a create may be under way
    assert sorted(await sweep(store, mode, older_than=0)) == sorted(lost_race + no_state)
    after = {o["Key"] for o in client.list_objects_v2(Bucket=stores.bucket)["Contents"]}
    assert after == before - set(lost_race) - set(no_state)
    assert foreign in after
    assert [e.text for e in store.load("kept").history] == ["kept", "hello"]
    assert await sweep(store, mode, older_than=0) == []  # nothing more to do
    client.close()


def test_sweep_refuses_a_negative_age(stores: Stores) -> None:
    with pytest.raises(ValueError, match="older_than"):
        stores.new().sweep(older_than=-1)
