"""The Avro contract between relay, sender and recorder: events as frozen values, bytes as Avro.

Each record type is written by the writer compiled from its schema (schemas/compiled_writer.py),
or by fastavro, the reference, for a schema that has none. How a record is framed on a topic is
schemas/framing.py's; reading one back, schemas/decoding.py's. Pure.
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

from postroom.schemas.compiled_writer import RecordWriter, compile_writer
from postroom.schemas.errors import SchemaError


class DeliveryStatus(enum.StrEnum):
    SENT = "sent"
    RETRYING = "retrying"
    FAILED = "failed"
    DEAD = "dead"
    # from postroom bounces: reports that arrive after the server accepted the email
    BOUNCED = "bounced"
    DELAYED = "delayed"
    COMPLAINED = "complained"


@dataclasses.dataclass(frozen=True)
class Schema:
    name: str
    parsed: Any
    fingerprint: str  # hex CRC-64-AVRO of the parsing canonical form
    text: str = dataclasses.field(default="", compare=False, repr=False)  # the .avsc as written
    # The record's own writer when every field has a type compile_writer() knows, else None.
    writer: RecordWriter | None = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def field_names(self) -> tuple[str, ...]:
        return tuple(field["name"] for field in self.parsed["fields"])


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
    return Schema(name=name, parsed=parsed, fingerprint=fp, text=text,
                  writer=compile_writer(parsed))


@cache
def load_schema(name: str) -> Schema:
    """Load ``schemas/<name>.avsc`` shipped with the package."""
    text = resources.files("postroom.schemas").joinpath(f"{name}.avsc").read_text(encoding="utf-8")
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
    # version 2 of the contract
    html: str | None = None
    inline: tuple[str, ...] = ()

    SCHEMA_NAME = "email_requested"

    def with_sender(self, sender: str) -> EmailRequested:
        """A copy with ``sender``. Not dataclasses.replace(), which runs ``__init__`` field by
        field: 2% of the sender's CPU on a fast server, where every event gets its sender so."""
        copy = object.__new__(EmailRequested)
        copy.__dict__.update(self.__dict__, sender=sender)
        return copy


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



def encode_values(schema: Schema, values: Sequence[Any], label: str | None = None) -> bytes:
    """Schemaless Avro bytes of a record given as its field values in the schema's order."""
    label = label or schema.name
    if schema.writer is None:
        names = schema.field_names
        if len(values) != len(names):
            raise SchemaError(f"cannot encode {label}: expected {len(names)} field values, "
                              f"got {len(values)}")
        return _fastavro_write(schema, dict(zip(names, values, strict=True)), label)
    try:
        return schema.writer.write(values)
    except SchemaError as exc:
        raise SchemaError(f"cannot encode {label}: {exc}") from exc


def _to_record(event: EmailRequested | EmailResult) -> dict[str, Any]:
    # fastavro takes aware datetimes for timestamp-millis; tuples and enums need converting.
    record = {name: getattr(event, name) for name in _FIELD_NAMES[type(event)]}
    if isinstance(event, EmailRequested):
        record["attachments"] = list(event.attachments)
        record["inline"] = list(event.inline)
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
    label = type(event).__name__
    if schema.writer is None:
        return _fastavro_write(schema, _to_record(event), label)
    try:
        values = schema.writer.values_of(event)
    except SchemaError as exc:
        raise SchemaError(f"cannot encode {label}: {exc}") from exc
    return encode_values(schema, values, label)


def _fastavro_write(schema: Schema, record: Mapping[str, Any], label: str) -> bytes:
    buf = io.BytesIO()
    try:
        fastavro.schemaless_writer(buf, schema.parsed, record)
    except (ValueError, TypeError, AttributeError) as exc:
        raise SchemaError(f"cannot encode {label}: {exc}") from exc
    return buf.getvalue()
