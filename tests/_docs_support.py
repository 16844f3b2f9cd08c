"""What the tests of examples/ and docs/ share: a moto server, a clean environment, a runner.

The programs under test run as real processes with the venv's Python, offline: dummy AWS
credentials, the machine's AWS configuration and ANTHROPIC_API_KEY kept out, and S3 requests
sent to moto's HTTP server on 127.0.0.1 through ``AWS_ENDPOINT_URL_S3``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import boto3

from tests.helpers import AWS_ENV, AWS_UNSET

if TYPE_CHECKING:
    from types_boto3_s3 import S3Client

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent

KEPT_OUT = ("ANTHROPIC_API_KEY", *AWS_UNSET, "ALPINEAGENTS_DEBUG")


def offline_env(endpoint: str, **extra: str) -> dict[str, str]:
    """The environment of a program under test: offline, S3 at ``endpoint``, the venv first."""
    env = {k: v for k, v in os.environ.items() if k not in KEPT_OUT}
    env.update(AWS_ENV)
    env["AWS_ENDPOINT_URL_S3"] = endpoint
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def s3_client(endpoint: str) -> S3Client:
    """A plain boto3 client on the moto server, to set up and inspect buckets."""
    client: S3Client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    return client


def new_bucket(endpoint: str, stem: str = "docs") -> str:
    """Create a bucket with a fresh name on the moto server; its name."""
    name = f"{stem}-{uuid.uuid4().hex[:12]}"
    s3_client(endpoint).create_bucket(Bucket=name)
    return name


def keys(endpoint: str, bucket: str, prefix: str = "") -> list[str]:
    """Every key under ``prefix`` in ``bucket``."""
    pages = (
        s3_client(endpoint).get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    )
    return [item["Key"] for page in pages for item in page.get("Contents", [])]


def run(
    args: list[str],
    env: Mapping[str, str],
    cwd: Path,
    *,
    stdin: str = "",
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """Run a program to its end; fail with its output if it exits non-zero."""
    done = subprocess.run(
        args,
        input=stdin,
        env=dict(env),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, (
        f"{' '.join(args)} exited {done.returncode}\n--- stdout\n{done.stdout}"
        f"\n--- stderr\n{done.stderr}"
    )
    return done
