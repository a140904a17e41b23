"""The Avro contract and its codec: schemas parse, events round-trip, unreadable bytes raise
SchemaError (the poison handling of sender and recorder relies on it), and the contract evolves."""

from __future__ import annotations

import dataclasses
import datetime as dt
import io
import json
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import fastavro
import pytest
from fastavro.read import SchemaResolutionError
from fastavro.schema import to_parsing_canonical_form

from postroom.schemas.codec import (
    DeliveryStatus,
    EmailRequested,
    EmailResult,
    Schema,
    encode,
    encode_values,
    load_schema,
    parse_schema_text,
)
from postroom.schemas.compiled_writer import RecordWriter
from postroom.schemas.decoding import decode, earlier_versions, known_writer_schemas
from postroom.schemas.errors import SchemaError
from postroom.schemas.framing import SCHEMA_HEADER, header_value, headers_for

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
SCHEMA_FILES = sorted(p.name for p in resources.files("schemas").iterdir()
                      if p.name.endswith(".avsc"))
CEST = dt.timezone(dt.timedelta(hours=2))
# Timestamps are timestamp-millis: values with whole milliseconds survive a round trip exactly.
CREATED = dt.datetime(2026, 9, 30, 23, 59, 58, 125000, tzinfo=dt.UTC)

FULL_REQUEST = EmailRequested(
    idempotency_key="sales-report-2026-09|anna@example.com",
    message_key="sales-report-2026-09",
    outbox_id=2**40,
    recipient="anna@example.com",
    sender="reports@example.com",
    subject="Umsätze September — 📈 Übersicht",
    body="Hallo Anna,\n\nim Anhang der Bericht.\n",
    attachments=("/srv/reports/2026-09.xlsx", "/srv/reports/Übersicht 2026-09.pdf"),
    priority="high",
    created_at=CREATED,
    attempt=3,
    not_before=dt.datetime(2026, 10, 1, 9, 0, 0, 500000, tzinfo=CEST),
)
MINIMAL_REQUEST = EmailRequested(
    idempotency_key="k|b@example.com", message_key="k", outbox_id=1, recipient="b@example.com",
    sender="", subject="s", body="", attachments=(), priority="low", created_at=CREATED)
FULL_RESULT = EmailResult(
    idempotency_key="sales-report-2026-09|anna@example.com",
    outbox_id=2**40,
    recipient="anna@example.com",
    status=DeliveryStatus.RETRYING,
    attempt=2,
    occurred_at=CREATED,
    smtp_code=451,
    enhanced_code="4.7.1",
    error="451 4.7.1 Greylisted, versuchen Sie es später — 稍后再试",
    next_attempt_at=dt.datetime(2026, 10, 1, 0, 9, 58, 125000, tzinfo=CEST),
    message_id="<20260930235958.abc@postroom>",
)
MINIMAL_RESULT = EmailResult(
    idempotency_key="k|b@example.com", outbox_id=1, recipient="b@example.com",
    status=DeliveryStatus.SENT, attempt=1, occurred_at=CREATED)


def avro_crc64(data: bytes) -> int:
    """CRC-64-AVRO (Rabin) exactly as the Avro specification writes it, to check ours against."""
    empty = 0xC15D213AA4D7A795
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (empty & -(fp & 1))
        table.append(fp)
    fp = empty
    for byte in data:
        fp = (fp >> 8) ^ table[(fp ^ byte) & 0xFF]
    return fp


def fixture_schema(name: str) -> Schema:
    return parse_schema_text((FIXTURES / name).read_text(encoding="utf-8"), name)


def variant(filename: str, edit: Callable[[dict[str, Any]], None]) -> Schema:
    """The fixture ``filename`` changed by ``edit(raw)``, parsed as yet another version."""
    raw = json.loads((FIXTURES / filename).read_text(encoding="utf-8"))
    edit(raw)
    return parse_schema_text(json.dumps(raw), f"{filename} ({edit.__name__})")


