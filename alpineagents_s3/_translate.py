"""What a failed S3 call means for the user: a table from S3's answers to the store's errors.

:func:`translate` is pure: given what failed (the client's exception, or one key's error in a
DeleteObjects answer) and where, it returns the exception to raise, whose message names the
object, says what happened and what to do. The rows of :data:`RULES` are tried in order; an S3
answer that matches none is an :class:`S3StoreError` with S3's code, status and message.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
)

from alpineagents_s3._steps import CONFLICT_ATTEMPTS, error_code, http_status
from alpineagents_s3.errors import (
    BucketNotFoundError,
    ConcurrentWriteError,
    ConditionalWritesUnsupportedError,
    S3AccessDeniedError,
    S3StoreError,
)

ACCESS_CODES: Final = frozenset(
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
# A missing key: GetObject says NoSuchKey, HeadObject only its status.
NOT_FOUND_CODES: Final = frozenset({"NoSuchKey", "404", "NotFound"})
# A condition that did not hold: PutObject says PreconditionFailed, HeadObject only its status.
PRECONDITION_CODES: Final = frozenset({"PreconditionFailed", "412"})


@dataclass(frozen=True)
class Fault:
    """An error answer of S3 for one request or one key.

    Attributes:
        code: S3's error code (``"NoSuchBucket"``), or the HTTP status when it sent none.
        status: The HTTP status, when known (a DeleteObjects entry has none of its own).
        message: S3's message.
        quota_spent: botocore did not retry it: the client's retry quota was spent.
    """

    code: str
    status: int | None
    message: str
    quota_spent: bool = False

    @classmethod
    def of(cls, error: ClientError) -> Fault:
        """The fault a client error reports."""
        return cls(
            error_code(error) or "?",
            http_status(error),
            str(error.response.get("Error", {}).get("Message", "")),
            bool(error.response.get("ResponseMetadata", {}).get("RetryQuotaReached")),
        )


@dataclass(frozen=True)
class Where:
    """What a message says about the store and the request that failed.

    Attributes:
        action: The request, with any detail (``"GetObject (before a write)"``).
        url: The object or prefix it was about, as ``s3://bucket/key``.
        bucket: The store's bucket.
        endpoint: The endpoint the store talks to.
        root: The store's prefix as ``s3://bucket/prefix/``.
        conditions: The conditional headers the request sent (``"If-Match: ..."``), if any.
    """

    action: str
    url: str
    bucket: str
    endpoint: str
    root: str
    conditions: str = ""


@dataclass(frozen=True)
class Rule:
    """One row of the table: the faults it matches, the error raised and its message."""

    matches: Callable[[Fault, Where], bool]
    error: type[S3StoreError]
    message: str  # str.format fields: those of Where and Fault, and attempts


RULES: Final[tuple[Rule, ...]] = (
    Rule(
        lambda fault, _: fault.code == "NoSuchBucket",
        BucketNotFoundError,
        "{action} {url}: the bucket {bucket!r} does not exist at {endpoint}. Create it, or check "
        "the bucket name, region and endpoint",
    ),
    Rule(
        # 403 too, but no permission is missing: the object is in an archive storage class.
        lambda fault, _: fault.code == "InvalidObjectState",
        S3StoreError,
        "{action} {url} was refused ({code}: {message}): the object is archived (S3 Glacier "
        "Flexible Retrieval or Deep Archive, by a lifecycle rule or a PUT) and must be "
        "restored before it can be read. Restore it and the State's other archived objects "
        "(aws s3api restore-object; store.objects(id) lists them), then load it again once "
        "the restore is done",
    ),
    Rule(
        lambda fault, _: fault.code in ACCESS_CODES or fault.status == 403,
        S3AccessDeniedError,
        "{action} {url} was refused ({code}: {message}). The credentials in use need "
        "s3:GetObject, s3:PutObject and s3:DeleteObject on {root}* and s3:ListBucket on the "
        "bucket {bucket!r}: check the credentials, profile, bucket policy and KMS key policy",
    ),
    Rule(
        lambda fault, _: fault.code == "ConditionalRequestConflict",
        ConcurrentWriteError,
        "{action} {url}: S3 kept answering 409 ConditionalRequestConflict after {attempts} "
        "attempts: other writers are changing this object right now. Save again later",
    ),
    Rule(
        lambda fault, where: (
            bool(where.conditions) and (fault.code == "NotImplemented" or fault.status == 501)
        ),
        ConditionalWritesUnsupportedError,
        "{action} {url} with {conditions} was refused ({code}: {message}): the endpoint "
        "{endpoint} does not support conditional writes, which S3Store needs to keep entries "
        "immutable and to detect a second writer. Use AWS S3 or an S3-compatible server that "
        "supports If-None-Match and If-Match on PutObject",
    ),
)


_USERINFO = re.compile(r"(?<=://)[^/@\s\"']+@")


def scrub(text: str) -> str:
    """``text`` without the ``user:password@`` of any URL in it (an endpoint may carry one)."""
    return _USERINFO.sub("***@", text)


def translate_fault(fault: Fault, where: Where) -> S3StoreError:
    """The store's error for an S3 error answer: the first matching rule, else S3StoreError."""
    fields: Mapping[str, Any] = {
        **vars(where),
        **vars(fault),
        "attempts": CONFLICT_ATTEMPTS,
    }
    for rule in RULES:
        if rule.matches(fault, where):
            return rule.error(scrub(rule.message.format(**fields)))
    retried = " (after botocore's retries)" if fault.status and fault.status >= 500 else ""
    if fault.quota_spent:
        retried = (
            " (not retried: this client's botocore retry quota is spent, after many failed "
            "requests; see docs/s3.md, Configuration)"
        )
    return S3StoreError(
        scrub(
            f"{where.action} {where.url} failed: {fault.code} (HTTP {fault.status}): "
            f"{fault.message}{retried}"
        )
    )


def translate(failure: Exception, where: Where) -> S3StoreError:
    """The store's error for what a client call raised; no credential of a URL is repeated."""
    if isinstance(failure, ClientError):
        return translate_fault(Fault.of(failure), where)
    error: type[S3StoreError] = S3StoreError
    if isinstance(failure, NoCredentialsError):
        error = S3AccessDeniedError
        message = (
            f"{where.action} {where.url}: no AWS credentials were found. Configure them the "
            "usual way (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, ~/.aws, an "
            "instance role) or pass session=boto3.Session(...) to S3Store"
        )
    elif isinstance(failure, EndpointConnectionError):
        message = (
            f"{where.action} {where.url}: cannot connect to {where.endpoint} ({failure}). "
            "Check endpoint_url (or AWS_ENDPOINT_URL_S3) and the network"
        )
    elif isinstance(failure, BotoCoreError):
        message = f"{where.action} {where.url} failed: {failure}"
    else:
        message = f"{where.action} {where.url} failed: {type(failure).__name__}: {failure}"
    return error(scrub(message))
