"""What the tests of examples/ and docs/ share: a moto server, a clean environment, a runner.

The programs under test run as real processes with the venv's Python, offline: dummy AWS
credentials, the machine's AWS configuration and ANTHROPIC_API_KEY kept out, and S3 requests
sent to moto's HTTP server on 127.0.0.1 through ``AWS_ENDPOINT_URL_S3``.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import boto3
from moto.server import ThreadedMotoServer

if TYPE_CHECKING:
    from types_boto3_s3 import S3Client

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent

AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",
}
KEPT_OUT = (
    "ANTHROPIC_API_KEY",
    "AWS_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_RETRY_MODE",
    "AWS_MAX_ATTEMPTS",
    "ALPINEAGENTS_DEBUG",
)


@contextmanager
def moto_server() -> Iterator[str]:
    """moto's S3 server on 127.0.0.1 (a free port) while the block runs; its URL."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


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
