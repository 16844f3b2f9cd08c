"""The engine check on a real S3 server (docs/protocol.md, invariant 11): behind an endpoint that
accepts conditional PUTs and ignores their conditions, the first save and the first delete of a
process are refused before any head is written; ``doctor()``, ``adoctor()`` and
``alpineagents doctor s3://...`` report what they found.

The lying engine is moto's server with the condition headers taken off the store's PUTs on the
way (a ``before-call`` hook): the server then does what an engine that ignores them does, it
accepts every PUT. The model checker (tests/protocol) explores the same case request by request.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from alpineagents import State
from alpineagents_s3 import Check, ConditionalWritesUnsupportedError, S3Store
from alpineagents_s3.testing import RequestLog
from tests.helpers import Mode
from tests.s3.helpers import Stores


class Ignore:
    """A ``before-call`` hook on PutObject: the conditions named are not sent, so the server
    accepts the PUT as an engine that ignores them does."""

    def __init__(self, *headers: str):
        self.headers = headers or ("If-None-Match", "If-Match")
        self.ignored = 0

    def __call__(self, params: dict[str, Any], **kwargs: Any) -> None:
        for name in self.headers:
            if params["headers"].pop(name, None) is not None:
                self.ignored += 1


def hooks(ignore: Ignore, log: RequestLog | None = None) -> dict[str, Any]:
    found: dict[str, Any] = {"before-call.s3.PutObject": ignore}
    return found | (log.hooks if log is not None else {})


async def doctor(store: S3Store, mode: Mode) -> list[Check]:
    """``doctor`` (on a worker thread) or ``adoctor``, by mode."""
    if mode == "async":
        return await store.adoctor()
    return await asyncio.to_thread(store.doctor)


@pytest.mark.parametrize(
    ("ignored", "accepted"),
    [
        (("If-None-Match", "If-Match"), "a second PUT with If-None-Match: *"),
        (("If-Match",), "a PUT with a stale If-Match"),
        (("If-None-Match",), "a second PUT with If-None-Match: *"),
    ],
    ids=["both", "if-match", "if-none-match"],
)
async def test_a_save_behind_an_engine_that_ignores_conditions_is_refused(
    mode: Mode, stores: Stores, ignored: tuple[str, ...], accepted: str
) -> None:
    log = RequestLog()
    io = stores.io(mode, event_hooks=hooks(Ignore(*ignored), log))
    with pytest.raises(ConditionalWritesUnsupportedError) as raised:
        await io.save(State("t", id="lied-to"))
    message = str(raised.value)
    assert stores.url in message and f"s3://{stores.bucket}/runs/probes/" in message
    assert f"it accepted {accepted}" in message
    assert "trust_conditional_writes=True" in message
    # No head was sent: the State does not exist, for this store or an honest one.
    assert not [r for r in log.requests if "/runs/heads/" in r.path]
    assert await io.read("lied-to") is None
    assert await stores.io(mode).read("lied-to") is None
    # The probe was deleted; what the save wrote before the verdict is no head's: swept.
    keys = await stores.keys()
    assert not [k for k in keys if "/probes/" in k]
    assert keys and all(k.startswith("runs/states/lied-to/") for k in keys)
    swept = await asyncio.to_thread(stores.new().sweep, 0)
    assert sorted(swept) == keys and await stores.keys() == []


async def test_the_refusal_stands_for_every_save_and_a_delete_until_the_engine_is_honest(
    mode: Mode, stores: Stores
) -> None:
    """A refused check is not remembered as passed; a delete checks too (its tombstone head is
    an If-Match PUT); and nothing saved before is touched."""
    honest = stores.io(mode)
    await honest.save(State("saved while honest", id="kept"))
    before = await stores.keys()
    lied_to = stores.io(mode, event_hooks=hooks(Ignore()))
    for attempt in (lied_to.save(State("t", id="other")), lied_to.delete("kept")):
        with pytest.raises(ConditionalWritesUnsupportedError):
            await attempt
    with pytest.raises(ConditionalWritesUnsupportedError):
        await lied_to.save(State("again", id="other"))
    loaded = await honest.load("kept")
    assert loaded.task == "saved while honest"
    assert [k for k in await stores.keys() if not k.startswith("runs/states/other/")] == before


async def test_trust_conditional_writes_skips_the_check(mode: Mode, stores: Stores) -> None:
    """The opt-out, in writing: no probe, and the save goes through (unguarded, as documented)."""
    log = RequestLog()
    io = stores.io(mode, event_hooks=hooks(Ignore(), log), trust_conditional_writes=True)
    await io.save(State("t", id="trusted"))
    assert not [r for r in log.requests if "/probes/" in r.path]
    assert log.counts() == {"PUT": 2}
    assert (await stores.io(mode).load("trusted")).task == "t"


async def test_doctor_on_an_honest_bucket(mode: Mode, stores: Stores) -> None:
    await stores.io(mode).save(State("t", id="one"))
    checks = await doctor(stores.new(same_process=True), mode)
    assert [(c.name, c.ok) for c in checks] == [
        ("bucket", True),
        ("conditional writes", True),
        ("versioning", True),
    ]
    assert checks[0].detail == f"s3://{stores.bucket}/runs/ is readable (1 heads)"
    assert "refuses a second create and a stale If-Match (412)" in checks[1].detail
    assert checks[2].detail.startswith("off: ")
    assert [k for k in await stores.keys() if "/probes/" in k] == []
    # The check passed in this process: its first save to the bucket sends no probe.
    log = RequestLog()
    await stores.io(mode, same_process=True, event_hooks=log.hooks).save(State("t", id="two"))
    assert log.counts() == {"PUT": 2}  # an entry and the head
    assert not [r for r in log.requests if "/probes/" in r.path]


async def test_doctor_names_an_engine_that_ignores_conditions(mode: Mode, stores: Stores) -> None:
    store = stores.new(event_hooks=hooks(Ignore()))
    checks = await doctor(store, mode)
    named = {c.name: c for c in checks}
    assert named["bucket"].ok and named["versioning"].ok
    assert not named["conditional writes"].ok
    detail = named["conditional writes"].detail
    assert "it accepted a second PUT with If-None-Match: *" in detail
    assert "it accepted a PUT with a stale If-Match" in detail
    assert detail.endswith("S3Store refuses to save here")
    assert await stores.keys() == []  # the probe, each version of it, deleted
    # Not remembered as passed: a save is still refused.
    with pytest.raises(ConditionalWritesUnsupportedError):
        await stores.io(mode, event_hooks=hooks(Ignore())).save(State("t", id="x"))


async def test_doctor_on_a_versioned_bucket_and_on_a_missing_one(
    mode: Mode, stores: Stores
) -> None:
    versioned = stores.make_bucket(versioned=True)
    checks = await doctor(stores.new(bucket=versioned), mode)
    assert all(c.ok for c in checks)
    assert checks[2].detail.startswith("enabled: delete() leaves older versions")
    assert "purge=True" in checks[2].detail
    missing = await doctor(stores.new(bucket="no-such-bucket-here"), mode)
    assert [(c.name, c.ok) for c in missing] == [("bucket", False)]
    assert "s3://no-such-bucket-here/runs/heads/" in missing[0].detail
    assert "does not exist" in missing[0].detail


def test_the_doctor_command_on_s3(cli: Any, bucket: str, moto_endpoint: str) -> None:
    run = cli("doctor", f"s3://{bucket}/runs")
    assert run.status == 0, run.err
    lines = run.out.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "ok      bucket",
        "ok      conditional writes",
        "ok      versioning",
    ]
    assert f"s3://{bucket}/runs/ is readable" in lines[0]
    assert "every check passed" in run.err
