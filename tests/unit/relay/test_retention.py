"""The ledger's cutoff against the topics' retention, and the failure report's key: tables."""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from postroom.errors import InvalidContentError
from postroom.headers import ATTEMPT_BASE_HEADER, read_headers
from postroom.relay.report import BODY_MAX_LINES, Failure, render_csv, report_body, report_key
from postroom.relay.retention import (
    DEFAULT_MIN_AGE_S,
    PurgePlan,
    ledger_cutoff,
    minimum_age_s,
    parse_age_s,
    render_plan,
)
from postroom.rules import SizeLimits
from support.fuzz import examples

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


@pytest.mark.parametrize(("text", "seconds"), [
    ("30d", 30 * DAY_S), ("30days", 30 * DAY_S), ("30 days", 30 * DAY_S), ("1 day", DAY_S),
    ("30D", 30 * DAY_S), (" 7d ", 7 * DAY_S), ("1.5d", 1.5 * DAY_S), ("2w", 14 * DAY_S),
    ("12h", 12 * 3600.0), ("12 hours", 12 * 3600.0), ("90m", 5400.0), ("90 minutes", 5400.0),
    ("90min", 5400.0), ("45s", 45.0), ("45 seconds", 45.0),
])
def test_an_age_with_a_unit(text: str, seconds: float) -> None:
    assert parse_age_s(text) == seconds


@pytest.mark.parametrize(("text", "says"), [
    ("30", "'30' has no unit"), ("0", "has no unit"), ("30.5", "has no unit"),
    ("30x", "unknown unit 'x'"), ("30 fortnights", "unknown unit"), ("d", "not an age"),
    ("", "not an age"), ("-30d", "not an age"), ("0d", "more than 0"), ("30d5", "not an age"),
    ("9" * 400 + "d", "more than 100 years"), ("36501d", "more than 100 years"),
    # m is minutes only: a month or a year is refused, never guessed (issue 45 item 7)
    ("1mo", "months and years have no fixed length"), ("3 months", "no fixed length"),
    ("1y", "no fixed length"), ("2 years", "no fixed length"), ("1M", "'M' reads as minutes"),
])
def test_an_age_without_a_unit_is_refused_naming_the_forms(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says) as refused:
        parse_age_s(text)
    if "more than" not in says:
        assert "30d or 30days (days), 12h (hours), 90m (minutes)" in str(refused.value)


@settings(max_examples=examples(200), deadline=None)
@given(st.one_of(st.integers(min_value=0, max_value=10**12).map(str),
                 st.floats(min_value=0, max_value=1e9, allow_nan=False).map(repr)))
def test_a_bare_number_never_means_any_age(number: str) -> None:
    with pytest.raises(ValueError, match="write it as 30d or 30days"):
        parse_age_s(number)


@pytest.mark.parametrize(("retention_s", "minimum_s", "from_"), [
    (7 * DAY_S, 7 * DAY_S, "the topics' retention (7 days)"),
    (30 * DAY_S, 30 * DAY_S, "the topics' retention (30 days)"),
    (3600.0, 3600.0, "the topics' retention (1 hour)"),
    (7.5 * DAY_S, 7.5 * DAY_S, "the topics' retention (7.5 days)"),
    (3650 * DAY_S, 3650 * DAY_S, "the topics' retention (3,650 days)"),  # not 3.65e+03
    (None, DEFAULT_MIN_AGE_S, "the minimum of 7 days"),   # retention.ms=-1: forever
])
def test_minimum_age(retention_s: float | None, minimum_s: float, from_: str) -> None:
    assert minimum_age_s(retention_s) == (minimum_s, from_)


def test_the_plan_names_the_cutoff_in_utc_and_the_rows_by_state() -> None:
    plan = PurgePlan(NOW - dt.timedelta(days=30), None, "kept", {"sent": 5, "dead": 1}, 0)
    assert render_plan(plan, 30 * DAY_S) == [
        "cutoff 2026-11-01 12:00:00 UTC (30 days ago): outbox rows that ended sent, bounced, "
        "failed, dead or suppressed before it and are not queued again",
        "outbox: 6 row(s) to delete (5 sent, 0 failed, 1 dead)",
        "ledger: 0 row(s) to delete; kept"]


