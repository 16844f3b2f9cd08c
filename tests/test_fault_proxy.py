"""The S3 fault proxy and its runner, against moto's server.

First the instrument: each fault of reliability/_proxy.py, played on every request of a plain
boto3 client without retries, does what its name says (whether S3 applied the write, what
the client sees). Then reliability/fault_proxy.py, which starts moto's ThreadedMotoServer and
its proxy itself, run as a real process for some hundreds of faults of every kind, with
readers and a lister, which must give no violation; once with the proxy acknowledging PUTs it
never forwards (saves that are acknowledged and lost), and once with a store whose list
silently leaves a State out and whose delete leaves objects behind: the runner must report
each, exiting 1.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from types_boto3_s3 import S3Client

ROOT = Path(__file__).resolve().parents[1]
RUNNER = ROOT / "reliability" / "fault_proxy.py"
KINDS = (
    "500 InternalError",
    "503 SlowDown",
    "reset before forwarding",
    "answer lost after the write",
    "answer after the read timeout",
    "failed in an outage",
)


def load_proxy_module() -> Any:
    """reliability/_proxy.py, which is no package: loaded from its file."""
    spec = importlib.util.spec_from_file_location("_proxy", ROOT / "reliability" / "_proxy.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("_proxy", module)
    spec.loader.exec_module(module)
    return module


# (fault, what botocore raises, whether the PUT was applied)
FAULTS = [
    ("500", "InternalError", False),
    ("503", "SlowDown", False),
    ("reset", "ConnectionClosedError", False),
    ("lost", "ConnectionClosedError", True),
    ("late", "ReadTimeoutError", True),
    ("outage", None, False),  # a 500, a 503 or a reset
]


@pytest.mark.parametrize(("fault", "raised", "applied"), FAULTS, ids=[f[0] for f in FAULTS])
def test_each_fault_does_what_it_says(
    moto_url: str, moto: S3Client, fault: str, raised: str | None, applied: bool
) -> None:
    import boto3
    import botocore.exceptions
    from botocore.config import Config

    proxy_module = load_proxy_module()
    bucket = f"t-{uuid.uuid4().hex[:20]}"
    moto.create_bucket(Bucket=bucket)
    plan = proxy_module.Plan(rate=1.0, late_seconds=1.0, kinds=(fault,))
    proxy = proxy_module.FaultProxy(moto_url, plan, seed=7)
    proxy.start()
    config = Config(retries={"total_max_attempts": 1}, read_timeout=0.5, connect_timeout=5)
    client = boto3.client("s3", endpoint_url=proxy.url, region_name="us-east-1", config=config)
    try:
        started = time.monotonic()
        with pytest.raises(
            (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError)
        ) as e:
            client.put_object(Bucket=bucket, Key="k", Body=b"written")
        if raised is not None:
            if isinstance(e.value, botocore.exceptions.ClientError):
                assert e.value.response["Error"]["Code"] == raised
            else:
                assert type(e.value).__name__ == raised, repr(e.value)
        if fault == "late":
            assert time.monotonic() - started >= 0.5
        listed = moto.list_objects_v2(Bucket=bucket).get("KeyCount", 0)
        assert listed == (1 if applied else 0)
        # Paused, the proxy passes requests on and their answers back.
        plan.paused = True
        client.put_object(Bucket=bucket, Key="k2", Body=b"through")
        assert client.get_object(Bucket=bucket, Key="k2")["Body"].read() == b"through"
        with proxy.tally.lock:
            assert proxy.tally.faults[fault] == 1
            assert proxy.tally.requests == 3
    finally:
        client.close()
        proxy.stop()


def test_a_cut_answer_breaks_off_mid_body(moto_url: str, moto: S3Client) -> None:
    import boto3
    import botocore.exceptions
    from botocore.config import Config

    proxy_module = load_proxy_module()
    bucket = f"t-{uuid.uuid4().hex[:20]}"
    moto.create_bucket(Bucket=bucket)
    moto.put_object(Bucket=bucket, Key="k", Body=b"0123456789" * 10)
    plan = proxy_module.Plan(rate=1.0, late_seconds=1.0, kinds=("cut",))
    proxy = proxy_module.FaultProxy(moto_url, plan, seed=7)
    proxy.start()
    config = Config(retries={"total_max_attempts": 1}, read_timeout=5, connect_timeout=5)
    client = boto3.client("s3", endpoint_url=proxy.url, region_name="us-east-1", config=config)
    try:
        answer = client.get_object(Bucket=bucket, Key="k")  # the headers came whole
        assert answer["ContentLength"] == 100
        with pytest.raises(botocore.exceptions.BotoCoreError) as e:
            answer["Body"].read()
        assert type(e.value).__name__ == "ResponseStreamingError", repr(e.value)
        with proxy.tally.lock:
            assert proxy.tally.faults["cut"] == 1
    finally:
        client.close()
        proxy.stop()


def test_a_request_marked_pass_meets_no_fault(moto_url: str, moto: S3Client) -> None:
    import boto3
    from botocore.config import Config

    proxy_module = load_proxy_module()
    bucket = f"t-{uuid.uuid4().hex[:20]}"
    moto.create_bucket(Bucket=bucket)
    proxy = proxy_module.FaultProxy(moto_url, proxy_module.Plan(rate=1.0, late_seconds=1.0), 3)
    proxy.start()
    config = Config(retries={"total_max_attempts": 1}, connect_timeout=5, read_timeout=5)
    client = boto3.client("s3", endpoint_url=proxy.url, region_name="us-east-1", config=config)

    def mark(request: Any, **kwargs: Any) -> None:
        request.headers[proxy_module.PASS_HEADER] = "pass"

    client.meta.events.register("before-send.s3", mark)
    try:
        for i in range(20):  # at rate 1.0 each would meet a fault, unmarked
            client.put_object(Bucket=bucket, Key=f"k{i}", Body=b"through")
        assert moto.list_objects_v2(Bucket=bucket)["KeyCount"] == 20
        with proxy.tally.lock:
            assert proxy.tally.requests == 20
            assert sum(proxy.tally.faults.values()) == 0
    finally:
        client.close()
        proxy.stop()


def test_a_spent_retry_quota_is_named_and_the_state_saves_once_s3_answers(
    moto_url: str, moto: S3Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    import botocore.retries.standard
    from botocore.config import Config

    from alpineagents import State
    from alpineagents_s3 import S3Store
    from alpineagents_s3.errors import S3StoreError

    # botocore's backoff between retries, not its retry logic, is cut to nothing.
    monkeypatch.setattr(botocore.retries.standard.ExponentialBackoff, "delay_amount", lambda *a: 0)
    proxy_module = load_proxy_module()
    bucket = f"t-{uuid.uuid4().hex[:20]}"
    moto.create_bucket(Bucket=bucket)
    plan = proxy_module.Plan(rate=1.0, late_seconds=1.0, kinds=("500",))
    proxy = proxy_module.FaultProxy(moto_url, plan, seed=5)
    proxy.start()
    config = Config(retries={"mode": "standard", "total_max_attempts": 5})
    store = S3Store(bucket, "runs", endpoint_url=proxy.url, region_name="us-east-1", config=config)
    state = State("a task", id="quota")
    messages: list[str] = []
    try:
        # 4 retries a request, 5 units each: the 500 units last 25 requests.
        for _ in range(30):
            with pytest.raises(S3StoreError) as e:
                store.save(state)
            assert type(e.value) is S3StoreError
            messages.append(str(e.value))
        assert "after botocore's retries" in messages[0]
        assert "retry quota is spent" not in messages[0]
        assert "not retried: this client's botocore retry quota is spent" in messages[-1]
        plan.paused = True  # S3 answers again: the State saves from memory, the quota spent
        assert store.save(state)
        assert store.load("quota").task == "a task"
    finally:
        store.close()
        proxy.stop()


def run(*arguments: str) -> subprocess.CompletedProcess[str]:
    # This checkout first on sys.path, so its alpineagents and alpineagents_s3 are the ones run.
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, str(RUNNER), *arguments],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def figure(output: str, pattern: str) -> int:
    found = re.search(pattern, output, re.MULTILINE)
    assert found, f"{pattern!r} not in:\n{output}"
    return int(found.group(1))


@pytest.mark.slow
def test_over_a_hundred_faults_of_every_kind_lose_nothing_acknowledged() -> None:
    # 120 faults: every kind about 20 times; the run ends at that count, not at its bound.
    # Two readers read the States under way meanwhile, and a lister lists them, through the
    # proxy too; every State is deleted through it at its end.
    # (reliability/fault_proxy.py runs for longer: docs/reliability.md, "The last long runs".)
    done = run(
        "--faults", "120", "--seconds", "25", "--rate", "0.3", "--workers", "12",
        "--read", "0.05", "--list", "0.2",
    )  # fmt: skip
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert out.startswith("fault proxy at http://127.0.0.1:")
    assert figure(out, r"^violations: (\d+)$") == 0
    assert figure(out, r"^faults injected: (\d+)$") >= 80
    for kind in KINDS:
        assert figure(out, rf"^  {re.escape(kind)} +(\d+)") > 0, kind
    # Both APIs saved through the proxy, and both kinds of State were checked.
    assert figure(out, r"^saves acknowledged: \d+ \(async (\d+)") > 0
    assert figure(out, r"^saves acknowledged: .*sync (\d+)\)$") > 0
    assert figure(out, r"^States checked: \d+ \(agent run (\d+)") > 0
    assert figure(out, r"^States checked: .*direct saves (\d+)\)") > 0
    # Faults that outlast botocore's retries reach the caller, as the documented error only.
    errors = re.search(r"^errors raised: (\d+) \((.*)\)$", out, re.MULTILINE)
    assert errors, out
    if int(errors.group(1)):
        assert re.fullmatch(r"S3StoreError \d+", errors.group(2)), errors.group(2)
    # The direct saves packed: their States ended named by segments.
    assert figure(out, r"^packed: (\d+) States were named by segments at their end") > 0
    # Reads by both kinds of reader ran, each finding the State, or none (not created yet,
    # deleted meanwhile), or failing with the documented error only (else a violation above).
    reads = re.search(
        r"^reads: (\d+) \(same process (\d+), other process (\d+)\): (.*)$", out, re.M
    )
    assert reads, out
    assert int(reads.group(2)) > 0 and int(reads.group(3)) > 0, reads.group(0)
    outcomes = reads.group(4).split(", ")
    allowed = r"(found|none \((not created yet|deleted meanwhile)\)|S3StoreError) \d+"
    assert all(re.fullmatch(allowed, o) for o in outcomes), outcomes
    assert any(o.startswith("found ") for o in outcomes), outcomes
    # Lists ran; each returned every State that existed throughout it, or named it.
    lists = re.search(
        r"^lists: (\d+) \(complete (\d+), IncompleteListError (\d+) naming (\d+) ids, "
        r"S3StoreError (\d+)\); States that existed throughout a list: (\d+), each listed or "
        r"named$",
        out,
        re.M,
    )
    assert lists, out
    ran, complete, incomplete, _, failed, throughout = map(int, lists.groups())
    assert ran == complete + incomplete + failed and ran > 0
    assert throughout >= 5 * (complete + incomplete)  # the five States made at the start
    # Every State was deleted through the proxy, and each delete finished with nothing left.
    deletes = figure(out, r"^deletes: (\d+) \(")
    assert deletes == figure(out, r"^States checked: (\d+) ")
    # What the deletes kept (of creates whose head PUT failed) and probes left by a failed
    # engine check were swept at the end: nothing else was left, and nothing after the sweep
    # but the tombstone heads, one per id deleted: by a worker, or one of the five made at the
    # start (a State whose create failed leaves none).
    left = re.search(
        r"^objects left after every State was deleted: (\d+) \((.*)\); sweep\(older_than=0\) "
        r"removed (\d+); left after it: 0; tombstone heads kept: (\d+)$",
        out,
        re.M,
    )
    assert left, out
    assert "else" not in left.group(2)
    assert int(left.group(1)) == int(left.group(3))
    assert 5 < int(left.group(4)) <= deletes + 5


@pytest.mark.slow
def test_the_runner_reports_an_acknowledged_save_that_was_lost() -> None:
    # No fault but this one: the proxy answers some PUTs 200 without forwarding them. A State
    # whose save was acknowledged and lost cannot save again (its ETag is gone): one try under
    # faults, then the runner's tries with faults off, instead of 12 tries waiting up to 5 s each.
    done = run(
        "--faults", "10", "--seconds", "15", "--rate", "0", "--fake-ack", "0.05", "--attempts", "1"
    )  # fmt: skip
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert figure(out, r"^  PUT acknowledged, not forwarded \(test only\) +(\d+)") > 0
    violations = figure(out, r"^violations: (\d+)$")
    assert violations > 0
    # Each is named by what it is about and says what broke.
    listed = re.findall(r"^  [^\s:]+: (.+)$", out, re.MULTILINE)  # a State, "list", a bucket
    assert len(listed) == min(violations, 20)
    assert any(
        "is not stored" in v or "does not load" in v or "direct read failed" in v for v in listed
    ), listed


@pytest.mark.slow
def test_a_state_that_failed_every_try_saves_once_faults_stop() -> None:
    # Every request fails (500, no botocore retry), so every State's saves and runs fail their
    # tries under faults; each must then save with faults off, and is counted, not a violation.
    # Every request meets a fault, so the count ends the run: 150 faults take each worker
    # (one sync, one async) through States of both kinds (about 22 faults a State), rather
    # than waiting out the 20 s bound.
    done = run(
        "--faults", "150", "--seconds", "20", "--rate", "1", "--kind", "500",
        "--attempts", "2", "--max-attempts", "1", "--workers", "2",
    )  # fmt: skip
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert figure(out, r"^violations: (\d+)$") == 0
    assert figure(out, r"^after 2 failed tries, done once faults stopped: saves (\d+)") > 0
    assert figure(out, r"^after 2 failed tries, .*, runs (\d+),") > 0
    assert figure(out, r"^botocore retries: (\d+);") == 0


@pytest.mark.slow
def test_lists_that_cannot_read_every_head_name_the_ids_they_could_not_read() -> None:
    # No botocore retry: a fault on a head's GET fails it, so lists meet heads they cannot
    # read. Each must raise IncompleteListError naming them (never return fewer silently).
    # No outage: one would spend the faults at once, before any State was there to list.
    done = run(
        "--faults", "150", "--seconds", "40", "--rate", "0.3", "--workers", "4",
        "--list", "0.1", "--max-attempts", "1", "--kind", "500", "--kind", "503",
        "--kind", "reset",
    )  # fmt: skip
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert figure(out, r"^violations: (\d+)$") == 0
    assert figure(out, r"^lists: .*IncompleteListError (\d+) naming") > 0, out
    assert figure(out, r"^lists: .*IncompleteListError \d+ naming (\d+) ids") > 0, out


# A store whose list silently leaves out a State, and whose delete removes the head alone.
BROKEN = """
import sys
sys.path.insert(0, {folder!r})
import fault_proxy
from alpineagents_s3 import S3Store

