"""build_message: headers, a Message-ID stable across attempts, attachment types and safety."""

from __future__ import annotations

import datetime as dt
import email
import email.policy
import email.utils
import itertools
import os
import re
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest

from postroom.schemas.codec import EmailRequested
from postroom.sender.attachments import attachments_refusal, mime_type_for, read_attachment
from postroom.sender.errors import AttachmentError
from postroom.sender.message import (
    UnsafeHeaderError,
    build_message,
    check_header_values,
    message_id_for,
)

NOW = dt.datetime(2026, 10, 2, 7, 0, tzinfo=dt.UTC)
XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"


def event(**changes: Any) -> EmailRequested:
    values: dict[str, Any] = {
        "idempotency_key": "sales-report-2026-09|finance@example.com",
        "message_key": "sales-report-2026-09",
        "outbox_id": 1,
        "recipient": "finance@example.com",
        "sender": "reports@example.com",
        "subject": "Sales report — September 2026",
        "body": "The September sales report is attached.\nGrüße\n",
        "attachments": (),
        "priority": "normal",
        "created_at": NOW,
    }
    values.update(changes)
    return EmailRequested(**values)


def reparsed(message: EmailMessage) -> EmailMessage:
    """The message as a receiver sees it: serialised for SMTP and parsed back."""
    parsed = email.message_from_bytes(message.as_bytes(), policy=email.policy.default)
    assert isinstance(parsed, EmailMessage)
    return parsed


def attachments_of(message: EmailMessage) -> list[tuple[str | None, str, bytes]]:
    found = []
    for part in reparsed(message).iter_attachments():
        assert isinstance(part, EmailMessage)
        payload = part.get_payload(decode=True)
        assert isinstance(payload, bytes)
        found.append((part.get_filename(), part.get_content_type(), payload))
    return found


# --- headers and body


def test_headers_and_body() -> None:
    message = reparsed(build_message(event(), attachments_root=None, now=NOW))
    assert message["From"] == "reports@example.com"
    assert message["To"] == "finance@example.com"
    assert message["Subject"] == "Sales report — September 2026"
    assert message["Date"] == email.utils.format_datetime(NOW)
    assert message["Message-ID"] == message_id_for(
        "sales-report-2026-09|finance@example.com", "example.com")
    assert message.get_content_type() == "text/plain"
    assert message.get_content_charset() == "utf-8"
    body = message.get_content().replace("\r\n", "\n")
    assert body == "The September sales report is attached.\nGrüße\n"


def test_message_is_serialised_with_crlf_line_endings() -> None:
    raw = build_message(event(), attachments_root=None, now=NOW).as_bytes()
    assert b"\r\nSubject: " in raw
    assert b"\n" not in raw.replace(b"\r\n", b"")


def test_a_naive_clock_is_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        build_message(event(), attachments_root=None, now=NOW.replace(tzinfo=None))


# --- Message-ID


def test_message_id_is_deterministic_per_key() -> None:
    key = "sales-report-2026-09|finance@example.com"
    assert message_id_for(key, "example.com") == message_id_for(key, "example.com")
    assert message_id_for(key, "example.com") != message_id_for(key + "x", "example.com")
    assert re.fullmatch(r"<[0-9a-f]{32}@example\.com>", message_id_for(key, "example.com"))


def test_a_retried_email_keeps_its_message_id() -> None:
    first = build_message(event(attempt=1), attachments_root=None, now=NOW)
    later = build_message(event(attempt=3), attachments_root=None,
                          now=NOW + dt.timedelta(minutes=15))
    assert first["Message-ID"] == later["Message-ID"]
    assert first["Date"] != later["Date"]


def test_message_id_domain_comes_from_the_from_address() -> None:
    message = build_message(event(sender="Reports <reports@Mail.Example.ORG>"),
                            attachments_root=None, now=NOW)
    assert str(message["Message-ID"]).endswith("@mail.example.org>")


@pytest.mark.parametrize("domain", ["", "exa mple.com", "example.com\r\nBcc: x", "a@b"])
def test_message_id_refuses_what_is_not_a_domain(domain: str) -> None:
    with pytest.raises(UnsafeHeaderError):
        message_id_for("key", domain)


# --- header injection


