"""The errors S3Store raises.

Each derives from the builtin that the Store contract of every alpineagents version names
(a taken id is a ``ValueError``, an unknown or deleted id a ``LookupError``, a missing bucket a
``FileNotFoundError``, refused credentials a ``PermissionError``) and, where the installed
alpineagents has a class of the same meaning, from that class too. So ``except ValueError:``
works with the published alpineagents, and ``except StoreError:`` or
``except StateExistsError:`` of a core that defines them works as well.

Every message names the bucket and key (``s3://bucket/key``) and says what to do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import alpineagents

__all__ = [
    "BucketNotFoundError",
    "ConcurrentWriteError",
    "ConditionalWritesUnsupportedError",
    "CorruptStateError",
    "IncompleteListError",
    "S3AccessDeniedError",
    "S3StoreError",
    "SchemaVersionError",
    "StateExistsError",
    "StateNotFoundError",
]


def _core(name: str) -> tuple[type[Exception], ...]:
    """The installed core's public exception class ``name``, if it has one, as a base tuple."""
    found = getattr(alpineagents, name, None)
    if isinstance(found, type) and issubclass(found, Exception):
        return (found,)
    return ()


if TYPE_CHECKING:  # the checker sees the plain hierarchy; at run time the core's classes join
    _StoreBase: tuple[type[Exception], ...] = (Exception,)
else:
    _StoreBase = _core("StoreError") or (Exception,)


class S3StoreError(*_StoreBase):  # type: ignore[misc]
    """The root of S3Store's errors: an S3 request or a stored object failed.

    For errors worth retrying (throttling, 5xx, connection resets) botocore's retries were
    used up before this is raised.
    """


class StateExistsError(S3StoreError, *_core("StateExistsError"), ValueError):  # type: ignore[misc]
    """A new State was written with an id the bucket already has."""


class StateNotFoundError(S3StoreError, *_core("StateNotFoundError"), KeyError):  # type: ignore[misc]
    """The bucket has no State with this id (never saved, or deleted). A ``LookupError``."""

    def __str__(self) -> str:
        # KeyError quotes its argument; the message reads better as it is.
        return str(self.args[0]) if self.args else ""


class ConcurrentWriteError(S3StoreError, *_core("ConcurrentWriteError")):  # type: ignore[misc]
    """Another writer saved the same State since this store object last wrote or read it."""


class CorruptStateError(S3StoreError, *_core("CorruptStateError"), ValueError):  # type: ignore[misc]
    """A stored object is damaged or was not written by S3Store. A ``ValueError``."""


class SchemaVersionError(S3StoreError, *_core("SchemaVersionError"), ValueError):  # type: ignore[misc]
    """A stored object was written by a newer alpineagents-s3 than the one installed."""


class BucketNotFoundError(S3StoreError, FileNotFoundError):
    """The store's bucket does not exist at the endpoint in use."""


class S3AccessDeniedError(S3StoreError, PermissionError):
    """S3 refused a request: the credentials in use lack a permission."""


class ConditionalWritesUnsupportedError(S3StoreError):
    """The endpoint refuses conditional writes (``If-None-Match`` / ``If-Match`` on PUT).

    S3Store needs them to keep history entries immutable and to detect a second writer.
    """


class IncompleteListError(S3StoreError):
    """``list()`` could not read every State; ``states`` holds those it read, newest first.

    Attributes:
        states: The summaries that were read, as ``list()`` would have returned them.
        failed: For each id that could not be read, the error.
    """

    def __init__(self, where: str, states: list[Any], failed: dict[str, S3StoreError]):
        shown = "; ".join(f"{state_id!r}: {error}" for state_id, error in list(failed.items())[:5])
        more = f"; and {len(failed) - 5} more" if len(failed) > 5 else ""
        super().__init__(
            f"could not read {len(failed)} of the States under {where} ({shown}{more}); "
            f"the {len(states)} read are in this error's .states"
        )
        self.states = states
        self.failed = failed


class StoreClosedError(S3StoreError, RuntimeError):
    """The S3Store was closed (``close()``, ``aclose()``, or the end of a ``with`` block)."""
