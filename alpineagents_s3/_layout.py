"""Where a State's objects live in the bucket, what their metadata says, and the calls on them.

Layout under the store's prefix::

    {id}/snapshot.json                           the rest of the State; names the generation
    {id}/entries/{generation}/{seq}.json         one immutable object per history entry
    {id}/packed/{generation}/{start}-{end}.json  a packed segment: entries start to end - 1

``seq`` is zero-padded to ten digits, so lexical order is seq order. A *generation* is a random
token chosen when a State is created: entries are written under it before the snapshot that names
it, so entries of a create that lost a race (or died before its snapshot) never mix with the
winner's. The snapshot's metadata names the generation, the PUT that wrote it (a random token, so
a PUT whose answer was lost is recognised as our own), the layout version, and how many entries
from seq 0 on were stored when it was written: those entries are part of the State. An entry's
metadata names the *base* of its writer, the ETag of the snapshot that writer had last written or
read; the *writer* (a random token per store object); and, for an entry of a save that ends with a
snapshot PUT, that it is *pending* until a snapshot counts it. Beyond the snapshot's count, a
reader replays only entries saved alone (a tool result, acknowledged after a check of the base)
on top of the stored snapshot, one writer's in a row. An entry saved on top of an older snapshot
belongs to a writer that lost a race or held a stale copy; its snapshot PUT (``If-Match`` on that
older ETag) can never land, so no reader replays it and the next writer replaces it. Before a
writer replaces an entry based on the *stored* snapshot (another writer's pending entry, or an
orphan), it first *claims* that snapshot: it PUTs it again, slightly changed, with ``If-Match``,
so that the other writer's snapshot PUT can no longer land.
"""

from __future__ import annotations

import re
import secrets
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, NoReturn

from alpineagents_s3 import _refs
from alpineagents_s3._codec import loads_snapshot
from alpineagents_s3._steps import Call, Outcome, Response, Steps, send
from alpineagents_s3._translate import Where, translate
from alpineagents_s3.errors import (
    CorruptStateError,
    S3StoreError,
    SchemaVersionError,
    StateNotFoundError,
)

SNAPSHOT: Final = "snapshot.json"
ENTRIES: Final = "entries/"
PACKED: Final = "packed/"
SEQ_DIGITS: Final = 10
GENERATION_META: Final = "alpineagents-generation"
WRITE_META: Final = "alpineagents-write"
# The layout version of the objects (absent: 1). A newer one is refused, not misread. A
# snapshot object whose context's long texts are kept in history entries (``_refs``) is 2.
# Layout 3 (every snapshot this version writes): beyond the snapshot's count, a load reads the
# entries committed alone (``ALONE_META``), one writer's in a row, whatever snapshot they were
# based on, and applies the snapshot changes they carry (``_patches``); the body is plain JSON
# or, for a snapshot holding a model context, compressed as in layout 2.
LAYOUT_META: Final = "alpineagents-layout"
LAYOUT: Final = 3
# On a layout 3 snapshot: "1" if saves that commit by their entry alone may carry changes of it
# after it (the State is running); a listing then reads those changes.
OPEN_META: Final = "alpineagents-open"
ENTRIES_META: Final = "alpineagents-entries"
# On an entry: the ETag of the snapshot its writer had last written or read ("-" in a create).
BASE_META: Final = "alpineagents-base"
CREATE_BASE: Final = "-"
# The base of an entry of a refused save: on top of no snapshot, so never replayed.
REFUSED_BASE: Final = "refused"
# On an entry: the writer (store object) that stored it, a random token.
WRITER_META: Final = "alpineagents-writer"
# On an entry of a save that ends with a snapshot PUT: "snapshot" (pending until one counts it).
PENDING_META: Final = "alpineagents-pending"
PENDING: Final = "snapshot"
# On an entry committed alone in layout 3 (its PUT is the save): the change of the snapshot it
# carries (``_patches``), "-" for none.
ALONE_META: Final = "alpineagents-alone"
# On a claim: the ETag of the snapshot it replaced, and the claiming writer. Loads read that
# writer's entries saved alone on the replaced snapshot as on the claim (its own tool results).
CLAIMED_META: Final = "alpineagents-claimed-from"
CLAIMER_META: Final = "alpineagents-claimer"
# S3 lists at most 1,000 keys a page and deletes at most 1,000 keys a request.
PAGE: Final = 1000

