"""Fixtures of the plugin suite: S3Store against moto's real HTTP server, any alpineagents.

This folder is run against this repository's core and against published alpineagents
releases (scripts/test.sh installs each into a virtualenv of its own, with the plugin's
wheel). So it imports nothing from this repository but ``alpineagents_s3`` and the public
Store contract, and it is not a package: nothing here puts the repository on ``sys.path``.

``ALPINEAGENTS_EXPECT_CORE`` (set by scripts/test.sh) names the alpineagents version the run
must be using; the session refuses to start on another one, or on a copy imported from the
repository instead of the virtualenv.
"""

from __future__ import annotations

import logging
import os
import sys
import uuid
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

import alpineagents
import alpineagents.store
import alpineagents_s3

EXPECT_CORE = "ALPINEAGENTS_EXPECT_CORE"


# Dummy credentials moto accepts; the machine's AWS configuration is kept out.
AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",
}
AWS_UNSET = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")

CORE_VERSION = metadata.version("alpineagents")
# The contract generation of the installed core: "snapshot" (0.2-0.4, this repository's core)
# or "info" (0.5+).
GENERATION = "info" if hasattr(alpineagents.store, "StateInfo") else "snapshot"


def pytest_report_header(config: pytest.Config) -> list[str]:
    return [
        f"alpineagents {CORE_VERSION} ({GENERATION} contract) from "
        f"{Path(alpineagents.__file__).parent}",
        f"alpineagents_s3 from {Path(alpineagents_s3.__file__).parent}",
    ]


def pytest_sessionstart(session: pytest.Session) -> None:
    expected = os.environ.get(EXPECT_CORE)
    if not expected:
        return
    if CORE_VERSION != expected:
        raise pytest.UsageError(
            f"{EXPECT_CORE}={expected}, but alpineagents {CORE_VERSION} is installed"
        )
    prefix = Path(sys.prefix).resolve()
    for module in (alpineagents, alpineagents_s3):
        where = Path(module.__file__ or "").resolve()
        if prefix not in where.parents:
            raise pytest.UsageError(
                f"{module.__name__} was imported from {where}, not from the virtualenv "
                f"{prefix}: the run would not test the installed packages"
            )


@pytest.fixture(scope="session", autouse=True)
def aws_environment() -> Iterator[None]:
    """Dummy credentials for the whole session, nothing of the machine's AWS configuration."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in AWS_ENV.items():
            patch.setenv(name, value)
        for name in AWS_UNSET:
            patch.delenv(name, raising=False)
        yield


def _moto_modules_listed_once() -> None:
    """Make moto's server list its own service modules once, not at every request.

    For each request it cannot route by path, moto's server looks for the service in
    ``moto.backends.list_of_moto_modules()``, which lists moto's package folder and stats
    every entry in it: about a sixth of the CPU an S3 request costs here, client and server.
    The folder does not change while the tests run, so its listing is kept; what moto answers
    is the same.
    """
    from moto import backends

    if getattr(backends.list_of_moto_modules, "listed_once", False):
        return
    modules = tuple(backends.list_of_moto_modules())

    def listed() -> tuple[str, ...]:
        return modules

    listed.listed_once = True  # type: ignore[attr-defined]
    backends.list_of_moto_modules = listed


@pytest.fixture(scope="session")
def moto_url(aws_environment: None) -> Iterator[str]:
    """moto's S3 server, a real HTTP server on 127.0.0.1 in this process."""
    _moto_modules_listed_once()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture(scope="session")
def s3(moto_url: str) -> Iterator[Any]:
    """A plain boto3 client, for looking behind the store's back."""
    client = boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1")
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def bucket(s3: Any) -> str:
    """A new, empty bucket."""
    name = f"p-{uuid.uuid4().hex[:20]}"
    s3.create_bucket(Bucket=name)
    return name


@pytest.fixture
def make_store(moto_url: str, bucket: str) -> Iterator[Callable[..., alpineagents_s3.S3Store]]:
    """``make_store(prefix="runs", **options)``: S3Stores on the test's bucket, closed after."""
    made: list[alpineagents_s3.S3Store] = []

    def make(prefix: str = "runs", **options: Any) -> alpineagents_s3.S3Store:
        store = alpineagents_s3.S3Store(bucket, prefix, endpoint_url=moto_url, **options)
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()
