"""What S3Store does, without doing any I/O: key layout, bodies, validation, error translation.

Each store operation is a generator of *steps*. It yields a :class:`Batch` of S3 calls, receives
one outcome per call (the response, or the exception botocore raised), and decides what comes
next; its return value is the operation's result. The boto3 path (``_sync``) and the aioboto3
path (``_async``) only make the calls of a batch, concurrently and bounded, so both follow the
same protocol by construction.

Layout under ``{prefix}``::

    {id}/snapshot.json                     the rest of the State; metadata names its generation
    {id}/entries/{generation}/{seq}.json   one immutable object per history entry

``seq`` is zero-padded to ten digits, so lexical order is seq order. A *generation* is a random
token chosen when a State is created: entries are written under it before the snapshot that
names it, so entries of a create that lost a race (or died before its snapshot) never mix with
the winner's. Such leftovers are ignored when reading and removed with the State.

Writes:

* entries with ``If-None-Match: *``: a 412 means the seq is stored; it is skipped after a GET
  confirms the same entry, else the State has a second writer;
* a new State's snapshot with ``If-None-Match: *``: a 412 means the id is taken;
* a later snapshot with ``If-Match`` on the ETag this store object last wrote or read: a 412
  means another process wrote the State since. A read keeps the ETag it finds only if it is
  not the one held already (see :class:`Version` and :meth:`Protocol._remember`);
* entries beyond a gap (*orphans* of a save killed during its parallel entry PUTs) are left out
  by a read; the next write replaces them with ``If-Match`` on their ETags, or deletes them,
  before it fills the gap.

A 409 ``ConditionalRequestConflict`` (real S3, under contention) is retried here; throttling and
5xx are retried by botocore's retry modes.
"""

from __future__ import annotations

import json
import logging
import random
import re
import uuid
from collections.abc import Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Final, NoReturn, TypeAlias, TypeVar

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
)

from alpineagents_s3 import _contract
from alpineagents_s3._codec import dumps, loads_entry, loads_snapshot, validate_id
from alpineagents_s3._contract import Record, Summary
from alpineagents_s3.errors import (
    BucketNotFoundError,
    ConcurrentWriteError,
    ConditionalWritesUnsupportedError,
    CorruptStateError,
    S3AccessDeniedError,
    S3StoreError,
    SchemaVersionError,
    StateExistsError,
    StateNotFoundError,
)

logger = logging.getLogger("alpineagents_s3")

T = TypeVar("T")

SNAPSHOT: Final = "snapshot.json"
ENTRIES: Final = "entries/"
GENERATION_META: Final = "alpineagents-generation"
# A random token per snapshot PUT: a PUT whose answer was lost is recognised as our own.
WRITE_META: Final = "alpineagents-write"
# The layout version of the objects (absent: 1). A newer one is refused, not misread.
LAYOUT_META: Final = "alpineagents-layout"
LAYOUT: Final = 1
# How many entries from seq 0 on were stored when the snapshot was PUT.
ENTRIES_META: Final = "alpineagents-entries"
SEQ_DIGITS: Final = 10
# S3 lists at most 1,000 keys a page and deletes at most 1,000 keys a request.
PAGE: Final = 1000
# How often a write waits for another write of the same store object clearing orphans.
CLEARING_POLL: Final = 0.01
# 409 ConditionalRequestConflict: attempts in all, and the first backoff in seconds.
CONFLICT_ATTEMPTS: Final = 6
CONFLICT_BACKOFF: Final = 0.05

_ENTRY_NAME = re.compile(rf"([0-9a-f]+)/([0-9]{{{SEQ_DIGITS}}})\.json")
_ACCESS_CODES: Final = frozenset(
    {
        "AccessDenied",
        "AllAccessDisabled",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "AccountProblem",
    }
)
_NOT_FOUND_CODES: Final = frozenset({"NoSuchKey", "404", "NotFound"})


# Steps -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """One S3 client call: a method name of the client and its keyword arguments."""

    method: str
    params: dict[str, Any]


@dataclass(frozen=True)
class Batch:
    """Calls to make concurrently, after ``delay`` seconds."""

    calls: Sequence[Call]
    delay: float = 0.0


# The response of a call (a GetObject's "Body" already read into bytes), or what it raised.
Outcome: TypeAlias = dict[str, Any] | Exception
Steps: TypeAlias = Generator[Batch, list[Outcome], T]


@dataclass(frozen=True)
class Version:
    """What this store object knows of a State: its snapshot, and orphans found by a read.

    ``etag`` and ``generation`` are those of the snapshot this store object last wrote or read:
    the next snapshot is written with ``If-Match`` on that ETag.

    ``floor`` is the history length of the State as this store object last read it after
    another writer changed it. A copy of the State loaded by that read saves from seq
    ``floor`` on; a save from a lower seq comes from a copy older than the other writer's save
    (one held since before, in this process), and is refused like a stale ``If-Match``.

    An orphan is an entry object beyond a gap in the seqs: a save whose entries are PUT in
    parallel was stopped halfway (the process was killed), so seq 3 may be stored and seqs
    1-2 not. A read returns only the unbroken run from seq 0 (``gap`` is its length); the
    orphans are never part of the State, and the next write that fills the gap first replaces
    them (``If-Match`` on the ETag listed here) or removes them.
    """

    etag: str
    generation: str
    gap: int | None = None
    orphans: Mapping[int, str] = field(default_factory=dict)  # seq -> ETag
    floor: int = 0
    # How many entries from seq 0 on are stored, as far as this store object knows; written
    # into the snapshot's metadata so a reader can tell a listing that missed some.
    count: int | None = None
    # Tokens of snapshot PUTs that failed without an answer since the last one that landed:
    # S3 may have applied them, so finding one of them stored means "our own write".
    unsure: frozenset[str] = frozenset()


