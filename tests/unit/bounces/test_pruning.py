"""What the intake keeps of a message as it arrives: every report reads the same kept as whole (the
fixtures, a complaint about an email with a 3.3 MB attachment), however the DATA is split; and,
whatever arrives, at most KEPT_MAX_BYTES is kept (junk, many parts, deep nesting, huge headers)."""

from __future__ import annotations

import re
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from postroom.bounces import pruning
from postroom.bounces.errors import Refusal, UnusableReportError
from postroom.bounces.pruning import KEPT_MAX_BYTES, Kept, Pruner
from postroom.bounces.reports import Report, parse_report
from postroom.schemas.codec import DeliveryStatus
from support.bounce_reports import feedback_report, original_with_attachment
from support.fuzz import examples

FIXTURES = Path(__file__).parents[2] / "fixtures" / "bounces"
MiB = 1024 * 1024


def wire(raw: bytes) -> bytes:
    """``raw`` as DATA carries it: CRLF lines, a leading dot doubled (RFC 5321 4.5.2)."""
    return re.sub(rb"(?m)^\.", b"..", re.sub(rb"\r?\n", b"\r\n", raw))


def pruned(raw: bytes, step: int | None = None) -> Kept:
    pruner = Pruner()
    data = wire(raw)
    for start in range(0, len(data), step or len(data) or 1):
        pruner.feed(data[start:start + (step or len(data))])
    return pruner.close()


def read(raw: bytes) -> Report | Refusal:
    try:
        return parse_report(raw)
    except UnusableReportError as exc:
        return exc.refusal


@pytest.mark.parametrize("step", [None, 1, 2, 7, 4096])
@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("*.eml")))
def test_each_fixture_reads_the_same_kept_as_whole(name: str, step: int | None) -> None:
    raw = (FIXTURES / name).read_bytes()
    kept = pruned(raw, step)
    assert kept == pruned(raw)
    assert not kept.pruned
    assert read(kept.message) == read(re.sub(rb"\r?\n", b"\r\n", raw))


def test_a_complaint_about_an_email_with_a_large_attachment_keeps_its_report_only() -> None:
    raw = feedback_report(original_with_attachment(3_300_000))
    assert len(raw) > 4 * MiB  # base64: over the 4 MiB the intake refused before
    kept = pruned(raw, 65536)
    assert len(kept.message) < 8 * 1024
    assert kept.received == len(wire(raw))
    report = read(kept.message)
    assert report == read(raw)
    assert isinstance(report, Report)
    [notice] = report.notices
    assert (report.kind, notice.status, notice.recipient) == (
        "feedback", DeliveryStatus.COMPLAINED, "ceo@example.com")
    assert report.token_hints == ("bounces+TOKEN@bounce.example.com",) * 2


