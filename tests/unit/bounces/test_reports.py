"""Reading what arrives at the bounce domain: real Postfix 3.7 DSNs captured from the project's
smarthost (tests/fixtures/bounces/postfix_*.eml), an RFC 5965 feedback report, a qmail bounce and
a vacation message; and a property: whatever the bytes, a Report or UnusableReportError."""

from __future__ import annotations

from email.message import Message
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from postroom.bounces.errors import Refusal, UnusableReportError
from postroom.bounces.reports import is_auto_reply, parse_report
from postroom.schemas.codec import DeliveryStatus
from support.fuzz import examples

FIXTURES = Path(__file__).parents[2] / "fixtures" / "bounces"


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


@pytest.mark.parametrize(("name", "kind", "status", "code", "smtp_code", "recipient", "hints"), [
    ("postfix_failed.eml", "dsn", DeliveryStatus.BOUNCED, "5.1.1", 550, "gone@example.com",
     ("1-a-aaaa", "bounces+1-a-aaaa@bounce.example.com", "bounces+1-a-aaaa@bounce.example.com")),
    # sent without ENVID or ORCPT: the return path in X-Postfix-Sender still names the row
    ("postfix_failed_no_dsn_options.eml", "dsn", DeliveryStatus.BOUNCED, "5.1.1", 550,
     "gone@example.com", ("bounces+4-a-dddd@bounce.example.com",) * 2),
    ("postfix_delayed.eml", "dsn", DeliveryStatus.DELAYED, "4.3.0", 451, "slow@example.com",
     ("2-a-bbbb", "bounces+2-a-bbbb@bounce.example.com", "bounces+2-a-bbbb@bounce.example.com")),
    # a deferred message's end at maximal_queue_lifetime: Action failed with the 4.x.x it had
    ("postfix_expired.eml", "dsn", DeliveryStatus.BOUNCED, "4.3.0", 451, "slow@example.com",
     ("2-a-bbbb", "bounces+2-a-bbbb@bounce.example.com", "bounces+2-a-bbbb@bounce.example.com")),
    ("arf_abuse.eml", "feedback", DeliveryStatus.COMPLAINED, None, None, "ceo@example.com",
     ("bounces+TOKEN@bounce.example.com", "bounces+TOKEN@bounce.example.com")),
    ("qmail_failed.eml", "bounce", DeliveryStatus.BOUNCED, None, None, "old.manager@example.com",
     ()),
])
def test_reports(name: str, kind: str, status: DeliveryStatus, code: str | None,
                 smtp_code: int | None, recipient: str, hints: tuple[str, ...]) -> None:
    report = parse_report(fixture(name))
    assert report.kind == kind
    [notice] = report.notices
    assert (notice.status, notice.enhanced_code, notice.smtp_code, notice.recipient) == (
        status, code, smtp_code, recipient)
    assert report.token_hints == hints


def test_a_global_delivery_status_reads_as_one() -> None:
    """RFC 6533: what Postfix sends for an SMTPUTF8 email; its blocks are UTF-8 text."""
    raw = fixture("postfix_failed.eml").replace(
        b"message/delivery-status", b"message/global-delivery-status").replace(
        b"rfc822; gone@example.com", "utf-8; göne@exämple.com".encode())
    report = parse_report(raw)
    [notice] = report.notices
    assert (report.kind, notice.status, notice.enhanced_code, notice.recipient) == (
        "dsn", DeliveryStatus.BOUNCED, "5.1.1", "gone@example.com")


def test_a_dsn_of_another_mta_names_its_row_by_the_enclosed_return_path() -> None:
    """No ENVID, no X-Postfix-Sender (Exchange's, say): the original's headers still carry it."""
    raw = fixture("postfix_failed.eml").replace(b"Original-Envelope-Id: 1-a-aaaa\r\n", b"").replace(
        b"X-Postfix-Sender: rfc822; bounces+1-a-aaaa@bounce.example.com\r\n", b"")
    assert parse_report(raw).token_hints == ("bounces+1-a-aaaa@bounce.example.com",)


