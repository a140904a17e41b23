"""The intake's bounds: sessions admitted against both caps and released once; the largest report
taken encloses the largest email postroom sends."""

from __future__ import annotations

from email.message import EmailMessage

import pytest

from postroom.bounces.limits import Admission, SessionLimits, base64_bytes, report_max_bytes
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
