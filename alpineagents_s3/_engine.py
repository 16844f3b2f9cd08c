"""The engine check: that the endpoint really refuses a second create and a stale ``If-Match``.

Invariant 11 of docs/protocol.md. Some S3-compatible engines accept the conditional headers and
ignore them (all the time, or under concurrency); behind one, a second writer would overwrite a
State unseen. So before its first head PUT to a bucket, a process creates a probe object with
``If-None-Match: *``, then sends two PUTs that S3 must refuse with 412 (a second create, and an
``If-Match`` on an ETag the object never had), then deletes the probe (each version it made).

:class:`Probe` is the check as calls and outcomes, so that a save can send its first request
with the save's own entry PUTs, and its delete with the head PUT: one round trip more than a
save, once per process and bucket.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from alpineagents_s3 import _keys
from alpineagents_s3._keys import Layout, fail
from alpineagents_s3._memory import Ctx
from alpineagents_s3._steps import Call, Outcome, Steps, error_code, http_status, send
from alpineagents_s3._translate import PRECONDITION_CODES, translate
from alpineagents_s3.errors import ConditionalWritesUnsupportedError, S3StoreError

__all__ = ["Check", "Probe", "check", "doctor", "ensure"]

_BODY: Final = b'{"alpineagents-s3":"probe"}'
# An ETag no object has: 32 hex digits, as an MD5 ETag, that S3 never gives these bytes.
_STALE: Final = '"00000000000000000000000000000000"'


@dataclass
class Probe:
    """One engine check on ``layout``'s bucket (see the module)."""

    layout: Layout
    key: str = ""
    versions: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.key = self.layout.probe_key(_keys.new_wid())

    def create(self) -> Call:
        """The first request: create the probe."""
        return self.layout.put(self.key, _BODY, "probe")

    def created(self, outcome: Outcome) -> None:
        """Its outcome: a failure here is the store's usual error for a PUT."""
        if isinstance(outcome, Exception):
            if error_code(outcome) in PRECONDITION_CODES:
                return  # its own PUT, answered twice: the probe's key is new
            fail(self.layout, outcome, "PutObject (the engine check)", self.key, "If-None-Match: *")
        self._version(outcome)

    def test(self) -> Steps[None]:
        """The two PUTs S3 must refuse; raises if the endpoint accepts either."""
        tests = [
            ("a second PUT with If-None-Match: *", self.layout.put(self.key, _BODY, "probe")),
            (
                f"a PUT with a stale If-Match: {_STALE}",
                self.layout.put(self.key, _BODY, "probe", if_match=_STALE),
            ),
        ]
        outcomes = yield from send([call for _, call in tests], self.layout.root)
        for (what, _), outcome in zip(tests, outcomes, strict=True):
            if not isinstance(outcome, Exception):
                self._version(outcome)
                self.problems.append(f"it accepted {what}")
            elif error_code(outcome) == "NotImplemented" or http_status(outcome) == 501:
                self.problems.append(f"it answered {what} with 501 NotImplemented")
            elif error_code(outcome) not in PRECONDITION_CODES:
                fail(self.layout, outcome, "PutObject (the engine check)", self.key, what)

    def cleanup(self) -> list[Call]:
        """The deletes of the probe: each version it made, or the key."""
        if not self.versions:
            return [self.layout.delete(self.key)]
        return [self.layout.delete(self.key, version) for version in self.versions]

    def verdict(self) -> None:
        """Raise ``ConditionalWritesUnsupportedError`` if the endpoint failed the check."""
        if self.problems:
            raise ConditionalWritesUnsupportedError(
                f"the endpoint {self.layout.endpoint} does not honour conditional writes on "
                f"{self.layout.url(self.key)}: {'; '.join(self.problems)}. S3Store needs them to "
                "keep a State safe from a second writer; a store there could lose saves "
                "silently. Use AWS S3 or an engine that refuses them with 412, or, if you "
                "accept that risk, make the store with trust_conditional_writes=True"
            )

    def _version(self, outcome: Outcome) -> None:
        version = outcome.get("VersionId") if isinstance(outcome, dict) else None
        if version and version != "null":
            self.versions.append(version)


def check(layout: Layout) -> Steps[list[str]]:
    """The whole check on its own (``doctor``): the problems found, the probe deleted."""
    return (yield from _tested(layout)).problems


def _tested(layout: Layout) -> Steps[Probe]:
    """A probe made, tested and deleted again."""
    probe = Probe(layout)
    (created,) = yield from send([probe.create()], layout.root)
    probe.created(created)
    try:
        yield from probe.test()
    except S3StoreError:
        yield from send(probe.cleanup(), layout.root)
        raise
    yield from send(probe.cleanup(), layout.root)
    return probe


def ensure(ctx: Ctx) -> Steps[None]:
    """The check before a head PUT that is not a save's (a delete's), once per process."""
    if ctx.engine_checked:
        return
    probe = yield from _tested(ctx.layout)
    probe.verdict()
    ctx.engine_passed()


@dataclass(frozen=True)
class Check:
    """One finding of ``S3Store.doctor()`` (``alpineagents doctor`` prints them).

    Attributes:
        name: What was checked.
        ok: Whether it is as S3Store needs it.
        detail: What was found, and what to do if it is not ok.
    """

    name: str
    ok: bool
    detail: str


def doctor(ctx: Ctx) -> Steps[list[Check]]:
    """The checks of ``doctor``: the bucket reachable, conditional writes, versioning."""
    layout = ctx.layout
    checks = []
    (listed,) = yield from send([layout.list_page(layout.heads)], layout.root)
    if isinstance(listed, Exception):
        error = translate(listed, layout.where("ListObjectsV2", layout.heads))
        return [Check("bucket", False, str(error))]
    count = listed.get("KeyCount", 0)
    more = "+" if listed.get("IsTruncated") else ""
    checks.append(
        Check("bucket", True, f"{layout.url(layout.root)} is readable ({count}{more} heads)")
    )
    try:
        problems = yield from check(layout)
    except S3StoreError as e:
        checks.append(Check("conditional writes", False, str(e)))
    else:
        if problems:
            detail = "; ".join(problems) + ": S3Store refuses to save here"
        else:
            detail = f"{layout.endpoint} refuses a second create and a stale If-Match (412)"
            ctx.engine_passed()
        checks.append(Check("conditional writes", not problems, detail))
    (status,) = yield from send(
        [Call("get_bucket_versioning", {"Bucket": layout.bucket})], layout.root
    )
    if isinstance(status, Exception):
        checks.append(Check("versioning", True, f"unknown ({type(status).__name__}: {status})"))
    elif status.get("Status") in ("Enabled", "Suspended"):
        checks.append(
            Check(
                "versioning",
                True,
                f"{status['Status'].lower()}: delete() leaves older versions until a lifecycle "
                "rule expires them; delete(id, purge=True) removes them at once",
            )
        )
    else:
        checks.append(Check("versioning", True, "off: delete() removes everything of a State"))
    return checks
