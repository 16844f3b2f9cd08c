"""Deleting a State, and erasing every version of it (docs/protocol.md, "Delete").

The head goes first: from then on the State does not exist, for every reader and writer. Then
every object under ``states/<id>/`` that the store can prove it wrote (invariant 9): named by
the head it read, or marked in its metadata (a HEAD for each object not named). A stranger's
object is left and reported. With ``purge=True`` on a versioned bucket, every version and delete
marker of those keys and of the head goes too. A delete that fails part way raises; run again, it
removes what is left.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from alpineagents_s3._codec import validate_id
from alpineagents_s3._keys import MARK, PAGE, Layout, fail, list_all
from alpineagents_s3._load import get_head
from alpineagents_s3._memory import Ctx
from alpineagents_s3._steps import Call, Hold, Steps, error_code, send
from alpineagents_s3._translate import ACCESS_CODES, NOT_FOUND_CODES, Fault, translate_fault
from alpineagents_s3.errors import S3AccessDeniedError, S3StoreError

__all__ = ["Deleted", "delete", "marked", "remove"]


@dataclass(frozen=True)
class Deleted:
    """What ``S3Store.delete`` removed.

    Attributes:
        state_id: The State.
        objects: Objects deleted (the head, entries, segments, leftovers).
        versions: Older versions and delete markers removed (``purge=True``).
        kept: Keys under the State's folder left because the store did not write them.
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
            text += f"; kept {len(self.kept)} objects S3Store did not write: {', '.join(self.kept)}"
        return text


def delete(ctx: Ctx, state_id: str, purge: bool) -> Steps[Deleted | None]:
    """The steps of ``delete``: ``None`` when there was nothing of the State at all."""
    validate_id(state_id)
    layout = ctx.layout
    yield Hold(ctx.memory.lock(ctx.scope, state_id))
    head_key = layout.head_key(state_id)
    got = yield from get_head(ctx, state_id)
    named = {head_key}
    if got is not None:
        named.update(got[0].keys(layout))
        (outcome,) = yield from send([layout.delete(head_key)], layout.root)
        if isinstance(outcome, Exception) and error_code(outcome) not in NOT_FOUND_CODES:
            fail(layout, outcome, "DeleteObject", head_key)
    ctx.memory.forget(ctx.scope, state_id)
    listed = yield from list_all(layout, layout.state_folder(state_id))
    keys = [obj["Key"] for obj in listed]
    ours, kept = yield from marked(ctx, keys, named)
    yield from remove(layout, [(key, None) for key in ours])
    ctx.memory.bodies.drop(layout.bucket, ours)
    versions = 0
    if purge:
        versions = yield from _purge(ctx, state_id, set(ours) | named, set(kept))
    if got is None and not ours and not versions:
        return None
    return Deleted(state_id, len(ours) + (got is not None), versions, tuple(sorted(kept)))


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
    return metadata.get(MARK) in {"head", "entry", "segment", "probe"}


def remove(layout: Layout, keys: Sequence[tuple[str, str | None]]) -> Steps[None]:
    """DeleteObjects of ``(key, version)`` pairs; any key not deleted raises, naming it."""
    outcomes = yield from send(layout.delete_many(keys), layout.root)
    for chunk, outcome in zip(_chunks(keys), outcomes, strict=True):
        if isinstance(outcome, Exception):
            fail(layout, outcome, "DeleteObjects", chunk[0][0])
        errors = [e for e in outcome.get("Errors", ()) if e.get("Code") not in NOT_FOUND_CODES]
        if errors:
            first = errors[0]
            fault = Fault(str(first.get("Code")), None, str(first.get("Message", "")))
            where = layout.where("DeleteObjects", str(first.get("Key")))
            error = translate_fault(fault, where)
            if first.get("Code") in ACCESS_CODES and any(v for _, v in chunk):
                error = S3AccessDeniedError(
                    f"{error} The bucket {layout.bucket!r} refused to delete object versions: "
                    "Object Lock (a retention period or legal hold) or MFA delete is on for it. "
                    "Nothing is erased while it protects them"
                )
            raise S3StoreError(
                f"{len(errors)} of {len(chunk)} objects were not deleted ({error}); nothing "
                "deleted is back: run the delete again"
            ) from error


def _chunks(keys: Sequence[tuple[str, str | None]]) -> Iterable[Sequence[tuple[str, str | None]]]:
    return [keys[start : start + PAGE] for start in range(0, len(keys), PAGE)]


def _purge(ctx: Ctx, state_id: str, ours: set[str], kept: set[str]) -> Steps[int]:
    """Remove every older version and delete marker of the State's keys; how many."""
    layout = ctx.layout
    (status,) = yield from send(
        [Call("get_bucket_versioning", {"Bucket": layout.bucket})], layout.root
    )
    if isinstance(status, dict) and status.get("Status") not in ("Enabled", "Suspended"):
        return 0  # never versioned: a plain delete leaves nothing
    head_key = layout.head_key(state_id)
    found = yield from _versions(layout, layout.state_folder(state_id))
    found += [v for v in (yield from _versions(layout, head_key)) if v[0] == head_key]
    unproven = sorted({key for key, _, marker in found if not marker} - ours - kept)
    for key in unproven:  # older versions of keys no head named: the mark of one version
        version = next(v for k, v, marker in found if k == key and not marker)
        (outcome,) = yield from send([layout.head_object(key, version)], layout.root)
        if isinstance(outcome, dict) and _is_marked(outcome):
            ours.add(key)
    markers_only = {k for k, _, m in found if m} - {k for k, _, m in found if not m}
    ours.update(k for k in markers_only if k == head_key or layout.part_name(k) is not None)
    doomed = [(key, version) for key, version, _ in found if key in ours]
    yield from remove(layout, doomed)
    return len(doomed)


def _versions(layout: Layout, prefix: str) -> Steps[list[tuple[str, str, bool]]]:
    """Every version and delete marker under ``prefix``: ``(key, version id, is a marker)``."""
    found: list[tuple[str, str, bool]] = []
    params: dict[str, Any] = {"Bucket": layout.bucket, "Prefix": prefix}
    while True:
        (page,) = yield from send([Call("list_object_versions", dict(params))], layout.root)
        if isinstance(page, Exception):
            fail(layout, page, "ListObjectVersions", prefix)
        found += [(v["Key"], v["VersionId"], False) for v in page.get("Versions", ())]
        found += [(m["Key"], m["VersionId"], True) for m in page.get("DeleteMarkers", ())]
        if not page.get("IsTruncated"):
            return found
        params["KeyMarker"] = page.get("NextKeyMarker")
        params["VersionIdMarker"] = page.get("NextVersionIdMarker")
