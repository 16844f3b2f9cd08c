"""Retries: 409 conflicts (here), throttling and 5xx (botocore's retry modes), answers lost after
S3 applied a write, and the retry configuration of the sync and async clients."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from botocore.config import Config

from alpineagents import State
from alpineagents.errors import ConcurrentWriteError
from alpineagents_s3 import S3Store, S3StoreError, _steps
from alpineagents_s3.testing import RequestLog
from tests.helpers import MakeBucket, Mode, entry_dicts, snapshot_dict, tool_turn
from tests.s3.helpers import ClientsSeen, LoseAnswers, Refuse, Stores, Throttle, objects


async def test_409_conditional_request_conflict_is_retried(
    mode: Mode, stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_steps, "CONFLICT_BACKOFF", 0.001)
    conflict = Refuse(409, "ConditionalRequestConflict", times=4)
    io = stores.io(mode, event_hooks={"before-call.s3.PutObject": conflict})
    state = State("contended", id="s")

    await io.save(state)  # entry, then snapshot create: 409, 409, ... then through
    state.add_user_message("more")
    conflict.left = 2
    await io.save(state)
    assert (await io.load("s")).history == state.history
    # A conflict that does not end: the save fails, naming the object.
    conflict.left = None
    state.data = {"x": 1}
    with pytest.raises(ConcurrentWriteError, match=r"s3://.*/runs/heads/s\.json.*409"):
        await io.save(state)
    assert conflict.refused == 4 + 2 + _steps.CONFLICT_ATTEMPTS


def test_throttling_and_5xx_are_retried_by_botocore(moto_url: str, moto_bucket: MakeBucket) -> None:
    bucket = moto_bucket()
    log, slow = RequestLog(), Throttle(times=1)
    hooks: dict[str, Callable[..., Any]] = {**log.hooks, "before-send.s3.PutObject": slow}
    # No engine check: its requests are not counted.
    trust: dict[str, Any] = {"trust_conditional_writes": True}
    with S3Store(bucket, "runs", endpoint_url=moto_url, event_hooks=hooks, **trust) as store:
        store.write("s", entry_dicts(0, 1), snapshot_dict("s", 1), create=True)
        assert log.counts() == {"PUT": 3}  # a 503 SlowDown, then the entry and the head
        assert store.read("s") is not None

    # After the retries run out: the store's exception, naming the key.
    hooks = {"before-send.s3.PutObject": Throttle(times=10)}
    config = Config(retries={"mode": "standard", "total_max_attempts": 2})
    options = {"event_hooks": hooks, "config": config, **trust}
    with S3Store(bucket, "runs", endpoint_url=moto_url, **options) as store:
        with pytest.raises(S3StoreError, match=r"s3://.*/runs/states/t/.*SlowDown.*HTTP 503"):
            store.write("t", entry_dicts(0, 1), snapshot_dict("t", 1), create=True)


async def test_answers_lost_after_s3_applied_the_write_are_recognised(
    mode: Mode, stores: Stores
) -> None:
    lose = LoseAnswers()
    io = stores.io(mode, event_hooks={"needs-retry.s3.PutObject": lose})
    state = State("lost answers", id="lost")

    await io.save(state)  # entry and create: each repeated, each 412, each recognised
    tool_turn(state, 1)
    await io.save(state)  # entries, and the If-Match snapshot repeated after it applied
    state.data["more"] = True
    await io.save(state)
    loaded = await io.load("lost")
    assert loaded.history == state.history and loaded.data == {"more": True}
    assert {o.role for o in await objects(io, "lost")} == {"entry", "head"}
    assert lose.repeated == 7  # 1 + 2 + 1 entries, 3 heads; and the engine check's create


async def test_a_create_retried_by_a_new_attempt_finds_its_own_state(
    mode: Mode, stores: Stores
) -> None:
    """A create that S3 applied but whose answer was lost (the call raised), retried by the
    Agent's next save with a newer snapshot, is recognised by its write token."""
    lost = {"left": 1}
    creating = threading.local()

    def mark(params: dict[str, Any], **kwargs: Any) -> None:
        creating.snapshot = "/heads/" in params["url"] and ("If-None-Match" in params["headers"])

    def lose_create_answer(**kwargs: Any) -> None:
        if getattr(creating, "snapshot", False) and lost["left"]:
            lost["left"] -= 1
            raise ConnectionResetError("the answer was lost after S3 applied the PUT")

    io = stores.io(
        mode,
        event_hooks={
            "before-call.s3.PutObject": mark,
            "after-call.s3.PutObject": lose_create_answer,
        },
    )
    entries, snapshot = entry_dicts(0, 3), snapshot_dict("again", 3)

    with pytest.raises(S3StoreError, match="ConnectionResetError"):
        await io.write("again", entries, snapshot, create=True)
    assert lost["left"] == 0
    later = dict(snapshot, updated_at="2026-01-01T00:00:09+00:00")
    await io.write("again", entries, later, create=True)  # not "id taken"
    await io.write("again", entry_dicts(3, 4), snapshot_dict("again", 4))
    found = await objects(io, "again")
    assert [o.role for o in found] == ["head"] + ["entry"] * 4
    record = await io.read("again")
    assert record is not None and record.snapshot == snapshot_dict("again", 4)


