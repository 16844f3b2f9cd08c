"""Fixtures of the S3Store tests, beyond moto's server and buckets (tests/conftest.py).

LocalStack is started outside pytest (localstack/localstack.sh) and found through
ALPINEAGENTS_LOCALSTACK_URL; the tests marked ``integration`` are skipped without it.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator

import aioboto3
import boto3
import pytest

from tests.helpers import MakeBucket, bucket_maker
from tests.s3.helpers import Stores, raw_client

LOCALSTACK_ENV = "ALPINEAGENTS_LOCALSTACK_URL"


@pytest.fixture(autouse=True)
def _dummy_aws(aws_environment: None) -> None:
    """Every S3Store test runs with dummy credentials, none of the machine's configuration."""


@pytest.fixture(scope="session")
def localstack_url(aws_environment: None) -> str:
    """LocalStack's endpoint; the test is skipped when ALPINEAGENTS_LOCALSTACK_URL is unset."""
    url = os.environ.get(LOCALSTACK_ENV)
    if not url:
        pytest.skip(f"{LOCALSTACK_ENV} is not set: start LocalStack with localstack/localstack.sh")
    return url


@pytest.fixture
def localstack_bucket(localstack_url: str) -> Iterator[MakeBucket]:
    """Makes a new, empty bucket on LocalStack."""
    client = raw_client(localstack_url)
    try:
        yield bucket_maker(client)
    finally:
        client.close()


@pytest.fixture(scope="session")
def boto_session(aws_environment: None) -> boto3.Session:
    """One boto3 session for the store objects of the ``stores`` fixture."""
    return boto3.Session()


@pytest.fixture(scope="session")
def aio_session(aws_environment: None) -> aioboto3.Session:
    """One aioboto3 session for their async clients (a new one costs ~30 ms of CPU)."""
    return aioboto3.Session()


async def _stores(
    url: str, buckets: MakeBucket, session: boto3.Session, aio: aioboto3.Session
) -> AsyncIterator[Stores]:
    made = Stores(url, buckets, session, aio)
    try:
        yield made
    finally:
        await made.close()


@pytest.fixture
async def stores(
    moto_url: str,
    moto_bucket: MakeBucket,
    boto_session: boto3.Session,
    aio_session: aioboto3.Session,
) -> AsyncIterator[Stores]:
    """Store objects on a new bucket of moto's server, closed after the test."""
    async for made in _stores(moto_url, moto_bucket, boto_session, aio_session):
        yield made


@pytest.fixture
async def localstack(
    localstack_url: str,
    localstack_bucket: MakeBucket,
    boto_session: boto3.Session,
    aio_session: aioboto3.Session,
) -> AsyncIterator[Stores]:
    """Store objects on a new bucket of LocalStack, closed after the test."""
    async for made in _stores(localstack_url, localstack_bucket, boto_session, aio_session):
        yield made
