"""The store conformance suite on S3Store, sync and async, on moto's server and on LocalStack."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from alpineagents.store import Store
from alpineagents.testing import StoreConformance
from alpineagents_s3 import S3Store
from tests.helpers import MakeBucket


class TestS3StoreOnMoto(StoreConformance):
    # moto checks If-None-Match without a lock: two racing creators can both win there.
    concurrent_create = False

    @pytest.fixture
    def store(self, moto_url: str, moto_bucket: MakeBucket) -> Iterator[Store]:
        store = S3Store(moto_bucket(), "runs", endpoint_url=moto_url)
        yield store
        store.close()


@pytest.mark.integration
class TestS3StoreOnLocalStack(StoreConformance):
    concurrent_create = True

    @pytest.fixture
    def store(self, localstack_url: str, localstack_bucket: MakeBucket) -> Iterator[Store]:
        store = S3Store(localstack_bucket(), "runs", endpoint_url=localstack_url)
        yield store
        store.close()