@pytest.mark.parametrize("field", ["recipient", "subject", "sender"])
@pytest.mark.parametrize("breaker", ["\r\n", "\n", "\r", "\x00", "\u2028"])
def test_line_breaks_in_header_fields_are_refused(field: str, breaker: str) -> None:
    value = f"finance@example.com{breaker}Bcc: everyone@example.com"
    with pytest.raises(UnsafeHeaderError, match=field) as refused:
        build_message(event(**{field: value}), attachments_root=None, now=NOW)
    assert isinstance(refused.value, ValueError)


@pytest.mark.parametrize("field", ["subject", "sender"])
def test_a_refused_sender_or_subject_is_refused_every_time(field: str) -> None:
    bad = event(**{field: "finance@example.com\r\nBcc: everyone@example.com"})
    for _ in range(2):  # the second check is not answered from the checks that passed
        with pytest.raises(UnsafeHeaderError, match=field):
            check_header_values(bad)


def test_a_sender_and_subject_that_passed_still_leave_the_recipient_checked() -> None:
    check_header_values(event())
    with pytest.raises(UnsafeHeaderError, match="recipient"):
        check_header_values(event(recipient="a@example.com\nBcc: b@example.com"))
    with pytest.raises(UnsafeHeaderError, match="recipient"):
        check_header_values(event(recipient="Name <a@example.com>"))


# --- attachment types


@pytest.mark.parametrize(("name", "expected"), [
    ("sales_2026-09.xlsx", XLSX),
    ("SALES.XLSX", XLSX),
    ("memo.docx", "application/vnd.openxmlformats-officedocument.wordprocessingml.document"),
    ("deck.pptx", "application/vnd.openxmlformats-officedocument.presentationml.presentation"),
    ("old.xls", "application/vnd.ms-excel"),
    ("rows.csv", "text/csv"),
    ("report.pdf", "application/pdf"),
    ("rows.csv.gz", "application/gzip"),
    ("picture.png", "image/png"),
    ("no-extension", "application/octet-stream"),
    ("odd.qqq", "application/octet-stream"),
])
def test_mime_type_for(name: str, expected: str) -> None:
    assert mime_type_for(name) == expected


def test_xlsx_attachment_has_its_type_name_and_bytes(tmp_path: Path) -> None:
    workbook = tmp_path / "sales_2026-09.xlsx"
    workbook.write_bytes(b"PK\x03\x04 not really a workbook \x00\xff")
    message = build_message(event(attachments=(str(workbook),)), attachments_root=None, now=NOW)
    assert attachments_of(message) == [
        ("sales_2026-09.xlsx", XLSX, b"PK\x03\x04 not really a workbook \x00\xff")]
    assert reparsed(message).get_content_type() == "multipart/mixed"


