"""The ``alpineagents`` console script as a process: exit codes, a closed pipe, the shell pipe
into ``head``, a missing boto3, and the start-up time of ``--help``."""

from __future__ import annotations

import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from alpineagents import Agent, FileStore, State
from alpineagents.cli import (
    EXIT_FAILURE,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_PIPE,
    EXIT_USAGE,
)
from alpineagents.testing import TestModel

REPO = Path(__file__).resolve().parents[1]
SCRIPT = Path(sys.executable).with_name("alpineagents")


def script(*argv: str, **popen: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), *argv], capture_output=True, text=True, timeout=60, **popen)


@pytest.mark.slow
def test_a_missing_boto3_names_what_to_install(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['boto3'] = None; sys.modules['aioboto3'] = None\n"
        "from alpineagents.cli import main; sys.exit(main(['ls', 's3://bucket/runs']))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert done.returncode == EXIT_FAILURE
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("alpineagents: error: ") and "pip install" in done.stderr


# The console script -----------------------------------------------------------------------

needs_script = pytest.mark.skipif(not SCRIPT.exists(), reason="no console script installed")


@pytest.mark.slow
@needs_script
def test_the_console_script_exit_codes(folder: Path, tmp_path: Path) -> None:
    done = script("ls", str(folder))
    assert done.returncode == EXIT_OK and done.stdout.startswith("ID ")
    done = script("ls", str(tmp_path / "typo"))
    assert (done.returncode, done.stdout) == (EXIT_NOT_FOUND, "")
    assert done.stderr.count("\n") == 1 and "no store folder" in done.stderr
    done = script("show", str(folder), "nope")
    assert done.returncode == EXIT_NOT_FOUND and "Traceback" not in done.stderr
    done = script("rm", str(folder), "run-0", stdin=subprocess.DEVNULL)
    assert done.returncode == EXIT_USAGE and "pass --yes" in done.stderr
    assert script("bogus").returncode == EXIT_USAGE


@pytest.mark.slow
@needs_script
@pytest.mark.parametrize("argv", [["ls", "--json"], ["export"]])
def test_a_closed_pipe_is_quiet(tmp_path: Path, argv: list[str]) -> None:
    store = FileStore(tmp_path / "big")
    for i in range(3):  # 1.5 MB each, past a pipe's buffer even where it is 1 MB
        Agent(TestModel(answer="x"), store=store).run(State("long " * 300_000, id=f"big-{i}"))
    command = [str(SCRIPT), argv[0], str(store.path), *argv[1:]]
    if argv[0] == "export":
        command.append("big-0")
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert child.stdout is not None and child.stderr is not None
    assert child.stdout.read(10)
    child.stdout.close()  # as `| head -c 10` does
    assert child.wait(timeout=60) == EXIT_PIPE
    with child.stderr:
        assert child.stderr.read() == b""


@pytest.mark.slow
@needs_script
def test_the_shell_pipe_into_head_is_quiet(folder: Path) -> None:
    if shutil.which("head") is None:
        pytest.skip("no head")
    done = subprocess.run(
        f"'{SCRIPT}' ls '{folder}' | head -1",
        shell=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.startswith("ID ") and done.stdout.count("\n") == 1
    assert done.stderr == ""


HEAVY = ("boto3", "botocore", "aioboto3", "alpineagents_s3", "moto", "alpineagents.transfer")


@pytest.mark.slow
def test_help_imports_nothing_heavy_beyond_the_package() -> None:
    code = (
        "import sys, alpineagents; before = set(sys.modules)\n"
        "from alpineagents.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        f"print(sorted(m for m in set(sys.modules) - before if m.startswith({HEAVY!r})))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.slow
def test_help_adds_little_to_importing_the_package() -> None:
    """What the CLI itself costs at start-up: --help minus `import alpineagents`, in CPU time
    (the machine may be busy)."""

    def best(code: str) -> float:
        times = []
        for _ in range(2):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run(
                [sys.executable, "-c", code], capture_output=True, timeout=60, check=True
            )
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            times.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        return min(times)

    package = best("import alpineagents")
    helped = best("from alpineagents.cli import main; main(['--help'])")
    assert helped - package < 0.15, (helped, package)


@pytest.mark.slow
@needs_script
def test_help_starts_in_well_under_a_second() -> None:
    # The CPU time the command uses, not the wall time: the machine may be busy with other work.
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([str(SCRIPT), "--help"], capture_output=True, timeout=60, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert cpu < 0.6, f"alpineagents --help used {cpu:.2f} s of CPU ({wall:.2f} s wall)"
