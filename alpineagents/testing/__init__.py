"""Test helpers for alpineagents users: offline models and a store conformance suite."""

import pytest

pytest.register_assert_rewrite("alpineagents.testing._store_suite")

from alpineagents.testing._models import FunctionModel, TestModel, call  # noqa: E402
from alpineagents.testing._store_suite import StoreConformance, StoreIO  # noqa: E402

__all__ = ["FunctionModel", "StoreConformance", "StoreIO", "TestModel", "call"]