def write(schema: Schema, record: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema.parsed, record)
    return buf.getvalue()


def read(payload: bytes, writer: Schema, reader: Schema) -> Any:
    return fastavro.schemaless_reader(io.BytesIO(payload), writer.parsed, reader.parsed)


def v1_record() -> dict[str, Any]:
    return {f.name: getattr(FULL_REQUEST, f.name) for f in dataclasses.fields(FULL_REQUEST)} | {
        "attachments": list(FULL_REQUEST.attachments)}


# -- the schema files ---------------------------------------------------------------------------

def test_the_contract_has_the_two_records() -> None:
    assert SCHEMA_FILES == ["email_requested.avsc", "email_result.avsc"]


@pytest.mark.parametrize("filename", SCHEMA_FILES)
def test_every_schema_file_parses_as_one_versioned_record(filename: str) -> None:
    text = resources.files("schemas").joinpath(filename).read_text(encoding="utf-8")
    schema = parse_schema_text(text, filename)
    raw = json.loads(text)
    assert raw["type"] == "record"
    assert raw["namespace"] == "postroom.v1"
    assert len(schema.fingerprint) == 16
    int(schema.fingerprint, 16)
    assert load_schema(filename.removesuffix(".avsc")) == schema


@pytest.mark.parametrize("cls", [EmailRequested, EmailResult])
def test_dataclass_fields_are_the_schema_fields_in_order(cls: type[Any]) -> None:
    raw = json.loads(resources.files("schemas").joinpath(f"{cls.SCHEMA_NAME}.avsc").read_text())
    assert raw["name"] == cls.__name__
    assert [f.name for f in dataclasses.fields(cls)] == [f["name"] for f in raw["fields"]]


@pytest.mark.parametrize("text", [
    "{not json",
    '{"type": "record", "name": "X", "fields": [{"name": "a", "type": "strin"}]}',
    '{"type": "enum", "name": "E", "symbols": ["a", "a"]}',
])
def test_an_invalid_schema_raises_schema_error_naming_the_file(text: str) -> None:
    with pytest.raises(SchemaError, match=r"^broken\.avsc: invalid Avro schema"):
        parse_schema_text(text, "broken.avsc")


# -- round trips and the header ------------------------------------------------------------------

@pytest.mark.parametrize("event", [FULL_REQUEST, MINIMAL_REQUEST, FULL_RESULT, MINIMAL_RESULT],
                         ids=["request-full", "request-minimal", "result-full", "result-minimal"])
def test_round_trip(event: EmailRequested | EmailResult) -> None:
    decoded = decode(type(event), encode(event), headers_for(event))
    assert decoded == event
    assert isinstance(decoded, type(event))
    for field in dataclasses.fields(decoded):
        value = getattr(decoded, field.name)
        if isinstance(value, dt.datetime):
            assert value.utcoffset() == dt.timedelta(0)  # read back in UTC, same instant


@pytest.mark.parametrize("event", [FULL_REQUEST, MINIMAL_RESULT], ids=["request", "result"])
@pytest.mark.parametrize("extra", [b"\x00", b"trailing bytes"])
def test_bytes_after_the_record_are_refused(event: EmailRequested | EmailResult,
                                            extra: bytes) -> None:
    # fastavro reads one record and leaves the rest: the poison storm's valid event followed by
    # trailing bytes was admitted and delivered.
    with pytest.raises(SchemaError, match=f"{len(extra)} byte\\(s\\) after the record"):
        decode(type(event), encode(event) + extra, headers_for(event))


@pytest.mark.parametrize("event", [FULL_REQUEST, MINIMAL_REQUEST], ids=["full", "minimal"])
def test_with_sender_is_replace_with_the_sender(event: EmailRequested) -> None:
    copy = event.with_sender("Reports <reports@example.org>")
    assert copy == dataclasses.replace(event, sender="Reports <reports@example.org>")
    assert type(copy) is EmailRequested
    assert event.sender != copy.sender  # the original is untouched
    with pytest.raises(dataclasses.FrozenInstanceError):
        copy.sender = "x@example.org"  # type: ignore[misc]