_ENTRY_NAME = re.compile(rf"([0-9a-f]+)/([0-9]{{{SEQ_DIGITS}}})\.json")
_SEGMENT_NAME = re.compile(rf"([0-9a-f]+)/([0-9]{{{SEQ_DIGITS}}})-([0-9]{{{SEQ_DIGITS}}})\.json")


def new_generation() -> str:
    """A random token naming one creation of a State id."""
    return uuid.uuid4().hex[:16]


def new_token() -> str:
    """A random token naming one snapshot PUT (64 bits: metadata is sent with every PUT)."""
    return secrets.token_hex(8)


@dataclass(frozen=True)
class SnapshotMeta:
    """What a snapshot object's metadata says.

    Attributes:
        generation: The generation whose entries belong to the State.
        token: The token of the PUT that wrote it (``None`` if absent).
        count: How many entries from seq 0 on were stored when it was written, if recorded.
        claimed_from: For a claim, the ETag of the snapshot it replaced.
        claimer: For a claim, the writer that made it.
        layout: Its layout version (1 if not recorded).
        open: Whether entries committed alone after it may carry changes of it (layout 3).
    """

    generation: str
    token: str | None
    count: int | None
    claimed_from: str | None = None
    claimer: str | None = None
    layout: int = 1
    open: bool = False


@dataclass(frozen=True)
class StoredSnapshot:
    """A snapshot object as read: ``snapshot`` is ``None`` for a State created without one.

    ``refs`` are the texts of its context kept in history entries: ``snapshot`` holds ``""``
    in their place until :func:`~alpineagents_s3._refs.resolve` puts them back.
    """

    etag: str
    meta: SnapshotMeta
    snapshot: dict[str, Any] | None
    body: bytes
    refs: tuple[_refs.Ref, ...] = ()


@dataclass(frozen=True)
class Mark:
    """What an entry's metadata says of its writer, besides the base.

    Attributes:
        writer: The writer's token (one per store object).
        pending: Whether the save ends with a snapshot PUT, which makes the entry part of the
            State; an entry saved alone is part of it once saved on top of the stored snapshot.
        change: For an entry committed alone (layout 3), the change of the snapshot it carries
            (``_patches``; ``"-"``: none); ``None`` for the other entries.
    """

    writer: str
    pending: bool
    change: str | None = None

    def metadata(self, base: str) -> dict[str, str]:
        """The entry's metadata, on top of the snapshot ``base``.

        An entry committed alone carries no base (loads read it whatever snapshot it was saved
        on), unless it is that of a refused save.
        """
        metadata = {WRITER_META: self.writer}
        if self.change is None or self.pending or base == REFUSED_BASE:
            metadata[BASE_META] = base
        if self.pending:
            metadata[PENDING_META] = PENDING
        elif self.change is not None:
            metadata[ALONE_META] = self.change
        return metadata


def claim_body(body: bytes) -> bytes:
    """``body`` with a random tail of whitespace: the same JSON, an ETag no PUT had before.

    S3's ETag of a plain PUT is the MD5 of the body, so each claim must write bytes no earlier
    version of the snapshot had: 64 random bits, spelled in spaces and tabs.
    """
    if _refs.compressed(body):  # layout 2: the same JSON inside, compressed again
        return _refs.compress(claim_body(_refs.decompress(body, "the snapshot")))
    bits = secrets.randbits(64)
    tail = bytes(b" \t"[(bits >> i) & 1] for i in range(64))
    return body.rstrip(b" \t\n") + b"\n" + tail + b"\n"


