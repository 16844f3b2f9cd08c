"""reliability/kill_soak.py, run briefly: real forked children killed with SIGKILL and SIGTERM.

Each run is a real process of its own (the runner forks its children, which pytest's process
should not do). FileStore is soaked with both signals; S3Store, against moto's server in a
process the runner starts, with SIGKILL. With a store that drops tool results saved alone
while reporting them saved, the runner must report violations and exit 1.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KILL_SOAK = ROOT / "reliability" / "kill_soak.py"

LINE = re.compile(
    r"^(?P<store>file|s3) +(?P<signal>SIGKILL|SIGTERM) +kills +(?P<kills>\d+) +resumes +"
    r"(?P<resumes>\d+) +States finished +(?P<finished>\d+) +violations +(?P<violations>\d+) ",
    re.MULTILINE,
)
TOTAL = re.compile(
    r"^(?P<store>file|s3) +total +kills +(?P<kills>\d+) +children +(?P<children>\d+) +States "
    r"(?P<states>\d+) \((?P<finished>\d+) finished\) +violations +(?P<violations>\d+) ",
    re.MULTILINE,
)


def soak(*args: str) -> subprocess.CompletedProcess[str]:
    # This checkout first on sys.path, so its alpineagents and alpineagents_s3 are the ones run.
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, str(KILL_SOAK), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def figures(output: str, store: str) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
    """The per-signal lines and the total line of one store, as numbers."""
    lines = {
        m["signal"]: {k: int(v) for k, v in m.groupdict().items() if v.isdigit()}
        for m in LINE.finditer(output)
        if m["store"] == store
    }
    total = next(m for m in TOTAL.finditer(output) if m["store"] == store)
    return lines, {k: int(v) for k, v in total.groupdict().items() if v.isdigit()}


@pytest.mark.slow
def test_file_store_keeps_every_promise_through_sigkill_and_sigterm() -> None:
    done = soak("--store", "file", "--kills", "20", "--seconds", "120", "--seed", "3")
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert out.startswith("kill soak: stores file, signals kill,term, 20 kills per store")
    lines, total = figures(out, "file")
    assert set(lines) == {"SIGKILL", "SIGTERM"}
    assert total["kills"] == 20 == sum(line["kills"] for line in lines.values())
    assert total["violations"] == 0
    for line in lines.values():
        assert line["kills"] > 0
        assert line["violations"] == 0
        # Every kill is followed by a resume of the same State, which then goes on to the end.
        assert line["resumes"] == line["kills"]
    assert total["finished"] == total["states"]
    assert total["children"] >= total["kills"] + total["states"]
    assert re.search(r"\((\d+) inside agent\.run\)", out)
    assert re.search(r"^total: 20 kills, 0 violations, ", out, re.MULTILINE)


@pytest.mark.slow
def test_s3_store_keeps_every_promise_through_sigkill_and_sigterm() -> None:
    done = soak("--store", "s3", "--signals", "kill,term", "--kills", "20", "--seconds", "120")
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert re.match(r"kill soak: stores s3 \(S3 at http://127\.0\.0\.1:\d+, moto\)", out)
    lines, total = figures(out, "s3")
    assert set(lines) == {"SIGKILL", "SIGTERM"}
    assert lines["SIGKILL"]["kills"] + lines["SIGTERM"]["kills"] == 20 == total["kills"]
    assert lines["SIGKILL"]["resumes"] + lines["SIGTERM"]["resumes"] == 20
    assert lines["SIGKILL"]["violations"] == 0 == lines["SIGTERM"]["violations"]
    assert total["violations"] == 0
    assert total["finished"] == total["states"]
    assert re.search(r"^total: 20 kills, 0 violations, ", out, re.MULTILINE)


@pytest.mark.slow
def test_s3_store_packing_as_it_resumes_keeps_every_promise_through_sigkill() -> None:
    done = soak(
        "--store", "s3", "--signals", "kill", "--kills", "12", "--seconds", "120",
        "--auto-pack", "2", "--seed", "5",
    )  # fmt: skip
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "S3Store(auto_pack=2)" in out.splitlines()[0]
    _, total = figures(out, "s3")
    assert total["kills"] == 12 and total["violations"] == 0
    assert total["finished"] == total["states"]
    # The resumes did pack: States finished with segments.
    packed = re.search(r"^s3 +packed segments left in the bucket: (\d+)$", out, re.MULTILINE)
    assert packed is not None and int(packed[1]) > 0, out


# What each store makes of the lost tool results: FileStore's load sees a seq missing from
# what the child was told is saved; S3Store refuses the child's next save, which would leave
# a hole where the dropped entries are (and the load then finds them missing). Either is a
# violation the runner must print.
CAUGHT = {
    "file": r"after child \d+: entry \d+ \(tool_result\), saved, is missing",
    "s3": r"child \d+ raised: ValueError: this save of State '[\w-]+' begins at history entry "
    r"\d+, but entry \d+ is not stored",
}


@pytest.mark.slow
@pytest.mark.parametrize("store", ["file", "s3"])
def test_a_store_that_drops_saves_is_caught(store: str) -> None:
    done = soak("--store", store, "--kills", "6", "--seconds", "120", "--break", "drop-save")
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert out.splitlines()[0].endswith("BROKEN: drop-save")
    _, total = figures(out, store)
    assert total["violations"] > 0
    assert re.search(rf"^  {store}: soak-\w+: \[[^]]+\] {CAUGHT[store]}", out, re.MULTILINE)
    assert re.search(r"^total: \d+ kills, [1-9]\d* violations, ", out, re.MULTILINE)