def test_a_text_part_is_kept_up_to_its_cap_and_the_status_after_it_is_read() -> None:
    raw = (FIXTURES / "postfix_failed.eml").read_bytes()
    big = raw.replace(b"This is the mail system at host",
                      b"filler\n" * (pruning.TEXT_PART_MAX_BYTES // 4) + b"This is the mail")
    kept = pruned(big, 8192)
    assert kept.pruned
    assert len(kept.message) < pruning.TEXT_PART_MAX_BYTES + 8192
    assert read(kept.message) == read(raw)


def test_a_leading_dot_is_undone_in_what_is_kept() -> None:
    kept = pruned(b"Subject: dots\n\n.hidden\n..two\n")
    assert kept.message == b"Subject: dots\r\n\r\n.hidden\r\n..two\r\n"


@pytest.mark.parametrize(("name", "raw"), [
    ("one text part of 4 MiB", b"Subject: junk\r\n\r\n" + (b"x" * 70 + b"\r\n") * (4 * MiB // 72)),
    ("lines of 4 MiB", b"Subject: junk\r\n\r\n" + b"y" * (4 * MiB) + b"\r\n"),
    ("an attachment of 4 MiB", b"Content-Type: application/octet-stream\r\n\r\n"
     + (b"A" * 76 + b"\r\n") * (4 * MiB // 78)),
    ("100,000 parts", b"Content-Type: multipart/mixed; boundary=b\r\n\r\n"
     + b"--b\r\nContent-Type: text/plain\r\n\r\nx\r\n" * 100_000 + b"--b--\r\n"),
    ("a header block of 4 MiB", b"X-Junk: j\r\n" * (4 * MiB // 11) + b"\r\nbody\r\n"),
    ("10,000 nested multiparts", b"".join(
        b"Content-Type: multipart/mixed; boundary=b%d\r\n\r\n--b%d\r\n" % (i, i)
        for i in range(10_000)) + b"\r\ntext\r\n"),
    ("10,000 enclosed messages", b"Content-Type: message/rfc822\r\n\r\n" * 10_000),
])
def test_whatever_arrives_at_most_the_cap_is_kept(name: str, raw: bytes) -> None:
    kept = pruned(raw, 65536)
    assert len(kept.message) <= KEPT_MAX_BYTES
    assert kept.received == len(wire(raw))
    read(kept.message)  # reads as a report or a refusal


def test_parts_past_the_cap_are_dropped_and_the_message_stays_well_formed() -> None:
    raw = (b"Content-Type: multipart/mixed; boundary=b\r\n\r\n"
           + b"--b\r\nContent-Type: text/plain\r\n\r\npart\r\n" * (pruning.MAX_PARTS + 50)
           + b"--b--\r\n")
    kept = pruned(raw)
    assert kept.pruned
    assert kept.message.count(b"\r\npart\r\n") == pruning.MAX_PARTS
    assert kept.message.endswith(b"--b--\r\n")


@pytest.mark.parametrize("line", [b"-\r\n", b"-\n", b"--b-x\r\n", b"-: header\r\n"])
@pytest.mark.parametrize("head", [
    b"Content-Type: application/octet-stream\r\n\r\n",  # a body dropped
    b"Content-Type: multipart/mixed; boundary=b\r\n\r\n",  # a preamble
    b"Subject: s\r\n",  # a header block past its cap
])
def test_lines_that_may_be_delimiters_are_looked_at_one_by_one_up_to_a_cap(
        head: bytes, line: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    """A body of lines that start with "-" is looked at line by line, on the event loop: past
    LINES_MAX the rest is read without looking (it was 1 s of CPU a MiB, 40 s a message)."""
    looked_at = 0
    end_line = Pruner._end_line

    def counting(self: Pruner) -> None:
        nonlocal looked_at
        looked_at += 1
        end_line(self)

    monkeypatch.setattr(Pruner, "_end_line", counting)
    pruner = Pruner()
    pruner.feed(head)
    junk = line * (65536 // len(line))
    for _ in range(64):  # 4 MiB
        pruner.feed(junk)
    kept = pruner.close()
    assert kept.pruned
    assert kept.received == len(head) + 64 * len(junk)
    assert looked_at <= pruning.LINES_MAX + 1
    read(kept.message)


_LINES = st.sampled_from([
    b"\r\n", b"\n", b"--b\r\n", b"--b--\r\n", b"--c\r\n", b"--c--  \r\n", b"--b-x\r\n", b"-\r\n",
    b"Content-Type: multipart/mixed; boundary=b\r\n",
    b"Content-Type: multipart/report; boundary=c\r\n",
    b"Content-Type: message/rfc822\r\n", b"Content-Type: message/delivery-status\r\n",
    b"Content-Type: application/pdf\r\n", b"Content-Type: text/plain\r\n",
    b"Subject: s\r\n", b" folded\r\n", b"Action: failed\r\n", b"..dot\r\n", b".\r\n",
    b"text line\r\n", b"no newline", b"\r",
])


@settings(max_examples=examples(300), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(_LINES, max_size=60), cuts=st.lists(st.integers(0, 3000), max_size=8),
       lines_max=st.sampled_from([pruning.LINES_MAX, 3, 20]))
def test_what_is_kept_does_not_depend_on_how_the_data_is_split(
        lines: list[bytes], cuts: list[int], lines_max: int) -> None:
    data = b"".join(lines)
    with mock.patch.object(pruning, "LINES_MAX", lines_max):
        _kept_the_same_however_split(data, cuts)


def _kept_the_same_however_split(data: bytes, cuts: list[int]) -> None:
    whole = Pruner()
    whole.feed(data)
    expected = whole.close()
    split = Pruner()
    start = 0
    for cut in sorted({c for c in cuts if c < len(data)}):
        split.feed(data[start:cut])
        start = cut
    split.feed(data[start:])
    assert split.close() == expected
    assert len(expected.message) <= KEPT_MAX_BYTES


@settings(max_examples=examples(200), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=4000), step=st.integers(1, 600))
def test_any_bytes_are_read_within_the_cap(data: bytes, step: int) -> None:
    pruner = Pruner()
    for start in range(0, len(data), step):
        pruner.feed(data[start:start + step])
    kept = pruner.close()
    assert kept.received == len(data)
    assert len(kept.message) <= KEPT_MAX_BYTES


_ACTIONS = st.sampled_from(["failed", "delayed", "delivered", "relayed", "expanded"])


@st.composite
def delivery_reports(draw: st.DrawFn) -> bytes:
    """A DSN as an MTA may write it: a notice of any length, 1-5 recipient blocks, and the
    original enclosed whole (with an attachment of any size), as headers only, or not at all."""
    envid = draw(st.sampled_from(["1-a-aaaa", "none"]))
    blocks = [f"Reporting-MTA: dns; mx.example.com\nOriginal-Envelope-Id: {envid}\n"]
    for n in range(draw(st.integers(1, 5))):
        blocks.append(f"Final-Recipient: rfc822; r{n}@example.com\n"
                      f"Original-Recipient: rfc822;r{n}@example.com\n"
                      f"Action: {draw(_ACTIONS)}\nStatus: 5.1.{n}\n"
                      f"Diagnostic-Code: smtp; 550 5.1.{n} no\n")
    parts = [b"Content-Type: text/plain\n\n"
             + b"x" * draw(st.integers(0, 3 * pruning.TEXT_PART_MAX_BYTES)) + b"\n",
             b"Content-Type: message/delivery-status\n\n" + "\n".join(blocks).encode()]
    enclosed = draw(st.sampled_from(["whole", "headers", "none"]))
    if enclosed == "whole":
        original = original_with_attachment(draw(st.integers(0, 2_000_000)),
                                            return_path="bounces+1-a-aaaa@bounce.example.com")
        original.set_boundary("=O=")  # not the email package's random one
        parts.append(b"Content-Type: message/rfc822\n\n" + original.as_bytes())
    elif enclosed == "headers":
        parts.append(b"Content-Type: text/rfc822-headers\n\n"
                     b"Return-Path: <bounces+1-a-aaaa@bounce.example.com>\nSubject: s\n")
    return (b"From: MAILER-DAEMON@mx.example.com\nSubject: Undelivered Mail\nMIME-Version: 1.0\n"
            b"Content-Type: multipart/report; report-type=delivery-status; boundary=\"=B=\"\n\n"
            + b"".join(b"--=B=\n" + part + b"\n" for part in parts) + b"--=B=--\n")


@settings(max_examples=examples(40), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(raw=delivery_reports(), step=st.sampled_from([None, 997, 65536]))
def test_a_report_reads_the_same_kept_as_whole(raw: bytes, step: int | None) -> None:
    kept = pruned(raw, step)
    assert len(kept.message) <= KEPT_MAX_BYTES
    assert read(kept.message) == read(re.sub(rb"\r?\n", b"\r\n", raw))
