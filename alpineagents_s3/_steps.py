"""The steps an S3Store operation yields, and sending calls with the 409 retry.

Each store operation is a generator of steps. It yields a :class:`Batch` of S3 calls and receives
one outcome per call: the response (a GetObject's ``Body`` already read into bytes) or the
exception the client raised. It yields :class:`Hold` to run the rest of it exclusively among
the operations of the process on one State. Its return value is the operation's result.

A *driver* runs the steps: ``_sync.SyncDriver`` with boto3 on a thread pool, ``_async.AsyncDriver``
with aioboto3 as tasks, and the tests' scripted driver with canned outcomes. Drivers make calls and
hold locks; every decision is made here and in the operation modules, so both paths follow the same
protocol by construction.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias, TypeVar

from botocore.exceptions import ClientError

from alpineagents_s3._lock import HandoffLock

logger = logging.getLogger("alpineagents_s3")

T = TypeVar("T")

# 409 ConditionalRequestConflict: attempts in all, and the first backoff in seconds.
CONFLICT_ATTEMPTS: Final = 6
CONFLICT_BACKOFF: Final = 0.05


@dataclass(frozen=True)
class Call:
    """One S3 client call: a method name of the client and its keyword arguments.

    ``then``, for a GetObject, is applied by the driver to the body's bytes as soon as they are
    read (a packed segment is parsed while the other objects of its batch are still on the
    way); its value becomes the ``Body``. It must not raise: it returns what went wrong.
    """

    method: str
    params: dict[str, Any]
    then: Callable[[bytes], Any] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Batch:
    """Calls to make concurrently, after ``delay`` seconds; the driver sends their outcomes."""

    calls: Sequence[Call]
    delay: float = 0.0


@dataclass(frozen=True)
class Hold:
    """Acquire ``lock``; the driver releases it when the operation ends, however it ends."""

    lock: HandoffLock


Step: TypeAlias = Batch | Hold
# A response as the client returns it (a GetObject's "Body" already read into bytes).
Response: TypeAlias = dict[str, Any]
# The response of a call, or what the client raised.
Outcome: TypeAlias = Response | Exception
# An operation: it yields steps, is sent the outcomes of each Batch (nothing for a Hold),
# and returns T.
Steps: TypeAlias = Generator[Step, list[Outcome], T]


def error_code(outcome: Outcome) -> str | None:
    """The S3 error code of a failed call (``None`` for a response or a non-S3 error).

    An error without a code (a HEAD request's 404 has no body) is named by its HTTP status.
    """
    if isinstance(outcome, ClientError):
        return str(outcome.response.get("Error", {}).get("Code", "")) or str(
            outcome.response.get("ResponseMetadata", {}).get("HTTPStatusCode", "")
        )
    return None


def http_status(outcome: Outcome) -> int | None:
    """The HTTP status of a failed S3 call, if the client recorded one."""
    if isinstance(outcome, ClientError):
        status = outcome.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return int(status) if status is not None else None
    return None


def send(calls: Sequence[Call], where: str) -> Steps[list[Outcome]]:
    """Make ``calls`` at once, retrying those refused with 409 ConditionalRequestConflict.

    S3 answers 409 to a conditional request that races another on the same key; it is safe to
    send again, after a jittered backoff. Throttling and 5xx are botocore's retry modes' work.
    ``where`` names the store's prefix in the log.
    """
    if not calls:
        return []
    outcomes = list((yield Batch(calls)))
    for attempt in range(1, CONFLICT_ATTEMPTS):
        again = [i for i, o in enumerate(outcomes) if error_code(o) == "ConditionalRequestConflict"]
        if not again:
            break
        delay = random.uniform(0, CONFLICT_BACKOFF * 2**attempt)
        logger.debug(
            "409 ConditionalRequestConflict on %d request(s) in %s; retry %d in %.3fs",
            len(again),
            where,
            attempt,
            delay,
        )
        retried = yield Batch([calls[i] for i in again], delay=delay)
        for i, outcome in zip(again, retried, strict=True):
            outcomes[i] = outcome
    return outcomes
