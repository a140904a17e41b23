"""Lag in seconds, the overdue part of a retry tier, and Burrow's verdicts: tables."""

from __future__ import annotations

import pytest

from postroom.lagrules import (
    CommitWindows,
    Observation,
    Verdict,
    first_not_due,
    group_verdict,
    lag_seconds,
    partition_verdict,
    standing_by,
)


@pytest.mark.parametrize(("lag", "first_ms", "now_s", "expected"), [
    (0, 1_000_000, 2_000.0, 0.0),        # nothing unconsumed: no lag, whatever the timestamp
    (5, None, 2_000.0, None),            # the record could not be read: unknown, not 0
    (5, 1_000_000, 1_030.5, 30.5),       # the first unconsumed record is 30.5 s old
    (1, 1_000_000, 1_000.0, 0.0),
    (3, 1_000_500, 1_000.0, 0.0),        # a producer clock ahead of ours is not negative lag
    (10_000, 1_999_000, 2_000.0, 1.0),   # a burst: many records, but only one second behind
])
def test_lag_seconds(lag: int, first_ms: int | None, now_s: float,
                    expected: float | None) -> None:
    if expected is None:
        assert lag_seconds(lag, first_ms, now_s) is None
    else:
        assert lag_seconds(lag, first_ms, now_s) == pytest.approx(expected)


@pytest.mark.parametrize(("low", "high", "due_before", "expected"), [
    (0, 0, 0, 0),          # nothing waiting
    (0, 10, 0, 0),         # none due
    (0, 10, 10, 10),       # all due
    (0, 10, 4, 4),
    (5, 6, 6, 6),
    (5, 6, 5, 5),
    (100, 1_000_000, 123_456, 123_456),
])
def test_first_not_due(low: int, high: int, due_before: int, expected: int) -> None:
    probed: list[int] = []

    def is_due(offset: int) -> bool:
        assert low <= offset < high
        probed.append(offset)
        return offset < due_before

    assert first_not_due(low, high, is_due) == expected
    assert len(probed) <= max(1, (high - low).bit_length())


def window(*entries: tuple[int, int, float]) -> list[Observation]:
    return [Observation(offset, lag, at) for offset, lag, at in entries]


@pytest.mark.parametrize(("entries", "current_lag", "now_s", "expected"), [
    # No lag now is OK whatever came before.
    ([(10, 5, 0), (10, 5, 10), (10, 5, 20)], 0, 25, Verdict.OK),
    ([], 5, 25, Verdict.OK),
    # Progress, lag going down: OK.
    ([(10, 50, 0), (20, 45, 10), (30, 40, 20)], 40, 25, Verdict.OK),
    # Progress, but the lag never went down: WARN (the consumer is falling behind).
    ([(10, 5, 0), (20, 5, 10), (30, 8, 20)], 8, 25, Verdict.WARN),
    # Same offset all window long, with lag: STALL.
    ([(10, 5, 0), (10, 5, 10), (10, 7, 20)], 7, 25, Verdict.STALL),
    # Zero lag once in the window: OK, even though the offset did not move since.
    ([(10, 0, 0), (10, 3, 10), (10, 3, 20)], 3, 25, Verdict.OK),
    # Last commit older than the window is long: STOP, even with zero lag in the window.
    ([(10, 0, 0), (12, 2, 10), (14, 4, 20)], 4, 41, Verdict.STOP),
    ([(10, 0, 0), (12, 2, 10), (14, 4, 20)], 4, 40, Verdict.OK),
    # One commit: STOP once time passes without another, else no verdict yet.
    ([(10, 5, 20)], 5, 20, Verdict.OK),
    ([(10, 5, 20)], 5, 21, Verdict.STOP),
])
def test_partition_verdict_follows_burrows_rules(
        entries: list[tuple[int, int, float]], current_lag: int, now_s: float,
        expected: Verdict) -> None:
    assert partition_verdict(window(*entries), current_lag, now_s) is expected


def test_a_group_is_as_bad_as_its_worst_partition() -> None:
    assert group_verdict([]) is Verdict.OK
    assert group_verdict([Verdict.OK, Verdict.STALL, Verdict.WARN]) is Verdict.STALL
    assert [v.value for v in Verdict] == [0, 1, 2, 3]


def test_windows_add_a_live_groups_unchanged_offset_but_not_an_empty_groups() -> None:
    windows = CommitWindows(size=3)
    key = ("g", "t", 0)
    for at in (0.0, 1.0, 2.0, 3.0):
        live = windows.add(key, 10, 4, at, alive=True)
    assert [o.at_s for o in live] == [1.0, 2.0, 3.0]  # the oldest fell out
    assert partition_verdict(live, 4, 3.0) is Verdict.STALL

    gone = ("g", "t", 1)
    windows.add(gone, 10, 4, 0.0, alive=False)
    windows.add(gone, 10, 4, 1.0, alive=False)
    stopped = windows.add(gone, 10, 4, 2.0, alive=False)
    assert [o.at_s for o in stopped] == [0.0]
    assert partition_verdict(stopped, 4, 2.0) is Verdict.STOP
    moved = windows.add(gone, 11, 3, 3.0, alive=False)
    assert [o.offset for o in moved] == [10, 11]


@pytest.mark.parametrize(("state", "owned", "idle"), [
    ("stable", [3, 3, 2, 0], [3]),        # a fourth member on a group of three partitions
    ("stable", [1, 1, 1], []),
    ("stable", [0], [0]),                 # one member, no partition to own
    ("preparingrebalance", [0, 0], []),   # every member owns none while the group rebalances
    ("completingrebalance", [0, 2], []),
    ("empty", [], []),
])
def test_a_member_of_a_settled_group_without_a_partition_stands_by(
        state: str, owned: list[int], idle: list[int]) -> None:
    assert standing_by(state, owned) == idle