def test_the_plan_counts_bounced_and_suppressed_rows_when_there_are_some() -> None:
    plan = PurgePlan(NOW - dt.timedelta(days=30), None, "kept",
                     {"sent": 5, "bounced": 2, "suppressed": 1}, 0)
    assert render_plan(plan, 30 * DAY_S)[1] == (
        "outbox: 8 row(s) to delete (5 sent, 0 failed, 0 dead, 2 bounced, 1 suppressed)")


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
    ([(ATTEMPT_BASE_HEADER, b"-2")], None),
    ([(ATTEMPT_BASE_HEADER, b"x")], None),
    ([(ATTEMPT_BASE_HEADER, None)], 0),
    ([("postroom.error", b"attempt=1")], 0),
])
def test_attempt_base(headers: list[tuple[str, str | bytes | None]] | None,
                      expected: int | None) -> None:
    """The attempt base a redrive writes, as the sender reads it; None: refused (poison)."""
    if expected is None:
        with pytest.raises(InvalidContentError):
            read_headers(headers)
    else:
        assert read_headers(headers).attempt_base == expected


@pytest.mark.parametrize(("count", "body_max", "attached", "listed"), [
    (3, 524_288, None, 3),
    (3, 524_288, "r.csv", 3),
    (4000, 524_288, "r.csv", BODY_MAX_LINES),
    (4000, 20_000, None, None),      # the body cap decides
    (4000, 2_000, None, None),
])
def test_a_report_body_lists_what_fits_and_counts_the_rest(
        count: int, body_max: int, attached: str | None, listed: int | None) -> None:
    failures = [failure(n) for n in range(count)]
    limits = SizeLimits(body_max_bytes=body_max)
    body, shown = report_body(failures, NOW, limits, attached, count)
    assert len(body.encode()) <= body_max
    if listed is not None:
        assert shown == listed
    assert body.count("a@example.com | k | S | failed") == shown
    if shown < count:
        assert f"... and {count - shown} more; " in body
        assert ("every one of them is in the attached r.csv" in body if attached
                else "`postroom report failures --since 2026-12-01T12:00:00+00:00`" in body)
    else:
        assert "more;" not in body


def test_the_csv_holds_every_failure_with_a_header() -> None:
    text = render_csv([failure(1), failure(2, "dead", 5)])
    assert text.splitlines() == [
        "recipient,message_key,idempotency_key,subject,status,attempts,last_error,updated_at",
        "a@example.com,k,k|a@example.com,S,failed,1,550,2026-12-01T12:00:00+00:00",
        "a@example.com,k,k|a@example.com,S,dead,5,550,2026-12-01T12:00:00+00:00"]


def test_a_multi_line_reply_stays_on_its_failures_line() -> None:
    from postroom.relay.report import render_lines

    many = dataclasses.replace(failure(1), last_error="550-5.1.1 first\r\n550 5.1.1 second")
    assert render_lines([many], NOW)[1] == (
        "a@example.com | k | S | failed | attempts=1 | 550-5.1.1 first 550 5.1.1 second")


def test_the_reports_csv_is_written_below_the_root_and_never_through_a_link(
        tmp_path: Path) -> None:
    from postroom.errors import PostroomError
    from postroom.relay.report import _write_csv

    root = tmp_path / "root"
    root.mkdir()
    path, rows = _write_csv(root, "postroom-failures-abc", [failure(1), failure(2)], 10_000)
    assert (path, rows) == (root / "postroom-reports" / "postroom-failures-abc.csv", 2)
    assert path.read_bytes().decode() == render_csv([failure(1), failure(2)])
    # Over the attachment cap: the first rows that fit.
    _, rows = _write_csv(root, "small", [failure(n) for n in range(100)], 1_000)
    assert 0 < rows < 100
    assert len((root / "postroom-reports" / "small.csv").read_bytes()) <= 1_000

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "postroom-reports").symlink_to(elsewhere)
    with pytest.raises(PostroomError, match="is a symbolic link"):
        _write_csv(linked, "k", [failure(1)], 10_000)
    assert list(elsewhere.iterdir()) == []

    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(PostroomError, match="cannot write the report's CSV"):
        _write_csv(tmp_path / "file", "k", [failure(1)], 10_000)
