"""Reports as a mailbox provider sends them, for the bounce intake's tests and benchmark."""

from __future__ import annotations

from email.message import EmailMessage
from email.mime.base import MIMEBase
from email.mime.message import MIMEMessage
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText


def original_with_attachment(size: int, return_path: str = "bounces+TOKEN@bounce.example.com",
                             recipient: str = "ceo@example.com") -> EmailMessage:
    """An email as postroom sends it, with a ``size``-byte attachment."""
    original = EmailMessage()
    original["From"] = "Reports <reports@example.com>"
    original["To"] = recipient
    original["Subject"] = "the quarterly figures"
    original["Return-Path"] = f"<{return_path}>"
    original.set_content("The figures are attached.\n")
    original.add_attachment(bytes(range(256)) * (size // 256), maintype="application",
                            subtype="pdf", filename="figures.pdf")
    return original


def feedback_report(original: EmailMessage) -> bytes:
    """An RFC 5965 complaint enclosing the whole email, as a mailbox provider sends it (naming
    the email's return path and recipient)."""
    report = MIMEMultipart("report", report_type="feedback-report")
    report["From"] = "abuse@mailbox.example"
    report["To"] = "bounces@bounce.example.com"
    report["Subject"] = "Abuse report"
    report.attach(MIMEText("This is an email abuse report.\n"))
    fields = MIMEBase("message", "feedback-report")
    fields.set_payload("Feedback-Type: abuse\nUser-Agent: SomeGenerator/1.0\nVersion: 1\n"
                       f"Original-Mail-From: {original['Return-Path']}\n"
                       f"Original-Rcpt-To: <{original['To']}>\n")
    report.attach(fields)
    report.attach(MIMEMessage(original))
    return report.as_bytes()
