"""The intake's answers, over the captured Postfix DSNs with real tokens, an in-memory outbox and
results topic: what is published for which row, what is refused and counted, and that an outage
of either is a 451 that holds the report."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from postroom.bounces.intake import (
    ACCEPTED_REPLY,
    EXPIRED_REPLY,
    FORGED_REPLY,
    HELD_REPLY,
    IGNORED_REPLY,
    NOT_OURS_REPLY,
    REFUSAL_LOG_INTERVAL_S,
    REFUSAL_LOG_LINES,
    UNKNOWN_REPLY,
    Accepted,
    BounceConfig,
    Intake,
    UnavailableError,
)
from postroom.bounces.mapping import OutboxRow
from postroom.metrics import Metrics
from postroom.schemas.codec import DeliveryStatus, EmailResult
from postroom.verp import make_token, return_path
from support.fuzz import examples
from support.metrics import counter

FIXTURES = Path(__file__).parents[2] / "fixtures" / "bounces"
NOW = dt.datetime(2026, 12, 2, 22, 5, tzinfo=dt.UTC)
SECRET = b"0123456789abcdef-bounce-secret"
BOUNCE = "bounces@bounce.example.com"
CONFIG = BounceConfig(BOUNCE, (SECRET,), dt.timedelta(days=60))
ROW = OutboxRow(17, "sales-report-2026-09|gone@example.com", "gone@example.com", 1, "sent")
SLOW = OutboxRow(18, "sales-report-2026-09|slow@example.com", "slow@example.com", 1, "sent")
# The tokens Postfix carried in the captured reports, by fixture.
CAPTURED = {"postfix_failed.eml": "1-a-aaaa", "postfix_delayed.eml": "2-a-bbbb",
            "postfix_expired.eml": "2-a-bbbb", "postfix_failed_no_dsn_options.eml": "4-a-dddd"}


class FakeRows:
    def __init__(self, *rows: OutboxRow) -> None:
        self.rows = {row.outbox_id: row for row in rows}
        self.down = False

    def row(self, outbox_id: int) -> OutboxRow | None:
        if self.down:
            raise UnavailableError("the database: connection refused")
        return self.rows.get(outbox_id)


class FakeResults:
    def __init__(self) -> None:
        self.published: list[EmailResult] = []
        self.down = False

    def publish(self, results: Sequence[EmailResult]) -> None:
        if self.down:
            raise UnavailableError("Kafka: no acknowledgement in 30s")
        self.published.extend(results)


def token(row: OutboxRow, secret: bytes = SECRET, made: dt.datetime = NOW) -> str:
    return make_token(row.outbox_id, secret, made)


def report(name: str, row: OutboxRow, *, token_text: str | None = None) -> bytes:
    raw = (FIXTURES / name).read_bytes()
    return raw.replace((CAPTURED.get(name) or "TOKEN").encode(), (token_text or token(row)).encode())


@pytest.fixture
def parts() -> tuple[Intake, FakeRows, FakeResults, Metrics]:
    rows, results, metrics = FakeRows(ROW, SLOW), FakeResults(), Metrics()
    return Intake(CONFIG, rows, results, metrics, clock=lambda: NOW), rows, results, metrics


def refused(metrics: Metrics, reason: str) -> float:
    return counter(metrics, "bounce_refused_total", reason=reason)


def test_a_hard_bounce_becomes_one_bounced_result_for_its_row(parts: tuple) -> None:
    intake, _rows, results, metrics = parts
    accepted = intake.recipient(return_path(BOUNCE, token(ROW)))
    assert accepted == Accepted(return_path(BOUNCE, token(ROW)), ROW.outbox_id)
    assert intake.message([accepted], report("postfix_failed.eml", ROW)) == ACCEPTED_REPLY
    assert results.published == [EmailResult(
        idempotency_key=ROW.idempotency_key, outbox_id=17, recipient="gone@example.com",
        status=DeliveryStatus.BOUNCED, attempt=1, occurred_at=NOW, smtp_code=550,
        enhanced_code="5.1.1", error="550 5.1.1 User unknown")]
    assert counter(metrics, "bounce_reports_total", status="bounced") == 1


@pytest.mark.parametrize(("name", "status"), [
    ("postfix_delayed.eml", DeliveryStatus.DELAYED),
    ("postfix_expired.eml", DeliveryStatus.BOUNCED),
])
def test_a_deferred_recipient_is_delayed_then_bounced(parts: tuple, name: str,
                                                      status: DeliveryStatus) -> None:
    intake, _rows, results, _metrics = parts
    accepted = intake.recipient(return_path(BOUNCE, token(SLOW)))
    assert intake.message([accepted], report(name, SLOW)) == ACCEPTED_REPLY
    [result] = results.published
    assert (result.status, result.enhanced_code, result.smtp_code, result.outbox_id) == (
        status, "4.3.0", 451, 18)


def test_the_bare_address_takes_the_token_from_the_report(parts: tuple) -> None:
    """A report to bounces@ (a feedback loop's address, say): ENVID, X-Postfix-Sender or the
    original's Return-Path names the row."""
    intake, _rows, results, _metrics = parts
    accepted = intake.recipient(BOUNCE)
    assert accepted == Accepted(BOUNCE, None)
    for name in ("postfix_failed.eml", "postfix_failed_no_dsn_options.eml", "arf_abuse.eml"):
        assert intake.message([accepted], report(name, ROW)) == ACCEPTED_REPLY
    assert [r.status for r in results.published] == [
        DeliveryStatus.BOUNCED, DeliveryStatus.BOUNCED, DeliveryStatus.COMPLAINED]
    # the complaint names ceo@, the row gone@: its only notice is taken as the row's (redacted
    # or forwarded addresses are the rule in feedback loops)
    assert {r.recipient for r in results.published} == {"gone@example.com"}


@pytest.mark.parametrize(("address", "reply", "reason"), [
    (return_path(BOUNCE, make_token(17, b"not-our-secret-at-all", NOW)), FORGED_REPLY, "forged_token"),
    (return_path(BOUNCE, make_token(17, SECRET, NOW - dt.timedelta(days=62))), EXPIRED_REPLY,
     "expired_token"),
    ("bounces+17@bounce.example.com", NOT_OURS_REPLY, "malformed_token"),
    ("postmaster@bounce.example.com", NOT_OURS_REPLY, "no_token"),
    (f"bounces+{make_token(17, SECRET, NOW)}@other.example.com", NOT_OURS_REPLY, "no_token"),
])
def test_refused_at_rcpt(parts: tuple, address: str, reply: str, reason: str) -> None:
    intake, _rows, _results, metrics = parts
    assert intake.recipient(address) == reply
    assert refused(metrics, reason) == 1


def test_a_forged_token_inside_a_report_changes_nothing(parts: tuple) -> None:
    intake, _rows, results, metrics = parts
    forged = make_token(ROW.outbox_id, b"not-our-secret-at-all", NOW)
    raw = report("postfix_failed.eml", ROW, token_text=forged)
    assert intake.message([Accepted(BOUNCE, None)], raw) == IGNORED_REPLY
    assert results.published == []
    assert refused(metrics, "forged_token") == 1


def test_a_token_naming_no_row_is_refused(parts: tuple) -> None:
    intake, _rows, results, metrics = parts
    gone = OutboxRow(999, "k|x@example.com", "x@example.com", 1, "sent")
    accepted = intake.recipient(return_path(BOUNCE, token(gone)))
    assert intake.message([accepted], report("postfix_failed.eml", gone)) == UNKNOWN_REPLY
    assert results.published == []
    assert refused(metrics, "unknown_row") == 1


@pytest.mark.parametrize(("name", "reason"), [
    ("vacation.eml", "auto_reply"),
])
def test_ignored_and_counted(parts: tuple, name: str, reason: str) -> None:
    intake, _rows, results, metrics = parts
    accepted = intake.recipient(return_path(BOUNCE, token(ROW)))
    assert intake.message([accepted], report(name, ROW)) == IGNORED_REPLY
    assert results.published == []
    assert refused(metrics, reason) == 1


@pytest.mark.parametrize("field", [b"Original-Recipient: rfc822;", b"Final-Recipient: rfc822; "])
def test_a_dsn_naming_another_address_is_not_applied_to_the_row(
        parts: tuple, field: bytes, caplog: pytest.LogCaptureFixture) -> None:
    """A late DSN for an outbox id a restore gave again names the old address: the row the token
    names is not bounced (nor its address suppressed); logged and counted."""
    intake, _rows, results, metrics = parts
    raw = report("postfix_failed.eml", ROW).replace(field + b"gone@example.com",
                                                     field + b"previous@example.com")
    if field.startswith(b"Final"):  # without ORCPT: the final address is all the report names
        raw = raw.replace(b"Original-Recipient: rfc822;gone@example.com\r\n", b"")
    accepted = intake.recipient(return_path(BOUNCE, token(ROW)))
    assert intake.message([accepted], raw) == IGNORED_REPLY
    assert results.published == []
    assert refused(metrics, "recipient_mismatch") == 1
    assert f"outbox_id={ROW.outbox_id}" in caplog.text


def test_a_heuristic_bounce_about_another_address_changes_nothing(parts: tuple) -> None:
    """qmail names old.manager@; the row is gone@'s: no result."""
    intake, _rows, results, metrics = parts
    accepted = intake.recipient(return_path(BOUNCE, token(ROW)))
    assert intake.message([accepted], report("qmail_failed.eml", ROW)) == IGNORED_REPLY
    assert results.published == []
    assert refused(metrics, "recipient_mismatch") == 1


@pytest.mark.parametrize("down", ["rows", "results"])
def test_an_outage_holds_the_report_until_the_mta_tries_again(parts: tuple, down: str) -> None:
    intake, rows, results, metrics = parts
    accepted = intake.recipient(return_path(BOUNCE, token(ROW)))
    raw = report("postfix_failed.eml", ROW)
    (rows if down == "rows" else results).down = True
    assert intake.message([accepted], raw) == HELD_REPLY
    assert results.published == []
    assert counter(metrics, "bounce_held_total") == 1
    rows.down = results.down = False
    assert intake.message([accepted], raw) == ACCEPTED_REPLY
    assert [r.status for r in results.published] == [DeliveryStatus.BOUNCED]


def test_two_recipients_naming_one_row_give_one_result(parts: tuple) -> None:
    intake, _rows, results, _metrics = parts
    accepted = intake.recipient(return_path(BOUNCE, token(ROW)))
    bare = intake.recipient(BOUNCE)
    assert intake.message([accepted, bare], report("postfix_failed.eml", ROW)) == ACCEPTED_REPLY
    assert len(results.published) == 1


_ADDRESSES = st.one_of(
    st.text(max_size=80),
    st.builds(lambda t: f"bounces+{t}@bounce.example.com", st.text(max_size=60)),
    st.builds(lambda i, s: return_path(BOUNCE, make_token(i, s, NOW)),
              st.integers(1, 2**63 - 1), st.binary(min_size=1, max_size=40)),
    st.just(BOUNCE),
    st.just(return_path(BOUNCE, make_token(ROW.outbox_id, SECRET, NOW))),
)


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(addresses=st.lists(_ADDRESSES, max_size=3), data=st.data())
def test_no_address_or_message_ever_crashes_the_intake_or_changes_another_row(
        addresses: list[str], data: st.DataObject) -> None:
    """Hostile RCPTs and bytes (a real report garbled, or none): a reply of the three kinds, and
    results only for the row a genuine token names."""
    rows, results = FakeRows(ROW, SLOW), FakeResults()
    intake = Intake(CONFIG, rows, results, Metrics(), clock=lambda: NOW)
    sample = report(data.draw(st.sampled_from(sorted(CAPTURED))), ROW)
    raw = data.draw(st.one_of(st.binary(max_size=500), st.builds(
        lambda at, junk: sample[:at] + junk + sample[at:], st.integers(0, len(sample)),
        st.binary(max_size=50))))
    accepted = [a for a in map(intake.recipient, addresses) if isinstance(a, Accepted)]
    reply = intake.message(accepted, raw)
    assert reply in {ACCEPTED_REPLY, IGNORED_REPLY, UNKNOWN_REPLY}
    assert {r.outbox_id for r in results.published} <= {ROW.outbox_id}
    assert all(r.recipient == ROW.recipient for r in results.published)


def test_refusals_are_logged_at_most_ten_a_second_and_all_counted(
        caplog: pytest.LogCaptureFixture) -> None:
    """Anyone can send junk, and each refusal was a log line (one connection's tiny messages:
    150 lines a second). Past REFUSAL_LOG_LINES a second they are counted only, and the next
    line says how many were left out."""
    now = [0.0]
    metrics = Metrics()
    intake = Intake(CONFIG, FakeRows(ROW), FakeResults(), metrics, clock=lambda: NOW,
                    monotonic=lambda: now[0])
    for _ in range(100):
        assert intake.recipient("someone@elsewhere.example") == NOT_OURS_REPLY
    assert len(caplog.records) == REFUSAL_LOG_LINES
    now[0] += REFUSAL_LOG_INTERVAL_S
    assert intake.message([Accepted(BOUNCE, None)], b"Subject: hi\r\n\r\nhello\r\n") == (
        IGNORED_REPLY)
    assert caplog.records[-1].getMessage().endswith(
        f"({100 - REFUSAL_LOG_LINES} refusals before this one not logged)")
    assert counter(metrics, "bounce_refused_total", reason="no_token") == 100