@pytest.mark.parametrize("status", list(DeliveryStatus))
def test_every_delivery_status_round_trips_as_the_enum(status: DeliveryStatus) -> None:
    event = dataclasses.replace(MINIMAL_RESULT, status=status)
    decoded = decode(EmailResult, encode(event), headers_for(event))
    assert decoded.status is status


def test_timestamps_keep_milliseconds_and_drop_microseconds() -> None:
    event = dataclasses.replace(MINIMAL_REQUEST, created_at=CREATED.replace(microsecond=125999))
    assert decode(EmailRequested, encode(event), headers_for(event)).created_at == CREATED


@pytest.mark.parametrize("event", [FULL_REQUEST, FULL_RESULT], ids=["request", "result"])
def test_the_header_is_the_crc64_avro_fingerprint_of_the_canonical_form(
        event: EmailRequested | EmailResult) -> None:
    schema = load_schema(event.SCHEMA_NAME)
    expected = avro_crc64(to_parsing_canonical_form(schema.parsed).encode())
    # Little-endian, as in Avro's single-object encoding.
    assert headers_for(event) == [(SCHEMA_HEADER, expected.to_bytes(8, "little").hex().encode())]


def test_the_two_contracts_have_different_fingerprints() -> None:
    assert load_schema("email_requested").fingerprint != load_schema("email_result").fingerprint


def test_header_value_takes_the_last_one_and_accepts_str() -> None:
    headers = [(SCHEMA_HEADER, b"old"), ("other", b"x"), (SCHEMA_HEADER, "new")]
    assert header_value(headers, SCHEMA_HEADER) == b"new"
    assert header_value(headers, "missing") is None
    assert header_value(None, SCHEMA_HEADER) is None


def test_a_str_header_decodes_like_bytes() -> None:
    fp = load_schema("email_result").fingerprint
    assert decode(EmailResult, encode(FULL_RESULT), [(SCHEMA_HEADER, fp)]) == FULL_RESULT


# -- the compiled writer: fastavro's bytes, faster ---------------------------------------------

PRE_EPOCH = dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC)
ENCODED_EVENTS = [
    FULL_REQUEST, MINIMAL_REQUEST, FULL_RESULT, MINIMAL_RESULT,
    dataclasses.replace(FULL_REQUEST, outbox_id=2**63 - 1, attempt=2**31 - 1, created_at=PRE_EPOCH),
    dataclasses.replace(MINIMAL_REQUEST, outbox_id=-(2**63), attempt=-(2**31), not_before=PRE_EPOCH),
    # lengths and values on either side of the varint's one-byte limit (63 / 64 after zig-zag)
    dataclasses.replace(MINIMAL_REQUEST, body="x" * 63, subject="y" * 64, outbox_id=63,
                        attempt=64, attachments=tuple(f"/a/{n}" for n in range(64))),
    dataclasses.replace(MINIMAL_REQUEST, body="é" * 70_000, outbox_id=-64, attempt=-65,
                        priority="normal", attachments=("",)),
    dataclasses.replace(FULL_RESULT, smtp_code=-1, error="", enhanced_code="5.1.1",
                        status=DeliveryStatus.DEAD, next_attempt_at=None),
]


def fastavro_bytes(event: EmailRequested | EmailResult) -> bytes:
    record = {f.name: getattr(event, f.name) for f in dataclasses.fields(event)}
    if isinstance(event, EmailRequested):
        record["attachments"] = list(event.attachments)
    else:
        record["status"] = event.status.value
    return write(load_schema(event.SCHEMA_NAME), record)


