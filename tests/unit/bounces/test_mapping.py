"""Which notices of a report concern the row its token names, and the result each becomes."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from postroom.bounces.mapping import OutboxRow, concerns, results_for
from postroom.bounces.reports import Notice, Report
from postroom.schemas.codec import DeliveryStatus
from support.fuzz import examples

NOW = dt.datetime(2026, 12, 2, 22, 5, tzinfo=dt.UTC)
ROW = OutboxRow(5, "k|old.manager@example.com", "Old.Manager@example.com", 3, "sent")
B = DeliveryStatus.BOUNCED


@pytest.mark.parametrize(("notice", "of", "expected"), [
    (Notice(B, "old.manager@example.com"), 1, True),   # named so, whatever the case
    (Notice(B, "old.manager@example.com"), 3, True),
    (Notice(B, "forwarded@elsewhere.example"), 1, True),   # a complaint's only notice
    (Notice(B, "someone.else@example.com", exact_recipient=True), 1, False),  # a DSN's
    (Notice(B, None, exact_recipient=True), 1, True),  # unnamed: the token names the row
    (Notice(B, "someone.else@example.com"), 2, False),
    (Notice(B, None), 2, True),
    (Notice(B, "forwarded@elsewhere.example", exact_recipient=True), 1, False),  # heuristics
    (Notice(B, "OLD.MANAGER@example.com ", exact_recipient=True), 1, True),
])
def test_concerns(notice: Notice, of: int, expected: bool) -> None:
    assert concerns(notice, ROW, of) is expected


IDN_ROW = OutboxRow(6, "k|j\u00f6rg+tag@xn--bcher-kva.example", "j\u00f6rg+tag@xn--bcher-kva.example",
                    1, "sent")


@pytest.mark.parametrize(("named", "expected"), [
    ("j\u00f6rg+tag@xn--bcher-kva.example", True),
    ("J\u00d6RG+TAG@XN--BCHER-KVA.EXAMPLE", True),
    ("j\u00f6rg+tag@b\u00fccher.example", True),  # the U-label, as an SMTPUTF8 MTA writes it
    ("J\u00d6RG+TAG@B\u00dcCHER.EXAMPLE", True),
    ("<j\u00f6rg+tag@b\u00fccher.example>", True),
    ("j\\x{F6}rg+tag@xn--bcher-kva.example", True),  # RFC 6533's utf-8-addr-xtext
    ("j\\x{f6}rg+2Btag@b\\x{FC}cher.example", True),  # and ORCPT's xtext left on
    ("j\u00f6rg+2Btag@xn--bcher-kva.example", True),
    ("j\u00f6rg@b\u00fccher.example", False),
    ("someone@b\u00fccher.example", False),
    ("j\u00f6rg+tag@b\u00fccher..example", False),  # no domain: never the row's
    ("j\\x{110000}rg+tag@xn--bcher-kva.example", False),
    ("", False),
])
def test_a_dsns_recipient_is_the_rows_however_spelled(named: str, expected: bool) -> None:
    """A DSN must name the row's address; the same mailbox spelled otherwise (the U-label of
    the domain the row holds as an A-label, an encoding left on) was a mismatch, the genuine
    bounce ignored."""
    assert concerns(Notice(B, named, exact_recipient=True), IDN_ROW, 1) is expected


@settings(max_examples=examples(300), deadline=None)
@given(named=st.text(alphabet=st.sampled_from("aJ\u00f6\u00fc@.+2BFx{}\\<>- \u200d\ufb00"),
                     max_size=40) | st.text(max_size=40))
def test_any_recipient_named_is_compared_without_raising(named: str) -> None:
    assert isinstance(concerns(Notice(B, named, exact_recipient=True), IDN_ROW, 1), bool)


def test_results_carry_the_rows_key_id_recipient_and_attempt() -> None:
    report = Report("dsn", (Notice(B, "old.manager@example.com", "5.1.1", 550,
                                   "550 5.1.1 User unknown\x00"),
                            Notice(B, "someone.else@example.com", "5.1.1")))
    mapped = results_for(report, ROW, NOW)
    assert mapped.mismatched == 1
    [result] = mapped.results
    assert (result.idempotency_key, result.outbox_id, result.recipient, result.attempt) == (
        ROW.idempotency_key, 5, ROW.recipient, 3)
    assert (result.status, result.enhanced_code, result.smtp_code, result.occurred_at) == (
        B, "5.1.1", 550, NOW)
    assert result.error == "550 5.1.1 User unknown?"  # printable, one line


def test_a_notice_without_diagnostic_says_its_status() -> None:
    report = Report("dsn", (Notice(DeliveryStatus.DELAYED, None, "4.4.1"),))
    [result] = results_for(report, OutboxRow(1, "k", "a@example.com", 0, "sent"), NOW).results
    assert (result.error, result.attempt) == ("delayed: Status 4.4.1", 1)
