"""Erasure (docs/erasure.md): after ``delete(id, purge=True)`` no version, delete marker or
leftover of the State exists, on versioned buckets and on plain ones, on moto and LocalStack,
sync and async; a purge killed after any of its requests, then run again, leaves nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from alpineagents import State
from alpineagents_s3 import Deleted, S3AccessDeniedError, S3Store
from alpineagents_s3.testing import separate_process
from tests.helpers import MakeBucket, Mode, tool_turn
from tests.s3.helpers import Refuse, Stores, raw_client

if TYPE_CHECKING:
    from types_boto3_s3 import S3Client

ROOT = Path(__file__).resolve().parents[2]


def versions_of(client: S3Client, bucket: str, state_id: str) -> list[tuple[str, str]]:
    """Every version and delete marker of the State's keys: (key, version id)."""
    found = []
    for prefix in (f"runs/heads/{state_id}.json", f"runs/states/{state_id}/"):
        listed = client.list_object_versions(Bucket=bucket, Prefix=prefix)
        found += [(v["Key"], v["VersionId"]) for v in listed.get("Versions", [])]
        found += [(v["Key"], v["VersionId"]) for v in listed.get("DeleteMarkers", [])]
    return found


def assert_erased(client: S3Client, bucket: str, state_id: str) -> None:
    """Nothing of the State is left but its tombstone head: one version, naming nothing (it is
    what keeps a create sent before the delete from bringing the State back)."""
    head = f"runs/heads/{state_id}.json"
    left = versions_of(client, bucket, state_id)
    assert [key for key, _ in left] == [head], left
    body = json.loads(client.get_object(Bucket=bucket, Key=head)["Body"].read())
    assert body["deleted"] is True, body
    assert body["parts"] == [] and body["snapshot"] is None and body["count"] == 0, body


async def a_long_conversation(io: Any, state_id: str) -> None:
    """A State saved 11 times (21 entries): 11 versions of its head, a segment of 16."""
    state = State("a person's conversation", id=state_id)
    await io.save(state)
    for n in range(10):
        tool_turn(state, n)
        await io.save(state)


@pytest.mark.parametrize("versioned", [True, False], ids=["versioned", "plain"])
async def test_a_purge_leaves_no_version_of_the_state(
    mode: Mode, stores: Stores, moto: S3Client, versioned: bool
) -> None:
    bucket = stores.make_bucket(versioned=versioned)
    io = stores.io(mode, bucket=bucket)
    await a_long_conversation(io, "gdpr")
    await a_long_conversation(io, "other")  # another person's, kept whole
    before = versions_of(moto, bucket, "gdpr")
    assert len(before) > 11 if versioned else len(before) >= 2

    report = await io.delete_with("gdpr", purge=True)
    assert isinstance(report, Deleted) and "gdpr" in str(report)
    assert_erased(moto, bucket, "gdpr")
    assert report.versions >= len(before) if versioned else report.versions == 0
    assert [s.id for s in await io.list()] == ["other"]
    other = await stores.io(mode, bucket=bucket).load("other")
    assert len(other.history) == 21


async def test_a_plain_delete_on_a_versioned_bucket_keeps_versions_a_purge_then_removes(
    mode: Mode, stores: Stores, moto: S3Client
) -> None:
    bucket = stores.make_bucket(versioned=True)
    io = stores.io(mode, bucket=bucket)
    await a_long_conversation(io, "gdpr")
    await io.delete("gdpr")
    assert await io.read("gdpr") is None
    left = versions_of(moto, bucket, "gdpr")
    assert left  # readable with GetObject(VersionId=...): not erased
    head_versions = [v for v in left if v[0] == "runs/heads/gdpr.json"]
    assert len(head_versions) == 11 + 1  # every save's head, and the tombstone head
    await io.delete_with("gdpr", purge=True)  # the State is gone; its versions go now
    assert_erased(moto, bucket, "gdpr")