@pytest.mark.parametrize("event", ENCODED_EVENTS)
def test_encode_writes_what_fastavro_writes(event: EmailRequested | EmailResult) -> None:
    assert encode(event) == fastavro_bytes(event)


@pytest.mark.parametrize("filename", SCHEMA_FILES)
def test_every_shipped_schema_gets_a_compiled_writer(filename: str) -> None:
    # Without one, encode() silently falls back to fastavro's slower writer.
    assert load_schema(filename.removesuffix(".avsc")).writer is not None


def test_a_schema_with_a_type_the_writer_does_not_know_falls_back_to_fastavro() -> None:
    assert V2.writer is None  # its "headers" field is a map
    assert read(encode(FULL_REQUEST, schema=V2), V2, V2)["subject"] == FULL_REQUEST.subject


def test_a_field_the_event_lacks_takes_the_schema_default() -> None:
    with_reply_to = variant("email_requested_v2.avsc", keep_reply_to_only)
    assert with_reply_to.writer is not None
    record = read(encode(FULL_REQUEST, schema=with_reply_to), with_reply_to, with_reply_to)
    assert record["reply_to"] is None
    assert record["recipient"] == FULL_REQUEST.recipient


def test_a_record_of_one_field_encodes_its_value() -> None:
    one = parse_schema_text(json.dumps({"type": "record", "name": "One", "fields": [
        {"name": "subject", "type": "string"}]}), "one.avsc")
    assert one.writer is not None
    assert encode(FULL_REQUEST, schema=one) == write(one, {"subject": FULL_REQUEST.subject})


def test_a_record_of_no_fields_encodes_to_nothing() -> None:
    empty = parse_schema_text(json.dumps({"type": "record", "name": "Empty", "fields": []}),
                              "empty.avsc")
    assert empty.writer is not None
    assert encode(FULL_REQUEST, schema=empty) == b"" == write(empty, {})


class Text(str):
    """A str subclass: the generated writer's in-line path takes exact str only."""


@pytest.mark.parametrize("event", ENCODED_EVENTS)
def test_writing_field_by_field_gives_the_generated_writers_bytes(
        event: EmailRequested | EmailResult) -> None:
    # The generated record function writes strings and small ints in line; without kinds,
    # RecordWriter calls each field's writer. Both are fastavro's bytes.
    compiled = load_schema(event.SCHEMA_NAME).writer
    assert compiled is not None
    per_field = RecordWriter(compiled.names, compiled.writers, compiled.defaults)
    values = compiled.values_of(event)
    assert per_field.write(values) == compiled.write(values) == fastavro_bytes(event)


def test_values_of_str_and_int_subclasses_take_the_field_writers_path() -> None:
    schema = load_schema("email_requested")
    values = list(schema.writer.values_of(FULL_REQUEST))  # type: ignore[union-attr]
    names = schema.field_names
    values[names.index("subject")] = Text(FULL_REQUEST.subject)
    values[names.index("body")] = Text("x" * 100)  # a length past the one-byte varint
    expected = write(schema, {**dict(zip(names, values, strict=True)),
                              "attachments": list(FULL_REQUEST.attachments), "body": "x" * 100})
    assert encode_values(schema, values) == expected


@pytest.mark.parametrize(("field", "value", "message"), [
    ("outbox_id", True, "not an integer"),           # a bool is not a long, though an int
    ("attempt", 2**31, "out of range"),              # int, past the in-line small range
    ("recipient", b"b@example.com", "not a string"),
    ("priority", "urgent", "is not one of"),
])
def test_a_bad_value_names_its_field(field: str, value: Any, message: str) -> None:
    schema = load_schema("email_requested")
    values = list(schema.writer.values_of(MINIMAL_REQUEST))  # type: ignore[union-attr]
    values[schema.field_names.index(field)] = value
    with pytest.raises(SchemaError, match=f"field {field}: .*{message}"):
        encode_values(schema, values)


