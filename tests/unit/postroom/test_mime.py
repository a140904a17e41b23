"""No text from a job or an event ends up as anything but the value of its header: examples from
issue 10 and hypothesis properties over subjects, names, addresses and file names."""

from __future__ import annotations

import datetime as dt
import email
import email.policy
import tempfile
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from postroom.errors import InvalidContentError, UnsafeHeaderError
from postroom.mime import check_composable, check_serialized
from postroom.rules import check_address, check_attachment_path, check_subject
from schemas.codec import EmailRequested
from sender.errors import AttachmentError
from sender.message import build_message
from support.fuzz import examples

NOW = dt.datetime(2026, 10, 2, 7, 0, tzinfo=dt.UTC)
TOP_HEADERS = ["from", "to", "subject", "date", "message-id"]
PART_HEADERS = {"content-type", "content-transfer-encoding", "content-disposition",
                "mime-version"}
ENCODED_CRLF = "=?utf-8?q?=0D=0AReply-To:_attacker@evil.example?="
POLICIES = [email.policy.SMTP, email.policy.SMTPUTF8]


def event(**changes: Any) -> EmailRequested:
    values: dict[str, Any] = {
        "idempotency_key": "k|finance@example.com", "message_key": "k", "outbox_id": 1,
        "recipient": "finance@example.com", "sender": "reports@example.com",
        "subject": "Sales report", "body": "see attached\n", "attachments": (),
        "priority": "normal", "created_at": NOW}
    values.update(changes)
    return EmailRequested(**values)


def received(message: EmailMessage, policy: email.policy.EmailPolicy) -> EmailMessage:
    parsed = email.message_from_bytes(message.as_bytes(policy=policy), policy=email.policy.default)
    assert isinstance(parsed, EmailMessage)
    return parsed


def assert_exactly_the_intended_headers(message: EmailMessage, attachments: int) -> None:
    """What a receiver parses: the five headers we set and MIME's own, nothing else."""
    for policy in POLICIES:
        parsed = received(message, policy)
        top = [name.lower() for name in parsed.keys()]
        assert top[:5] == TOP_HEADERS
        assert set(top[5:]) <= PART_HEADERS
        assert parsed.get_all("Reply-To") is None and parsed.get_all("Bcc") is None
        parts = list(parsed.iter_attachments())
        assert len(parts) == attachments
        for part in parts:
            assert {name.lower() for name in part.keys()} <= PART_HEADERS


# --- the examples of issue 10


@pytest.mark.parametrize("subject", [
    f"Invoice {ENCODED_CRLF}",
    "=?utf-8?b?SGkNClJlcGx5LVRvOiBldmVAZXZpbC5leGFtcGxl?=",  # the same, base64
    "x =?utf-8?q?=0A=0ABody_starts_here?=",                    # would end the header block
    "=?utf-8?q?=E2=80=A8?= U+2028 encoded",
])
def test_an_encoded_line_break_in_the_subject_is_refused(subject: str) -> None:
    with pytest.raises(UnsafeHeaderError, match="Subject"):
        build_message(event(subject=subject), attachments_root=None, now=NOW)
    with pytest.raises(UnsafeHeaderError):
        check_composable("reports@example.com", "finance@example.com", subject, [])


@pytest.mark.parametrize("name", [
    "=?utf-8?q?a=0D=0AX-Evil:_1?=.pdf",
    "=?utf-8?q?a=0A=0A?=.pdf",
])
def test_an_encoded_line_break_in_a_file_name_is_refused(tmp_path: Path, name: str) -> None:
    (tmp_path / name).write_bytes(b"%PDF")
    with pytest.raises(UnsafeHeaderError):
        build_message(event(attachments=(name,)), attachments_root=tmp_path, now=NOW)
    with pytest.raises(UnsafeHeaderError):
        check_composable("reports@example.com", "finance@example.com", "s", [name])


def test_serialised_bytes_with_an_added_header_are_refused() -> None:
    message = build_message(event(), attachments_root=None, now=NOW)
    content = message.as_bytes().replace(b"Subject: Sales report\r\n",
                                         b"Subject: Sales report\r\nReply-To: eve@evil.example\r\n")
    with pytest.raises(UnsafeHeaderError, match="added: reply-to"):
        check_serialized(message, content)
    check_serialized(message, message.as_bytes())  # the genuine bytes pass


