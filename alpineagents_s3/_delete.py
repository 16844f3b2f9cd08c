"""Deleting a State, and erasing every version of it (docs/protocol.md, "Delete").

The delete is a commit like a save's: a tombstone head replaces the head, ``If-Match`` on its
ETag (invariant 4). The head's key is never deleted, so no create still in flight and no save
of a copy can name that incarnation again (invariant 12): it is dead, and the delete removes
every object in its folder that the store can prove it wrote: named by the head it replaced, or
marked in its metadata (a HEAD for each object not named). A stranger's object is left and
reported, and so are the objects of other incarnation folders of the id (a create under way,
or one that failed): they are left to ``sweep``. With
``purge=True`` on a versioned bucket, every version and delete marker of the keys removed goes
too. A delete that fails part way raises; run again, it finds the tombstone head and removes
what is left.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from alpineagents_s3 import _keys
from alpineagents_s3._codec import validate_id
from alpineagents_s3._engine import ensure
from alpineagents_s3._head import Head
from alpineagents_s3._keys import MARK, PAGE, ROLES, Layout, fail, list_all
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
from alpineagents_s3.errors import ConcurrentWriteError, S3AccessDeniedError, S3StoreError

__all__ = ["Deleted", "delete", "marked", "remove"]

# Tombstone PUTs a delete makes while saves keep replacing the head, before it gives up.
_ATTEMPTS: Final = 6


@dataclass(frozen=True)
class Deleted:
    """What ``S3Store.delete`` removed.

    Attributes:
        state_id: The State.
        objects: Objects deleted (the head, entries, segments, leftovers).
        versions: Older versions and delete markers removed (``purge=True``).
        kept: Keys under the State's folder that were left: not written by S3Store, or in the
            folder of another incarnation (a create under way or one that failed, which no head
            names: ``sweep`` removes those once they are old).
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
    # Asked before anything changes: a purge refused the permission deletes nothing.
    versioned = (yield from _versioned(layout)) if purge else False
    got = yield from get_head(ctx, state_id)
    if got is None:
        return None  # no head was ever written: there is nothing the store can prove its own
    replaced: Head | None = None
    tombstone: Head | None = got[0]
    if not got[0].deleted:
        replaced, tombstone = yield from _commit(ctx, state_id, *got)
    if tombstone is None:
        return None
    named = set(replaced.keys(layout)) if replaced is not None else set()
    # One LIST of the State's folder: the dead incarnation's objects, and others' (left).
    folder = layout.inc_folder(state_id, tombstone.inc)
    listed = [obj["Key"] for obj in (yield from list_all(layout, layout.state_folder(state_id)))]
    dead = [key for key in listed if key.startswith(folder)]
    ours, kept = yield from marked(ctx, dead, named)
    kept += [key for key in listed if not key.startswith(folder)]
    yield from remove(layout, [(key, None) for key in ours])
    ctx.memory.bodies.drop(layout.bucket, ours)
    versions = 0
    if versioned:
        versions = yield from _purge(ctx, state_id, {tombstone.inc}, set(kept))
    if replaced is None and not ours and not versions:
        return None
    return Deleted(state_id, len(ours) + (replaced is not None), versions, tuple(sorted(kept)))


def _commit(
    ctx: Ctx, state_id: str, head: Head, etag: str
) -> Steps[tuple[Head | None, Head | None]]:
    """Put a tombstone head over ``head`` (invariants 4, 12).

    Returns the head it replaced (``None``: another delete was first) and the tombstone head
    (``None``: the head is gone, deleted by something other than S3Store; nothing is dead).
    """
    layout = ctx.layout
    key = layout.head_key(state_id)
    yield from ensure(ctx)  # invariant 11: the If-Match below must mean something
    for _ in range(_ATTEMPTS):
        tombstone = head.tombstone(_keys.new_wid())
        put = layout.put(key, tombstone.encode(), "tombstone", if_match=etag)
        (outcome,) = yield from send([put], layout.root)
        if not isinstance(outcome, Exception):
            ctx.memory.wrote(ctx.scope, state_id, tombstone, str(outcome["ETag"]))
            return head, tombstone
        if error_code(outcome) not in PRECONDITION_CODES | NOT_FOUND_CODES:
            fail(layout, outcome, "PutObject", key, f"If-Match: {etag}")
        got = yield from get_head(ctx, state_id)
        if got is None:  # the head is gone: only something other than S3Store deletes one
            return None, None
        stored, etag = got
        if stored.deleted:  # this delete's PUT answered twice, or another delete first
            return (head if stored.write == tombstone.write else None), stored
        head = stored  # a save landed in between: delete what it made
    raise ConcurrentWriteError(
        f"State {state_id!r} in {layout.url(key)} was saved {_ATTEMPTS} times while it was "
        "deleted: stop its writers, then delete it again"
    )


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
    """Remove the versions and delete markers the State left on a versioned bucket; how many.

    One rule: a version goes only if its own metadata carries the store's mark (a HEAD by
    version id), and a delete marker only once no version of its key is left. Under the State's
    folder and at its head, except the current tombstone head, the current objects of an
    incarnation still alive (a State made again, a create under way) and the keys a stranger
    holds.
    """
    layout = ctx.layout
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
    ours = {k for k, *_ in listed if k == head_key or layout.part_name(k)}
    markers = [(k, v) for k, v, marker, _ in listed if marker and k in ours and k not in left]
    # Data versions first: a delete marker removed before them would bring an object back.
    yield from remove(layout, data)
    yield from remove(layout, markers)
    return len(data) + len(markers)


def _versioned(layout: Layout) -> Steps[bool]:
    """Whether the bucket keeps versions (versioning enabled or suspended)."""
    (status,) = yield from send(
        [Call("get_bucket_versioning", {"Bucket": layout.bucket})], layout.root
    )
    if isinstance(status, Exception):
        fail(layout, status, "GetBucketVersioning", layout.root)
    return status.get("Status") in ("Enabled", "Suspended")


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
