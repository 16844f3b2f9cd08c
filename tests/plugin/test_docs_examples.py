"""The worked examples of docs/s3.md, extracted from the markdown and run as written: the
``save`` example in one process, the ``resume`` example in another, against moto's server
through the standard ``AWS_ENDPOINT_URL_S3`` configuration."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import alpineagents.store
import alpineagents.testing

DOC = Path(__file__).resolve().parents[2] / "docs" / "s3.md"
GENERATION = "info" if hasattr(alpineagents.store, "StateInfo") else "snapshot"


def examples() -> dict[str, str]:
    """The doc's titled Python blocks: title -> code."""
    found = re.findall(r'```python title="([^"]+)"\n(.*?)```', DOC.read_text(), re.S)
    return dict(found)


def run(code: str, tmp_path: Path, name: str, env: dict[str, str]) -> str:
    path = tmp_path / name
    path.write_text(code)
    done = subprocess.run(
        [sys.executable, "-P", str(path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, f"{name} failed:\n{done.stderr}"
    return done.stdout


def test_the_docs_have_one_example_pair_per_contract_generation() -> None:
    assert set(examples()) == {
        "save_info.py",
        "resume_info.py",
        "save_snapshot.py",
        "resume_snapshot.py",
    }


def test_the_example_for_this_core_saves_and_resumes_in_another_process(
    tmp_path: Path, moto_url: str, s3: Any
) -> None:
    if not hasattr(alpineagents.testing, "FakeModel"):
        pytest.skip("the examples are for the published alpineagents (FakeModel, @tool)")
    s3.create_bucket(Bucket="agent-runs")
    try:
        env = {**os.environ, "AWS_ENDPOINT_URL_S3": moto_url}
        code = examples()
        saved = run(code[f"save_{GENERATION}.py"], tmp_path, "save.py", env)
        assert saved.strip().endswith("It will be sunny in Oslo.")
        resumed = run(code[f"resume_{GENERATION}.py"], tmp_path, "resume.py", env)
        assert resumed.splitlines()[0] == "['trip-oslo']"
        assert resumed.strip().endswith("Rain in Bergen.")
    finally:
        listed = s3.list_objects_v2(Bucket="agent-runs").get("Contents", [])
        for item in listed:
            s3.delete_object(Bucket="agent-runs", Key=item["Key"])
        s3.delete_bucket(Bucket="agent-runs")