real_list, real_alist = S3Store.list, S3Store.alist


def silent_list(self, *args, **kwargs):
    return real_list(self, *args, **kwargs)[:-1]


async def silent_alist(self, *args, **kwargs):
    return (await real_alist(self, *args, **kwargs))[:-1]


def head_only(self, state_id, **kwargs):
    self.client.delete_object(Bucket=self.bucket, Key=f"{{self.prefix}}heads/{{state_id}}.json")


async def ahead_only(self, state_id, **kwargs):
    head_only(self, state_id)


S3Store.list, S3Store.alist = silent_list, silent_alist
S3Store.delete, S3Store.adelete = head_only, ahead_only
sys.exit(fault_proxy.main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_the_runner_reports_a_list_that_leaves_a_state_out_and_a_delete_that_leaves_objects() -> (
    None
):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [
            sys.executable, "-c", BROKEN.format(folder=str(RUNNER.parent)),
            "--faults", "10", "--seconds", "8", "--rate", "0", "--workers", "2", "--list", "0.1",
        ],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert re.search(
        r"^  list: a list left out 1 States that existed throughout it without naming them "
        r"\(complete\): ",
        out,
        re.M,
    ), out
    assert re.search(
        r"^  w\d+-\d+-[0-9a-f]{6}: a delete left \d+ objects of the State \(returned at once\): ",
        out,
        re.M,
    ), out
    assert re.search(r"^objects left after every State was deleted: .*else \d+", out, re.M), out


@pytest.mark.parametrize("option", ["--read", "--list"])
@pytest.mark.parametrize("pause", ["-1", "nan"])
def test_a_pause_that_is_no_number_of_seconds_is_refused(option: str, pause: str) -> None:
    done = run(option, pause, "--seconds", "1")
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{option} is a number of seconds, 0 for none, not {pause}" in done.stderr
    assert "fault proxy at" not in done.stdout  # refused before any server started
