"""alpineagents_s3: keep alpineagents States in an S3 bucket.

``S3Store(bucket, prefix)`` is an ``alpineagents`` Store with a sync path on boto3 and an
async path on aioboto3. It works with the Store contract of every alpineagents from 0.2 on
(``snapshot`` in 0.2-0.4, ``info`` from 0.5) and is registered as the store scheme ``s3``.
Helpers for demos and tests (a request log, an embedded moto server) are in
``alpineagents_s3.testing``.
"""

try:
    import boto3  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "alpineagents_s3 needs boto3, which is not installed: pip install 'boto3>=1.40' "
        "(or reinstall the plugin: pip install alpineagents-s3)"
    ) from e

from alpineagents_s3._delete import Deleted
from alpineagents_s3._engine import Check
from alpineagents_s3._list import StoredObject
from alpineagents_s3._store import S3Store
from alpineagents_s3.errors import (
    BucketNotFoundError,
    ConcurrentWriteError,
    ConditionalWritesUnsupportedError,
    CorruptStateError,
    IncompleteListError,
    S3AccessDeniedError,
    S3StoreError,
    SchemaVersionError,
    StateExistsError,
    StateNotFoundError,
    StoreClosedError,
)

__all__ = [
    "BucketNotFoundError",
    "Check",
    "ConcurrentWriteError",
    "ConditionalWritesUnsupportedError",
    "CorruptStateError",
    "Deleted",
    "IncompleteListError",
    "S3AccessDeniedError",
    "S3Store",
    "S3StoreError",
    "SchemaVersionError",
    "StateExistsError",
    "StateNotFoundError",
    "StoreClosedError",
    "StoredObject",
]
