"""What is left of a State in a bucket, read without the store (the runners' own view)."""

from __future__ import annotations

import json
from typing import Any


def state_keys(client: Any, bucket: str, prefix: str, state_id: str) -> list[str]:
    """The State's head and every object in its folder, listed with ``client``.

    A tombstone head (``"deleted": true``, what a delete puts over the head: docs/protocol.md,
    invariant 12) is left out: it names nothing and is all a deleted State leaves.
    """
    found = []
    for sub in (f"heads/{state_id}.json", f"states/{state_id}/"):
        pages = client.get_paginator("list_objects_v2")
        for page in pages.paginate(Bucket=bucket, Prefix=f"{prefix}/{sub}"):
            found += [item["Key"] for item in page.get("Contents", [])]
    head = f"{prefix}/heads/{state_id}.json"
    if head in found and is_tombstone(client, bucket, head):
        found.remove(head)
    return found


def is_tombstone(client: Any, bucket: str, key: str) -> bool:
    """Whether the head at ``key`` is a tombstone head (``False`` if it is gone)."""
    try:
        body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    except client.exceptions.NoSuchKey:
        return False
    doc = json.loads(body)
    return isinstance(doc, dict) and doc.get("deleted") is True


def remove_bucket(client: Any, bucket: str) -> None:
    """Delete every object left in ``bucket`` (a run's own), then the bucket."""
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
    keys = [{"Key": item["Key"]} for page in pages for item in page.get("Contents", [])]
    for start in range(0, len(keys), 1000):
        client.delete_objects(Bucket=bucket, Delete={"Objects": keys[start : start + 1000]})
    client.delete_bucket(Bucket=bucket)