@dataclass(frozen=True)
class PendingCreate:
    """A create of this store object whose snapshot PUT failed without a clear answer.

    A later create of the same id reuses its generation and recognises its tokens, so a create
    that S3 applied but whose answer was lost is not taken for a taken id.
    """

    generation: str
    tokens: frozenset[str]


@dataclass(frozen=True)
class StoredSnapshot:
    """A snapshot object as read from S3: ``snapshot`` is ``None`` for a State created without."""

    version: Version
    snapshot: dict[str, Any] | None
    body: bytes
    token: str | None


@dataclass(frozen=True)
class StoredObject:
    """One object of a saved State, as :meth:`S3Store.objects` lists it.

    Attributes:
        key: The object's key in the bucket.
        size: Its size in bytes.
        kind: ``"snapshot"``, ``"entry"`` (a history entry of the State), ``"abandoned"`` (an
            entry of a create that did not finish or lost a race: never read, removed with
            the State) or ``"other"`` (not written by S3Store).
        seq: The history entry's seq, for entries.
        last_modified: When S3 stored it.
    """

    key: str
    size: int
    kind: str
    seq: int | None
    last_modified: datetime


def error_code(outcome: Outcome) -> str | None:
    """The S3 error code of a failed call (``None`` for a response or a non-S3 error)."""
    if isinstance(outcome, ClientError):
        return str(outcome.response.get("Error", {}).get("Code", "")) or str(
            outcome.response.get("ResponseMetadata", {}).get("HTTPStatusCode", "")
        )
    return None


def _status(outcome: Outcome) -> int | None:
    if isinstance(outcome, ClientError):
        status = outcome.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return int(status) if status is not None else None
    return None


def new_generation() -> str:
    """A random token naming one creation of a State id."""
    return uuid.uuid4().hex[:16]


def new_token() -> str:
    """A random token naming one snapshot PUT."""
    return uuid.uuid4().hex


# The protocol ------------------------------------------------------------------------------


