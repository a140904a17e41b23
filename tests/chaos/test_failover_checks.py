"""The failover suite's pause measure (checks.longest_pause), pure: times in, seconds out."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chaos.checks import longest_pause

DONE = 50.0


@pytest.mark.parametrize(("accepted", "began", "expected"), [
    # deliveries every second, the fault at 10, none from 10.5 to 22.5: a 12.5 s pause
    ([*range(11), 22.5, 23, *range(24, 60)], 10.0, 12.5),
    # the first delivery after the fault counts from the fault itself
    ([5, 30, 40, 51], 10.0, 20.0),
    # a pause that lasts past the end of the faults ends at the first delivery after it
    ([5, 12, 70], 10.0, 58.0),
    # deliveries before the fault are not its pause
    ([0, 9, 10.5, 11, 51], 10.0, 40.0),
])
def test_longest_pause(accepted: list[float], began: float, expected: float) -> None:
    assert longest_pause([float(t) for t in accepted], began, DONE) == pytest.approx(expected)


def test_no_delivery_after_the_faults_is_no_figure() -> None:
    assert longest_pause([11.0, 12.0], 10.0, DONE) is None


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0, 100), min_size=1), st.floats(0, 40))
def test_the_pause_bounds_every_gap_it_covers(accepted: list[float], began: float) -> None:
    pause = longest_pause(accepted, began, DONE)
    later = sorted(t for t in accepted if t > DONE)
    if not later:
        assert pause is None
    else:
        assert pause is not None
        covered = sorted([began, *(t for t in accepted if began < t <= DONE), later[0]])
        assert all(b - a <= pause for a, b in itertools.pairwise(covered))
        assert pause <= later[0] - began
