"""The S3 fault proxy runner, run briefly as a real process against moto's server.

reliability/fault_proxy.py starts moto's ThreadedMotoServer and its proxy itself. It is run
here for some hundreds of faults of every kind, which must give no violation; and once with
the proxy acknowledging PUTs it never forwards (saves that are acknowledged and lost), which
the runner must report, exiting 1.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

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
def test_hundreds_of_faults_of_every_kind_lose_nothing_acknowledged() -> None:
    done = run("--faults", "300", "--seconds", "25", "--rate", "0.3", "--workers", "12")
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert out.startswith("fault proxy at http://127.0.0.1:")
    assert figure(out, r"^violations: (\d+)$") == 0
    assert figure(out, r"^faults injected: (\d+)$") >= 120
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


@pytest.mark.slow
def test_the_runner_reports_an_acknowledged_save_that_was_lost() -> None:
    # No fault but this one: the proxy answers some PUTs 200 without forwarding them.
    done = run("--faults", "10", "--seconds", "15", "--rate", "0", "--fake-ack", "0.05")
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert figure(out, r"^  PUT acknowledged, not forwarded \(test only\) +(\d+)") > 0
    violations = figure(out, r"^violations: (\d+)$")
    assert violations > 0
    # Each is named by its State and says what broke.
    listed = re.findall(r"^  w\d+-\d+-[0-9a-f]{6}: (.+)$", out, re.MULTILINE)
    assert len(listed) == min(violations, 20)
    assert any(
        "is not stored" in v or "does not load" in v or "direct read failed" in v for v in listed
    ), listed