@dataclass
class Protocol:
    """Key layout, bodies, validation, error translation and the steps of each operation.

    One per S3Store; it keeps the :class:`Version` of each State this store object wrote or
    read, for ``If-Match``.
    """

    bucket: str
    root: str  # the prefix: "" or ending with "/"
    endpoint: str  # for messages
    sse: dict[str, str] = field(default_factory=dict)
    versions: dict[str, Version] = field(default_factory=dict)
    pending_creates: dict[str, PendingCreate] = field(default_factory=dict)
    # State ids whose orphans a write of this store object is clearing: id -> its token.
    _clearing: dict[str, object] = field(default_factory=dict)

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

    # Calls -----------------------------------------------------------------------------

    def _put(self, key: str, body: bytes, **conditions: Any) -> Call:
        params: dict[str, Any] = {
            "Bucket": self.bucket,
            "Key": key,
            "Body": body,
            "ContentType": "application/json",
            **conditions,
            **self.sse,
        }
        return Call("put_object", params)

    def _get(self, key: str) -> Call:
        return Call("get_object", {"Bucket": self.bucket, "Key": key})

    def _list(self, prefix: str, token: str | None = None, **extra: Any) -> Call:
        params: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix, "MaxKeys": PAGE}
        if token:
            params["ContinuationToken"] = token
        return Call("list_objects_v2", {**params, **extra})

    def _send(self, calls: Sequence[Call]) -> Steps[list[Outcome]]:
        """Make calls, retrying those refused with 409 ConditionalRequestConflict."""
        if not calls:
            return []
        outcomes = list((yield Batch(calls)))
        for attempt in range(1, CONFLICT_ATTEMPTS):
            again = [
                i for i, o in enumerate(outcomes) if error_code(o) == "ConditionalRequestConflict"
            ]
            if not again:
                break
            delay = random.uniform(0, CONFLICT_BACKOFF * 2**attempt)
            logger.debug(
                "409 ConditionalRequestConflict on %d request(s) in %s; retry %d in %.3fs",
                len(again),
                self.url(self.root),
                attempt,
                delay,
            )
            retried = yield Batch([calls[i] for i in again], delay=delay)
            for i, outcome in zip(again, retried, strict=True):
                outcomes[i] = outcome
        return outcomes

    # Errors ----------------------------------------------------------------------------

    def error(self, outcome: Outcome, key: str, action: str, conditions: str = "") -> Exception:
        """The store's exception for a failed call on ``key``: what failed, where, what to do.

        ``conditions`` names the conditional headers the call sent, if any.
        """
        where = self.url(key)
        if isinstance(outcome, ClientError):
            code = error_code(outcome) or "?"
            status = _status(outcome)
            message = outcome.response.get("Error", {}).get("Message", "")
            if code == "NoSuchBucket":
                return BucketNotFoundError(
                    f"{action} {where}: the bucket {self.bucket!r} does not exist at "
                    f"{self.endpoint}. Create it, or check the bucket name, region and endpoint"
                )
            if code in _ACCESS_CODES or status == 403:
                return S3AccessDeniedError(
                    f"{action} {where} was refused ({code}: {message}). The credentials in use "
                    f"need s3:GetObject, s3:PutObject and s3:DeleteObject on "
                    f"{self.url(self.root)}* and s3:ListBucket on the bucket {self.bucket!r}: "
                    "check the credentials, profile, bucket policy and KMS key policy"
                )
            if code == "ConditionalRequestConflict":
                return ConcurrentWriteError(
                    f"{action} {where}: S3 kept answering 409 ConditionalRequestConflict "
                    f"after {CONFLICT_ATTEMPTS} attempts: other writers are changing this "
                    "object right now. Save again later"
                )
            if conditions and (code == "NotImplemented" or status == 501):
                return ConditionalWritesUnsupportedError(
                    f"{action} {where} with {conditions} was refused ({code}: {message}): the "
                    f"endpoint {self.endpoint} does not support conditional writes, which "
                    "S3Store needs to keep entries immutable and to detect a second writer. "
                    "Use AWS S3 or an S3-compatible server that supports If-None-Match and "
                    "If-Match on PutObject"
                )
            return S3StoreError(
                f"{action} {where} failed: {code} (HTTP {status}): {message}"
                + (" (after botocore's retries)" if status and status >= 500 else "")
            )
        if isinstance(outcome, NoCredentialsError):
            return S3AccessDeniedError(
                f"{action} {where}: no AWS credentials were found. Configure them the usual "
                "way (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, ~/.aws, an "
                "instance role) or pass session=boto3.Session(...) to S3Store"
            )
        if isinstance(outcome, EndpointConnectionError):
            return S3StoreError(
                f"{action} {where}: cannot connect to {self.endpoint} ({outcome}). Check "
                "endpoint_url (or AWS_ENDPOINT_URL_S3) and the network"
            )
        if isinstance(outcome, BotoCoreError):
            return S3StoreError(f"{action} {where} failed: {outcome}")
        return S3StoreError(f"{action} {where} failed: {type(outcome).__name__}: {outcome}")

    def _raise(self, outcome: Outcome, key: str, action: str, conditions: str = "") -> NoReturn:
        """Raise the store's exception for a failed call."""
        raise self.error(outcome, key, action, conditions) from (
            outcome if isinstance(outcome, BaseException) else None
        )

    def _not_found(self, state_id: str, why: str = "") -> StateNotFoundError:
        """An unknown id: a ``LookupError`` (``KeyError``) in every contract generation."""
        return StateNotFoundError(
            f"no saved State with id {state_id!r} in {self.url(self.root)}{why}"
        )

    # Reading objects -------------------------------------------------------------------

    def _stored_snapshot(self, state_id: str, response: dict[str, Any]) -> StoredSnapshot:
        key = self.snapshot_key(state_id)
        metadata = response.get("Metadata", {})
        self._check_layout(metadata, key)
        generation = metadata.get(GENERATION_META)
        if not generation:
            raise CorruptStateError(
                f"{self.url(key)} has no {GENERATION_META!r} metadata: it was not written by "
                "S3Store (or was copied without its metadata)"
            )
        body = response["Body"]
        raw_count = metadata.get(ENTRIES_META)
        count = int(raw_count) if raw_count and raw_count.isdigit() else None
        return StoredSnapshot(
            Version(response["ETag"], generation, count=count),
            loads_snapshot(body, self.url(key)),
            body,
            metadata.get(WRITE_META),
        )

    def _check_layout(self, metadata: Mapping[str, str], key: str) -> None:
        """Refuse an object of a newer layout than this alpineagents-s3 writes."""
        raw = metadata.get(LAYOUT_META, "1")
        if not raw.isdigit():
            raise CorruptStateError(f"{self.url(key)} has the layout version {raw!r}")
        if int(raw) > LAYOUT:
            raise SchemaVersionError(
                f"{self.url(key)} was written in layout {raw} of alpineagents-s3, newer than "
                f"the installed one reads ({LAYOUT}): upgrade alpineagents-s3 to read it"
            )

    def _entry(self, response: dict[str, Any], key: str, seq: int) -> dict[str, Any]:
        return loads_entry(response["Body"], self.url(key), seq)

    def _snapshot_put(
        self,
        key: str,
        body: bytes,
        version: Version,
        token: str,
        **conditions: Any,
    ) -> Call:
        """The snapshot PUT: its metadata names the generation, this PUT and the layout."""
        metadata = {
            GENERATION_META: version.generation,
            WRITE_META: token,
            LAYOUT_META: str(LAYOUT),
        }
        if version.count is not None:
            metadata[ENTRIES_META] = str(version.count)
        return self._put(key, body, Metadata=metadata, **conditions)

    def _get_snapshot(self, state_id: str, action: str) -> Steps[StoredSnapshot | None]:
        key = self.snapshot_key(state_id)
        (outcome,) = yield from self._send([self._get(key)])
        if isinstance(outcome, Exception):
            if error_code(outcome) in _NOT_FOUND_CODES:
                return None
            self._raise(outcome, key, action)
        assert isinstance(outcome, dict)
        return self._stored_snapshot(state_id, outcome)

    # Write -----------------------------------------------------------------------------

    def write(
        self,
        state_id: str,
        entries: Sequence[dict[str, Any]],
        snapshot: dict[str, Any] | None,
        create: bool,
    ) -> Steps[None]:
        """Entries the bucket lacks (in parallel), then the snapshot (unless ``None``).

        ``snapshot`` is the core's snapshot or info dict, opaque here. ``None`` (the snapshot
        contract of alpineagents 0.2-0.4) keeps the stored one; a State created with ``None``
        gets a snapshot object whose body is ``null``, so its id is taken all the same.
        """
        validate_id(state_id)
        # Every body first: a value JSON cannot hold fails before any request.
        bodies: dict[int, bytes] = {}
        for entry in entries:
            seq = entry.get("seq")
            if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
                raise ValueError(f"a history entry of State {state_id!r} has the seq {seq!r}")
            bodies[seq] = dumps(entry, f"history entry {seq} of State {state_id!r}")
        body = None if snapshot is None else dumps(snapshot, f"the snapshot of {state_id!r}")
        if create:
            yield from self._create(
                state_id, entries, [bodies[e["seq"]] for e in entries], body or b"null"
            )
            return
        # The first seq this copy of the State has not saved yet.
        first = _first_seq(entries) if entries else None
        version = self.versions.get(state_id)
        if version is None:
            version = yield from self._first_write(state_id, entries)
        elif first is not None and first < version.floor:
            raise ConcurrentWriteError(
                f"State {state_id!r} was saved by another writer since this copy of it was "
                f"loaded: this store object has read it since with {version.floor} history "
                f"entries ({self.url(self.snapshot_key(state_id))}), and this save continues "
                f"from entry {first}. Load it again with store.load({state_id!r}) and continue "
                "from what is saved"
            )
        rest = entries
        if entries and version.orphans and first == version.gap:
            version, stored = yield from self._clear_orphans(state_id, version, bodies)
            rest = [entry for entry in entries if entry["seq"] not in stored]
        yield from self._put_entries(
            state_id, version.generation, rest, [bodies[e["seq"]] for e in rest]
        )
        current = self.versions.get(state_id)
        if entries and current is not None:
            # A new Version object: a read that began before these PUTs landed does not
            # record what it listed (it could take them for orphans).
            seqs = {entry["seq"] for entry in entries}
            self.versions[state_id] = replace(
                current,
                orphans={k: v for k, v in current.orphans.items() if k not in seqs},
                count=max(current.count or 0, max(seqs) + 1),
            )
        if body is not None:
            yield from self._replace_snapshot(state_id, body)
        logger.debug(
            "saved %d entries of %s in %s (snapshot: %s)",
            len(entries),
            state_id,
            self.url(self.root),
            snapshot is not None,
        )

    def _first_write(self, state_id: str, entries: Sequence[dict[str, Any]]) -> Steps[Version]:
        """The Version of a State this store object has neither read nor written.

        The snapshot, and for a write with entries the orphans it could meet, listed in the
        same round.
        """
        key = self.snapshot_key(state_id)
        prefix = self.entries_prefix(state_id)
        calls = [self._get(key)] + ([self._list(prefix)] if entries else [])
        outcome, *page = yield from self._send(calls)
        if isinstance(outcome, Exception):
            if error_code(outcome) in _NOT_FOUND_CODES:
                raise self._not_found(state_id, ": create it with create=True first")
            self._raise(outcome, key, "GetObject (before a write)")
        assert isinstance(outcome, dict)
        version = self._stored_snapshot(state_id, outcome).version
        if entries:
            # The State was loaded through another store object: its copy has every seq
            # below its first unsaved one. A gap right there means orphans may follow.
            first = _first_seq(entries)
            listed: dict[int, tuple[str, str]] = {}
            after = self.entry_key(state_id, version.generation, first - 1) if first else None
            yield from self._scan(state_id, version.generation, page[0], listed, after=after)
            gap = first
            while gap in listed:  # seqs below ``first`` are stored: the copy saved them
                gap += 1
            orphans = {seq: etag for seq, (_, etag) in listed.items() if seq > gap}
            version = replace(version, gap=gap, orphans=orphans, count=gap)
        return self.versions.setdefault(state_id, version)

    def _clear_orphans(
        self, state_id: str, version: Version, bodies: Mapping[int, bytes]
    ) -> Steps[tuple[Version, set[int]]]:
        """Replace or delete the orphans, before a write fills the gap below them.

        Each orphan the write has an entry for is replaced (``If-Match`` on the orphan's ETag),
        the others are deleted, so that no entry of the save that was stopped ever joins the
        history. Returns the Version now, and the seqs stored here.

        Never touches a seq of the unbroken run: orphans all lie beyond ``version.gap``. Writes
        of one store object clear one at a time (the deletes are unconditional: S3-compatible
        servers such as LocalStack refuse a conditional DeleteObject), so a delete never
        removes what a concurrent write of the same State has just put in an orphan's place.
        """
        token = object()
        while self._clearing.setdefault(state_id, token) is not token:
            yield Batch((), delay=CLEARING_POLL)
        try:
            cleared = replace(version, orphans={})
            current = self.versions.get(state_id)
            if current is None or current.generation != version.generation or not current.orphans:
                return cleared, set()  # cleared by a write that ran meanwhile
            orphans = dict(current.orphans)
            stale = [
                self.entry_key(state_id, version.generation, seq)
                for seq in sorted(orphans)
                if seq not in bodies
            ]
            puts = {
                seq: (self.entry_key(state_id, version.generation, seq), bodies[seq])
                for seq in orphans
                if seq in bodies
            }
            calls = [self._put(k, b, IfMatch=orphans[seq]) for seq, (k, b) in puts.items()]
            deletes = self._delete_calls(stale)
            outcomes = yield from self._send(calls + deletes)
            stored: set[int] = set()
            changed: list[int] = []
            for seq, outcome in zip(puts, outcomes, strict=False):
                key = puts[seq][0]
                if not isinstance(outcome, Exception):
                    stored.add(seq)
                elif error_code(outcome) == "PreconditionFailed":
                    changed.append(seq)  # replaced since we listed it: by whom?
                elif error_code(outcome) not in _NOT_FOUND_CODES:  # gone: put it anew
                    self._raise(outcome, key, "PutObject", f"If-Match: {orphans[seq]}")
            self._check_deletes(stale, outcomes[len(calls) :], required=True)
            if changed:
                found = yield from self._send([self._get(puts[seq][0]) for seq in changed])
                for seq, outcome in zip(changed, found, strict=True):
                    key, body = puts[seq]
                    if isinstance(outcome, Exception):
                        if error_code(outcome) in _NOT_FOUND_CODES:
                            continue
                        self._raise(outcome, key, "GetObject (a replaced orphan)")
                    assert isinstance(outcome, dict)
                    if self._entry(outcome, key, seq) != json.loads(body):
                        raise self._second_writer(state_id, key, seq)
                    stored.add(seq)  # our own replacement, whose answer was lost
            if self.versions.get(state_id) is current:
                self.versions[state_id] = replace(current, orphans={})
            logger.debug(
                "cleared %d orphan entries of %s: %d replaced, %d deleted",
                len(orphans),
                state_id,
                len(stored),
                len(stale),
            )
            return cleared, stored
        finally:
            if self._clearing.get(state_id) is token:
                del self._clearing[state_id]

    def _second_writer(self, state_id: str, key: str, seq: int) -> ConcurrentWriteError:
        return ConcurrentWriteError(
            f"{self.url(key)} already holds a different history entry {seq} of State "
            f"{state_id!r}: another process is running this State, or ran it since this one "
            f"loaded it. Load it again with store.load({state_id!r}) and continue from what "
            "is saved"
        )

    def _put_entries(
        self,
        state_id: str,
        generation: str,
        entries: Sequence[dict[str, Any]],
        bodies: Sequence[bytes],
    ) -> Steps[list[str]]:
        """PUT entries with If-None-Match; return the keys written. Known seqs are skipped."""
        keys = [self.entry_key(state_id, generation, entry["seq"]) for entry in entries]
        outcomes = yield from self._send(
            [self._put(k, b, IfNoneMatch="*") for k, b in zip(keys, bodies, strict=True)]
        )
        written: list[str] = []
        taken: list[int] = []
        for i, outcome in enumerate(outcomes):
            if not isinstance(outcome, Exception):
                written.append(keys[i])
            elif error_code(outcome) == "PreconditionFailed":
                taken.append(i)
            else:
                self._raise(outcome, keys[i], "PutObject", "If-None-Match: *")
        if taken:
            found = yield from self._send([self._get(keys[i]) for i in taken])
            for i, outcome in zip(taken, found, strict=True):
                if isinstance(outcome, Exception):
                    self._raise(outcome, keys[i], "GetObject (an entry already stored)")
                assert isinstance(outcome, dict)
                stored = self._entry(outcome, keys[i], entries[i]["seq"])
                if outcome["Body"] != bodies[i] and stored != json.loads(bodies[i]):
                    raise self._second_writer(state_id, keys[i], entries[i]["seq"])
                logger.debug("entry %s of %s is stored already: skipped", keys[i], state_id)
        return written

    def _create(
        self,
        state_id: str,
        entries: Sequence[dict[str, Any]],
        entry_bodies: Sequence[bytes],
        body: bytes,
    ) -> Steps[None]:
        """Entries under a new generation, then the snapshot with ``If-None-Match: *``.

        A 412 is a taken id, unless the snapshot found is one this store object PUT in an
        attempt whose answer was lost (its write token says so): then the create happened,
        and the snapshot is brought up to date with ``If-Match``.
        """
        pending = self.pending_creates.get(state_id)
        generation = pending.generation if pending else new_generation()
        written = yield from self._put_entries(state_id, generation, entries, entry_bodies)
        key = self.snapshot_key(state_id)
        token = new_token()
        tokens = (pending.tokens if pending else frozenset()) | {token}
        self.pending_creates[state_id] = PendingCreate(generation, tokens)
        count = len(entries)
        put = self._snapshot_put(
            key, body, Version("", generation, count=count), token, IfNoneMatch="*"
        )
        (outcome,) = yield from self._send([put])
        if not isinstance(outcome, Exception):
            del self.pending_creates[state_id]
            self.versions[state_id] = Version(outcome["ETag"], generation, count=count)
            logger.debug("created %s with %d entries at %s", state_id, len(entries), self.url(key))
            return
        if error_code(outcome) != "PreconditionFailed":
            self._raise(outcome, key, "PutObject", "If-None-Match: *")
        current = yield from self._get_snapshot(state_id, "GetObject (a taken id)")
        if current is not None and current.token in tokens:
            # An attempt of this very create was applied, but its answer was lost.
            del self.pending_creates[state_id]
            self.versions[state_id] = replace(current.version, count=count)
            logger.debug("%s was created by an earlier attempt of this write", self.url(key))
            if current.body != body:
                yield from self._replace_snapshot(state_id, body)
            return
        self.pending_creates.pop(state_id, None)
        yield from self._delete_keys(written, required=False)
        raise StateExistsError(
            f"{self.url(self.root)} already has a State with id {state_id!r} ({self.url(key)}): "
            f"continue it with store.load({state_id!r}), or pick another id"
        )

    def _replace_snapshot(self, state_id: str, body: bytes) -> Steps[None]:
        """PUT the snapshot with ``If-Match`` on the ETag this store object last wrote or read.

        A 412 is a second writer, unless the snapshot found carries the token of one of our own
        PUTs whose answer was lost (botocore retried it, or an earlier save raised): then it is
        ours, and the PUT is made again on its ETag.
        """
        key = self.snapshot_key(state_id)
        for _ in range(3):
            version = self.versions[state_id]
            token = new_token()
            put = self._snapshot_put(key, body, version, token, IfMatch=version.etag)
            (outcome,) = yield from self._send([put])
            if not isinstance(outcome, Exception):
                self.versions[state_id] = replace(version, etag=outcome["ETag"], unsure=frozenset())
                return
            code = error_code(outcome)
            if code in _NOT_FOUND_CODES:
                self.versions.pop(state_id, None)
                raise self._not_found(
                    state_id,
                    f": {self.url(key)} was deleted since this store object last saved it",
                )
            if code != "PreconditionFailed":
                # It may have been applied: remember its token.
                self.versions[state_id] = replace(version, unsure=version.unsure | {token})
                self._raise(outcome, key, "PutObject", f"If-Match: {version.etag}")
            current = yield from self._get_snapshot(state_id, "GetObject (a changed snapshot)")
            if current is None:
                self.versions.pop(state_id, None)
                raise self._not_found(
                    state_id,
                    f": {self.url(key)} was deleted since this store object last saved it",
                )
            ours = version.unsure | {token}
            if current.version.generation != version.generation or current.token not in ours:
                break
            # Our own write, whose answer was lost.
            self.versions[state_id] = replace(
                version, etag=current.version.etag, unsure=frozenset()
            )
            if current.body == body:
                return
        # Keep the old version: every later write of this State here is refused too.
        raise ConcurrentWriteError(
            f"State {state_id!r} was saved by another writer since this process last read or "
            f"wrote it ({self.url(key)} no longer has ETag {version.etag}): two processes are "
            f"running this State. Its saved history is kept; load it again with "
            f"store.load({state_id!r}) to continue from what is saved"
        )

    # Read ------------------------------------------------------------------------------

    def read(self, state_id: str) -> Steps[Record | None]:
        """The snapshot GET and the entry listing at once, then the entry GETs in parallel.

        Returns the unbroken run of entries from seq 0 only; entries beyond a gap (orphans of
        a save that was stopped halfway) are remembered with their ETags, not returned.
        """
        validate_id(state_id)
        held = self.versions.get(state_id)
        prefix = self.entries_prefix(state_id)
        snap_key = self.snapshot_key(state_id)
        snap_out, page = yield from self._send([self._get(snap_key), self._list(prefix)])
        if isinstance(snap_out, Exception):
            if error_code(snap_out) in _NOT_FOUND_CODES:
                return None
            self._raise(snap_out, snap_key, "GetObject")
        assert isinstance(snap_out, dict)
        stored = self._stored_snapshot(state_id, snap_out)
        generation = stored.version.generation
        listed: dict[int, tuple[str, str]] = {}
        entries: dict[int, dict[str, Any]] = {}
        yield from self._scan(state_id, generation, page, listed, entries)

        # A writer may have added entries between our listing and our snapshot GET.
        covered = stored.version.count
        for _ in range(3):
            gap = _run(entries)
            if not isinstance(covered, int) or gap >= covered:
                break
            start = {"StartAfter": self.entry_key(state_id, generation, gap - 1)} if gap else {}
            (page,) = yield from self._send([self._list(f"{prefix}{generation}/", **start)])
            yield from self._scan(state_id, generation, page, listed, entries)
        gap = _run(entries)
        if isinstance(covered, int) and gap < covered:
            raise CorruptStateError(
                f"{self.url(snap_key)} accounts for {covered} history entries, but "
                f"{self.url(prefix)}{generation}/ holds {gap} in a row from seq 0: entry "
                "objects were deleted or moved. Restore them from a bucket version, or delete "
                "the State"
            )

        orphans = {seq: etag for seq, (_, etag) in listed.items() if seq > gap}
        if orphans:
            logger.info(
                "%s: %d entry object(s) beyond seq %d, where a save was stopped halfway, are "
                "left out; the next save replaces or removes them",
                self.url(prefix),
                len(orphans),
                gap,
            )
        self._remember(state_id, held, stored.version, gap, orphans)
        logger.debug("read %s: %d entries", self.url(snap_key), gap)
        return _contract.make_record([entries[seq] for seq in range(gap)], stored.snapshot)

    def _remember(
        self,
        state_id: str,
        held: Version | None,
        read: Version,
        gap: int,
        orphans: dict[int, str],
    ) -> None:
        """Record what a read found, as the Version of the State here.

        ``held`` is the Version when the read began. A write or read of this store object that
        finished meanwhile wins: its knowledge is newer. The same snapshot as ``held`` keeps
        the baseline and floor (a monitor's ``load`` of a running State changes nothing) and
        only updates the orphans. A different snapshot (another writer saved the State, or this
        store object meets it first) becomes the baseline, for the copy this read loads, with
        ``floor`` at its history length: the save of an older copy is refused.
        """
        if self.versions.get(state_id) is not held:
            return
        if held is not None and (held.etag, held.generation) == (read.etag, read.generation):
            self.versions[state_id] = replace(held, gap=gap, orphans=orphans, count=gap)
        else:
            self.versions[state_id] = replace(read, gap=gap, orphans=orphans, floor=gap, count=gap)

    def _scan(
        self,
        state_id: str,
        generation: str,
        page: Outcome,
        listed: dict[int, tuple[str, str]],
        into: dict[int, dict[str, Any]] | None = None,
        *,
        after: str | None = None,
    ) -> Steps[None]:
        """List the entries of ``generation`` from ``page`` on into ``listed`` (seq: key, ETag).

        With ``into``, also GET the entries that extend the unbroken run from seq 0, each round
        fetching the entries of one page while it lists the next. Seqs up to the key ``after``
        are not needed: a truncated listing of all generations skips to it.
        """
        prefix = self.entries_prefix(state_id)
        mine = f"{prefix}{generation}/"
        while True:
            if isinstance(page, Exception):
                self._raise(page, prefix, "ListObjectsV2")
            assert isinstance(page, dict)
            last = ""
            for item in page.get("Contents", ()):
                last = item["Key"]
                parsed = self.parse_entry_key(state_id, last)
                if parsed is None:
                    logger.debug("ignoring %s: not an entry object", self.url(last))
                elif parsed[0] == generation:
                    listed[parsed[1]] = (last, item.get("ETag", ""))
            calls: list[Call] = []
            if page.get("IsTruncated"):
                jump = max(after or "", mine)
                if page.get("Prefix") != mine and last < jump:
                    calls = [self._list(mine, StartAfter=jump)]
                else:
                    calls = [self._list(page.get("Prefix", prefix), page["NextContinuationToken"])]
            wanted: list[int] = []
            if into is not None:
                seq = 0
                while seq in listed:
                    if seq not in into:
                        wanted.append(seq)
                    seq += 1
            outcomes = yield from self._send(calls + [self._get(listed[s][0]) for s in wanted])
            if calls:
                page = outcomes.pop(0)
            for seq, outcome in zip(wanted, outcomes, strict=True):
                key = listed[seq][0]
                if isinstance(outcome, Exception):
                    if error_code(outcome) in _NOT_FOUND_CODES:
                        # Deleted since it was listed (an orphan a writer cleared): the run
                        # ends below it; listing again tells what follows.
                        del listed[seq]
                        continue
                    self._raise(outcome, key, "GetObject")
                assert isinstance(outcome, dict) and into is not None
                into[seq] = self._entry(outcome, key, seq)
            if not calls:
                return

    # List ------------------------------------------------------------------------------

    def list_states(self) -> Steps[list[Summary]]:
        """One ListObjectsV2 per 1,000 States (by ``/``), snapshot GETs in parallel.

        Each State is summarised by the installed core's own summary class. A State created
        without a snapshot (alpineagents 0.2-0.4, in the middle of a turn) is listed once its
        first snapshot is saved.
        """
        saved: list[Summary] = []
        (page,) = yield from self._send([self._list(self.root, Delimiter="/")])
        while True:
            if isinstance(page, Exception):
                self._raise(page, self.root, "ListObjectsV2")
            assert isinstance(page, dict)
            ids = []
            for common in page.get("CommonPrefixes", ()):
                name = common["Prefix"][len(self.root) :].rstrip("/")
                try:
                    ids.append(validate_id(name))
                except ValueError:
                    logger.debug("ignoring %s: not a State id", self.url(common["Prefix"]))
            token = page.get("NextContinuationToken") if page.get("IsTruncated") else None
            calls = [self._list(self.root, token, Delimiter="/")] if token else []
            outcomes = yield from self._send(calls + [self._get(self.snapshot_key(i)) for i in ids])
            if token:
                page = outcomes.pop(0)
            for state_id, outcome in zip(ids, outcomes, strict=True):
                key = self.snapshot_key(state_id)
                if isinstance(outcome, Exception):
                    if error_code(outcome) in _NOT_FOUND_CODES:
                        continue  # a create that did not finish, or a State being deleted
                    self._raise(outcome, key, "GetObject")
                assert isinstance(outcome, dict)
                self._check_layout(outcome.get("Metadata", {}), key)
                snapshot = loads_snapshot(outcome["Body"], self.url(key))
                if snapshot is None:
                    logger.debug("not listing %s: created without a snapshot", self.url(key))
                    continue
                saved.append(self._summary(state_id, snapshot, key))
            if not token:
                break
        return _contract.newest_first(saved)

    def _summary(self, state_id: str, snapshot: dict[str, Any], key: str) -> Summary:
        """The core's summary of a snapshot; a snapshot it cannot read names the object."""
        try:
            return _contract.summarize(state_id, snapshot)
        except Exception as e:
            newer = any(c.__name__ == "SchemaVersionError" for c in type(e).__mro__)
            error = SchemaVersionError if newer else CorruptStateError
            raise error(
                f"{self.url(key)} is not a snapshot alpineagents {_contract.CORE_VERSION} can "
                f"summarise: {type(e).__name__}: {e}"
            ) from e

    # Delete ----------------------------------------------------------------------------

    def delete(self, state_id: str) -> Steps[None]:
        """List every object of the State, delete the snapshot, then the rest in batches.

        An unknown id raises ``StateNotFoundError`` where the installed core says so (this
        repository's core), and does nothing where its contract says that (published
        alpineagents).
        """
        validate_id(state_id)
        prefix = self.state_prefix(state_id)
        keys = yield from self._list_keys(prefix)
        snap_key = self.snapshot_key(state_id)
        self.versions.pop(state_id, None)
        if snap_key not in keys:
            if keys:  # leftovers of a create that did not finish
                yield from self._delete_keys(keys, required=False)
            if _contract.DELETE_OF_UNKNOWN_RAISES:
                raise self._not_found(state_id)
            return  # the published contract: "does nothing if the id does not exist"
        # The snapshot first: the State is gone at once, whole.
        (outcome,) = yield from self._send(
            [Call("delete_object", {"Bucket": self.bucket, "Key": snap_key})]
        )
        if isinstance(outcome, Exception):
            self._raise(outcome, snap_key, "DeleteObject")
        yield from self._delete_keys([k for k in keys if k != snap_key], required=True)
        logger.debug("deleted %s: %d objects", self.url(prefix), len(keys))

    def _list_keys(self, prefix: str) -> Steps[list[str]]:
        keys: list[str] = []
        for item in (yield from self._list_all(prefix)):
            keys.append(item["Key"])
        return keys

    def _list_all(self, prefix: str) -> Steps[list[dict[str, Any]]]:
        items: list[dict[str, Any]] = []
        token = None
        while True:
            (page,) = yield from self._send([self._list(prefix, token)])
            if isinstance(page, Exception):
                self._raise(page, prefix, "ListObjectsV2")
            assert isinstance(page, dict)
            items.extend(page.get("Contents", ()))
            token = page.get("NextContinuationToken") if page.get("IsTruncated") else None
            if not token:
                return items

    def _delete_keys(self, keys: Iterable[str], *, required: bool) -> Steps[None]:
        """DeleteObjects in batches of 1,000, in parallel. Failures raise if ``required``."""
        keys = list(keys)
        outcomes = yield from self._send(self._delete_calls(keys))
        self._check_deletes(keys, outcomes, required=required)

    def _delete_calls(self, keys: Sequence[str]) -> list[Call]:
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

    def _check_deletes(
        self, keys: Sequence[str], outcomes: Sequence[Outcome], *, required: bool
    ) -> None:
        """Raise (if ``required``) or log the first failure of ``_delete_calls(keys)``."""
        batches = [keys[i : i + PAGE] for i in range(0, len(keys), PAGE)]
        for batch, outcome in zip(batches, outcomes, strict=True):
            failure: Exception | None = None
            if isinstance(outcome, Exception):
                failure = self.error(outcome, batch[0], "DeleteObjects")
            elif outcome.get("Errors"):
                first = outcome["Errors"][0]
                response: Any = {
                    "Error": {"Code": first.get("Code"), "Message": first.get("Message")},
                    "ResponseMetadata": {},
                }
                failure = self.error(
                    ClientError(response, "DeleteObjects"),
                    first.get("Key", batch[0]),
                    f"DeleteObjects ({len(outcome['Errors'])} of {len(batch)} keys failed)",
                )
            if failure is None:
                continue
            if required:
                raise failure
            logger.warning("could not remove leftover objects: %s", failure)

    # Objects ---------------------------------------------------------------------------

    def objects(self, state_id: str) -> Steps[list[StoredObject]]:
        """Every object of a State with its size and role, in key order."""
        validate_id(state_id)
        prefix = self.state_prefix(state_id)
        snap_key = self.snapshot_key(state_id)
        head, listing = yield from self._send(
            [Call("head_object", {"Bucket": self.bucket, "Key": snap_key}), self._list(prefix)]
        )
        generation = None
        if isinstance(head, Exception):
            if error_code(head) not in _NOT_FOUND_CODES:
                self._raise(head, snap_key, "HeadObject")
        else:
            generation = head.get("Metadata", {}).get(GENERATION_META)
        if isinstance(listing, Exception):
            self._raise(listing, prefix, "ListObjectsV2")
        assert isinstance(listing, dict)
        items = list(listing.get("Contents", ()))
        if listing.get("IsTruncated"):
            items = yield from self._list_all(prefix)
        found = []
        for item in items:
            key = item["Key"]
            parsed = self.parse_entry_key(state_id, key)
            seq = parsed[1] if parsed else None
            if key == snap_key:
                kind = "snapshot"
            elif parsed is None:
                kind = "other"
            else:
                kind = "entry" if parsed[0] == generation else "abandoned"
            found.append(StoredObject(key, int(item["Size"]), kind, seq, item["LastModified"]))
        return found


def _first_seq(entries: Sequence[dict[str, Any]]) -> int:
    return min(int(entry["seq"]) for entry in entries)


def _run(entries: Mapping[int, Any]) -> int:
    """How many seqs from 0 on ``entries`` has without a hole."""
    seq = 0
    while seq in entries:
        seq += 1
    return seq