def test_serialised_bytes_whose_header_block_ends_early_are_refused() -> None:
    message = build_message(event(), attachments_root=None, now=NOW)
    content = message.as_bytes().replace(b"Subject: Sales report\r\n",
                                         b"Subject: Sales\r\n\r\nreport\r\n")
    with pytest.raises(UnsafeHeaderError):
        check_serialized(message, content)


# --- properties

# Text that likes to break headers: line breaks raw and encoded, encoded-word syntax, quotes.
_TRICKY = st.sampled_from(["\r", "\n", "\r\n", "\x85", "\u2028", "\u2029", "\x00", "\t", " ",
                           "=?", "?=", "=?utf-8?q?", "=?utf-8?b?", "=0D", "=0A", "_", '"', ";",
                           "\\", ":", "<", ">", ",", "@", "Bcc: x@y.z", "é", "ß", "€", "日本"])
TEXT = st.lists(st.one_of(_TRICKY, st.text(max_size=5)), max_size=12).map("".join)
FILE_NAME = TEXT.filter(lambda n: "/" not in n and "\x00" not in n and n not in ("", ".", "..")
                        and len(n.encode("utf-8", "surrogatepass")) < 200)
_LOCAL = st.text(st.characters(codec="utf-8", exclude_characters="@"), min_size=1, max_size=12)
ADDRESS = st.one_of(
    st.builds(lambda local, dom: f"{local}@{dom}", _LOCAL,
              st.sampled_from(["example.com", "bücher.example", "exa mple.com", "x"])),
    TEXT)
PROPERTY = settings(max_examples=examples(300), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def _accepted(check: Any, value: str) -> bool:
    try:
        check(value)
    except InvalidContentError:
        return False
    return True


@PROPERTY
@given(subject=TEXT, recipient=ADDRESS, sender=ADDRESS)
def test_any_subject_and_addresses_make_exactly_the_intended_headers(
        subject: str, recipient: str, sender: str) -> None:
    try:
        message = build_message(event(subject=subject, recipient=recipient, sender=sender),
                                attachments_root=None, now=NOW)
    except ValueError:  # UnsafeHeaderError among them: refused, nothing to send
        assume(False)
    assert_exactly_the_intended_headers(message, attachments=0)


@PROPERTY
@given(names=st.lists(FILE_NAME, min_size=1, max_size=3, unique=True))
def test_any_file_names_make_exactly_the_intended_headers(names: list[str]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        for name in names:
            try:
                (root / name).write_bytes(b"data")
            except (OSError, UnicodeError):
                assume(False)  # a name this file system cannot hold never reaches the sender
        try:
            message = build_message(event(attachments=tuple(names)), attachments_root=root,
                                    now=NOW)
        except (ValueError, AttachmentError):
            assume(False)
    assert_exactly_the_intended_headers(message, attachments=len(names))


@PROPERTY
@given(subject=TEXT, recipient=ADDRESS, names=st.lists(FILE_NAME, max_size=2))
def test_what_enqueue_accepts_the_sender_can_send(
        subject: str, recipient: str, names: list[str]) -> None:
    """enqueue's rules and its header check, then the sender's: one may not pass what the other
    refuses on the sender's side (the row would be written and then fail)."""
    assume(_accepted(check_subject, subject) and _accepted(check_address, recipient)
           and all(_accepted(check_attachment_path, n) for n in names))
    try:
        check_composable("reports@example.com", recipient.strip(), subject, names)
    except UnsafeHeaderError:
        assume(False)
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        try:
            for name in names:
                (root / name).write_bytes(b"data")
        except (OSError, UnicodeError):
            assume(False)
        message = build_message(event(subject=subject, recipient=recipient.strip(),
                                      attachments=tuple(names)), attachments_root=root, now=NOW)
    assert_exactly_the_intended_headers(message, attachments=len(names))
    for policy in POLICIES:
        check_serialized(message, message.as_bytes(policy=policy))
