"""Offline without dev tools: the offline models and the demo without pytest, and
scripts/demo.sh installing only what the demo asks for, once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from alpineagents import Agent, FileStore, State
from alpineagents.demo import main as demo_main
from alpineagents.demo import where_the_runs_are
from alpineagents.testing import TestModel

REPO = Path(__file__).resolve().parents[1]

# Put first on a subprocess's sys.path: it refuses to import the dev and S3 tools, as on a
# machine where only `pip install alpineagents` ran. Every process the demo starts inherits it.
HIDE_DEV_TOOLS = """
import sys

HIDDEN = ("pytest", "_pytest", "pytest_asyncio", "moto", "boto3", "botocore", "aioboto3",
          "alpineagents_s3")


class Hide:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r} (hidden by the test)", name=name)
        return None


sys.meta_path.insert(0, Hide())
"""


@pytest.fixture
def without_dev_tools(tmp_path: Path) -> dict[str, str]:
    """An environment whose Python processes cannot import pytest, moto, boto3 or the plugin."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(HIDE_DEV_TOOLS)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "AWS_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(REPO)])
    return env


def python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, timeout=60
    )


@pytest.mark.slow
def test_the_tools_are_really_hidden(without_dev_tools: dict[str, str]) -> None:
    done = python("import pytest", without_dev_tools)
    assert done.returncode == 1 and "No module named 'pytest'" in done.stderr


