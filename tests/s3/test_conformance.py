"""The store conformance suite on S3Store, sync and async, on moto's server and on LocalStack.

On moto, listings are cut into pages of 100 keys (S3 may answer fewer keys than ``MaxKeys``
asks for; the store follows the continuation either way), so the long-history test crosses
pages with 300 entries instead of 1,100. Full pages of 1,000 keys are crossed on LocalStack
here by the sync API, and on moto by tests/s3/test_request_budget.py's load of 1,101 entries
by the async one: both walk the listing with the same steps (``alpineagents_s3._reading``),
and each of these writes takes LocalStack or moto about 10 s of CPU.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from alpineagents.store import Store
from alpineagents.testing import StoreConformance
from alpineagents_s3 import S3Store
from tests.helpers import MakeBucket


def short_pages(params: dict[str, Any], **kwargs: Any) -> None:
    """A ``before-parameter-build.s3.ListObjectsV2`` hook: pages of at most 100 keys."""
    params["MaxKeys"] = min(params.get("MaxKeys", 1000), 100)


class TestS3StoreOnMoto(StoreConformance):
    # moto checks If-None-Match without a lock: two racing creators can both win there.
    concurrent_create = False
    many_entries = 300

    @pytest.fixture
    def store(self, moto_url: str, moto_bucket: MakeBucket) -> Iterator[Store]:
        hooks = {"before-parameter-build.s3.ListObjectsV2": short_pages}
        store = S3Store(moto_bucket(), "runs", endpoint_url=moto_url, event_hooks=hooks)
        yield store
        store.close()


@pytest.mark.integration
class TestS3StoreOnLocalStack(StoreConformance):
    concurrent_create = True

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        """Every test in both modes, but the 1,100 entries of the long history in sync only."""
        if metafunc.function.__name__ == "test_long_history_comes_back_whole_and_in_order":
            metafunc.parametrize("mode", ["sync"])
        else:
            super().pytest_generate_tests(metafunc)

    @pytest.fixture
    def store(self, localstack_url: str, localstack_bucket: MakeBucket) -> Iterator[Store]:
        store = S3Store(localstack_bucket(), "runs", endpoint_url=localstack_url)
        yield store
        store.close()
