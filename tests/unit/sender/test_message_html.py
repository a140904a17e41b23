"""build_message with an HTML body: multipart/alternative (text first), inline images as
multipart/related parts referenced by cid:, attachments in multipart/mixed around them."""

from __future__ import annotations

import datetime as dt
import email
import email.policy
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest

from postroom.schemas.codec import EmailRequested
from postroom.sender.attachments import attachments_refusal
from postroom.sender.errors import AttachmentError
from postroom.sender.message import build_message

NOW = dt.datetime(2026, 10, 2, 7, 0, tzinfo=dt.UTC)
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(40))
HTML = '<p>September</p><table><tr><td>Revenue</td><td>1,200</td></tr></table><img src="cid:chart.png">'


def event(**changes: Any) -> EmailRequested:
    values: dict[str, Any] = {
        "idempotency_key": "sales-report-2026-09|finance@example.com",
        "message_key": "sales-report-2026-09", "outbox_id": 1,
        "recipient": "finance@example.com", "sender": "reports@example.com",
        "subject": "Sales report — September 2026", "body": "The report is attached.\n",
        "attachments": (), "priority": "normal", "created_at": NOW, "html": HTML}
    values.update(changes)
    return EmailRequested(**values)


def received(message: EmailMessage) -> EmailMessage:
    parsed = email.message_from_bytes(message.as_bytes(), policy=email.policy.default)
    assert isinstance(parsed, EmailMessage)
    return parsed


def tree(part: EmailMessage) -> Any:
    """The MIME structure: a content type, or (multipart type, [children])."""
    if part.is_multipart():
        return (part.get_content_type(), [tree(p) for p in part.iter_parts()])  # type: ignore[arg-type]
    return part.get_content_type()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "chart.png").write_bytes(PNG)
    (tmp_path / "sales.xlsx").write_bytes(b"PK\x03\x04 workbook")
    return tmp_path


def test_text_and_html_are_alternatives_text_first() -> None:
    message = received(build_message(event(), attachments_root=None, now=NOW))
    assert tree(message) == ("multipart/alternative", ["text/plain", "text/html"])
    text, html = message.iter_parts()
    # the SMTP policy writes CRLF line ends
    assert text.get_content().replace("\r\n", "\n") == "The report is attached.\n"  # type: ignore[attr-defined]
    assert html.get_content().replace("\r\n", "\n") == HTML + "\n"  # type: ignore[attr-defined]


def test_without_html_the_message_is_text_only_as_before() -> None:
    message = received(build_message(event(html=None), attachments_root=None, now=NOW))
    assert tree(message) == "text/plain"


def test_inline_images_are_related_to_the_html_and_attachments_wrap_it_all(root: Path) -> None:
    built = build_message(event(inline=("chart.png",), attachments=("sales.xlsx",)),
                          attachments_root=root, now=NOW)
    message = received(built)
    assert tree(message) == ("multipart/mixed", [
        ("multipart/alternative", ["text/plain", ("multipart/related", ["text/html", "image/png"])]),
        "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"])
    image = next(p for p in message.walk() if p.get_content_type() == "image/png")
    assert image["Content-ID"] == "<chart.png>"  # what cid:chart.png in the HTML names
    assert image.get_content_disposition() == "inline"
    assert image.get_payload(decode=True) == PNG
    assert [a.get_filename() for a in message.iter_attachments()] == ["sales.xlsx"]


def test_inline_images_obey_the_attachments_root(root: Path, tmp_path_factory: Any) -> None:
    outside = tmp_path_factory.mktemp("outside") / "secret.png"
    outside.write_bytes(PNG)
    with pytest.raises(AttachmentError, match="outside the attachments root"):
        build_message(event(inline=(str(outside),)), attachments_root=root, now=NOW)
    assert attachments_refusal(event(inline=("chart.png",)), None) == (
        "POSTROOM_ATTACHMENTS_ROOT is not set: attachments are off")
    assert attachments_refusal(event(inline=("chart.png",)), root) is None


@pytest.mark.parametrize(("inline", "attachments", "what"), [
    (("one.png", "two.png"), (), "the inline images"),
    (("one.png",), ("sales.csv",), "the attachments and inline images"),
])
def test_inline_images_count_in_the_attachments_total(
        root: Path, inline: tuple[str, ...], attachments: tuple[str, ...], what: str) -> None:
    from postroom.rules import SizeLimits

    for name in ("one.png", "two.png", "sales.csv"):
        (root / name).write_bytes(b"\x89PNG" + b"x" * 56)  # 60 bytes each
    limits = SizeLimits(attachment_max_bytes=100, attachments_total_max_bytes=100)
    with pytest.raises(AttachmentError, match=f"would take {what} to more than 100 bytes"):
        build_message(event(inline=inline, attachments=attachments), attachments_root=root,
                      now=NOW, limits=limits)
    within = SizeLimits(attachment_max_bytes=100, attachments_total_max_bytes=120)
    built = build_message(event(inline=inline, attachments=attachments), attachments_root=root,
                          now=NOW, limits=within)
    assert len(list(received(built).walk())) > 2
