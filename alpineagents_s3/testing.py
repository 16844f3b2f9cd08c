"""Helpers for demos, benchmarks and tests of S3Store: a request log and an embedded moto server.

Not part of the store itself: `embedded_moto` needs moto and changes `os.environ` while it runs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import boto3

from alpineagents_s3._memory import Memory
from alpineagents_s3._store import S3Store

__all__ = ["Request", "RequestLog", "embedded_moto", "separate_process"]

# What each S3 operation S3Store makes counts as.
_KINDS = {
    "PutObject": "PUT",
    "GetObject": "GET",
    "HeadObject": "HEAD",
    "ListObjectsV2": "LIST",
    "ListObjectVersions": "LIST",
    "DeleteObject": "DELETE",
    "DeleteObjects": "DELETE",
}


@dataclass(frozen=True)
class Request:
    """One HTTP request sent to S3 (retries count as requests of their own).

    Attributes:
        operation: The S3 operation, e.g. ``"PutObject"``.
        kind: ``"PUT"``, ``"GET"``, ``"HEAD"``, ``"LIST"``, ``"DELETE"`` or the HTTP method.
        path: The URL path, unquoted: ``/bucket/key`` for path-style addressing.
        condition: ``"If-None-Match: *"`` or ``"If-Match: <etag>"`` when the request had one.
        size: The request body's size in bytes.
    """

    operation: str
    kind: str
    path: str
    condition: str | None
    size: int


class RequestLog:
    """Records every request an S3Store sends. Pass ``event_hooks=log.hooks`` to S3Store.

    Example::

        log = RequestLog()
        store = S3Store("bucket", event_hooks=log.hooks)
        ...
        print(log.counts())  # Counter({'PUT': 3, 'GET': 1})
    """

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self._lock = threading.Lock()

    @property
    def hooks(self) -> dict[str, Callable[..., Any]]:
        """The botocore event hooks for ``S3Store(event_hooks=...)``."""
        return {"before-send.s3": self._record}

    def _record(self, request: Any, event_name: str = "", **kwargs: Any) -> None:
        operation = event_name.rsplit(".", 1)[-1]
        headers = request.headers
        condition = None
        for name in ("If-None-Match", "If-Match"):
            value = headers.get(name)
            if value is not None:
                value = value.decode() if isinstance(value, bytes) else value
                condition = f"{name}: {value}"
        size = headers.get("x-amz-decoded-content-length") or headers.get("Content-Length")
        if size is None:
            body = request.body
            size = len(body) if isinstance(body, bytes | bytearray | str) else 0
        entry = Request(
            operation=operation,
            kind=_KINDS.get(operation, str(request.method)),
            path=unquote(urlsplit(request.url).path),
            condition=condition,
            size=int(size),
        )
        with self._lock:
            self.requests.append(entry)

    def counts(self) -> Counter[str]:
        """How many requests of each kind."""
        with self._lock:
            return Counter(r.kind for r in self.requests)

    def sent_bytes(self) -> int:
        """The request bodies' total size."""
        with self._lock:
            return sum(r.size for r in self.requests)

    def clear(self) -> None:
        """Forget the requests recorded so far."""
        with self._lock:
            self.requests.clear()


def separate_process(store: S3Store) -> S3Store:
    """Make ``store`` act as if it ran in a process of its own, for tests of two writers.

    Every S3Store of a process shares what the process knows of each State (the head its next
    save is conditional on; see docs/protocol.md, "Save"), so two store objects in one test
    are one writer. A store passed here gets a memory of its own: it is a second writer.
    Returns the store.
    """
    store._memory = Memory()
    return store


_TEST_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@contextlib.contextmanager
def embedded_moto(*buckets: str, versioned: bool = False) -> Iterator[str]:
    """Run moto's S3 server on 127.0.0.1 (a free port) for a demo; yield its endpoint URL.

    Creates ``buckets`` (with versioning if ``versioned``). While it runs, AWS credentials and
    region variables that are not set are set to dummy values moto accepts, so an
    ``S3Store(bucket, endpoint_url=url)`` works on a machine without AWS configuration. Needs
    moto's server: ``pip install 'moto[server]>=5.1'``.
    """
    try:
        from moto.server import ThreadedMotoServer
    except ImportError as e:
        raise ImportError(
            "embedded_moto() needs moto's server: pip install 'moto[server]>=5.1'"
        ) from e

    added = {k: v for k, v in _TEST_CREDENTIALS.items() if k not in os.environ}
    werkzeug = logging.getLogger("werkzeug")
    level = werkzeug.level
    werkzeug.setLevel(logging.ERROR)  # no access log lines in the demo's output
    os.environ.update(added)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        url = f"http://{host}:{port}"
        if buckets:
            client = boto3.client("s3", endpoint_url=url, region_name="us-east-1")
            try:
                for bucket in buckets:
                    client.create_bucket(Bucket=bucket)
                    if versioned:
                        client.put_bucket_versioning(
                            Bucket=bucket, VersioningConfiguration={"Status": "Enabled"}
                        )
            finally:
                client.close()
        yield url
    finally:
        server.stop()
        for key in added:
            os.environ.pop(key, None)
        werkzeug.setLevel(level)