def test_the_diagnostic_is_the_servers_reply() -> None:
    [notice] = parse_report(fixture("postfix_failed.eml")).notices
    assert notice.diagnostic == "550 5.1.1 User unknown"
    [complaint] = parse_report(fixture("arf_abuse.eml")).notices
    assert complaint.diagnostic == "complaint: abuse (SomeGenerator/1.0)"


def _dsn(action: str, *, report_type: str = "delivery-status", top: str = "multipart/report",
         recipients: bool = True) -> bytes:
    recipient = (f"Final-Recipient: rfc822; a@example.com\nAction: {action}\nStatus: 5.0.0\n"
                 if recipients else "")
    return (f"From: MAILER-DAEMON@mx.example\nSubject: report\nMIME-Version: 1.0\n"
            f"Content-Type: {top}; report-type={report_type}; boundary=b\n\n--b\n"
            f"Content-Type: text/plain\n\nnotification\n--b\n"
            f"Content-Type: message/delivery-status\n\nReporting-MTA: dns; mx.example\n\n"
            f"{recipient}\n--b--\n").encode()


@pytest.mark.parametrize(("raw", "refusal"), [
    (fixture("vacation.eml"), Refusal.AUTO_REPLY),
    (b"From: someone@example.com\nSubject: hello\n\nJust a message.\n", Refusal.NOT_A_REPORT),
    (b"", Refusal.MALFORMED_REPORT),  # flufl.bounce's Yale detector raises on no From
    (_dsn("delivered"), Refusal.NOTHING_TO_RECORD),
    (_dsn("relayed"), Refusal.NOTHING_TO_RECORD),
    (_dsn("failed", recipients=False), Refusal.MALFORMED_REPORT),
    (fixture("arf_abuse.eml").replace(b"Feedback-Type: abuse", b"Feedback-Type: not-spam"),
     Refusal.NOTHING_TO_RECORD),
    (fixture("arf_abuse.eml").replace(b"Feedback-Type: abuse\n", b""), Refusal.MALFORMED_REPORT),
])
def test_refused(raw: bytes, refusal: Refusal) -> None:
    with pytest.raises(UnusableReportError) as caught:
        parse_report(raw)
    assert caught.value.refusal == refusal


@pytest.mark.parametrize(("headers", "auto"), [
    ("Auto-Submitted: auto-replied", True),
    ("Auto-Submitted: auto-generated", True),
    ("Auto-Submitted: no", False),
    ("X-Autoreply: yes", True),
    ("X-Autorespond: Out of office", True),
    ("Precedence: auto_reply", True),
    ("Precedence: bulk", False),
    ("Subject: Out of office", False),
])
def test_auto_reply(headers: str, auto: bool) -> None:
    import email

    assert is_auto_reply(email.message_from_string(f"{headers}\n\nbody\n")) is auto


def test_a_report_inside_another_message_is_only_a_heuristic_bounce() -> None:
    """Forwarded, its recipient must be the row's own (exact_recipient), as flufl.bounce found."""
    report = parse_report(_dsn("failed", top="multipart/mixed"))
    assert report.kind == "bounce"
    assert [(n.recipient, n.exact_recipient, n.enhanced_code) for n in report.notices] == [
        ("a@example.com", True, None)]


def test_a_postfix_dsn_is_a_report_though_marked_auto_submitted() -> None:
    assert b"Auto-Submitted: auto-replied" in fixture("postfix_failed.eml")
    assert parse_report(fixture("postfix_failed.eml")).kind == "dsn"


def test_many_recipient_blocks_are_bounded() -> None:
    blocks = "".join(f"Final-Recipient: rfc822; r{i}@example.com\nAction: failed\nStatus: 5.1.1\n\n"
                     for i in range(5000))
    raw = _dsn("failed").replace(b"Final-Recipient: rfc822; a@example.com\nAction: failed\n"
                                 b"Status: 5.0.0\n", blocks.encode())
    assert len(parse_report(raw).notices) == 100


