"""Test helpers for alpineagents users: a store conformance suite and offline models."""

import pytest

pytest.register_assert_rewrite("alpineagents.testing._store_suite")

from alpineagents.testing._store_suite import StoreConformance, StoreIO  # noqa: E402

__all__ = ["StoreConformance", "StoreIO"]