def keep_reply_to_only(raw: dict[str, Any]) -> None:
    raw["fields"] = [f for f in raw["fields"] if f["name"] != "headers"]


# -- what cannot be encoded ----------------------------------------------------------------------

@pytest.mark.parametrize("event", [
    dataclasses.replace(MINIMAL_REQUEST, created_at=dt.datetime(2026, 1, 1)),  # noqa: DTZ001
    dataclasses.replace(MINIMAL_REQUEST, not_before=dt.datetime(2026, 1, 1)),  # noqa: DTZ001
    dataclasses.replace(MINIMAL_RESULT, occurred_at=dt.datetime(2026, 1, 1)),  # noqa: DTZ001
    dataclasses.replace(MINIMAL_RESULT, next_attempt_at=dt.datetime(2026, 1, 1)),  # noqa: DTZ001
], ids=["created_at", "not_before", "occurred_at", "next_attempt_at"])
def test_naive_datetimes_are_refused(event: EmailRequested | EmailResult) -> None:
    with pytest.raises(SchemaError, match="timezone-aware"):
        encode(event)


@pytest.mark.parametrize("event", [
    dataclasses.replace(MINIMAL_REQUEST, priority="urgent"),
    dataclasses.replace(MINIMAL_REQUEST, outbox_id="1"),  # type: ignore[arg-type]
    dataclasses.replace(MINIMAL_REQUEST, subject=None),  # type: ignore[arg-type]
    dataclasses.replace(MINIMAL_RESULT, smtp_code="451"),  # type: ignore[arg-type]
], ids=["unknown-priority", "str-id", "none-subject", "str-code"])
def test_a_value_outside_the_contract_raises_schema_error(
        event: EmailRequested | EmailResult) -> None:
    with pytest.raises(SchemaError, match="cannot encode"):
        encode(event)


# -- what cannot be decoded: every case must be SchemaError, or a poison record stalls a consumer --

REQUEST_HEADERS = headers_for(FULL_REQUEST)
REQUEST_BYTES = encode(FULL_REQUEST)


@pytest.mark.parametrize(("payload", "headers", "message"), [
    (None, REQUEST_HEADERS, "no value"),
    (REQUEST_BYTES, None, "no postroom.schema header"),
    (REQUEST_BYTES, [], "no postroom.schema header"),
    (REQUEST_BYTES, [("other", b"x")], "no postroom.schema header"),
    (REQUEST_BYTES, [(SCHEMA_HEADER, b"0123456789abcdef")], "unknown writer schema"),
    (REQUEST_BYTES, [(SCHEMA_HEADER, b"\xff\xfe")], "unknown writer schema"),
    # The result contract's fingerprint on a request topic: not a writer a request reader knows.
    (REQUEST_BYTES, headers_for(FULL_RESULT), "unknown writer schema"),
    (b"", REQUEST_HEADERS, "cannot decode"),
    (b"\x00", REQUEST_HEADERS, "cannot decode"),
    (b"\xff" * 20, REQUEST_HEADERS, "cannot decode"),  # a varint that never ends
    (b"\x80\x80\x80\x80\x80\x80\x80\x80\x80\x04", REQUEST_HEADERS, "cannot decode"),  # 2**64 long
    (b"\x04\xff\xfe" + REQUEST_BYTES, REQUEST_HEADERS, "cannot decode"),  # invalid UTF-8
    (b"\x01", REQUEST_HEADERS, "cannot decode"),  # a negative string length
    (REQUEST_BYTES[:2] + b"\xfe\xff\xff\xff\x0f", REQUEST_HEADERS, "cannot decode"),  # 2 GiB string
], ids=["no-value", "no-headers", "empty-headers", "other-header", "unknown-fingerprint",
        "non-ascii-fingerprint", "other-contract", "empty", "one-byte", "endless-varint",
        "overlong-varint", "bad-utf8", "negative-length", "huge-length"])
