"""Fixtures every test module may ask for: the two modes, and moto's S3 server; the markers.

moto (its real HTTP server, ThreadedMotoServer on 127.0.0.1) starts the first time a test asks
for ``moto_url`` and serves the rest of the session; a run without S3 tests never starts it,
nor imports boto3 or moto.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from alpineagents import FileStore
from tests.helpers import (
    AWS_ENV,
    AWS_UNSET,
    CliRun,
    MakeBucket,
    Mode,
    bucket_maker,
    make_states,
    moto_server,
)

if TYPE_CHECKING:
    from types_boto3_s3 import S3Client

pytest_plugins = ["pytester"]


# The fixtures that start moto's S3 server, here and in the test modules and folders that
# start their own (tests/plugin/conftest.py, test_examples.py, test_serverless.py,
# test_docs.py); a test that uses one, directly or through another fixture, is a `server`
# test. LocalStack's is an `integration` test.
SERVER_FIXTURES = frozenset({"moto_url", "moto_endpoint", "s3_for_docs"})
INTEGRATION_FIXTURES = frozenset({"localstack_url"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests that need an S3 server: not in the fast tier.

    A fixture asked for at run time (``request.getfixturevalue``) is not seen here: such a
    parameter carries the mark itself (``pytest.param("s3", marks=pytest.mark.server)``).
    """
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if names & SERVER_FIXTURES:
            item.add_marker(pytest.mark.server)
        if names & INTEGRATION_FIXTURES:
            item.add_marker(pytest.mark.integration)


@pytest.fixture
def compact_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Model entries written compact (schema version 2), as a later release will write them:
    this one only reads them."""
    from alpineagents import _serialize

    monkeypatch.setattr(_serialize, "_WRITE_COMPACT", True)


@pytest.fixture(params=["sync", "async"])
def mode(request: pytest.FixtureRequest) -> Mode:
    """Run the test once with the sync API and once with the async one."""
    param: Mode = request.param
    return param


# The command line ------------------------------------------------------------------------


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., CliRun]:
    """``cli("ls", folder)``: runs ``alpineagents ls folder`` in-process (``main(argv)``)."""
    return lambda *argv: CliRun(capsys, *argv)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A FileStore folder with three finished States, updated in the order run-0, run-1, run-2."""
    make_states(FileStore(tmp_path / "runs"), 3)
    return tmp_path / "runs"


# S3 ----------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def aws_environment() -> Iterator[None]:
    """Dummy AWS credentials from here to the end of the session, nothing of the machine's
    AWS configuration (profiles, endpoints, retry settings)."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in AWS_ENV.items():
            patch.setenv(name, value)
        for name in AWS_UNSET:
            patch.delenv(name, raising=False)
        yield


@pytest.fixture(scope="session")
def moto_url(aws_environment: None) -> Iterator[str]:
    """The endpoint of moto's S3 server, started on 127.0.0.1 (a free port) at first use."""
    with moto_server() as url:
        yield url


@pytest.fixture(scope="session")
def moto(moto_url: str) -> Iterator[S3Client]:
    """A plain boto3 client on moto's server, for setting up and inspecting buckets behind the
    store's back."""
    import boto3

    client: S3Client = boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1")
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def moto_bucket(moto: S3Client) -> MakeBucket:
    """Makes a new, empty bucket on moto: ``moto_bucket(versioned=False) -> name``."""
    return bucket_maker(moto)


@pytest.fixture
def moto_endpoint(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """moto's endpoint, also set as ``AWS_ENDPOINT_URL_S3`` for the test: ``s3://`` URLs
    reach moto the way a user's configuration points them at an endpoint."""
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_url)
    return moto_url


@pytest.fixture
def bucket(moto_endpoint: str, moto_bucket: MakeBucket) -> str:
    """A new, empty bucket on moto, which ``s3://{bucket}/...`` URLs reach."""
    return moto_bucket()


@pytest.fixture
def collections() -> Iterator[list[int]]:
    """The generations collected meanwhile, with thresholds low enough that a load of a few
    thousand entries would see many collections; the collector as it was after."""
    seen: list[int] = []

    def count(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            seen.append(info["generation"])

    thresholds, was_on = gc.get_threshold(), gc.isenabled()
    gc.enable()
    gc.set_threshold(50, 2, 2)
    gc.callbacks.append(count)
    try:
        yield seen
    finally:
        gc.callbacks.remove(count)
        gc.set_threshold(*thresholds)
        (gc.enable if was_on else gc.disable)()