async def test_a_lost_create_then_a_failed_update_is_never_refused_as_a_taken_id(
    mode: Mode, stores: Stores
) -> None:
    """A create lands with its answer lost; the core's next save (a create still) finds it and
    goes on as an update, whose PUT fails before it is sent; the third save (a create still)
    finds the State this process made, not another's (found by reliability/fault_proxy.py)."""
    plan: list[str | None] = ["lose the answer", None, "fail before sending"]  # head PUTs
    doing: dict[str, str | None] = {}

    def before(params: dict[str, Any], context: dict[str, Any], **kwargs: Any) -> None:
        if "/heads/" in params["url_path"] and plan:
            doing[context.setdefault("plan", str(len(plan)))] = what = plan.pop(0)
            if what == "fail before sending":
                raise ConnectionResetError("the connection failed before the PUT went out")

    def after(context: dict[str, Any], **kwargs: Any) -> None:
        if doing.pop(context.get("plan", ""), None) == "lose the answer":
            raise ConnectionResetError("S3 applied the PUT; its answer was lost")

    io = stores.io(
        mode, event_hooks={"before-call.s3.PutObject": before, "after-call.s3.PutObject": after}
    )
    state = State("a task", id="lost-create")
    with pytest.raises(S3StoreError, match="its answer was lost"):
        await io.save(state)
    state.add_user_message("one")
    with pytest.raises(S3StoreError, match="before the PUT went out"):
        await io.save(state)
    assert not plan
    state.add_user_message("two")
    await io.save(state)
    loaded = await stores.io(mode).load("lost-create")
    assert loaded.history == state.history
    # What the failed update wrote before its head PUT is named by no head (sweep's to remove).
    roles = [o.role for o in await objects(io, "lost-create")]
    assert roles.count("head") == 1 and roles.count("entry") == len(state.history)


# Configuration -------------------------------------------------------------------------------


def test_retry_mode_defaults_to_standard_and_follows_the_configuration(
    moto_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def retries(store: S3Store) -> Any:
        with store:
            config: Any = store.client.meta.config
            return config.retries

    assert retries(S3Store("b-b-b", endpoint_url=moto_url)) == {
        "mode": "standard",
        "total_max_attempts": 5,
    }
    adaptive = Config(retries={"mode": "adaptive"})
    with_config = S3Store("b-b-b", endpoint_url=moto_url, config=adaptive)
    assert retries(with_config)["mode"] == "adaptive"
    monkeypatch.setenv("AWS_RETRY_MODE", "adaptive")  # the standard boto configuration wins
    assert retries(S3Store("b-b-b", endpoint_url=moto_url)) == {"mode": "adaptive"}


async def test_async_clients_get_the_same_configuration(mode: Mode, stores: Stores) -> None:
    """What the client making the calls is configured with, seen by a botocore hook."""
    seen = ClientsSeen()
    io = stores.io(mode, max_concurrency=32, event_hooks={"before-call.s3": seen})
    await io.list()
    assert seen.configs and seen.clients == 1
    config = seen.configs[0]
    assert config.retries == {"mode": "standard", "total_max_attempts": 5}
    assert config.max_pool_connections == 32
    assert seen.urls[0].startswith(f"{stores.url}/{stores.bucket}")


def test_a_save_cut_short_by_system_exit_after_s3_applied_it_is_recognised(
    stores: Stores,
) -> None:
    """SIGTERM turned into SystemExit (the guide's handler) while a snapshot PUT's answer is
    on its way: the Agent's save on the way out, or the next one, must not take the applied
    PUT for a second writer (found by reliability/kill_soak.py)."""
    armed: list[int] = []

    def exit_after_the_put(**kwargs: Any) -> None:
        if armed and armed.pop():
            raise SystemExit(143)

    store = stores.new(event_hooks={"after-call.s3.PutObject": exit_after_the_put})
    state = State("task", id="cut-short")
    store.save(state)
    state.add_user_message("hello")
    state.add_user_message("again")  # two entries: the save ends with a snapshot PUT
    armed.extend([1, 0, 0])  # the entries' PUTs return; the snapshot's answer is cut short
    with pytest.raises(SystemExit):
        store.save(state)
    assert store.save(state) is True  # no ConcurrentWriteError
    texts = [e.text for e in stores.new().load("cut-short").history]
    assert texts == ["task", "hello", "again"]
