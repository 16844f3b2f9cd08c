"""The model checker: random schedules of two writers, a monitor, a reader and an admin.

The gate for every change of the S3 protocol (docs/protocol.md, "The model checker"). Each
example is one schedule (``tests/protocol/world.py``); Hypothesis draws its choices and shrinks
a failing one to a short schedule, printed with the violation. ``ALPINEAGENTS_CHECKER_EXAMPLES``
sets how many schedules a run explores (CI's fast tier: the default below).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from alpineagents_s3 import _pack
from tests.protocol.world import Chooser, World, counted_wids

EXAMPLES = int(os.environ.get("ALPINEAGENTS_CHECKER_EXAMPLES", "300"))
STEPS = 80


@pytest.fixture(autouse=True)
def small_packing(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Packing every 3 entries, merging 2 segments: short schedules pack and merge often."""
    monkeypatch.setattr(_pack, "FOLD", 3)
    monkeypatch.setattr(_pack, "MERGE", 2)
    logging.disable(logging.WARNING)  # the packing deletes that fail say so
    yield
    logging.disable(logging.NOTSET)


def explore(data: st.DataObject, **world: bool) -> None:
    chooser = Chooser(lambda n: data.draw(st.integers(0, n - 1)))
    with counted_wids():
        run = World(chooser, **world)
        try:
            run.run(STEPS)
        except AssertionError:
            print("\n".join(run.log))  # the schedule, shrunk
            raise


CHECKER = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)


@CHECKER
@given(st.data())
def test_every_schedule_keeps_the_invariants(data: st.DataObject) -> None:
    explore(data)


@CHECKER
@given(st.data())
def test_every_schedule_keeps_the_invariants_on_a_versioned_bucket(data: st.DataObject) -> None:
    explore(data, versioned=True)


@settings(CHECKER, max_examples=max(EXAMPLES // 10, 20))
@given(st.data())
def test_an_engine_that_ignores_conditions_never_gets_a_head(data: st.DataObject) -> None:
    explore(data, lying=True)
