"""Tables and simulations for the priority rule: strict priority with a starvation guard."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from postroom.sender.priority import (
    PriorityState,
    choose_active,
    partition_backlog,
    plan_round,
)
from postroom.topics import Priority

H, N, L = Priority.HIGH, Priority.NORMAL, Priority.LOW
ALL = frozenset({H, N, L})


def backlog(high: int = 0, normal: int = 0, low: int = 0) -> dict[Priority, int]:
    return {H: high, N: normal, L: low}


@pytest.mark.parametrize(("waiting", "rounds_waiting", "limit", "expected"), [
    # nothing waiting: fetch everything
    (backlog(), {}, 3, ALL),
    ({}, {}, 3, ALL),
    # strict priority
    (backlog(high=5), {}, 3, {H}),
    (backlog(high=5, normal=5), {}, 3, {H}),
    (backlog(high=5, normal=5, low=5), {}, 3, {H}),
    (backlog(high=1, low=9), {}, 3, {H}),
    (backlog(normal=5), {}, 3, {H, N}),
    (backlog(normal=5, low=5), {}, 3, {H, N}),
    (backlog(low=5), {}, 3, ALL),
    # starvation guard lets a paused priority with a backlog in
    (backlog(high=5, low=5), {L: 2}, 3, {H}),
    (backlog(high=5, low=5), {L: 3}, 3, {H, L}),
    (backlog(high=5, low=5), {L: 7}, 3, {H, L}),
    (backlog(high=5, normal=5), {N: 3}, 3, {H, N}),
    (backlog(high=5, normal=5, low=5), {N: 3, L: 3}, 3, ALL),
    (backlog(high=5, normal=5, low=5), {N: 3, L: 2}, 3, {H, N}),
    (backlog(high=5, normal=5, low=5), {N: 0, L: 3}, 3, {H, L}),
    (backlog(normal=5, low=5), {L: 3}, 3, ALL),
    (backlog(normal=5, low=5), {L: 2}, 3, {H, N}),
    # a long wait without a backlog now lets nothing in
    (backlog(high=5), {L: 9, N: 9}, 3, {H}),
    # the guard never pauses the priority that is on top
    (backlog(high=5), {H: 9}, 3, {H}),
    (backlog(high=5, low=5), {L: 1}, 1, {H, L}),
])
def test_choose_active(waiting: Mapping[Priority, int], rounds_waiting: Mapping[Priority, int],
                       limit: int, expected: set[Priority]) -> None:
    assert choose_active(waiting, rounds_waiting, limit) == frozenset(expected)


@pytest.mark.parametrize(("before", "waiting", "active", "after"), [
    ({}, backlog(high=1, normal=1, low=1), {H}, {H: 0, N: 1, L: 1}),
    ({N: 1, L: 1}, backlog(high=1, normal=1, low=1), {H}, {H: 0, N: 2, L: 2}),
    ({N: 2, L: 3}, backlog(high=1, normal=1, low=1), {H, L}, {H: 0, N: 3, L: 0}),
    ({N: 4, L: 4}, backlog(high=1), {H}, {H: 0, N: 0, L: 0}),   # no backlog: nothing waits
    ({L: 2}, backlog(), ALL, {H: 0, N: 0, L: 0}),
    ({L: 2}, backlog(low=3), ALL, {H: 0, N: 0, L: 0}),
])
def test_advance(before: Mapping[Priority, int], waiting: Mapping[Priority, int],
                 active: set[Priority], after: Mapping[Priority, int]) -> None:
    new = PriorityState(before).advance(waiting, frozenset(active))
    assert dict(new.rounds_waiting) == after


def simulate(rounds: int, waiting: Mapping[Priority, int], limit: int) -> list[frozenset[Priority]]:
    state, served = PriorityState(), []
    for _ in range(rounds):
        active, state = plan_round(state, waiting, limit)
        served.append(active)
    return served


@pytest.mark.parametrize("limit", [1, 2, 3, 10])
def test_low_is_served_within_limit_plus_one_rounds_under_permanent_high_backlog(
        limit: int) -> None:
    served = simulate(10 * (limit + 1), backlog(high=1000, normal=1000, low=1000), limit)
    rounds_with_low = [i for i, active in enumerate(served, start=1) if L in active]
    assert rounds_with_low == list(range(limit + 1, len(served) + 1, limit + 1))
    rounds_with_normal = [i for i, active in enumerate(served, start=1) if N in active]
    assert rounds_with_normal == rounds_with_low
    assert all(H in active for active in served)


@pytest.mark.parametrize("limit", [1, 4])
def test_low_gap_never_exceeds_limit_plus_one_under_high_backlog(limit: int) -> None:
    served = simulate(50, backlog(high=7, low=3), limit)
    gaps, last = [], 0
    for i, active in enumerate(served, start=1):
        if L in active:
            gaps.append(i - last)
            last = i
    assert gaps
    assert max(gaps) == limit + 1
    assert len(served) - last <= limit  # not starved at the end either


def test_high_preempts_otherwise() -> None:
    limit = 5
    served = simulate(limit, backlog(high=1, normal=1, low=1), limit)
    assert served == [frozenset({H})] * limit


def test_high_arriving_pauses_lower_priorities_at_once() -> None:
    state = PriorityState()
    active, state = plan_round(state, backlog(normal=5, low=5), 3)
    assert active == {H, N}
    active, state = plan_round(state, backlog(high=2, normal=5, low=5), 3)
    assert active == {H}
    active, state = plan_round(state, backlog(normal=5, low=5), 3)
    assert active == {H, N}
    assert dict(state.rounds_waiting) == {H: 0, N: 0, L: 3}
    active, state = plan_round(state, backlog(normal=5, low=5), 3)
    assert active == ALL


def test_state_is_immutable_and_complete() -> None:
    source = {L: 2}
    state = PriorityState(source)
    source[L] = 99
    assert dict(state.rounds_waiting) == {H: 0, N: 0, L: 2}
    with pytest.raises(TypeError):
        state.rounds_waiting[L] = 3  # type: ignore[index]
    assert state == PriorityState({H: 0, N: 0, L: 2})
    assert hash(state) == hash(PriorityState({L: 2}))
    assert state != PriorityState({L: 3})


@pytest.mark.parametrize("limit", [0, -1])
def test_starvation_limit_must_be_positive(limit: int) -> None:
    with pytest.raises(ValueError, match="starvation_limit"):
        choose_active(backlog(high=1), {}, limit)


def test_negative_counts_are_rejected() -> None:
    with pytest.raises(ValueError, match="backlog cannot be negative"):
        choose_active(backlog(high=-1), {}, 3)
    with pytest.raises(ValueError, match="rounds_waiting cannot be negative"):
        PriorityState({L: -1})
    with pytest.raises(ValueError, match="backlog cannot be negative"):
        PriorityState().advance(backlog(low=-2), frozenset())


@pytest.mark.parametrize(("position", "low", "high", "start", "backlog"), [
    (10, 0, 25, None, 15),       # reading: what is left behind our position
    (25, 0, 25, None, 0),        # caught up
    (30, 0, 25, None, 0),        # a stale cached watermark never makes a negative backlog
    (-1001, 0, -1001, 5, 0),     # nothing fetched yet: nothing known
    (-1001, 0, 25, 20, 5),       # position unknown: the committed offset stands in
    (-1001, 3, 25, None, 22),    # ...or the low watermark when nothing was committed
    (-1001, 3, 25, -1001, 22),   # an invalid committed offset counts as none
    (-1001, -1, 25, None, 25),
    (-1001, 0, 25, 0, 25),       # offset 0 committed is a real start
])
def test_partition_backlog(position: int, low: int, high: int, start: int | None,
                           backlog: int) -> None:
    assert partition_backlog(position, low, high, start) == backlog