@pytest.mark.slow
def test_a_purge_killed_after_any_of_its_requests_then_run_again_leaves_nothing(
    moto_url: str, moto_bucket: MakeBucket
) -> None:
    bucket = moto_bucket(versioned=True)

    def child(state_id: str, kill_at: int) -> subprocess.CompletedProcess[str]:
        args = [sys.executable, "-m", "tests.s3._child", "purge", moto_url, bucket, state_id]
        return subprocess.run(
            [*args, str(kill_at)],
            cwd=ROOT,
            text=True,
            capture_output=True,
            timeout=60,
        )

    def conversation(state_id: str) -> None:
        with separate_process(S3Store(bucket, "runs", endpoint_url=moto_url)) as store:
            state = State("erase me", id=state_id)
            store.save(state)
            for n in range(9):
                tool_turn(state, n)
                store.save(state)

    conversation("probe")
    done = child("probe", 0)
    assert done.returncode == 0, done.stderr
    requests = int(done.stdout.split()[-1])
    assert requests >= 8
    client = raw_client(moto_url)
    try:
        for kill_at in range(1, requests + 1):
            state_id = f"killed-{kill_at}"
            conversation(state_id)
            killed = child(state_id, kill_at)
            assert killed.returncode == -9, (kill_at, killed.stderr)
            with separate_process(S3Store(bucket, "runs", endpoint_url=moto_url)) as store:
                # A fresh process: the bucket's versioning, the head read, the engine check
                # (4 requests), then the tombstone head as request 7: killed after it, the
                # State is gone already.
                assert (store.read(state_id) is None) == (kill_at > 7), kill_at
                try:
                    store.delete(state_id, purge=True)  # run again
                except KeyError:
                    assert kill_at == requests  # only the last request was left undone
            assert_erased(client, bucket, state_id)
    finally:
        client.close()


def test_object_lock_refuses_the_purge_naming_the_bucket(moto_url: str, moto: S3Client) -> None:
    bucket = "locked-erasure"
    moto.create_bucket(Bucket=bucket, ObjectLockEnabledForBucket=True)
    moto.put_object_lock_configuration(
        Bucket=bucket,
        ObjectLockConfiguration={
            "ObjectLockEnabled": "Enabled",
            "Rule": {"DefaultRetention": {"Mode": "COMPLIANCE", "Days": 1}},
        },
    )
    with S3Store(bucket, "runs", endpoint_url=moto_url) as store:
        store.save(State("locked", id="locked"))
        with pytest.raises(S3AccessDeniedError, match=rf"'{bucket}'.*Object Lock"):
            store.delete("locked", purge=True)


@pytest.mark.integration
async def test_a_purge_on_localstack_leaves_no_version(mode: Mode, localstack: Stores) -> None:
    bucket = localstack.make_bucket(versioned=True)
    io = localstack.io(mode, bucket=bucket)
    await a_long_conversation(io, "gdpr")
    await io.delete_with("gdpr", purge=True)
    client = raw_client(localstack.url)
    try:
        assert_erased(client, bucket, "gdpr")
    finally:
        client.close()


@pytest.mark.parametrize("versioned", [True, False], ids=["versioned", "plain"])
async def test_a_purge_without_get_bucket_versioning_deletes_nothing(
    mode: Mode, stores: Stores, versioned: bool
) -> None:
    """The permission is asked for before anything changes (docs/s3.md, "Permissions"): a purge
    refused it leaves the State as it was, and runs once it is granted."""
    bucket = stores.make_bucket(versioned=versioned)
    await a_long_conversation(stores.io(mode, bucket=bucket), "kept")
    before = await stores.io(mode, bucket=bucket).read("kept")
    assert before is not None
    deny = Refuse(403, "AccessDenied")
    refused = stores.io(
        mode, bucket=bucket, event_hooks={"before-call.s3.GetBucketVersioning": deny}
    )
    with pytest.raises(S3AccessDeniedError, match=rf"GetBucketVersioning s3://{bucket}/runs/"):
        await refused.delete_with("kept", purge=True)
    assert deny.refused == 1
    assert await stores.io(mode, bucket=bucket).read("kept") == before
    deleted = await stores.io(mode, bucket=bucket).delete_with("kept", purge=True)
    assert isinstance(deleted, Deleted) and bool(deleted.versions) == versioned
    assert await stores.io(mode, bucket=bucket).read("kept") is None
