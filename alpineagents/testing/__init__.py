"""Test helpers for alpineagents users: offline models and a store conformance suite.

The offline models (:class:`TestModel`, :class:`FunctionModel`, :func:`call`) need nothing
but alpineagents. The store conformance suite (:class:`StoreConformance`, :class:`StoreIO`)
is a pytest test class, so it needs pytest; it is imported on first use, and without pytest
that first use raises ``ImportError`` saying to ``pip install pytest``.
"""

from typing import TYPE_CHECKING, Any

from alpineagents.testing._models import FunctionModel, TestModel, call

if TYPE_CHECKING:
    from alpineagents.testing._store_suite import StoreConformance, StoreIO

__all__ = ["FunctionModel", "StoreConformance", "StoreIO", "TestModel", "call"]

_NEEDS_PYTEST = ("StoreConformance", "StoreIO")


def __getattr__(name: str) -> Any:
    """Import the conformance suite, which needs pytest, when it is first asked for."""
    if name not in _NEEDS_PYTEST:
        raise AttributeError(f"module 'alpineagents.testing' has no attribute {name!r}")
    try:
        import pytest
    except ImportError as e:
        raise ImportError(
            f"alpineagents.testing.{name} is a pytest test class and needs pytest: "
            "pip install pytest (the offline models TestModel and FunctionModel do not)"
        ) from e
    # Plain asserts in the suite report their values, as in the user's own tests.
    pytest.register_assert_rewrite("alpineagents.testing._store_suite")
    from alpineagents.testing import _store_suite

    value: Any = getattr(_store_suite, name)
    return value
