"""The backlog benchmark's pure arithmetic: marks from stamps, windows of rows, the overall rate,
the trend over windows and what bound a stage."""

from __future__ import annotations

import pytest

from bench.backlog import Window, bound_by, cumulative, overall, trend, window_rows, windows
from bench.report import BenchError


def test_marks_count_the_rows_done_by_each_stamp() -> None:
    assert cumulative([(10.0, 5), (11.0, 3), (12.5, 2)]) == [(5, 10.0), (8, 11.0), (10, 12.5)]


def test_windows_are_cut_past_each_multiple_and_a_short_last_one_joins_the_one_before() -> None:
    marks = [(0, 0.0), (60, 1.0), (120, 2.0), (190, 3.0), (230, 4.0), (250, 5.0)]
    # Cut at 120 (past 100) and 230 (past 200); 250 - 230 = 20 < 50, so the last cut is dropped.
    assert windows(marks, 100) == [Window(120, 2.0), Window(130, 3.0)]
    assert windows([(0, 0.0)], 100) == []


def test_the_overall_rate_leaves_out_the_first_stamps_rows() -> None:
    assert overall([(1_000, 10.0), (11_000, 12.0)]).rows_per_s == 5_000
    with pytest.raises(BenchError, match="a rate needs two"):
        overall([(1, 1.0)])


def test_the_trend_is_the_fitted_lines_end_over_its_start() -> None:
    assert trend([100.0, 100.0, 100.0]) == pytest.approx(1.0)
    assert trend([100.0, 90.0, 80.0]) == pytest.approx(0.8)
    assert trend([100.0, 50.0]) is None  # fewer than three windows


def test_window_rows_and_what_bound_a_stage_are_the_documented_rules() -> None:
    assert window_rows(1_000_000) == 100_000
    assert window_rows(20_000) == 2_000  # a tenth of a run of fewer than ten windows
    cpus = {"sender": 0.9, "relay": 0.1}
    assert bound_by(cpus, 0.95, None) == "the CPUs (most: sender)"
    assert bound_by(cpus, 0.6, ("sender MainThread", 0.9)) == "one thread: sender MainThread"
    assert bound_by(cpus, 0.6, ("sender MainThread", 0.5)) == "no CPU: waiting"
    assert bound_by({}, 0.6, None) == "-"
