"""The results contract's second version (bounced, delayed, complained, from postroom bounces):
today's recorder reads version 1 results, a version 1 reader reads the old statuses of version 2,
and a status unknown to a reader is read as its enum default, delayed (state unchanged)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import io
import json
from typing import Any

import fastavro
import pytest

from postroom.schemas.codec import DeliveryStatus, EmailResult, encode, load_schema, parse_schema_text
from postroom.schemas.decoding import decode, earlier_versions
from postroom.schemas.errors import SchemaError
from postroom.schemas.framing import SCHEMA_HEADER, headers_for

NOW = dt.datetime(2026, 10, 2, 7, 0, tzinfo=dt.UTC)
V1 = earlier_versions("email_result")[0]
V2 = load_schema("email_result")
RESULT = EmailResult(idempotency_key="sales-2026-09|old.manager@example.com", outbox_id=7,
                     recipient="old.manager@example.com", status=DeliveryStatus.SENT, attempt=1,
                     occurred_at=NOW)
NEW_STATUSES = [DeliveryStatus.BOUNCED, DeliveryStatus.DELAYED, DeliveryStatus.COMPLAINED]


def status_type(schema: Any) -> dict[str, Any]:
    [field] = [f for f in schema["fields"] if f["name"] == "status"]
    return dict(field["type"])


def test_version_2_appends_three_symbols_with_a_default() -> None:
    old, new = status_type(json.loads(V1.text)), status_type(json.loads(V2.text))
    assert new["symbols"][:len(old["symbols"])] == old["symbols"]
    assert new["symbols"][len(old["symbols"]):] == ["bounced", "delayed", "complained"]
    assert new["default"] == "delayed" and "default" not in old
    assert [s.value for s in DeliveryStatus] == new["symbols"]
    assert V1.fingerprint != V2.fingerprint


def test_todays_recorder_reads_results_of_version_1() -> None:
    written = encode(dataclasses.replace(RESULT, smtp_code=250), V1)
    read = decode(EmailResult, written, [(SCHEMA_HEADER, V1.fingerprint.encode())])
    assert read == dataclasses.replace(RESULT, smtp_code=250)


@pytest.mark.parametrize("status", [DeliveryStatus.SENT, DeliveryStatus.DEAD])
def test_a_version_1_reader_reads_the_old_statuses_of_version_2(status: DeliveryStatus) -> None:
    result = dataclasses.replace(RESULT, status=status)
    assert decode(EmailResult, encode(result), headers_for(result), writers={V2.fingerprint: V2},
                  reader=V1) == result


@pytest.mark.parametrize("status", NEW_STATUSES)
def test_a_version_1_reader_refuses_the_new_statuses(status: DeliveryStatus) -> None:
    """Why the recorder is upgraded before ``postroom bounces`` starts (docs/operations.md): the
    previous release has no default to read them as."""
    result = dataclasses.replace(RESULT, status=status, attempt=0)
    with pytest.raises(SchemaError):
        decode(EmailResult, encode(result), headers_for(result), writers={V2.fingerprint: V2},
               reader=V1)


@pytest.mark.parametrize("status", NEW_STATUSES)
def test_the_new_statuses_round_trip(status: DeliveryStatus) -> None:
    result = dataclasses.replace(RESULT, status=status, smtp_code=550, enhanced_code="5.1.1",
                                 error="550 5.1.1 <old.manager@example.com>: user unknown")
    assert decode(EmailResult, encode(result), headers_for(result)) == result


def test_a_status_of_a_newer_writer_is_read_as_delayed() -> None:
    raw = json.loads(V2.text)
    for field in raw["fields"]:
        if field["name"] == "status":
            field["type"]["symbols"].append("unsubscribed")
    newer = parse_schema_text(json.dumps(raw), "email_result v3 (unsubscribed)")
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, newer.parsed, {
        "idempotency_key": RESULT.idempotency_key, "outbox_id": 7, "recipient": RESULT.recipient,
        "status": "unsubscribed", "attempt": 1, "occurred_at": NOW})
    read = decode(EmailResult, buf.getvalue(), [(SCHEMA_HEADER, newer.fingerprint.encode())],
                  writers={newer.fingerprint: newer})
    assert read.status is DeliveryStatus.DELAYED
