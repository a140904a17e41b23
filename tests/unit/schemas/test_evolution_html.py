"""The contract's first evolution, email_requested version 2 (html, inline): version 1 readers
read version 2 records and send their text part; today's reader reads version 1 records."""

from __future__ import annotations

import dataclasses
import datetime as dt

from postroom.schemas.codec import EmailRequested, encode, load_schema
from postroom.schemas.decoding import decode, earlier_versions
from postroom.schemas.framing import SCHEMA_HEADER, headers_for
from postroom.sender.message import build_message

NOW = dt.datetime(2026, 10, 2, 7, 0, tzinfo=dt.UTC)
V1 = earlier_versions("email_requested")[0]
V2 = load_schema("email_requested")
EVENT = EmailRequested(
    idempotency_key="sales-report-2026-09|ceo@example.com", message_key="sales-report-2026-09",
    outbox_id=4, recipient="ceo@example.com", sender="reports@example.com",
    subject="Sales report", body="Revenue 1,200 (text)", attachments=(), priority="high",
    created_at=NOW, html="<table><tr><td>Revenue</td><td>1,200</td></tr></table>")


def test_version_2_adds_html_and_inline_with_defaults_at_the_end() -> None:
    v1 = [f["name"] for f in V1.parsed["fields"]]
    added = V2.parsed["fields"][len(v1):]
    assert [f["name"] for f in V2.parsed["fields"]][:len(v1)] == v1
    assert [(f["name"], f["default"]) for f in added] == [("html", None), ("inline", [])]
    assert V1.fingerprint != V2.fingerprint


def test_a_version_1_sender_reads_version_2_records_and_sends_the_text_part() -> None:
    # A sender of the previous release: version 1 is its reader schema; it has learned of the
    # version 2 writer schema (from the registry by id, or shipped as a known writer).
    old_view = decode(EmailRequested, encode(EVENT), headers_for(EVENT),
                      writers={V2.fingerprint: V2}, reader=V1)
    assert old_view.html is None
    assert old_view == dataclasses.replace(EVENT, html=None)
    message = build_message(old_view, attachments_root=None, now=NOW)
    assert message.get_content_type() == "text/plain"
    assert "Revenue 1,200 (text)" in message.get_content()


def test_todays_sender_reads_version_1_records_with_the_new_fields_defaulted() -> None:
    old = dataclasses.replace(EVENT, html=None)
    written_by_v1 = encode(old, V1)
    assert written_by_v1 != encode(old)  # v1 has no html or inline fields
    read = decode(EmailRequested, written_by_v1, [(SCHEMA_HEADER, V1.fingerprint.encode())])
    assert read == old and read.inline == ()
    assert build_message(read, attachments_root=None, now=NOW).get_content_type() == "text/plain"
