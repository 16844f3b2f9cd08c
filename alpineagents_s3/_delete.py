"""Deleting a State, and erasing every version of it (docs/protocol.md, "Delete").

The delete marks the incarnation it deletes with a tombstone object in its folder, then deletes
the head: from then on the State does not exist, for every reader and writer, and no head can
name that incarnation again (invariant 9's rule for what may be deleted: a tombstoned
incarnation no head names is dead). Then every object in the folder of a dead incarnation that
the store can prove it wrote: named by the head it read, or marked in its metadata (a HEAD for
each object not named); the tombstone last. A stranger's object is left and reported. An
incarnation folder without a head and without a tombstone may be a create under way: ``sweep``
removes it once it is old. With ``purge=True`` on a versioned bucket, every version and delete
marker of the keys removed goes too. A delete that fails part way raises; run again, it finds
the tombstone and removes what is left.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from alpineagents_s3._codec import validate_id
from alpineagents_s3._keys import MARK, PAGE, ROLES, TOMBSTONE, Layout, fail, list_all
from alpineagents_s3._load import get_head
from alpineagents_s3._memory import Ctx
from alpineagents_s3._steps import Call, Hold, Steps, error_code, send
from alpineagents_s3._translate import (
    ACCESS_CODES,
    NOT_FOUND_CODES,
    PRECONDITION_CODES,
    Fault,
    translate_fault,
)
from alpineagents_s3.errors import S3AccessDeniedError, S3StoreError

__all__ = ["Deleted", "delete", "marked", "remove"]

_TOMBSTONE_BODY = b'{"alpineagents-s3":"deleted"}'


@dataclass(frozen=True)
class Deleted:
    """What ``S3Store.delete`` removed.

    Attributes:
        state_id: The State.
        objects: Objects deleted (the head, entries, segments, leftovers).
        versions: Older versions and delete markers removed (``purge=True``).
        kept: Keys under the State's folder that were left: not written by S3Store, or of a
            create that may still be under way (``sweep`` removes those once a day old).
    """

    state_id: str
    objects: int
    versions: int = 0
    kept: tuple[str, ...] = ()

    def __str__(self) -> str:
        text = f"deleted State {self.state_id!r}: {self.objects} objects"
        if self.versions:
            text += f", {self.versions} older versions and delete markers"
        if self.kept:
            text += f"; kept {len(self.kept)} objects: {', '.join(self.kept)}"
        return text


def delete(ctx: Ctx, state_id: str, purge: bool) -> Steps[Deleted | None]:
    """The steps of ``delete``: ``None`` when there was nothing of the State to delete."""
    validate_id(state_id)
    layout = ctx.layout
    yield Hold(ctx.memory.lock(ctx.scope, state_id))
    head_key = layout.head_key(state_id)
    got = yield from get_head(ctx, state_id)
    named = set()
    if got is not None:  # mark the incarnation dead, then delete the head: the commit
        head = got[0]
        named = {head_key, *head.keys(layout)}
        tombstone = layout.tombstone_key(state_id, head.inc)
        (outcome,) = yield from send([layout.put(tombstone, _TOMBSTONE_BODY, "tombstone")], "")
        if isinstance(outcome, Exception) and error_code(outcome) not in PRECONDITION_CODES:
            fail(layout, outcome, "PutObject", tombstone)  # 412: a killed delete put it
        (outcome,) = yield from send([layout.delete(head_key)], layout.root)
        if isinstance(outcome, Exception) and error_code(outcome) not in NOT_FOUND_CODES:
            fail(layout, outcome, "DeleteObject", head_key)
    listed = [obj["Key"] for obj in (yield from list_all(layout, layout.state_folder(state_id)))]
    folders = {key: layout.folder_of(key) for key in listed}
    dead = {folder[1] for key, folder in folders.items() if folder and key.endswith(TOMBSTONE)}
    if got is not None:
        dead.add(got[0].inc)
    tombstones = [layout.tombstone_key(state_id, inc) for inc in sorted(dead)]
    doomed = [k for k, folder in folders.items() if folder and folder[1] in dead]
    ours, kept = yield from marked(ctx, [k for k in doomed if k not in tombstones], named)
    yield from remove(layout, [(key, None) for key in ours])
    yield from remove(layout, [(key, None) for key in tombstones])  # last: dead until then
    ctx.memory.bodies.drop(layout.bucket, ours)
    versions = 0
    if purge:
        versions = yield from _purge(ctx, state_id, dead, set(kept))
    if got is None and not ours and not versions:
        return None
    waiting = [k for k in listed if k not in doomed]
    return Deleted(state_id, len(ours) + (got is not None), versions, tuple(sorted(kept + waiting)))


def marked(ctx: Ctx, keys: Sequence[str], named: set[str]) -> Steps[tuple[list[str], list[str]]]:
    """Split ``keys`` into those the store wrote (named, or marked: a HEAD each) and the rest."""
    layout = ctx.layout
    ours = [key for key in keys if key in named]
    unnamed = [key for key in keys if key not in named]
    outcomes = yield from send([layout.head_object(key) for key in unnamed], layout.root)
    kept: list[str] = []
    for key, outcome in zip(unnamed, outcomes, strict=True):
        if isinstance(outcome, Exception):
            if error_code(outcome) in NOT_FOUND_CODES:
                continue  # gone meanwhile
            fail(layout, outcome, "HeadObject", key)
        (ours if _is_marked(outcome) else kept).append(key)
    return ours, kept


def _is_marked(response: dict[str, Any]) -> bool:
    metadata = {k.lower(): v for k, v in (response.get("Metadata") or {}).items()}
    return metadata.get(MARK) in ROLES


def remove(layout: Layout, keys: Sequence[tuple[str, str | None]]) -> Steps[None]:
    """DeleteObjects of ``(key, version)`` pairs; any key not deleted raises, naming it."""
    chunks = [keys[start : start + PAGE] for start in range(0, len(keys), PAGE)]
    outcomes = yield from send(layout.delete_many(keys), layout.root)
    for chunk, outcome in zip(chunks, outcomes, strict=True):
        if isinstance(outcome, Exception):
            fail(layout, outcome, "DeleteObjects", chunk[0][0])
        errors = [e for e in outcome.get("Errors", ()) if e.get("Code") not in NOT_FOUND_CODES]
        if errors:
            first = errors[0]
            fault = Fault(str(first.get("Code")), None, str(first.get("Message", "")))
            error = translate_fault(fault, layout.where("DeleteObjects", str(first.get("Key"))))
            if first.get("Code") in ACCESS_CODES and any(v for _, v in chunk):
                raise S3AccessDeniedError(
                    f"{error}. The bucket {layout.bucket!r} refused to delete object versions: "
                    "Object Lock (a retention period or legal hold) or MFA delete is on for it. "
                    f"{len(errors)} of {len(chunk)} versions are kept while it protects them"
                )
            raise S3StoreError(
                f"{len(errors)} of {len(chunk)} objects were not deleted ({error}): run the "
                "delete again"
            ) from error


def _purge(ctx: Ctx, state_id: str, dead: set[str], kept: set[str]) -> Steps[int]:
    """Remove the versions and delete markers the State left; how many.

    One rule: a version goes only if its own metadata carries the store's mark (a HEAD by
    version id), and a delete marker only once no version of its key is left. Under the State's
    folder and at its head, except the current objects of an incarnation still alive (a State
    made again, a create under way) and the keys a stranger holds.
    """
    layout = ctx.layout
    (status,) = yield from send(
        [Call("get_bucket_versioning", {"Bucket": layout.bucket})], layout.root
    )
    if isinstance(status, Exception):
        fail(layout, status, "GetBucketVersioning", layout.root)
    if status.get("Status") not in ("Enabled", "Suspended"):
        return 0  # never versioned: the plain delete left nothing
    head_key = layout.head_key(state_id)
    listed = yield from _versions(layout, layout.state_folder(state_id))
    listed += [v for v in (yield from _versions(layout, head_key)) if v[0] == head_key]
    candidates = []
    for key, version, marker, latest in listed:
        folder = layout.folder_of(key)
        alive = key == head_key or (folder is not None and folder[1] not in dead)
        if key in kept or marker or (latest and alive):
            continue  # a stranger's, a marker (below), or the live State's current object
        candidates.append((key, version))
    outcomes = yield from send([layout.head_object(k, v) for k, v in candidates], layout.root)
    data = []
    for (key, version), outcome in zip(candidates, outcomes, strict=True):
        if isinstance(outcome, Exception):
            if error_code(outcome) in NOT_FOUND_CODES:
                continue  # gone meanwhile
            fail(layout, outcome, "HeadObject", key)
        if _is_marked(outcome):
            data.append((key, version))
    removed = set(data)
    left = {k for k, v, marker, _ in listed if not marker and (k, v) not in removed}
    ours = {k for k, *_ in listed if k == head_key or layout.part_name(k) or k.endswith(TOMBSTONE)}
    markers = [(k, v) for k, v, marker, _ in listed if marker and k in ours and k not in left]
    # Data versions first: a delete marker removed before them would bring an object back.
    yield from remove(layout, data)
    yield from remove(layout, markers)
    return len(data) + len(markers)


def _versions(layout: Layout, prefix: str) -> Steps[list[tuple[str, str, bool, bool]]]:
    """Every version under ``prefix``: ``(key, version id, is a delete marker, is latest)``."""
    found: list[tuple[str, str, bool, bool]] = []
    params: dict[str, Any] = {"Bucket": layout.bucket, "Prefix": prefix}
    while True:
        (page,) = yield from send([Call("list_object_versions", dict(params))], layout.root)
        if isinstance(page, Exception):
            fail(layout, page, "ListObjectVersions", prefix)
        for kind, marker in (("Versions", False), ("DeleteMarkers", True)):
            found += [
                (v["Key"], v["VersionId"], marker, bool(v.get("IsLatest")))
                for v in page.get(kind, ())
            ]
        if not page.get("IsTruncated"):
            return found
        params["KeyMarker"] = page.get("NextKeyMarker")
        params["VersionIdMarker"] = page.get("NextVersionIdMarker")
