"""The intake's bounds: sessions admitted against both caps and released once; the largest report
taken encloses the largest email postroom sends."""

from __future__ import annotations

from email.message import EmailMessage

import pytest

from postroom.bounces.limits import (
    Admission,
    LogBudget,
    SessionLimits,
    base64_bytes,
    client_of,
    report_max_bytes,
)
from postroom.rules import SizeLimits
from support.bounce_reports import feedback_report


def test_sessions_are_admitted_against_both_caps_and_released() -> None:
    limits = SessionLimits(max_sessions=3, max_per_client=2)
    assert [limits.admit("10.0.0.1") for _ in range(3)] == [
        Admission.ADMITTED, Admission.ADMITTED, Admission.TOO_MANY_FROM_CLIENT]
    assert limits.admit("10.0.0.2") is Admission.ADMITTED
    assert limits.admit("10.0.0.3") is Admission.TOO_MANY
    limits.release("10.0.0.1")
    assert limits.open == 2
    assert limits.admit("10.0.0.3") is Admission.ADMITTED
    with pytest.raises(ValueError, match="no session"):
        limits.release("10.0.0.9")


@pytest.mark.parametrize("size", [0, 1, 56, 57, 58, 1000, 123_457])
def test_base64_bytes_is_what_the_email_package_writes(size: int) -> None:
    part = EmailMessage()
    part.set_content(b"\xff" * size, maintype="application", subtype="octet-stream")
    body = part.as_bytes(policy=part.policy.clone(linesep="\r\n")).split(b"\r\n\r\n", 1)[1]
    assert len(body) == base64_bytes(size)


def test_the_largest_report_taken_encloses_the_largest_email_postroom_sends() -> None:
    limits = SizeLimits(body_max_bytes=20_000, attachment_max_bytes=300_000,
                        attachments_total_max_bytes=300_000)
    email = EmailMessage()
    email["From"], email["To"], email["Subject"] = "a@example.com", "b@example.com", "figures"
    email.set_content("é" * (limits.body_max_bytes // 2))
    email.add_alternative("<p>" + "ü" * (limits.body_max_bytes // 2 - 4) + "</p>",
                          subtype="html")
    email.add_attachment(b"\x00" * limits.attachments_total_max_bytes, maintype="application",
                         subtype="pdf", filename="figures.pdf")
    report = feedback_report(email)
    assert len(report.replace(b"\n", b"\r\n")) <= report_max_bytes(limits)


@pytest.mark.parametrize(("address", "client"), [
    ("192.0.2.7", "192.0.2.7"),
    ("::ffff:192.0.2.7", "192.0.2.7"),  # IPv4-mapped, from a dual-stack socket
    ("2001:db8:1:2::1", "2001:db8:1:2::/64"),
    ("2001:db8:1:2:ffff:ffff:ffff:fffe", "2001:db8:1:2::/64"),
    ("2001:DB8:1:2::1", "2001:db8:1:2::/64"),
    ("fe80::1%eth0", "fe80::/64"),
    ("2001:db8:1:3::1", "2001:db8:1:3::/64"),
    ("unknown", "unknown"),
])
def test_a_client_is_an_ipv4_address_or_an_ipv6_64(address: str, client: str) -> None:
    assert client_of(address) == client


def test_one_ipv6_host_cannot_pass_its_cap_by_changing_source_address() -> None:
    """A /64 is 2**64 source addresses: counted by address, one host filled the intake alone."""
    limits = SessionLimits(max_sessions=10, max_per_client=2)
    assert [limits.admit(f"2001:db8:1:2::{n:x}") for n in range(1, 4)] == [
        Admission.ADMITTED, Admission.ADMITTED, Admission.TOO_MANY_FROM_CLIENT]
    assert limits.admit("::ffff:192.0.2.7") is Admission.ADMITTED
    assert limits.admit("192.0.2.7") is Admission.ADMITTED
    assert limits.admit("192.0.2.7") is Admission.TOO_MANY_FROM_CLIENT
    limits.release("2001:db8:1:2::2")
    assert limits.admit("2001:db8:1:2::99") is Admission.ADMITTED


def test_refusals_in_a_row_are_counted_from_the_last_admission() -> None:
    limits = SessionLimits(max_sessions=1, max_per_client=1)
    limits.admit("192.0.2.1")
    assert [(limits.admit("192.0.2.2"), limits.refused_in_a_row) for _ in range(2)] == [
        (Admission.TOO_MANY, 1), (Admission.TOO_MANY, 2)]
    limits.release("192.0.2.1")
    limits.admit("192.0.2.2")
    assert limits.refused_in_a_row == 0


def test_a_log_budget_lets_lines_through_per_window_and_counts_the_rest() -> None:
    now = [0.0]
    budget = LogBudget(2, 1.0, lambda: now[0])
    assert [budget.take() for _ in range(5)] == [0, 0, None, None, None]
    now[0] = 0.999
    assert budget.take() is None
    now[0] = 1.0
    assert [budget.take() for _ in range(3)] == [4, 0, None]