def test_unreadable_records_raise_schema_error(
        payload: bytes | None, headers: Any, message: str) -> None:
    with pytest.raises(SchemaError, match=message):
        decode(EmailRequested, payload, headers)


@pytest.mark.parametrize("event", [FULL_REQUEST, FULL_RESULT], ids=["request", "result"])
def test_every_truncation_raises_schema_error(event: EmailRequested | EmailResult) -> None:
    payload = encode(event)
    for length in range(len(payload)):
        with pytest.raises(SchemaError):
            decode(type(event), payload[:length], headers_for(event))


def test_an_enum_index_out_of_range_raises_schema_error() -> None:
    sent = encode(MINIMAL_RESULT)
    dead = encode(dataclasses.replace(MINIMAL_RESULT, status=DeliveryStatus.DEAD))
    [status_at] = [i for i, (a, b) in enumerate(zip(sent, dead, strict=True)) if a != b]
    payload = bytearray(sent)
    payload[status_at] = 2 * 9  # zigzag varint 9: past the four symbols
    with pytest.raises(SchemaError, match="cannot decode"):
        decode(EmailResult, bytes(payload), headers_for(MINIMAL_RESULT))


def test_the_other_contract_as_writer_raises_schema_error() -> None:
    # A request's bytes labelled as a request, read as a result: resolution must refuse it.
    writers = known_writer_schemas("email_result", extra=[load_schema("email_requested")])
    with pytest.raises(SchemaError, match="cannot decode EmailResult"):
        decode(EmailResult, REQUEST_BYTES, REQUEST_HEADERS, writers=writers)


# -- schema evolution ----------------------------------------------------------------------------

V1 = load_schema("email_requested")
V2 = fixture_schema("email_requested_v2.avsc")


def test_v2_is_a_new_version_of_the_same_record() -> None:
    assert V2.fingerprint != V1.fingerprint
    v1_fields = [f["name"] for f in V1.parsed["fields"]]
    v2_fields = [f["name"] for f in V2.parsed["fields"]]
    assert v2_fields == [*v1_fields, "reply_to", "headers"]


def test_a_v2_reader_reads_v1_records_with_the_new_fields_defaulted() -> None:
    payload = encode(FULL_REQUEST)
    assert decode(EmailRequested, payload, REQUEST_HEADERS, reader=V2) == FULL_REQUEST
    record = read(payload, V1, V2)
    assert record["reply_to"] is None
    assert record["headers"] == {}
    assert record["subject"] == FULL_REQUEST.subject


def drop_not_before(raw: dict[str, Any]) -> None:
    raw["fields"] = [f for f in raw["fields"] if f["name"] != "not_before"]


def test_decode_resolves_to_the_reader_it_is_given() -> None:
    older = variant("email_requested_v2.avsc", drop_not_before)
    decoded = decode(EmailRequested, encode(FULL_REQUEST), REQUEST_HEADERS, reader=older)
    assert decoded == dataclasses.replace(FULL_REQUEST, not_before=None)


def test_todays_reader_reads_v2_records_once_v2_is_a_known_writer() -> None:
    payload = write(V2, v1_record() | {"reply_to": "sales@example.com",
                                      "headers": {"List-Unsubscribe": "<mailto:u@example.com>"}})
    headers = [(SCHEMA_HEADER, V2.fingerprint.encode())]
    with pytest.raises(SchemaError, match="unknown writer schema"):
        decode(EmailRequested, payload, headers)
    writers = known_writer_schemas("email_requested", extra=[V2])
    assert decode(EmailRequested, payload, headers, writers=writers) == FULL_REQUEST
    # Today's records still decode with the widened writer set.
    assert decode(EmailRequested, encode(FULL_REQUEST), REQUEST_HEADERS,
                  writers=writers) == FULL_REQUEST


