"""The reliability runners, run briefly as real processes against moto's server.

reliability/two_writers.py starts moto's ThreadedMotoServer itself; it is run here with a few
trials per scenario, and once with a store that hides refusals, to see that it does fail then:
both variants of stale-copy (B another process, or a second copy in A's own process) and the
second-process data-only scenario must each report the loser told it won.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TWO_WRITERS = ROOT / "reliability" / "two_writers.py"
SCENARIOS = ("race", "stale-copy", "data-only", "delete", "create-race")
DETERMINISTIC = ("stale-copy", "data-only", "delete")  # judged on moto too
RACES = ("race", "create-race")  # moto has no lock: run, not judged

# A store whose sync saves swallow ConcurrentWriteError: a loser that is told it won.
HIDE_REFUSALS = """
import sys
sys.path.insert(0, {folder!r})
import two_writers
from alpineagents import ConcurrentWriteError
from alpineagents_s3 import S3Store

refusing_write = S3Store.write

def write(self, *args, **kwargs):
    try:
        refusing_write(self, *args, **kwargs)
    except ConcurrentWriteError:
        pass

S3Store.write = write
sys.exit(two_writers.main(sys.argv[1:]))
"""


def run(*command: str) -> subprocess.CompletedProcess[str]:
    # This checkout first on sys.path, so its alpineagents and alpineagents_s3 are the ones run.
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, *command],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def scenario_lines(output: str) -> dict[str, str]:
    lines = {}
    for line in output.splitlines():
        words = line.split()
        if words and words[0] in SCENARIOS:
            lines[words[0]] = line
    return lines


@pytest.mark.slow
def test_two_writers_on_moto_finds_the_expected_winner_every_time() -> None:
    done = run(str(TWO_WRITERS), "--trials", "3", "--seconds", "400")
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert out.startswith("two writers on moto at http://127.0.0.1:")
    lines = scenario_lines(out)
    assert list(lines) == list(SCENARIOS)
    for label in DETERMINISTIC:
        assert re.match(rf"{label} +trials +3 +expected +3 +violations +0 ", lines[label])
        assert "not judged" not in lines[label]
    for label in RACES:
        assert re.match(rf"{label} +trials +3 ", lines[label])
        assert lines[label].endswith("(moto: no lock, not judged)")
    # Both APIs: trials alternate sync and async; the delete scenario names its tool calls.
    assert "mode both" in out
    assert "[1 tool call(s) 2, 2 tool call(s) 1]" in lines["delete"]
    # B is another process on even trials, a second copy in A's process on odd ones.
    assert "[B refused 2, B refused (same process) 1]" in lines["stale-copy"]
    assert "objects left in the bucket: 0" in out
    assert re.search(r"^total: 15 trials, 0 judged violations, ", out, re.M)


@pytest.mark.slow
def test_two_writers_fails_when_a_loser_is_told_it_won() -> None:
    script = HIDE_REFUSALS.format(folder=str(TWO_WRITERS.parent))
    done = run(
        "-c", script, "--trials", "2", "--mode", "sync", "--scenario", "stale-copy",
        "--scenario", "data-only", "--seconds", "300",
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    lines = scenario_lines(done.stdout)
    assert list(lines) == ["stale-copy", "data-only"]
    for line in lines.values():
        assert re.match(r"\S+ +trials +2 +expected +0 +violations +2 ", line), line
    assert "[B not refused 1, B not refused (same process) 1]" in lines["stale-copy"]
    assert "the loser's save: expected ConcurrentWriteError, got returned" in done.stdout
    assert re.search(r"^total: 4 trials, 4 judged violations, ", done.stdout, re.M)


@pytest.mark.slow
@pytest.mark.integration
def test_two_writers_on_localstack_judges_the_races_too() -> None:
    url = os.environ.get("ALPINEAGENTS_LOCALSTACK_URL")
    if not url:
        pytest.skip("ALPINEAGENTS_LOCALSTACK_URL is not set: start localstack/localstack.sh")
    done = run(str(TWO_WRITERS), "--trials", "3", "--seconds", "400", "--endpoint", url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith(f"two writers on LocalStack at {url} (conditions locked)")
    lines = scenario_lines(done.stdout)
    assert list(lines) == list(SCENARIOS)
    for label, line in lines.items():
        assert re.match(rf"{label} +trials +3 +expected +3 +violations +0 ", line), line
        assert "not judged" not in line
    assert "[one winner 3]" in lines["race"] and "[one winner 3]" in lines["create-race"]
    assert re.search(r"^total: 15 trials, 0 judged violations, ", done.stdout, re.M)