_SAMPLES = [fixture(name) for name in sorted(p.name for p in FIXTURES.glob("*.eml"))]


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_bytes_give_a_report_or_a_refusal(data: st.DataObject) -> None:
    """Random bytes, or a real report cut, spliced or garbled: never another exception."""
    sample = data.draw(st.sampled_from(_SAMPLES))
    raw = data.draw(st.one_of(
        st.binary(max_size=2000),
        st.builds(lambda cut: sample[:cut], st.integers(0, len(sample))),
        st.builds(lambda at, junk: sample[:at] + junk + sample[at:],
                  st.integers(0, len(sample)), st.binary(min_size=1, max_size=200)),
        st.builds(lambda at, text: sample[:at] + text.encode("utf-8", "surrogatepass")
                  + sample[at:], st.integers(0, len(sample)), st.text(max_size=100)),
    ))
    try:
        report = parse_report(raw)
    except UnusableReportError as exc:
        assert exc.refusal in set(Refusal)
    else:
        assert report.notices
        assert all(n.status in {DeliveryStatus.BOUNCED, DeliveryStatus.DELAYED,
                                DeliveryStatus.COMPLAINED} for n in report.notices)
        assert all(n.diagnostic is None or "\n" not in n.diagnostic for n in report.notices)


def test_the_heuristics_read_a_bounded_message(monkeypatch: pytest.MonkeyPatch) -> None:
    """flufl.bounce's detectors cost about 7 s of CPU a MB of empty parts: a message without a
    delivery status reaches them with at most HEURISTIC_MAX_PARTS parts and HEURISTIC_MAX_BYTES
    of payload."""
    from postroom.bounces import reports

    seen: list[int] = []

    def detectors(message: Message) -> tuple[frozenset[bytes], frozenset[bytes]]:
        seen.append(sum(len(p.get_payload()) for p in message.walk()
                        if isinstance(p.get_payload(), str)))
        return frozenset(), frozenset()

    monkeypatch.setattr(reports, "all_failures", detectors)
    many = (b"From: a@example.com\r\nContent-Type: multipart/mixed; boundary=b\r\n\r\n"
            + b"--b\r\nContent-Type: text/plain\r\n\r\nx\r\n" * 50 + b"--b--\r\n")
    with pytest.raises(UnusableReportError) as refused:
        parse_report(many)
    assert refused.value.refusal is Refusal.NOT_A_REPORT
    assert seen == []
    with pytest.raises(UnusableReportError):
        parse_report(b"From: a@example.com\r\n\r\n" + (b"x" * 70 + b"\r\n") * 2000)
    assert seen == [reports.HEURISTIC_MAX_BYTES]


def test_the_heuristics_read_a_bounded_number_of_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    """Their cost goes with the lines: 16 KiB of two-byte lines (8,000 lines) cost 0.2 s of
    CPU a message, anyone's to send. At most HEURISTIC_MAX_LINES reach them."""
    from postroom.bounces import reports

    seen: list[int] = []

    def detectors(message: Message) -> tuple[frozenset[bytes], frozenset[bytes]]:
        seen.append(sum(p.get_payload().count("\n") for p in message.walk()
                        if isinstance(p.get_payload(), str)))
        return frozenset(), frozenset()

    monkeypatch.setattr(reports, "all_failures", detectors)
    nested = (b"From: a@example.com\r\nContent-Type: multipart/mixed; boundary=b\r\n\r\n"
              + b"--b\r\nContent-Type: text/plain\r\n\r\n" + b"x\r\n" * 300
              + b"--b\r\nContent-Type: text/plain\r\n\r\n" + b"x\r\n" * 8000 + b"--b--\r\n")
    with pytest.raises(UnusableReportError):
        parse_report(nested)
    assert seen == [reports.HEURISTIC_MAX_LINES]
