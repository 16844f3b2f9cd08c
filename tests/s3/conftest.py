"""S3 servers for the S3Store tests: moto's real HTTP server, and LocalStack when it runs.

moto runs in this process (ThreadedMotoServer on 127.0.0.1, a free port) for the whole session.
LocalStack is started outside pytest (localstack/localstack.sh) and found through
ALPINEAGENTS_LOCALSTACK_URL; the tests marked ``integration`` are skipped without it.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import boto3
import pytest
from moto.server import ThreadedMotoServer

if TYPE_CHECKING:
    from types_boto3_s3 import S3Client

LOCALSTACK_ENV = "ALPINEAGENTS_LOCALSTACK_URL"

# Dummy credentials both emulators accept; the machine's AWS configuration is kept out.
AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",
}
AWS_UNSET = (
    "AWS_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_RETRY_MODE",
    "AWS_MAX_ATTEMPTS",
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


@pytest.fixture(scope="session")
def moto_url(aws_environment: None) -> Iterator[str]:
    """The endpoint of moto's S3 server, running in this process on 127.0.0.1."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture(scope="session")
def localstack_url(aws_environment: None) -> str:
    """LocalStack's endpoint; the test is skipped when ALPINEAGENTS_LOCALSTACK_URL is unset."""
    url = os.environ.get(LOCALSTACK_ENV)
    if not url:
        pytest.skip(f"{LOCALSTACK_ENV} is not set: start LocalStack with localstack/localstack.sh")
    return url


def raw_client(endpoint_url: str) -> S3Client:
    """A plain boto3 client, for setting up and inspecting buckets behind the store's back."""
    client: S3Client = boto3.client("s3", endpoint_url=endpoint_url, region_name="us-east-1")
    return client


MakeBucket = Callable[..., str]


def _bucket_factory(endpoint_url: str) -> Iterator[MakeBucket]:
    client = raw_client(endpoint_url)

    def make(*, versioned: bool = False) -> str:
        name = f"t-{uuid.uuid4().hex[:20]}"
        client.create_bucket(Bucket=name)
        if versioned:
            client.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
        return name

    try:
        yield make
    finally:
        client.close()


@pytest.fixture
def moto_bucket(moto_url: str) -> Iterator[MakeBucket]:
    """Makes a new, empty bucket on moto: ``moto_bucket(versioned=False) -> name``."""
    yield from _bucket_factory(moto_url)


@pytest.fixture
def localstack_bucket(localstack_url: str) -> Iterator[MakeBucket]:
    """Makes a new, empty bucket on LocalStack."""
    yield from _bucket_factory(localstack_url)


@pytest.fixture
def moto(moto_url: str) -> Iterator[S3Client]:
    """A plain boto3 client on moto's server."""
    client = raw_client(moto_url)
    try:
        yield client
    finally:
        client.close()
