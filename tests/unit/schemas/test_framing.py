"""The two framings: schemaless Avro with a fingerprint header, and the Confluent wire format; a
reader takes either, and neither is taken for the other."""

from __future__ import annotations

import datetime as dt
import re

import pytest

from postroom.schemas.codec import EmailRequested, EmailResult, Schema, encode, load_schema
from postroom.schemas.decoding import decode
from postroom.schemas.errors import SchemaError
from postroom.schemas.framing import SCHEMA_HEADER, SCHEMALESS, Framing, confluent_prefix, split_confluent
from postroom.topics import all_topics, results_topic, topic_schemas, value_subject

CREATED = dt.datetime(2026, 9, 30, 23, 59, 58, 125000, tzinfo=dt.UTC)
EVENT = EmailRequested(
    idempotency_key="sales-report-2026-09|anna@example.com", message_key="sales-report-2026-09",
    outbox_id=7, recipient="anna@example.com", sender="reports@example.com",
    subject="Sales", body="Hello", attachments=(), priority="normal", created_at=CREATED)
TOPIC = "t.email.normal"


@pytest.mark.parametrize(("schema_id", "expected"), [
    (0, b"\x00\x00\x00\x00\x00"),
    (1, b"\x00\x00\x00\x00\x01"),
    (258, b"\x00\x00\x00\x01\x02"),
    (2**32 - 1, b"\x00\xff\xff\xff\xff"),
])
def test_confluent_prefix(schema_id: int, expected: bytes) -> None:
    assert confluent_prefix(schema_id) == expected
    assert split_confluent(expected + b"body") == (schema_id, b"body")


@pytest.mark.parametrize("schema_id", [-1, 2**32])
def test_confluent_prefix_refuses_ids_that_do_not_fit(schema_id: int) -> None:
    with pytest.raises(SchemaError, match="does not fit"):
        confluent_prefix(schema_id)


@pytest.mark.parametrize("payload", [b"", b"\x00\x00\x00\x01", b"\x01\x00\x00\x00\x01x", b"\x0ekey"])
def test_split_confluent_refuses_what_is_not_framed(payload: bytes) -> None:
    assert split_confluent(payload) is None


def test_schemaless_framing_is_todays_format() -> None:
    value, headers = SCHEMALESS.frame(TOPIC, EVENT)
    assert value == encode(EVENT)
    assert headers == [(SCHEMA_HEADER, load_schema("email_requested").fingerprint.encode())]
    assert not SCHEMALESS.uses_registry


def test_registry_framing_prefixes_the_same_body_and_drops_the_fingerprint_header() -> None:
    framing = Framing({TOPIC: 42})
    value, headers = framing.frame(TOPIC, EVENT)
    assert value == b"\x00\x00\x00\x00\x2a" + encode(EVENT)
    # no postroom.schema header: a fingerprint-only reader refuses the record, never misreads it
    assert headers == []
    with pytest.raises(SchemaError, match="no schema registry is configured"):
        decode(EmailRequested, value, headers)


def test_registry_framing_without_an_id_for_the_topic_says_what_to_run() -> None:
    with pytest.raises(SchemaError, match=r"t.email.high .*postroom schemas register"):
        Framing({TOPIC: 42}).frame("t.email.high", EVENT)


def lookup(known: dict[int, Schema]) -> object:
    def schema_by_id(schema_id: int) -> Schema:
        try:
            return known[schema_id]
        except KeyError:
            raise SchemaError(f"the schema registry has no schema id {schema_id}") from None
    return schema_by_id


def test_a_reader_takes_both_framings() -> None:
    schema_by_id = lookup({42: load_schema("email_requested")})
    framed, framed_headers = Framing({TOPIC: 42}).frame(TOPIC, EVENT)
    plain, plain_headers = SCHEMALESS.frame(TOPIC, EVENT)
    assert decode(EmailRequested, framed, framed_headers, schema_by_id=schema_by_id) == EVENT
    assert decode(EmailRequested, plain, plain_headers, schema_by_id=schema_by_id) == EVENT
    assert decode(EmailRequested, plain, plain_headers) == EVENT


def test_a_framed_record_resolves_the_registrys_writer_schema_to_the_readers() -> None:
    result = EmailResult(idempotency_key="k|a@b.c", outbox_id=1, recipient="a@b.c",
                         status="sent", attempt=1, occurred_at=CREATED)  # type: ignore[arg-type]
    value, headers = Framing({"t.email.results": 3}).frame("t.email.results", result)
    decoded = decode(EmailResult, value, headers,
                     schema_by_id=lookup({3: load_schema("email_result")}))
    assert decoded.idempotency_key == "k|a@b.c" and decoded.status.value == "sent"


@pytest.mark.parametrize(("schema_by_id", "problem"), [
    (None, "Confluent wire format (schema id 42) but no schema registry is configured"),
    (lookup({}), "has no schema id 42"),
])
def test_a_framed_record_without_its_writer_schema_is_unreadable(schema_by_id: object,
                                                                 problem: str) -> None:
    value, headers = Framing({TOPIC: 42}).frame(TOPIC, EVENT)
    with pytest.raises(SchemaError, match=re.escape(problem)):
        decode(EmailRequested, value, headers, schema_by_id=schema_by_id)  # type: ignore[arg-type]


def test_a_framed_record_with_a_bad_body_is_unreadable() -> None:
    with pytest.raises(SchemaError, match="cannot decode EmailRequested"):
        decode(EmailRequested, b"\x00\x00\x00\x00\x2a\xff\xff", [],
               schema_by_id=lookup({42: load_schema("email_requested")}))  # type: ignore[arg-type]


def test_every_topic_has_its_contract_schema_and_subject() -> None:
    schemas = topic_schemas("p.", 2)
    assert list(schemas) == all_topics("p.", 2)
    assert schemas[results_topic("p.")] == "email_result"
    assert {name for topic, name in schemas.items() if topic != results_topic("p.")} == {
        "email_requested"}
    assert value_subject("p.email.high") == "p.email.high-value"
