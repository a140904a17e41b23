"""The Avro contract between relay, sender and recorder: events as frozen values, bytes as schemaless Avro.

Each Kafka record carries its writer schema's CRC-64-AVRO fingerprint in the ``postroom.schema``
header; a reader decodes with the writer schema it knows by that fingerprint, resolved to its own.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import io
import json
from collections.abc import Mapping, Sequence
from functools import cache
from importlib import resources
from typing import Any, TypeVar

import fastavro
from fastavro.schema import fingerprint, to_parsing_canonical_form

SCHEMA_HEADER = "postroom.schema"


class SchemaError(Exception):
    """A record could not be encoded or decoded against the contract."""


class DeliveryStatus(enum.StrEnum):
    SENT = "sent"
    RETRYING = "retrying"
    FAILED = "failed"
    DEAD = "dead"


@dataclasses.dataclass(frozen=True)
class Schema:
    name: str
    parsed: Any
    fingerprint: str  # hex CRC-64-AVRO of the parsing canonical form


def parse_schema_text(text: str, name: str) -> Schema:
    """Parse and check one .avsc text; raise SchemaError naming the file when it is invalid."""
    try:
        raw = json.loads(text)
        # The default write hint marks the schema as parsed, so fastavro does not parse it
        # again on every record; the fingerprint is taken from a copy without the marker.
        parsed = fastavro.parse_schema(raw)
        canonical = to_parsing_canonical_form(fastavro.parse_schema(raw, _write_hint=False))
        fp = fingerprint(canonical, "CRC-64-AVRO")
    except (ValueError, fastavro.schema.SchemaParseException) as exc:
        raise SchemaError(f"{name}: invalid Avro schema: {exc}") from exc
    return Schema(name=name, parsed=parsed, fingerprint=fp)


@cache
def load_schema(name: str) -> Schema:
    """Load ``schemas/<name>.avsc`` shipped with the package."""
    text = resources.files("schemas").joinpath(f"{name}.avsc").read_text(encoding="utf-8")
    return parse_schema_text(text, f"{name}.avsc")


@dataclasses.dataclass(frozen=True)
class EmailRequested:
    idempotency_key: str
    message_key: str
    outbox_id: int
    recipient: str
    sender: str
    subject: str
    body: str
    attachments: tuple[str, ...]
    priority: str
    created_at: dt.datetime
    attempt: int = 1
    not_before: dt.datetime | None = None

    SCHEMA_NAME = "email_requested"


@dataclasses.dataclass(frozen=True)
class EmailResult:
    idempotency_key: str
    outbox_id: int
    recipient: str
    status: DeliveryStatus
    attempt: int
    occurred_at: dt.datetime
    smtp_code: int | None = None
    enhanced_code: str | None = None
    error: str | None = None
    next_attempt_at: dt.datetime | None = None
    message_id: str | None = None

    SCHEMA_NAME = "email_result"


Event = TypeVar("Event", EmailRequested, EmailResult)


_FIELD_NAMES: dict[type, tuple[str, ...]] = {
    cls: tuple(f.name for f in dataclasses.fields(cls)) for cls in (EmailRequested, EmailResult)}


def _to_record(event: EmailRequested | EmailResult) -> dict[str, Any]:
    # fastavro takes aware datetimes for timestamp-millis; tuples and enums need converting.
    record = {name: getattr(event, name) for name in _FIELD_NAMES[type(event)]}
    if isinstance(event, EmailRequested):
        record["attachments"] = list(event.attachments)
        _require_aware(event.created_at, event.not_before)
    else:
        record["status"] = event.status.value
        _require_aware(event.occurred_at, event.next_attempt_at)
    return record


def _require_aware(*moments: dt.datetime | None) -> None:
    if any(m is not None and m.tzinfo is None for m in moments):
        raise SchemaError("timestamps must be timezone-aware")


def encode(event: EmailRequested | EmailResult, schema: Schema | None = None) -> bytes:
    """Schemaless Avro bytes of ``event`` under its current schema (or ``schema``)."""
    schema = schema or load_schema(event.SCHEMA_NAME)
    buf = io.BytesIO()
    try:
        fastavro.schemaless_writer(buf, schema.parsed, _to_record(event))
    except (ValueError, TypeError, AttributeError) as exc:
        raise SchemaError(f"cannot encode {type(event).__name__}: {exc}") from exc
    return buf.getvalue()


def headers_for(event: EmailRequested | EmailResult) -> list[tuple[str, bytes]]:
    """The header that names the writer schema; callers add their own after it."""
    return [(SCHEMA_HEADER, load_schema(event.SCHEMA_NAME).fingerprint.encode())]


HeaderList = Sequence[tuple[str, str | bytes | None]]


def header_value(headers: HeaderList | None, name: str) -> bytes | None:
    """The last value of header ``name``, or None."""
    found: bytes | None = None
    for key, value in headers or ():
        if key == name:
            found = value.encode() if isinstance(value, str) else value
    return found


def known_writer_schemas(name: str, extra: Sequence[Schema] = ()) -> Mapping[str, Schema]:
    """Writer schemas a reader accepts, by fingerprint: today's plus any ``extra`` versions."""
    current = load_schema(name)
    return {s.fingerprint: s for s in (current, *extra)}


def decode(
    cls: type[Event],
    payload: bytes | None,
    headers: HeaderList | None,
    *,
    writers: Mapping[str, Schema] | None = None,
    reader: Schema | None = None,
) -> Event:
    """Decode a Kafka record value into ``cls``; SchemaError says why a record is unreadable."""
    if payload is None:
        raise SchemaError("record has no value")
    raw_fp = header_value(headers, SCHEMA_HEADER)
    if raw_fp is None:
        raise SchemaError(f"record has no {SCHEMA_HEADER} header")
    writers = writers if writers is not None else known_writer_schemas(cls.SCHEMA_NAME)
    writer = writers.get(raw_fp.decode(errors="replace"))
    if writer is None:
        raise SchemaError(f"unknown writer schema fingerprint {raw_fp.decode(errors='replace')}")
    reader = reader or load_schema(cls.SCHEMA_NAME)
    try:
        record = fastavro.schemaless_reader(io.BytesIO(payload), writer.parsed, reader.parsed)
    except (EOFError, ValueError, TypeError, IndexError, OverflowError, UnicodeDecodeError,
            fastavro.read.SchemaResolutionError) as exc:
        raise SchemaError(f"cannot decode {cls.__name__}: {exc!r}") from exc
    if not isinstance(record, dict):
        raise SchemaError(f"cannot decode {cls.__name__}: not a record")
    return from_record(cls, record)


def from_record(cls: type[Event], record: Mapping[str, Any]) -> Event:
    """Build ``cls`` from a decoded Avro record, ignoring fields it does not know."""
    names = {f.name for f in dataclasses.fields(cls)}
    values = {k: v for k, v in record.items() if k in names}
    if "attachments" in values:
        values["attachments"] = tuple(values["attachments"])
    if cls is EmailResult and "status" in values:
        values["status"] = DeliveryStatus(values["status"])
    try:
        return cls(**values)
    except TypeError as exc:
        raise SchemaError(f"cannot decode {cls.__name__}: {exc}") from exc
