"""Where S3Store's objects live, the mark it puts on them, and the calls that touch them.

Under the store's prefix ``P`` (see docs/protocol.md, "Objects")::

    P heads/{id}.json                                the head: the State's one commit point
    P states/{id}/{inc}/e{seq}.{wid}.json            one history entry, seq zero-padded
    P states/{id}/{inc}/s{first}-{last}.{wid}.json   a segment: the entries first to last
    P probes/{wid}.json                              the engine check's object

Every object the store writes carries the metadata ``alpineagents-s3: <role>`` (invariant 9).
Every prefix it lists ends in ``/`` and is read to its end as a set (invariant 10): S3 Express
directory buckets list in no order and refuse other prefixes and ``StartAfter``.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, NoReturn

from alpineagents_s3._steps import Call, Outcome, Response, Steps, send
from alpineagents_s3._translate import Where, translate

__all__ = ["MARK", "PAGE", "Layout", "fail", "list_all", "new_wid"]

HEADS: Final = "heads/"
STATES: Final = "states/"
PROBES: Final = "probes/"
# The metadata key of the store's mark; its value is the object's role.
MARK: Final = "alpineagents-s3"
ROLES: Final = frozenset({"head", "entry", "segment", "tombstone", "probe"})
SEQ_DIGITS: Final = 10
# S3 lists at most 1,000 keys a page and deletes at most 1,000 keys a request.
PAGE: Final = 1000

_WID = r"[0-9a-f]{16}"
_ID = r"[A-Za-z0-9_-]{1,128}"
_HEAD_NAME: Final = re.compile(rf"({_ID})\.json")
_PART_NAME: Final = re.compile(
    rf"({_ID})/({_WID})/(?:e([0-9]{{{SEQ_DIGITS}}})|s([0-9]{{{SEQ_DIGITS}}})-([0-9]{{{SEQ_DIGITS}}}))"
    rf"\.({_WID})\.json"
)
_PROBE_NAME: Final = re.compile(rf"{_WID}\.json")
_FOLDER: Final = re.compile(rf"({_ID})/({_WID})/[^/]+")


SSE_MODES: Final = ("AES256", "aws:kms", "aws:kms:dsse")


def root_of(prefix: object) -> str:
    """The prefix as keys begin with it (``""`` or ending in ``/``), or ``ValueError``."""
    if not isinstance(prefix, str):
        raise TypeError(f"prefix is a string, not {type(prefix).__name__}")
    root = prefix.strip("/")
    for folder in root.split("/") if root else []:
        if folder in ("", ".", ".."):
            raise ValueError(
                f"invalid prefix {prefix!r}: the folder name {folder!r} is empty, '.' or '..'; "
                "S3 keeps such names as they are, so the States would not be where the prefix "
                "seems to say"
            )
        if any(ord(c) < 32 or ord(c) == 127 for c in folder):
            raise ValueError(f"invalid prefix {prefix!r}: it holds a control character")
    return f"{root}/" if root else ""


def sse_params(mode: str | None, kms_key_id: str | None) -> dict[str, str]:
    """Every PUT's encryption parameters (S3Store's SSE arguments), or ``ValueError``."""
    if kms_key_id and mode is None:
        mode = "aws:kms"
    if mode is not None and mode not in SSE_MODES:
        raise ValueError(f"server_side_encryption must be one of {SSE_MODES}, not {mode!r}")
    if kms_key_id and not str(mode).startswith("aws:kms"):
        raise ValueError("sse_kms_key_id needs server_side_encryption='aws:kms'")
    sse = {"ServerSideEncryption": mode} if mode else {}
    return sse | ({"SSEKMSKeyId": kms_key_id} if kms_key_id else {})


def new_wid() -> str:
    """A write id: 64 random bits as 16 hex digits, new for every save (and probe)."""
    return secrets.token_hex(8)


@dataclass(frozen=True)
class PartName:
    """What a key under ``P states/`` says: its State, incarnation and range."""

    state_id: str
    inc: str
    first: int
    last: int
    wid: str
    kind: str  # "e" (one entry) or "s" (a segment)


@dataclass(frozen=True)
class Layout:
    """The keys of one store (bucket and prefix), and the calls on them.

    Attributes:
        bucket: The bucket.
        root: The prefix, ``""`` or ending in ``/``.
        endpoint: The endpoint, for messages (no credentials: see ``_translate.scrub``).
        sse: The server-side encryption parameters sent with every PUT.
    """

    bucket: str
    root: str
    endpoint: str
    sse: Mapping[str, str]

    # Keys -------------------------------------------------------------------------------

    def head_key(self, state_id: str) -> str:
        """The key of a State's head."""
        return f"{self.root}{HEADS}{state_id}.json"

    @property
    def heads(self) -> str:
        """The folder of every head (listed by ``list``)."""
        return f"{self.root}{HEADS}"

    @property
    def states(self) -> str:
        """The folder of every State's parts."""
        return f"{self.root}{STATES}"

    @property
    def probes(self) -> str:
        """The folder of the engine check's objects."""
        return f"{self.root}{PROBES}"

    def state_folder(self, state_id: str) -> str:
        """The folder of every incarnation of a State."""
        return f"{self.states}{state_id}/"

    def inc_folder(self, state_id: str, inc: str) -> str:
        """The folder of one incarnation's parts."""
        return f"{self.states}{state_id}/{inc}/"

    def entry_key(self, state_id: str, inc: str, seq: int, wid: str) -> str:
        """The key of one history entry written by the save ``wid``."""
        return f"{self.inc_folder(state_id, inc)}e{seq:0{SEQ_DIGITS}d}.{wid}.json"

    def segment_key(self, state_id: str, inc: str, first: int, last: int, wid: str) -> str:
        """The key of a segment of the entries ``first`` to ``last``."""
        return (
            f"{self.inc_folder(state_id, inc)}"
            f"s{first:0{SEQ_DIGITS}d}-{last:0{SEQ_DIGITS}d}.{wid}.json"
        )

    def folder_of(self, key: str) -> tuple[str, str] | None:
        """``(state id, inc)`` of a key in an incarnation's folder (``None``: not in one)."""
        found = _FOLDER.fullmatch(key[len(self.states) :]) if key.startswith(self.states) else None
        return (found.group(1), found.group(2)) if found else None

    def probe_key(self, wid: str) -> str:
        """The key of one engine check."""
        return f"{self.probes}{wid}.json"

    def id_of_head(self, key: str) -> str | None:
        """The State id of a key under ``heads/`` (``None``: not a head's name)."""
        found = _HEAD_NAME.fullmatch(key.removeprefix(self.heads))
        return found.group(1) if found and key.startswith(self.heads) else None

    def part_name(self, key: str) -> PartName | None:
        """What a key under ``states/`` names (``None``: no name the store gives)."""
        if not key.startswith(self.states):
            return None
        found = _PART_NAME.fullmatch(key[len(self.states) :])
        if found is None:
            return None
        state_id, inc, seq, first, last, wid = found.groups()
        if seq is not None:
            return PartName(state_id, inc, int(seq), int(seq), wid, "e")
        return PartName(state_id, inc, int(first), int(last), wid, "s")

    def is_probe(self, key: str) -> bool:
        """Whether a key is named as the engine check names its objects."""
        return key.startswith(self.probes) and bool(_PROBE_NAME.fullmatch(key[len(self.probes) :]))

    # Messages ---------------------------------------------------------------------------

    def url(self, key: str) -> str:
        """``s3://bucket/key``."""
        return f"s3://{self.bucket}/{key}"

    def where(self, action: str, key: str, conditions: str = "") -> Where:
        """What an error message says about a request on ``key``."""
        return Where(
            action=action,
            url=self.url(key),
            bucket=self.bucket,
            endpoint=self.endpoint,
            root=self.url(self.root),
            conditions=conditions,
        )

    # Calls ------------------------------------------------------------------------------

    def put(
        self, key: str, body: bytes, role: str, *, if_match: str | None = None, create: bool = True
    ) -> Call:
        """A PUT of ``body``: ``If-Match`` when given, else ``If-None-Match: *`` if ``create``."""
        params: dict[str, Any] = {
            "Bucket": self.bucket,
            "Key": key,
            "Body": body,
            "ContentType": "application/json",
            "Metadata": {MARK: role},
            **self.sse,
        }
        if if_match is not None:
            params["IfMatch"] = if_match
        elif create:
            params["IfNoneMatch"] = "*"
        return Call("put_object", params)

    def get(self, key: str, *, if_none_match: str | None = None) -> Call:
        """A GET (with ``If-None-Match`` when given: 304 if unchanged)."""
        params: dict[str, Any] = {"Bucket": self.bucket, "Key": key}
        if if_none_match is not None:
            params["IfNoneMatch"] = if_none_match
        return Call("get_object", params)

    def head_object(self, key: str, version: str | None = None) -> Call:
        """A HEAD, to read an object's metadata (the store's mark)."""
        params: dict[str, Any] = {"Bucket": self.bucket, "Key": key}
        if version is not None:
            params["VersionId"] = version
        return Call("head_object", params)

    def delete(self, key: str, version: str | None = None) -> Call:
        """A DELETE of one key (or one version of it)."""
        params: dict[str, Any] = {"Bucket": self.bucket, "Key": key}
        if version is not None:
            params["VersionId"] = version
        return Call("delete_object", params)

    def delete_many(self, keys: Sequence[tuple[str, str | None]]) -> list[Call]:
        """DeleteObjects of ``(key, version or None)`` pairs, 1,000 a request."""
        calls = []
        for start in range(0, len(keys), PAGE):
            objects = [
                {"Key": key} if version is None else {"Key": key, "VersionId": version}
                for key, version in keys[start : start + PAGE]
            ]
            calls.append(
                Call(
                    "delete_objects",
                    {"Bucket": self.bucket, "Delete": {"Objects": objects, "Quiet": True}},
                )
            )
        return calls

    def list_page(self, prefix: str, token: str | None = None) -> Call:
        """One ListObjectsV2 page of ``prefix`` (which ends in ``/``)."""
        params: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix}
        if token is not None:
            params["ContinuationToken"] = token
        return Call("list_objects_v2", params)


def fail(layout: Layout, outcome: Outcome, action: str, key: str, conditions: str = "") -> NoReturn:
    """Raise the store's error for a failed call, naming bucket and key."""
    assert isinstance(outcome, Exception)
    raise translate(outcome, layout.where(action, key, conditions)) from outcome


def list_all(layout: Layout, prefix: str) -> Steps[list[dict[str, Any]]]:
    """Every object under ``prefix`` (``Key``, ``Size``, ``LastModified``), in no order.

    Pages are fetched one after another (each names the next); their order and the order
    within them mean nothing here.
    """
    found: list[dict[str, Any]] = []
    token: str | None = None
    while True:
        (outcome,) = yield from send([layout.list_page(prefix, token)], layout.root)
        if isinstance(outcome, Exception):
            fail(layout, outcome, "ListObjectsV2", prefix)
        page: Response = outcome
        found.extend(page.get("Contents", ()))
        token = page.get("NextContinuationToken")
        if not page.get("IsTruncated") or not token:
            return found