@pytest.mark.slow
def test_offline_models_import_and_run_without_pytest(without_dev_tools: dict[str, str]) -> None:
    done = python(
        "from alpineagents import Agent, State\n"
        "from alpineagents.testing import FunctionModel, TestModel, call\n"
        "print(Agent(TestModel()).run(State('hi')))\n"
        "print(Agent(FunctionModel(lambda request: 'scripted')).run(State('hi')))\n",
        without_dev_tools,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "scripted"


@pytest.mark.slow
def test_an_agent_with_a_model_object_never_imports_the_anthropic_sdk() -> None:
    """The SDK is about 2 s of start-up: a process (a crash-resumed run, a serverless cold
    start) whose Agent runs a Model object of its own does not pay it; a model id does."""
    done = python(
        "import sys\n"
        "from alpineagents import Agent, FileStore, State\n"
        "from alpineagents.testing import FunctionModel\n"
        "import tempfile\n"
        "model = FunctionModel(lambda request: 'done')\n"
        "agent = Agent(model, store=FileStore(tempfile.mkdtemp()))\n"
        "print(agent.run(State('hi')), 'anthropic' in sys.modules)\n"
        "Agent('claude-opus-5')\n"
        "print('anthropic' in sys.modules)\n",
        {**os.environ},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-2:] == ["done False", "True"]


@pytest.mark.slow
def test_the_conformance_suite_without_pytest_says_how_to_install_it(
    without_dev_tools: dict[str, str],
) -> None:
    done = python("from alpineagents.testing import StoreConformance", without_dev_tools)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: alpineagents.testing.StoreConformance is a pytest")
    assert "pip install pytest" in last


def test_the_conformance_suite_imports_with_pytest() -> None:
    from alpineagents.testing import StoreConformance, StoreIO

    assert StoreConformance.__module__ == StoreIO.__module__ == "alpineagents.testing._store_suite"


@pytest.mark.slow
@pytest.mark.crash
def test_the_demo_runs_without_dev_tools_and_keeps_its_runs(
    without_dev_tools: dict[str, str], tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    Agent(TestModel(), store=FileStore(runs)).run(State("an earlier run", id="book-oslo-trip"))
    done = subprocess.run(
        [sys.executable, "-m", "alpineagents.demo", "--dir", str(runs)],
        env=without_dev_tools,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    assert "book_flight ran 1 time(s)" in done.stdout
    # The demo ran a State of its own beside the one there, and says how to list them.
    assert "State: book-oslo-trip-2\n" in done.stdout
    assert f"alpineagents ls {runs}\n" in done.stdout
    assert f"alpineagents show {runs} book-oslo-trip-2" in done.stdout
    listed = subprocess.run(
        [sys.executable, "-m", "alpineagents.cli", "ls", str(runs), "--json"],
        env=without_dev_tools,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listed.returncode == 0, listed.stderr
    assert [s["id"] for s in json.loads(listed.stdout)] == ["book-oslo-trip-2", "book-oslo-trip"]


@pytest.mark.slow
def test_the_demo_help_without_dev_tools(without_dev_tools: dict[str, str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "alpineagents.demo", "--help"],
        env=without_dev_tools,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "--dir DIR" in done.stdout


def test_the_demo_says_where_its_runs_are() -> None:
    temporary = where_the_runs_are("file", "/tmp/x/agent-runs", "book-oslo-trip", kept=False)
    assert "a temporary folder, removed now" in temporary
    assert "python -m alpineagents.demo --dir agent-runs" in temporary
    kept = where_the_runs_are("file", "my runs", "book-oslo-trip", kept=True)
    assert "alpineagents ls 'my runs'" in kept
    assert "alpineagents show 'my runs' book-oslo-trip" in kept
    assert "stopped with the demo" in where_the_runs_are("s3", "s3://b/", "x", kept=False)


def test_the_demo_refuses_dir_with_another_store() -> None:
    with pytest.raises(SystemExit) as stopped:
        demo_main(["--store", "s3", "--dir", "runs"])
    assert stopped.value.code == 2


# scripts/demo.sh, with a stand-in venv whose python records what it is asked to do ----------

FAKE_PYTHON = """#!/bin/sh
echo "$*" >> "$(dirname "$0")/../calls"
"""


def demo_sh(venv: Path, *args: str) -> list[str]:
    """Run scripts/demo.sh on the stand-in venv; the python calls it made."""
    calls = venv / "calls"
    calls.unlink(missing_ok=True)
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "demo.sh"), *args],
        env={**os.environ, "ALPINEAGENTS_VENV": str(venv)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return calls.read_text().splitlines()


@pytest.fixture
def venv(tmp_path: Path) -> Path:
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    fake = tmp_path / "venv" / "bin" / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    return tmp_path / "venv"


PIP = "-m pip install --quiet --disable-pip-version-check"


@pytest.mark.slow
def test_demo_sh_installs_the_core_alone_and_only_once(venv: Path) -> None:
    assert demo_sh(venv) == [f"{PIP} -e .", "-m alpineagents.demo"]
    assert demo_sh(venv, "--dir", "runs") == ["-m alpineagents.demo --dir runs"]


@pytest.mark.slow
def test_demo_sh_installs_the_plugin_and_moto_only_for_store_s3(venv: Path) -> None:
    assert demo_sh(venv, "--store", "s3") == [
        f"{PIP} -e .",
        f"{PIP} ./packaging/alpineagents-s3[testing]",
        "-m alpineagents.demo --store s3",
    ]
    assert demo_sh(venv, "--store=s3") == ["-m alpineagents.demo --store=s3"]
    # A real bucket needs the plugin and boto3, not moto.
    assert demo_sh(venv, "--store", "s3://bucket/runs") == [
        f"{PIP} ./packaging/alpineagents-s3",
        "-m alpineagents.demo --store s3://bucket/runs",
    ]


@pytest.mark.slow
def test_demo_sh_installs_again_when_what_it_installed_changed(venv: Path) -> None:
    demo_sh(venv)
    stamp = venv / ".alpineagents-demo-core"
    # As if pyproject.toml changed after the install: the stamp older than it (not an hour
    # ago: a checkout's pyproject.toml can be older than that).
    past = (REPO / "pyproject.toml").stat().st_mtime - 60
    os.utime(stamp, (past, past))
    assert demo_sh(venv) == [f"{PIP} -e .", "-m alpineagents.demo"]
    assert demo_sh(venv) == ["-m alpineagents.demo"]
