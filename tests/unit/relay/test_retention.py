"""The ledger's cutoff against the topics' retention, and the failure report's key: tables."""

from __future__ import annotations

import datetime as dt

import pytest

from postroom.headers import ATTEMPT_BASE_HEADER, attempt_base
from relay.report import Failure, report_key
from relay.retention import ledger_cutoff

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)
DAY_S = 86_400.0


@pytest.mark.parametrize(("older_than_days", "retention_s", "expected_days", "why"), [
    (30, 7 * DAY_S, 30, "shorter than the cutoff"),      # the outbox's cutoff is older: it holds
    (2, 7 * DAY_S, 7, "are kept"),                       # never younger than the retention
    (7, 7 * DAY_S, 7, "shorter than the cutoff"),
    (1, 0.5 * DAY_S, 1, "shorter than the cutoff"),
    (30, None, None, "forever"),                         # retention.ms=-1: keep the ledger
])
def test_ledger_cutoff(older_than_days: int, retention_s: float | None,
                       expected_days: int | None, why: str) -> None:
    cutoff, reason = ledger_cutoff(NOW - dt.timedelta(days=older_than_days), NOW, retention_s)
    assert cutoff == (None if expected_days is None else NOW - dt.timedelta(days=expected_days))
    assert why in reason


def failure(id_: int, status: str = "failed", attempts: int = 1) -> Failure:
    return Failure(id_, "a@example.com", "k", "k|a@example.com", "S", status, attempts, "550",
                   NOW)


def test_the_same_failures_give_the_same_report_key_and_a_change_a_new_one() -> None:
    key = report_key([failure(1), failure(2)])
    assert key == report_key([failure(1), failure(2)])
    assert key.startswith("postroom-failures-")
    assert key != report_key([failure(1)])
    assert key != report_key([failure(1), failure(2, "dead", 5)])


@pytest.mark.parametrize(("headers", "expected"), [
    (None, 0),
    ([], 0),
    ([(ATTEMPT_BASE_HEADER, b"3")], 3),
    ([(ATTEMPT_BASE_HEADER, "4")], 4),
    ([(ATTEMPT_BASE_HEADER, b"1"), (ATTEMPT_BASE_HEADER, b"6")], 6),  # the last one counts
    ([(ATTEMPT_BASE_HEADER, b"-2")], 0),
    ([(ATTEMPT_BASE_HEADER, b"x")], 0),
    ([(ATTEMPT_BASE_HEADER, None)], 0),
    ([("postroom.error", b"attempt=1")], 0),
])
def test_attempt_base(headers: list[tuple[str, str | bytes | None]] | None, expected: int) -> None:
    assert attempt_base(headers) == expected