def test_several_attachments_keep_their_order(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_bytes(b"x,y\r\n1,2\r\n")
    (tmp_path / "b.pdf").write_bytes(b"%PDF-1.7")
    message = build_message(
        event(attachments=(str(tmp_path / "a.csv"), str(tmp_path / "b.pdf"))),
        attachments_root=tmp_path, now=NOW)
    assert attachments_of(message) == [
        ("a.csv", "text/csv", b"x,y\r\n1,2\r\n"), ("b.pdf", "application/pdf", b"%PDF-1.7")]


def test_non_ascii_attachment_name_survives(tmp_path: Path) -> None:
    (tmp_path / "Bericht März.xlsx").write_bytes(b"PK")
    message = build_message(event(attachments=(str(tmp_path / "Bericht März.xlsx"),)),
                            attachments_root=tmp_path, now=NOW)
    assert attachments_of(message) == [("Bericht März.xlsx", XLSX, b"PK")]


# --- attachment safety


@pytest.fixture
def root(tmp_path: Path) -> Path:
    inside = tmp_path / "reports"
    inside.mkdir()
    (inside / "sales.xlsx").write_bytes(b"PK inside")
    outside = tmp_path / "private"
    outside.mkdir()
    (outside / "secret.txt").write_bytes(b"do not mail me")
    return inside


def test_relative_path_is_taken_from_the_root(root: Path) -> None:
    assert read_attachment("sales.xlsx", root) == ("sales.xlsx", b"PK inside")


def test_path_outside_the_root_is_refused(root: Path) -> None:
    secret = root.parent / "private" / "secret.txt"
    with pytest.raises(AttachmentError, match="outside the attachments root") as refused:
        build_message(event(attachments=(str(secret),)), attachments_root=root, now=NOW)
    assert refused.value.path == str(secret)


@pytest.mark.parametrize("raw", ["../private/secret.txt", "{root}/../private/secret.txt",
                                 "/etc/passwd", "{root}/../private/missing.txt"])
def test_escapes_are_refused_before_the_file_system_is_asked(root: Path, raw: str) -> None:
    # A missing file outside the root gets the same answer: nothing leaks about what exists.
    with pytest.raises(AttachmentError, match="outside the attachments root"):
        read_attachment(raw.format(root=root), root)


def test_symlink_escaping_the_root_is_refused(root: Path) -> None:
    link = root / "innocent.xlsx"
    link.symlink_to(root.parent / "private" / "secret.txt")
    with pytest.raises(AttachmentError, match="is a symbolic link; refusing") as refused:
        read_attachment(str(link), root)
    assert str(root.parent / "private") not in str(refused.value)  # the path as given only


def test_symlinked_directory_escaping_the_root_is_refused(root: Path) -> None:
    (root / "shared").symlink_to(root.parent / "private", target_is_directory=True)
    with pytest.raises(AttachmentError, match="passes through a symbolic link"):
        read_attachment(str(root / "shared" / "secret.txt"), root)


def test_no_symlink_below_the_root_is_followed_even_one_within_it(root: Path) -> None:
    # Following links that stay inside would need a resolve-then-open, which can be raced.
    (root / "latest.xlsx").symlink_to(root / "sales.xlsx")
    with pytest.raises(AttachmentError, match="symbolic link"):
        read_attachment(str(root / "latest.xlsx"), root)


def test_a_directory_swapped_for_a_symlink_never_leads_outside(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race of issue 10, made deterministic: a directory inside the root is swapped for a
    link to a directory outside right before the n-th file-system call the read makes, for
    every n the read reaches; no read may return the outside file."""
    outside = root.parent / "private"
    (outside / "report.csv").write_bytes(b"outside")
    real, parked = root / "monthly", root / "parked"
    results: list[bytes] = []
    for swap_at in itertools.count(1):
        if real.is_symlink():
            real.unlink()
            parked.rename(real)
        else:
            real.mkdir()
            (real / "report.csv").write_bytes(b"inside")
        calls = 0

        def swapping(call: Any, swap_at: int = swap_at) -> Any:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                nonlocal calls
                calls += 1
                if calls == swap_at:
                    real.rename(parked)
                    real.symlink_to(outside, target_is_directory=True)
                return call(*args, **kwargs)
            return wrapper

        for name in ("open", "stat", "lstat"):
            monkeypatch.setattr(os, name, swapping(getattr(os, name)))
        try:
            results.append(read_attachment("monthly/report.csv", root)[1])
        except AttachmentError:
            results.append(b"refused")
        finally:
            monkeypatch.undo()
        if calls < swap_at:
            break  # this read ended before the swap: every moment has been tried
    assert b"outside" not in results
    assert results[-1] == b"inside"


def test_root_reached_through_a_symlink_is_still_the_root(root: Path) -> None:
    alias = root.parent / "alias"
    alias.symlink_to(root, target_is_directory=True)
    assert read_attachment(str(alias / "sales.xlsx"), alias) == ("sales.xlsx", b"PK inside")
    assert read_attachment(str(root / "sales.xlsx"), alias) == ("sales.xlsx", b"PK inside")


def test_missing_attachment(root: Path) -> None:
    with pytest.raises(AttachmentError, match="does not exist"):
        read_attachment(str(root / "gone.xlsx"), root)


def test_directory_is_not_an_attachment(root: Path) -> None:
    (root / "folder.xlsx").mkdir()
    with pytest.raises(AttachmentError, match="not a regular file"):
        read_attachment(str(root / "folder.xlsx"), root)


def test_fifo_is_refused_without_blocking(root: Path) -> None:
    os.mkfifo(root / "pipe.csv")
    with pytest.raises(AttachmentError, match="not a regular file"):
        read_attachment(str(root / "pipe.csv"), root)


@pytest.mark.timeout(10)
def test_a_fifo_swapped_in_after_any_check_does_not_block(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The swap happens at the last moment: right before the file itself is opened.
    real_open = os.open

    def swap_then_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if path == "sales.xlsx":
            os.unlink(root / "sales.xlsx")
            os.mkfifo(root / "sales.xlsx")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", swap_then_open)
    with pytest.raises(AttachmentError, match="not a regular file"):
        read_attachment("sales.xlsx", root)


def test_an_attachment_over_the_limit_is_refused(root: Path) -> None:
    (root / "big.csv").write_bytes(b"x" * 101)
    assert read_attachment("big.csv", root, max_bytes=101)[1] == b"x" * 101
    with pytest.raises(AttachmentError, match="101 bytes, over the limit of 100"):
        read_attachment("big.csv", root, max_bytes=100)


def test_attachments_over_the_total_limit_are_refused(root: Path) -> None:
    from postroom.rules import SizeLimits

    (root / "a.csv").write_bytes(b"x" * 60)
    (root / "b.csv").write_bytes(b"y" * 60)
    limits = SizeLimits(attachment_max_bytes=100, attachments_total_max_bytes=100)
    with pytest.raises(AttachmentError, match="more than 100 bytes"):
        build_message(event(attachments=("a.csv", "b.csv")), attachments_root=root, now=NOW,
                      limits=limits)


@pytest.mark.parametrize("raw", ["/proc/self/environ", "/sys/kernel/notes", "/dev/zero"])
def test_pseudo_file_systems_are_refused_even_without_a_root(raw: str) -> None:
    with pytest.raises(AttachmentError, match="pseudo file system"):
        read_attachment(raw, None)


def test_unreadable_attachment(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests may run as root, for whom chmod 000 does not stop a read: fail the open instead.
    def refuse(*args: object, **kwargs: object) -> int:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "open", refuse)
    with pytest.raises(AttachmentError, match=r"cannot be read: .*Permission denied"):
        read_attachment(str(root / "sales.xlsx"), root)


def test_control_character_in_an_attachment_path_is_refused(root: Path) -> None:
    with pytest.raises(AttachmentError, match="control character"):
        read_attachment("sales\n.xlsx", root)


def test_without_a_root_any_readable_path_is_allowed(root: Path) -> None:
    secret = root.parent / "private" / "secret.txt"
    assert read_attachment(str(secret), None) == ("secret.txt", b"do not mail me")


@pytest.mark.parametrize(("attachments", "root", "refusal"), [
    ((), None, None),
    ((), Path("/srv/reports"), None),
    (("q3.xlsx",), Path("/srv/reports"), None),
    (("q3.xlsx",), None, "POSTROOM_ATTACHMENTS_ROOT is not set: attachments are off"),
    (("/srv/reports/q3.xlsx", "b.pdf"), None,
     "POSTROOM_ATTACHMENTS_ROOT is not set: attachments are off"),
])
def test_attachments_policy(attachments: tuple[str, ...], root: Path | None,
                            refusal: str | None) -> None:
    assert attachments_refusal(event(attachments=attachments), root) == refusal


def _bytes_read(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of every os.read from now on."""
    sizes: list[int] = []
    real_read = os.read

    def counting_read(fd: int, n: int) -> bytes:
        data = real_read(fd, n)
        sizes.append(len(data))
        return data

    monkeypatch.setattr(os, "read", counting_read)
    return sizes


def test_a_file_past_the_total_is_refused_by_its_size_before_it_is_read(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from postroom.rules import SizeLimits

    for name in "abcdefgh":
        (root / f"{name}.csv").write_bytes(name.encode() * 60)
    limits = SizeLimits(attachment_max_bytes=100, attachments_total_max_bytes=100)
    read = _bytes_read(monkeypatch)
    with pytest.raises(AttachmentError, match=r"'b.csv' is 60 bytes, which would take the "
                                              r"attachments to more than 100 bytes"):
        build_message(event(attachments=tuple(f"{n}.csv" for n in "abcdefgh")),
                      attachments_root=root, now=NOW, limits=limits)
    assert sum(read) == 60  # a.csv only: b.csv was refused by its size, the rest never opened


def test_a_file_is_read_no_further_than_the_total_leaves(root: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from postroom.rules import SizeLimits
    from postroom.sender.attachments import FilesBudget

    (root / "a.csv").write_bytes(b"a" * 90)
    budget = FilesBudget(100)
    budget.used = 50
    read = _bytes_read(monkeypatch)
    # fstat says 90 bytes, under the file's own limit; the budget has 50 left: refused unread.
    with pytest.raises(AttachmentError, match="90 bytes, which would take"):
        read_attachment("a.csv", root, max_bytes=SizeLimits().attachment_max_bytes, budget=budget)
    assert read == []
    budget.used = 10
    assert read_attachment("a.csv", root, budget=budget)[1] == b"a" * 90
    assert budget.used == 100
