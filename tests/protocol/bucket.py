"""An S3 bucket in memory for the model checker: the calls S3Store makes, answered as S3 does.

Conditional headers are honoured (``If-None-Match: *`` and ``If-Match`` on PUT, ``If-None-Match``
on GET), unless the bucket is made ``lying`` (an engine that accepts them and ignores them). A
listing comes back in an order of the bucket's own choosing, a page at a time, and
``StartAfter`` is refused, as S3 Express directory buckets do. Versioning keeps every version
and delete marker. Time is a counter: each write is one tick later than the last.

It also keeps what the checker needs to see: every head change (:attr:`Bucket.events`) and the
keys of strangers' objects, which no store may delete.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from botocore.exceptions import ClientError

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def client_error(code: str, status: int, operation: str = "PutObject") -> ClientError:
    """A ClientError as botocore raises it for an S3 error answer."""
    response: Any = {
        "Error": {"Code": code, "Message": f"{code} (model bucket)"},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    return ClientError(response, operation)


@dataclass
class Version:
    body: bytes | None  # None: a delete marker
    etag: str
    metadata: dict[str, str]
    tick: int
    version_id: str


@dataclass
class Event:
    """A change of a head: a PUT (``body``) or a DELETE (``body is None``), and the head before."""

    key: str
    body: bytes | None
    before: bytes | None


@dataclass
class Bucket:
    """One bucket (see the module). Its methods have the boto3 client's names."""

    rng: random.Random
    lying: bool = False
    versioned: bool = False
    page: int = 3  # keys a listing page holds: small, so that listings page
    tick: int = 0
    objects: dict[str, list[Version]] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    strangers: set[str] = field(default_factory=set)
    # The first bytes of each key under states/ a PUT reached, and the keys PUT with others.
    parts: dict[str, bytes] = field(default_factory=dict)
    rewritten: list[str] = field(default_factory=list)

    # What the checker reads -------------------------------------------------------------

    def current(self, key: str) -> Version | None:
        versions = self.objects.get(key)
        if not versions or versions[-1].body is None:
            return None
        return versions[-1]

    def body(self, key: str) -> bytes | None:
        found = self.current(key)
        return None if found is None else found.body

    def keys(self) -> list[str]:
        return sorted(key for key in self.objects if self.current(key) is not None)

    def put_stranger(self, key: str, body: bytes) -> None:
        """An object of another application (no mark), which must never be deleted."""
        self._write(key, body, {})
        self.strangers.add(key)

    def delete_stranger(self, key: str) -> None:
        """The other application deletes its object: on a versioned bucket, a delete marker
        over its data, both of which are still its own."""
        if self.versioned:
            self.tick += 1
            self.objects[key].append(Version(None, "", {}, self.tick, f"v{self.tick}"))
        else:
            del self.objects[key]

    # The client's methods ---------------------------------------------------------------

    def put_object(
        self,
        Key: str,
        Body: bytes,
        IfNoneMatch: str | None = None,
        IfMatch: str | None = None,
        Metadata: dict[str, str] | None = None,
        **_: Any,
    ) -> dict[str, Any]:
        current = self.current(Key)
        if not self.lying:
            if IfNoneMatch == "*" and current is not None:
                raise client_error("PreconditionFailed", 412)
            if IfMatch is not None and current is None:
                raise client_error("NoSuchKey", 404)
            if IfMatch is not None and current is not None and current.etag != IfMatch:
                raise client_error("PreconditionFailed", 412)
        if "/states/" in Key:  # a part: its first bytes must stay its bytes (invariant 2)
            first = current.body if current is not None and current.body is not None else Body
            if self.parts.setdefault(Key, first) != Body:
                self.rewritten.append(Key)
        version = self._write(Key, Body, dict(Metadata or {}), head=current)
        response = {"ETag": version.etag}
        if self.versioned:
            response["VersionId"] = version.version_id
        return response

    def get_object(self, Key: str, IfNoneMatch: str | None = None, **_: Any) -> dict[str, Any]:
        current = self.current(Key)
        if current is None:
            raise client_error("NoSuchKey", 404, "GetObject")
        if IfNoneMatch is not None and IfNoneMatch == current.etag:
            raise client_error("304", 304, "GetObject")
        assert current.body is not None
        return {
            "Body": current.body,
            "ETag": current.etag,
            "Metadata": dict(current.metadata),
            "LastModified": EPOCH + timedelta(seconds=current.tick),
        }

    def head_object(self, Key: str, VersionId: str | None = None, **_: Any) -> dict[str, Any]:
        found = self.current(Key)
        if VersionId is not None:
            found = next((v for v in self.objects.get(Key, ()) if v.version_id == VersionId), None)
        if found is None or found.body is None:
            raise client_error("404", 404, "HeadObject")
        return {"ETag": found.etag, "Metadata": dict(found.metadata)}

    def delete_object(self, Key: str, VersionId: str | None = None, **_: Any) -> dict[str, Any]:
        self._delete(Key, VersionId)
        return {}

    def delete_objects(self, Delete: dict[str, Any], **_: Any) -> dict[str, Any]:
        for item in Delete["Objects"]:
            self._delete(item["Key"], item.get("VersionId"))
        return {}

    def list_objects_v2(
        self, Prefix: str, ContinuationToken: str | None = None, **params: Any
    ) -> dict[str, Any]:
        if "StartAfter" in params or not Prefix.endswith("/"):
            raise client_error("InvalidArgument", 400, "ListObjectsV2")
        if ContinuationToken is None:
            names = [k for k in self.keys() if k.startswith(Prefix)]
            self.rng.shuffle(names)  # no order, as a directory bucket lists
        else:
            names = ContinuationToken.split("\0") if ContinuationToken else []
        page, rest = names[: self.page], names[self.page :]
        contents = []
        for key in page:
            found = self.current(key)
            if found is not None:  # deleted since the listing began: left out
                assert found.body is not None
                contents.append(
                    {
                        "Key": key,
                        "Size": len(found.body),
                        "ETag": found.etag,
                        "LastModified": EPOCH + timedelta(seconds=found.tick),
                    }
                )
        response: dict[str, Any] = {"Contents": contents, "IsTruncated": bool(rest)}
        if rest:
            response["NextContinuationToken"] = "\0".join(rest)
        return response

    def list_object_versions(self, Prefix: str, **_: Any) -> dict[str, Any]:
        versions: list[dict[str, Any]] = []
        markers: list[dict[str, Any]] = []
        for key, found in self.objects.items():
            if key.startswith(Prefix):
                for v in found:
                    item = {"Key": key, "VersionId": v.version_id, "IsLatest": v is found[-1]}
                    (versions if v.body is not None else markers).append(item)
        return {"Versions": versions, "DeleteMarkers": markers, "IsTruncated": False}

    def get_bucket_versioning(self, **_: Any) -> dict[str, Any]:
        return {"Status": "Enabled"} if self.versioned else {}

    # ---------------------------------------------------------------------------------------

    def _write(
        self, key: str, body: bytes, metadata: dict[str, str], head: Version | None = None
    ) -> Version:
        self.tick += 1
        version = Version(
            body, f'"{hashlib.md5(body).hexdigest()}"', metadata, self.tick, f"v{self.tick}"
        )
        if "/heads/" in key:
            before = self.body(key)
            self.events.append(Event(key, body, before))
        versions = self.objects.setdefault(key, [])
        if not self.versioned:
            versions.clear()
        versions.append(version)
        return version

    def _delete(self, key: str, version_id: str | None) -> None:
        assert key not in self.strangers, f"a store deleted {key}, an object it did not write"
        versions = self.objects.get(key)
        if not versions:
            return
        before = self.body(key)
        if version_id is not None:
            versions[:] = [v for v in versions if v.version_id != version_id]
        elif self.versioned:
            self.tick += 1
            versions.append(Version(None, "", {}, self.tick, f"v{self.tick}"))
        else:
            versions.clear()
        if not versions:
            del self.objects[key]
        if "/heads/" in key and before is not None and self.body(key) is None:
            self.events.append(Event(key, None, before))
