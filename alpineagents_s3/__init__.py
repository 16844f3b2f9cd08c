"""alpineagents_s3: keep alpineagents States in an S3 bucket.

``S3Store(bucket, prefix)`` is a :class:`alpineagents.Store` with a sync path on boto3 and an
async path on aioboto3. It is registered as the store scheme ``s3``, so
``open_store("s3://bucket/prefix")`` opens one.
"""

try:
    import aioboto3  # noqa: F401
    import boto3  # noqa: F401
except ImportError as e:
    raise ImportError(
        "alpineagents_s3 needs boto3 and aioboto3: pip install 'alpineagents[s3]' "
        f"({e})"
    ) from e

from alpineagents_s3._protocol import StoredObject
from alpineagents_s3._store import S3Store
from alpineagents_s3._tools import Request, RequestLog, embedded_moto
from alpineagents_s3.errors import (
    BucketNotFoundError,
    ConditionalWritesUnsupportedError,
    S3AccessDeniedError,
    S3StoreError,
)

__all__ = [
    "BucketNotFoundError",
    "ConditionalWritesUnsupportedError",
    "Request",
    "RequestLog",
    "S3AccessDeniedError",
    "S3Store",
    "S3StoreError",
    "StoredObject",
    "embedded_moto",
]
