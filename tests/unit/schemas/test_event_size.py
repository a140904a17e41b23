"""requested_event_size counts what the record takes when encoded (its value and its schema
header), for any values an EmailRequested may hold, and refuses what the encoder refuses (issue
26); it imports no Avro library to do it."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from postroom.schemas.codec import EmailRequested, EmailResult, encode
from postroom.schemas.errors import SchemaError
from postroom.schemas.framing import SCHEMA_HEADER, headers_for
from postroom.schemas.sizes import SCHEMA_HEADER_BYTES, requested_event_size
from support.fuzz import examples

TEXT = st.text(max_size=300) | st.text(st.characters(codec="utf-8"), min_size=60, max_size=9000)
PATHS = st.lists(st.text(max_size=200), max_size=20)
# hypothesis takes naive bounds and makes them aware with the given zones
MOMENTS = st.datetimes(min_value=dt.datetime(1, 1, 1), max_value=dt.datetime(9999, 12, 31),  # noqa: DTZ001
                       timezones=st.just(dt.UTC))
OUTBOX_IDS = st.integers(0, 2**63 - 1) | st.sampled_from([0, 63, 64, 2**63 - 1])


def _values(draw: st.DrawFn) -> dict[str, object]:
    return {"idempotency_key": draw(TEXT), "message_key": draw(TEXT),
            "outbox_id": draw(OUTBOX_IDS), "recipient": draw(TEXT), "sender": draw(TEXT),
            "subject": draw(TEXT), "body": draw(TEXT), "attachments": draw(PATHS),
            "priority": draw(st.sampled_from(["high", "normal", "low"])),
            "created_at": draw(MOMENTS), "html": draw(st.none() | TEXT), "inline": draw(PATHS)}


@st.composite
def requested(draw: st.DrawFn) -> dict[str, object]:
    return _values(draw)


def event_size(event: EmailRequested | EmailResult) -> int:
    """Bytes of ``event``'s Kafka record in the schemaless framing: the reference."""
    return len(encode(event)) + sum(len(k) + len(v) for k, v in headers_for(event))


def _encoded_size(values: dict[str, object]) -> int:
    event = EmailRequested(**{**values, "attachments": tuple(values["attachments"]),  # type: ignore[arg-type]
                              "inline": tuple(values["inline"])})  # type: ignore[arg-type]
    return event_size(event)


@settings(max_examples=examples(500))
@given(requested())
def test_counted_size_is_the_encoded_size(values: dict[str, object]) -> None:
    assert requested_event_size(**values) == _encoded_size(values)  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["subject", "body", "recipient", "html"])
def test_a_lone_surrogate_is_refused_by_both(field: str) -> None:
    values: dict[str, object] = {
        "idempotency_key": "k|a@b.c", "message_key": "k", "outbox_id": 2**63 - 1,
        "recipient": "a@b.c", "sender": "", "subject": "s", "body": "b", "attachments": ["/x"],
        "priority": "normal", "created_at": dt.datetime.now(dt.UTC), "html": None, "inline": []}
    values[field] = "bad \ud800 text"
    with pytest.raises(SchemaError):
        _encoded_size(values)
    with pytest.raises(SchemaError):
        requested_event_size(**values)  # type: ignore[arg-type]


def test_the_counted_header_is_the_framing_s_header() -> None:
    """sizes.py counts the header without fastavro (which computes the fingerprint)."""
    headers = headers_for(EmailRequested)
    assert [name for name, _ in headers] == [SCHEMA_HEADER]
    assert SCHEMA_HEADER_BYTES == sum(len(k) + len(v) for k, v in headers)


def test_counting_imports_no_avro_library() -> None:
    code = ("import sys; from postroom.schemas import sizes; "
            "print(sorted(m for m in ('fastavro', 'postroom.schemas.codec') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          timeout=60)
    assert proc.stdout.strip() == "[]"
