"""The errors S3Store raises besides the core's store errors.

The core's errors keep their meaning on S3: a taken id is ``StateExistsError`` (a
``ValueError``), an unknown id ``StateNotFoundError`` (a ``KeyError``), a second process writing
the same State ``ConcurrentWriteError``, a damaged or foreign object ``CorruptStateError`` and an
object of a newer schema ``SchemaVersionError``. The classes here cover what only S3 has; each
message names the bucket and key and says what to do.
"""

from __future__ import annotations

from alpineagents.errors import StoreError

__all__ = [
    "BucketNotFoundError",
    "ConditionalWritesUnsupportedError",
    "S3AccessDeniedError",
    "S3StoreError",
]


class S3StoreError(StoreError):
    """An S3 request failed (after botocore's retries, for errors worth retrying)."""


class BucketNotFoundError(S3StoreError, FileNotFoundError):
    """The store's bucket does not exist at the endpoint in use."""


class S3AccessDeniedError(S3StoreError, PermissionError):
    """S3 refused a request: the credentials in use lack a permission."""


class ConditionalWritesUnsupportedError(S3StoreError):
    """The endpoint refuses conditional writes (``If-None-Match`` / ``If-Match`` on PUT).

    S3Store needs them to keep history entries immutable and to detect a second writer.
    """