def test_today_writes_v2_records_through_the_codec() -> None:
    # encode() with the v2 schema fills the new fields from their defaults.
    payload = encode(FULL_REQUEST, schema=V2)
    record = read(payload, V2, V2)
    assert (record["reply_to"], record["headers"]) == (None, {})


def readable(writer: Schema, reader: Schema, record: dict[str, Any]) -> bool:
    try:
        read(write(writer, record), writer, reader)
    except SchemaResolutionError:
        return False
    return True


def drop_defaults_of_new_fields(raw: dict[str, Any]) -> None:
    for field in raw["fields"][-2:]:
        del field["default"]


def rename_a_field(raw: dict[str, Any]) -> None:
    raw["fields"][3]["name"] = "to"


def add_a_priority(raw: dict[str, Any]) -> None:
    raw["fields"][8]["type"]["symbols"].append("bulk")


def test_v1_and_v2_are_backward_and_forward_compatible() -> None:
    old = v1_record()
    new = old | {"reply_to": "r@example.com", "headers": {"X-Report": "2026-09"}}
    assert readable(V1, V2, old), "backward: a v2 reader must read v1 records"
    assert readable(V2, V1, new), "forward: a v1 reader must read v2 records"
    assert readable(V1, V1, old)
    assert readable(V2, V2, new)


@pytest.mark.parametrize(("edit", "backward", "forward"), [
    # Adding fields without defaults: old records cannot fill them.
    (drop_defaults_of_new_fields, False, True),
    # Renaming without an alias looks like removing one field and adding another without default.
    (rename_a_field, False, False),
], ids=["no-defaults", "rename"])
def test_the_compatibility_check_catches_breaking_changes(
        edit: Callable[[dict[str, Any]], None], backward: bool, forward: bool) -> None:
    broken = variant("email_requested_v2.avsc", edit)
    old = v1_record()
    new = old | {"reply_to": "r@example.com", "headers": {}}
    if edit is rename_a_field:
        new["to"] = new.pop("recipient")
    assert readable(V1, broken, old) is backward
    assert readable(broken, V1, new) is forward


def test_an_unknown_priority_from_a_newer_writer_falls_back_to_the_enum_default() -> None:
    newer = variant("email_requested_v2.avsc", add_a_priority)
    payload = write(newer, v1_record() | {"priority": "bulk"})
    headers = [(SCHEMA_HEADER, newer.fingerprint.encode())]
    writers = known_writer_schemas("email_requested", extra=[newer])
    assert decode(EmailRequested, payload, headers, writers=writers).priority == "normal"


def test_known_writer_schemas_keeps_todays_first_and_adds_extras() -> None:
    earlier = earlier_versions("email_requested")
    writers = known_writer_schemas("email_requested", extra=[V2])
    assert list(writers) == [V1.fingerprint, *(e.fingerprint for e in earlier), V2.fingerprint]
    assert known_writer_schemas("email_requested") == {
        V1.fingerprint: V1, **{e.fingerprint: e for e in earlier}}
    assert known_writer_schemas("email_result") == {
        load_schema("email_result").fingerprint: load_schema("email_result"),
        **{e.fingerprint: e for e in earlier_versions("email_result")}}

@pytest.mark.parametrize("millis", [2**62, -(2**62), 10**15])
def test_an_out_of_range_timestamp_raises_schema_error(millis: int) -> None:
    raw = json.loads(resources.files("schemas").joinpath("email_result.avsc").read_text())
    for field in raw["fields"]:
        if field["name"] == "occurred_at":
            field["type"] = "long"  # same canonical form, so the same fingerprint
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(raw), {
        "idempotency_key": "k|a@example.com", "outbox_id": 1, "recipient": "a@example.com",
        "status": "sent", "attempt": 1, "occurred_at": millis})
    headers = [(SCHEMA_HEADER, load_schema("email_result").fingerprint.encode())]
    with pytest.raises(SchemaError):
        decode(EmailResult, buf.getvalue(), headers)
