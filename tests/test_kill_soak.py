"""reliability/kill_soak.py, run briefly: real forked children killed with SIGKILL and SIGTERM.

Each run is a real process of its own (the runner forks its children, which pytest's process
should not do). FileStore and S3Store (against moto's server in a process the runner starts)
are soaked with both signals; on S3 the runner then sweeps what the kills left and loads every
State again. With a store that drops tool results saved alone while reporting them saved, the
runner must report violations and exit 1.
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
    # What the kills left, by role; the sweep removed what no head names (and the probes of
    # engine checks cut short), and every State loads what the last check saw.
    left = re.search(
        r"^s3 +left by the soak: head (\d+), entry (\d+), segment (\d+), unnamed (\d+), "
        r"probe (\d+); sweep\(older_than=0\) removed (\d+); (\d+) of (\d+) States load what "
        r"the last check saw$",
        out,
        re.MULTILINE,
    )
    assert left is not None, out
    heads, entries, segments, unnamed, probes, removed, same, states = map(int, left.groups())
    assert heads == states == same == total["states"]
    assert removed == unnamed + probes
    assert entries > 0
    # The saves packed as they went: some State passed 16 entry objects (seed 1: 3 segments).
    assert segments > 0, out


# What each store makes of the lost tool results: the load after the child sees seqs missing
# from what the child was told is saved. S3Store also refuses the child's next save, which
# continues past the entries its head has (a second writer's save, to the store). Each is a
# violation the runner must print.
MISSING = r"after child \d+: entry \d+ \(tool_result\), saved, is missing"
CAUGHT = {
    "file": [MISSING],
    "s3": [
        MISSING,
        r"child \d+ raised: alpineagents_s3\.errors\.ConcurrentWriteError: State '[\w-]+' in "
        r"s3://\S+ was saved by another writer since this process last read or wrote it \(the "
        r"save continues from entry \d+, but the State has \d+ entries\)",
    ],
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
    for caught in CAUGHT[store]:
        assert re.search(rf"^  {store}: soak-\w+: \[[^]]+\] {caught}", out, re.MULTILINE), out
    assert re.search(r"^total: \d+ kills, [1-9]\d* violations, ", out, re.MULTILINE)


HUNG_CHILD = """
import faulthandler, os, signal, sys, time
sys.path.insert(0, "reliability")
from kill_soak import stacks, wait_for

log = sys.argv[1]
pid = os.fork()
if pid == 0:  # what _soak_child.child_main does with its log, then a wait that never ends
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    def waits_for_ever():
        time.sleep(3600)
    waits_for_ever()
time.sleep(0.5)
os.kill(pid, signal.SIGUSR1)
assert wait_for(pid, 1.0) is None
os.kill(pid, signal.SIGKILL)
wait_for(pid, 10)
from pathlib import Path
print(stacks(Path(log)))
print(stacks(Path(log + ".absent")))
"""


def test_a_hung_child_leaves_the_stack_it_hung_in(tmp_path: Path) -> None:
    """The runner's SIGUSR1 makes a hung child write its stacks; the violation quotes them."""
    done = subprocess.run(
        [sys.executable, "-c", HUNG_CHILD, str(tmp_path / "hung.log")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "Current thread 0x" in done.stdout
    assert "in waits_for_ever" in done.stdout
    assert done.stdout.rstrip().endswith("    (no log)")
