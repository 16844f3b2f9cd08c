from __future__ import annotations

import pytest

from tests.helpers import Mode

pytest_plugins = ["pytester"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "slow: spawns processes; `pytest -m 'not slow'` is the fast lane"
    )


@pytest.fixture(params=["sync", "async"])
def mode(request: pytest.FixtureRequest) -> Mode:
    """Run the test once with the sync API and once with the async one."""
    param: Mode = request.param
    return param