@dataclass(frozen=True)
class Layout:
    """The keys, calls and messages of one store's prefix in one bucket."""

    bucket: str
    root: str  # the prefix: "" or ending with "/"
    endpoint: str  # for messages
    sse: Mapping[str, str] = field(default_factory=dict)

    # Keys and names ------------------------------------------------------------------

    def url(self, key: str = "") -> str:
        """``s3://bucket/key``, the way messages name an object."""
        return f"s3://{self.bucket}/{key}"

    def state_prefix(self, state_id: str) -> str:
        """The prefix of every object of one State."""
        return f"{self.root}{state_id}/"

    def snapshot_key(self, state_id: str) -> str:
        """The key of a State's snapshot."""
        return f"{self.root}{state_id}/{SNAPSHOT}"

    def entries_prefix(self, state_id: str) -> str:
        """The prefix of a State's entry objects, all generations."""
        return f"{self.root}{state_id}/{ENTRIES}"

    def entry_key(self, state_id: str, generation: str, seq: int) -> str:
        """The key of one history entry."""
        return f"{self.root}{state_id}/{ENTRIES}{generation}/{seq:0{SEQ_DIGITS}d}.json"

    def parse_entry_key(self, state_id: str, key: str) -> tuple[str, int] | None:
        """``(generation, seq)`` of an entry key, or ``None`` for a key S3Store did not name."""
        match = _ENTRY_NAME.fullmatch(key.removeprefix(self.entries_prefix(state_id)))
        return (match[1], int(match[2])) if match else None

    def packed_prefix(self, state_id: str) -> str:
        """The prefix of a State's packed segments, all generations."""
        return f"{self.root}{state_id}/{PACKED}"

    def segment_key(self, state_id: str, generation: str, start: int, end: int) -> str:
        """The key of the packed segment holding entries ``start`` to ``end - 1``."""
        return (
            f"{self.root}{state_id}/{PACKED}{generation}/"
            f"{start:0{SEQ_DIGITS}d}-{end:0{SEQ_DIGITS}d}.json"
        )

    def parse_segment_key(self, state_id: str, key: str) -> tuple[str, int, int] | None:
        """``(generation, start, end)`` of a segment key, or ``None`` for another key."""
        match = _SEGMENT_NAME.fullmatch(key.removeprefix(self.packed_prefix(state_id)))
        if not match or int(match[3]) <= int(match[2]):
            return None
        return match[1], int(match[2]), int(match[3])

    def generation_of(self, state_id: str, key: str) -> str | None:
        """The generation an entry or segment key belongs to (``None``: neither)."""
        entry = self.parse_entry_key(state_id, key)
        if entry is not None:
            return entry[0]
        segment = self.parse_segment_key(state_id, key)
        return segment[0] if segment is not None else None

    # Calls -----------------------------------------------------------------------------

    def put(self, key: str, body: bytes, **conditions: Any) -> Call:
        """A PutObject of a JSON body, with the store's encryption settings."""
        params: dict[str, Any] = {
            "Bucket": self.bucket,
            "Key": key,
            "Body": body,
            "ContentType": "application/json",
            **conditions,
            **self.sse,
        }
        return Call("put_object", params)

    def entry_put(
        self,
        state_id: str,
        generation: str,
        seq: int,
        body: bytes,
        base: str,
        mark: Mark,
        **conditions: Any,
    ) -> Call:
        """An entry PUT: its metadata names the snapshot its writer worked from, and the writer.

        A PUT that replaces an entry (``IfMatch``) writes bytes no PUT had before (the same
        JSON, a random tail of whitespace): S3's ETag is the MD5 of the body, so a writer that
        read the entry before this replacement can no longer replace it in turn.
        """
        key = self.entry_key(state_id, generation, seq)
        if "IfMatch" in conditions:
            body = claim_body(body)
        return self.put(key, body, Metadata=mark.metadata(base), **conditions)

    def snapshot_put(
        self,
        state_id: str,
        body: bytes,
        generation: str,
        token: str,
        count: int | None,
        claim: tuple[str, str] | None = None,
        *,
        open: bool = False,
        **conditions: Any,
    ) -> Call:
        """The snapshot PUT: its metadata names the generation, this PUT and the layout (3).

        ``claim`` is ``(the ETag it replaces, the claiming writer)`` for a claim; ``open``
        says that saves committing by their entry alone may change the snapshot after it.
        """
        metadata = {GENERATION_META: generation, WRITE_META: token, LAYOUT_META: str(LAYOUT)}
        if count is not None:
            metadata[ENTRIES_META] = str(count)
        if claim is not None:
            metadata[CLAIMED_META], metadata[CLAIMER_META] = claim
        if open:
            metadata[OPEN_META] = "1"
        return self.put(self.snapshot_key(state_id), body, Metadata=metadata, **conditions)

    def get(self, key: str) -> Call:
        """A GetObject."""
        return Call("get_object", {"Bucket": self.bucket, "Key": key})

    def head(self, key: str, **conditions: Any) -> Call:
        """A HeadObject (``IfMatch=etag``: 412 unless the object still has that ETag)."""
        return Call("head_object", {"Bucket": self.bucket, "Key": key, **conditions})

    def list_page(self, prefix: str, token: str | None = None, **extra: Any) -> Call:
        """One page (1,000 keys) of ListObjectsV2 under ``prefix``."""
        params: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix, "MaxKeys": PAGE}
        if token:
            params["ContinuationToken"] = token
        return Call("list_objects_v2", {**params, **extra})

    def delete(self, key: str) -> Call:
        """A DeleteObject."""
        return Call("delete_object", {"Bucket": self.bucket, "Key": key})

    def delete_many(self, keys: Sequence[str]) -> list[Call]:
        """DeleteObjects calls for ``keys``, 1,000 a call."""
        return [
            Call(
                "delete_objects",
                {
                    "Bucket": self.bucket,
                    "Delete": {"Objects": [{"Key": k} for k in keys[i : i + PAGE]], "Quiet": True},
                },
            )
            for i in range(0, len(keys), PAGE)
        ]

    def send(self, calls: Sequence[Call]) -> Steps[list[Outcome]]:
        """Make ``calls`` at once, with the 409 retry (see :func:`~alpineagents_s3._steps.send`)."""
        return send(calls, self.url(self.root))

    # Objects ---------------------------------------------------------------------------

    def stored_snapshot(self, state_id: str, response: Response) -> StoredSnapshot:
        """A GetObject response of a snapshot, checked: layout, generation, body."""
        key = self.snapshot_key(state_id)
        metadata = response.get("Metadata", {})
        self.check_layout(metadata, key)
        generation = metadata.get(GENERATION_META)
        if not generation:
            raise CorruptStateError(
                f"{self.url(key)} has no {GENERATION_META!r} metadata: it was not written by "
                "S3Store (or was copied without its metadata)"
            )
        raw_count = metadata.get(ENTRIES_META)
        count = int(raw_count) if raw_count and raw_count.isdigit() else None
        body = response["Body"]
        snapshot, refs = self.snapshot_of(metadata, body, key)
        return StoredSnapshot(
            response["ETag"],
            SnapshotMeta(
                generation,
                metadata.get(WRITE_META),
                count,
                metadata.get(CLAIMED_META),
                metadata.get(CLAIMER_META),
                int(metadata.get(LAYOUT_META, "1")),
                metadata.get(OPEN_META) == "1",
            ),
            snapshot,
            body,
            tuple(refs),
        )

    def snapshot_of(
        self, metadata: Mapping[str, str], body: bytes, key: str
    ) -> tuple[dict[str, Any] | None, list[_refs.Ref]]:
        """The snapshot in a snapshot object's body, and the texts it keeps in entries."""
        where = self.url(key)
        layout = metadata.get(LAYOUT_META, "1")
        if layout == "1":
            return loads_snapshot(body, where), []
        if layout != "2" and not _refs.compressed(body):  # layout 3: a body says which it is
            return loads_snapshot(body, where), []
        if not _refs.compressed(body):
            raise CorruptStateError(f"{where} is a snapshot of layout 2, but not compressed")
        return _refs.unwrap(loads_snapshot(_refs.decompress(body, where), where), where)

    def check_layout(self, metadata: Mapping[str, str], key: str) -> None:
        """Refuse an object of a newer layout than this alpineagents-s3 writes."""
        raw = metadata.get(LAYOUT_META, "1")
        if not raw.isdigit():
            raise CorruptStateError(f"{self.url(key)} has the layout version {raw!r}")
        if int(raw) > LAYOUT:
            raise SchemaVersionError(
                f"{self.url(key)} was written in layout {raw} of alpineagents-s3, newer than "
                f"the installed one reads ({LAYOUT}): upgrade alpineagents-s3 to read it"
            )

    # Errors ----------------------------------------------------------------------------

    def where(self, key: str, action: str, conditions: str = "") -> Where:
        """What an error message says about a request on ``key``."""
        return Where(
            action, self.url(key), self.bucket, self.endpoint, self.url(self.root), conditions
        )

    def error(
        self, failure: Exception, key: str, action: str, conditions: str = ""
    ) -> S3StoreError:
        """The store's exception for a failed call on ``key``: what failed, where, what to do."""
        return translate(failure, self.where(key, action, conditions))

    def fail(self, failure: Exception, key: str, action: str, conditions: str = "") -> NoReturn:
        """Raise the store's exception for a failed call, chained to what the client raised."""
        raise self.error(failure, key, action, conditions) from failure

    def not_found(self, state_id: str, why: str = "") -> StateNotFoundError:
        """An unknown id: a ``LookupError`` (``KeyError``) in every contract generation."""
        return StateNotFoundError(
            f"no saved State with id {state_id!r} in {self.url(self.root)}{why}"
        )
