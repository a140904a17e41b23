"""The Avro contract between relay, sender and recorder: events as frozen values, bytes as Avro.

A record is framed one of two ways (:class:`Framing`): schemaless Avro with the writer schema's
CRC-64-AVRO fingerprint in the ``postroom.schema`` header, or the Confluent wire format (magic
byte 0, the registry's 4-byte schema id, the same Avro body). A reader takes either, decoding with
the writer schema (known by fingerprint, or fetched by id) resolved to its own. Pure.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import io
import json
import struct
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from importlib import resources
from operator import attrgetter
from typing import Any, TypeVar

import fastavro
from fastavro.schema import fingerprint, to_parsing_canonical_form

from postroom.errors import PostroomError

SCHEMA_HEADER = "postroom.schema"


class SchemaError(PostroomError):
    """A record could not be encoded or decoded against the contract."""


class SchemaUnavailableError(SchemaError):
    """The writer schema of a record cannot be had now (the registry does not answer): the
    record is not unreadable, and is read again once it can be."""


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


# -- the compiled writer -----------------------------------------------------------------------
#
# The relay encodes every outbox row, straight from the claimed row (the field values in the
# schema's order), without building a dict or a dataclass per row. Our records get a writer built
# once from the schema, for the few types the contract uses: one small function per field, and one
# function for the whole record, generated from the fields' types, that does the common cases (a
# str, a small int) in line and calls the field's function for the rest. A schema with any other
# type gets no writer, and encode() hands it to fastavro. tests/unit/schemas/test_codec.py checks
# the bytes are fastavro's; `python -m bench codec` times the three.

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_MILLISECOND = dt.timedelta(milliseconds=1)
_LONG_RANGE = (-(1 << 63), 1 << 63)
_INT_RANGE = (-(1 << 31), 1 << 31)
_SMALL_VARINTS = [bytes([n]) for n in range(0x80)]
_MISSING = object()
_WRITE_ERRORS = (TypeError, ValueError, OverflowError, UnicodeError, SchemaError)

FieldWriter = Callable[[Any], bytes]


def _zigzag(n: int) -> bytes:
    """Avro's variable-length zig-zag encoding of a long (range checked by the caller)."""
    n = (n << 1) ^ (n >> 63)
    if n < 0x80:
        return _SMALL_VARINTS[n]
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _integer_writer(bounds: tuple[int, int]) -> FieldWriter:
    low, high = bounds

    def write(value: Any) -> bytes:
        if type(value) is not int and (not isinstance(value, int) or isinstance(value, bool)):
            raise TypeError(f"{value!r} is not an integer")
        if 0 <= value < 64:
            return _SMALL_VARINTS[value + value]
        if not low <= value < high:
            raise ValueError(f"{value} is out of range")
        return _zigzag(value)
    return write


def _write_string(value: Any) -> bytes:
    if type(value) is not str and not isinstance(value, str):
        raise TypeError(f"{value!r} is not a string")
    raw = value.encode()
    size = len(raw)
    # zig-zag doubles a non-negative value: below 64 it is the one byte 2n
    return (_SMALL_VARINTS[size + size] if size < 64 else _zigzag(size)) + raw


def _write_timestamp_millis(value: Any) -> bytes:
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            raise SchemaError("timestamps must be timezone-aware")
        value = (value - _EPOCH) // _MILLISECOND
    elif type(value) is not int:
        raise TypeError(f"{value!r} is not a datetime")
    if not _LONG_RANGE[0] <= value < _LONG_RANGE[1]:
        raise ValueError(f"{value} is out of range")
    return _zigzag(value)


def _enum_writer(symbols: Sequence[str]) -> FieldWriter:
    encoded = {symbol: _zigzag(index) for index, symbol in enumerate(symbols)}

    def write(value: Any) -> bytes:
        try:
            return encoded[value]
        except (KeyError, TypeError):
            raise ValueError(f"{value!r} is not one of {list(symbols)}") from None
    return write


def _array_writer(item: FieldWriter) -> FieldWriter:
    def write(value: Any) -> bytes:
        if not isinstance(value, (list, tuple)):
            raise TypeError(f"{value!r} is not a list")
        if not value:
            return b"\x00"
        return b"".join((_zigzag(len(value)), *map(item, value), b"\x00"))
    return write


def _optional_writer(item: FieldWriter) -> FieldWriter:
    """A union of null and one other type, null first."""
    def write(value: Any) -> bytes:
        return b"\x00" if value is None else b"\x02" + item(value)
    return write


def _field_writer(schema: Any) -> FieldWriter | None:
    """The writer of one (fastavro-parsed) type, or None when it is not one we compile."""
    if isinstance(schema, list):
        if len(schema) == 2 and schema[0] == "null" and schema[1] != "null":
            item = _field_writer(schema[1])
            return None if item is None else _optional_writer(item)
        return None
    if isinstance(schema, str):
        return {"string": _write_string, "long": _integer_writer(_LONG_RANGE),
                "int": _integer_writer(_INT_RANGE)}.get(schema)
    if not isinstance(schema, dict):
        return None
    kind, logical = schema.get("type"), schema.get("logicalType")
    if kind == "long" and logical == "timestamp-millis":
        return _write_timestamp_millis
    if logical is not None:
        return None
    if kind == "enum":
        return _enum_writer(schema["symbols"])
    if kind == "array":
        item = _field_writer(schema["items"])
        return None if item is None else _array_writer(item)
    return _field_writer(kind) if isinstance(kind, str) and kind != schema.get("name") else None


@dataclasses.dataclass(frozen=True)
class RecordWriter:
    """Writes one record type: field names, their writers, and defaults for fields left out."""

    names: tuple[str, ...]
    writers: tuple[FieldWriter, ...]
    defaults: Mapping[str, Any]
    # How the generated record function writes each field (see _INLINE); none given: by calls.
    kinds: tuple[str, ...] = ()
    _getter: Callable[[object], Any] = dataclasses.field(init=False, repr=False, compare=False)
    _write: Callable[[Sequence[Any]], bytes] = dataclasses.field(init=False, repr=False,
                                                                  compare=False)

    def __post_init__(self) -> None:
        getter = attrgetter(*self.names) if self.names else (lambda event: ())
        if len(self.names) == 1:  # attrgetter of one name returns the value, not a tuple
            object.__setattr__(self, "_getter", lambda event: (getter(event),))
        else:
            object.__setattr__(self, "_getter", getter)
        object.__setattr__(self, "_write", _record_function(
            self.kinds or ("call",) * len(self.writers), self.writers))

    def write(self, values: Sequence[Any]) -> bytes:
        """The record's bytes from its field values, in the schema's order."""
        if len(values) != len(self.writers):
            raise SchemaError(f"expected {len(self.writers)} field values, got {len(values)}")
        try:
            return self._write(values)
        except _WRITE_ERRORS as exc:
            raise SchemaError(f"field {self._failing_field(values)}: {exc}") from exc

    def _failing_field(self, values: Sequence[Any]) -> str:
        for name, write, value in zip(self.names, self.writers, values, strict=True):
            try:
                write(value)
            except _WRITE_ERRORS:
                return name
        return "?"

    def values_of(self, event: object) -> Sequence[Any]:
        """The event's attributes in field order; a field it lacks takes the schema's default."""
        try:
            return self._getter(event)  # type: ignore[no-any-return]
        except AttributeError:
            pass
        values = []
        for name in self.names:
            value = getattr(event, name, _MISSING)
            if value is _MISSING:
                value = self.defaults.get(name, _MISSING)
                if value is _MISSING:
                    raise SchemaError(f"field {name} has no value and no default")
            values.append(value)
        return values


def compile_writer(parsed: Any) -> RecordWriter | None:
    """A RecordWriter for a parsed record schema, or None when any field's type is not ours."""
    if not isinstance(parsed, dict) or parsed.get("type") != "record":
        return None
    writers = []
    for field in parsed["fields"]:
        writer = _field_writer(field["type"])
        if writer is None:
            return None
        writers.append(writer)
    names = tuple(field["name"] for field in parsed["fields"])
    defaults = {field["name"]: field["default"] for field in parsed["fields"] if "default" in field}
    kinds = tuple(_inline_kind(field["type"]) for field in parsed["fields"])
    return RecordWriter(names, tuple(writers), defaults, kinds)


def _inline_kind(schema: Any) -> str:
    """How the record function writes a field of this type: string or integer in line, else
    call (its field writer)."""
    if schema in ("string", "long", "int"):
        return "string" if schema == "string" else "integer"
    return "call"


# The in-line code of each kind, for field {i}: it leaves the field's bytes in p{i} (and, for a
# string, its length prefix in h{i}). Only the common case is in line; any other value goes to the
# field's writer w{i}, which also raises the errors. The source holds field indices only, never a
# name or a symbol from the schema.
_INLINE = {
    "string": ("    if type(v{i}) is str:\n"
               "        p{i} = v{i}.encode()\n"
               "        n = len(p{i})\n"
               "        h{i} = SMALL[n + n] if n < 64 else zigzag(n)\n"
               "    else:\n"
               "        h{i}, p{i} = b'', w{i}(v{i})\n"),
    "integer": ("    p{i} = SMALL[v{i} + v{i}] if type(v{i}) is int and 0 <= v{i} < 64 "
                "else w{i}(v{i})\n"),
    "call": "    p{i} = w{i}(v{i})\n",
}


def _record_function(kinds: Sequence[str], writers: Sequence[FieldWriter],
                     ) -> Callable[[Sequence[Any]], bytes]:
    """One function that writes a whole record from its values: straight-line code per field
    instead of a call per field (`python -m bench codec` times both)."""
    count = len(kinds)
    if count == 0:
        return lambda values: b""
    lines = ["def write(values):\n",
             f"    {', '.join(f'v{i}' for i in range(count))}, = values\n"]
    parts = []
    for i, kind in enumerate(kinds):
        lines.append(_INLINE[kind].format(i=i))
        parts += [f"h{i}", f"p{i}"] if kind == "string" else [f"p{i}"]
    lines.append(f"    return b''.join(({', '.join(parts)},))\n")
    namespace: dict[str, Any] = {"SMALL": _SMALL_VARINTS, "zigzag": _zigzag,
                                 **{f"w{i}": writer for i, writer in enumerate(writers)}}
    exec("".join(lines), namespace)  # noqa: S102 - our own template, field indices only
    return namespace["write"]  # type: ignore[no-any-return]


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
_FIELD_SETS = {cls: frozenset(names) for cls, names in _FIELD_NAMES.items()}


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


def event_size(event: EmailRequested | EmailResult) -> int:
    """Bytes of ``event``'s Kafka record: its encoded value and its schema header."""
    return len(encode(event)) + sum(len(k) + len(v) for k, v in headers_for(event))


def _long_size(value: int) -> int:
    """Bytes of a long in Avro's zig-zag varint."""
    if 0 <= value < 64:
        return 1
    return (((value << 1) ^ (value >> 63)).bit_length() + 6) // 7


def _string_size(text: str) -> int:
    size = len(text.encode())
    return (1 if size < 64 else _long_size(size)) + size


def _strings_size(items: Sequence[str]) -> int:
    """Bytes of an array of strings as the writers write it: one block, then the end marker."""
    if not items:
        return 1
    return _long_size(len(items)) + sum(map(_string_size, items)) + 1


# The fields, in order, that requested_event_size counts: a new field of the contract must be
# counted there too, and this makes the first count fail loudly until it is.
_REQUESTED_FIELDS = ("idempotency_key", "message_key", "outbox_id", "recipient", "sender",
                     "subject", "body", "attachments", "priority", "created_at", "attempt",
                     "not_before", "html", "inline")


@cache
def _requested_layout() -> tuple[dict[str, int], int]:
    """The priority symbols' encoded sizes and the schema header's bytes, checked against the
    fields requested_event_size counts."""
    schema = load_schema(EmailRequested.SCHEMA_NAME)
    if tuple(schema.field_names) != _REQUESTED_FIELDS:
        raise SchemaError(f"requested_event_size counts {_REQUESTED_FIELDS}, the schema has "
                          f"{tuple(schema.field_names)}")
    priority = next(f["type"] for f in schema.parsed["fields"] if f["name"] == "priority")
    symbols = {symbol: _long_size(n) for n, symbol in enumerate(priority["symbols"])}
    return symbols, sum(len(k) + len(v) for k, v in headers_for(EmailRequested))


def requested_event_size(*, idempotency_key: str, message_key: str, outbox_id: int,
                         recipient: str, sender: str, subject: str, body: str,
                         attachments: Sequence[str], priority: str, created_at: dt.datetime,
                         html: str | None = None, inline: Sequence[str] = ()) -> int:
    """:func:`event_size` of the EmailRequested of a first attempt with these values, counted
    from their lengths instead of encoded (what enqueue checks of every call: 2.4 µs against
    the encoder's 10.6 for an invoice). SchemaError for a value no event carries, a lone surrogate say (the
    caller encodes to have the encoder's words for it). A differential test holds it to
    event_size."""
    symbols, header = _requested_layout()
    try:
        strings = (_string_size(idempotency_key) + _string_size(message_key)
                   + _string_size(recipient) + _string_size(sender) + _string_size(subject)
                   + _string_size(body))
        priority_size = symbols[priority]
        millis = (created_at - _EPOCH) // _MILLISECOND
        html_size = 1 if html is None else 1 + _string_size(html)
        arrays = _strings_size(attachments) + _strings_size(inline)
    except (UnicodeError, TypeError, KeyError, AttributeError) as exc:
        raise SchemaError(f"cannot count EmailRequested: {exc!r}") from exc
    # attempt 1 and a null not_before are one byte each
    return (header + strings + _long_size(outbox_id) + arrays + priority_size
            + _long_size(millis) + 1 + 1 + html_size)


def headers_for(event: EmailRequested | EmailResult | type[EmailRequested] | type[EmailResult],
                ) -> list[tuple[str, bytes]]:
    """The schemaless framing's header that names the writer schema (of an event or event type);
    callers add theirs."""
    return SCHEMALESS.headers(load_schema(event.SCHEMA_NAME))


HeaderList = Sequence[tuple[str, str | bytes | None]]


def header_value(headers: HeaderList | None, name: str) -> bytes | None:
    """The last value of header ``name``, or None."""
    found: bytes | None = None
    for key, value in headers or ():
        if key == name:
            found = value.encode(errors="surrogatepass") if isinstance(value, str) else value
    return found


# -- framing ------------------------------------------------------------------------------------

CONFLUENT_MAGIC = 0
_CONFLUENT_PREFIX = struct.Struct(">BI")  # magic byte, schema id (big-endian, unsigned 32 bits)

SchemaById = Callable[[int], Schema]


def confluent_prefix(schema_id: int) -> bytes:
    """The 5 bytes the Confluent wire format puts before the Avro body."""
    if not 0 <= schema_id < 1 << 32:
        raise SchemaError(f"schema id {schema_id} does not fit the wire format's 4 bytes")
    return _CONFLUENT_PREFIX.pack(CONFLUENT_MAGIC, schema_id)


def split_confluent(payload: bytes) -> tuple[int, bytes] | None:
    """(schema id, Avro body) of a record in the Confluent wire format, else None."""
    if len(payload) < _CONFLUENT_PREFIX.size or payload[0] != CONFLUENT_MAGIC:
        return None
    _, schema_id = _CONFLUENT_PREFIX.unpack_from(payload)
    return schema_id, payload[_CONFLUENT_PREFIX.size:]


def confluent_schema_id(payload: bytes | None, headers: HeaderList | None) -> int | None:
    """The registry id of the writer schema of a record ``decode`` reads in the Confluent wire
    format; None for any other record (schemaless, or unreadable)."""
    if payload is None or header_value(headers, SCHEMA_HEADER) is not None:
        return None
    framed = split_confluent(payload)
    return None if framed is None else framed[0]


@dataclasses.dataclass(frozen=True)
class Framing:
    """How a writer frames its records on each topic.

    Without ``schema_ids``: schemaless Avro, the writer schema's fingerprint in the
    ``postroom.schema`` header. With them (topic -> the id the registry holds for the writer
    schema under the subject ``<topic>-value``): the Confluent wire format, and no
    ``postroom.schema`` header, so a reader that knows only fingerprints refuses the record
    instead of misreading it.
    """

    schema_ids: Mapping[str, int] | None = None

    @property
    def uses_registry(self) -> bool:
        return self.schema_ids is not None

    def prefix(self, topic: str) -> bytes:
        """What goes before the Avro body of a record on ``topic``."""
        if self.schema_ids is None:
            return b""
        try:
            return confluent_prefix(self.schema_ids[topic])
        except KeyError:
            raise SchemaError(f"no registry schema id for topic {topic} "
                              "(run `postroom schemas register`)") from None

    def headers(self, schema: Schema) -> list[tuple[str, bytes]]:
        """The headers that name the writer schema; callers add theirs."""
        return [] if self.schema_ids is not None else [(SCHEMA_HEADER, schema.fingerprint.encode())]

    def frame(self, topic: str, event: EmailRequested | EmailResult,
              ) -> tuple[bytes, list[tuple[str, bytes]]]:
        """The value and schema headers of ``event`` as a record on ``topic``."""
        schema = load_schema(event.SCHEMA_NAME)
        return self.prefix(topic) + encode(event, schema), self.headers(schema)


SCHEMALESS = Framing()


@cache
def earlier_versions(name: str) -> tuple[Schema, ...]:
    """The contract's earlier versions of ``schemas/<name>.avsc``, kept in ``schemas/history/``
    as ``<name>_v<n>.avsc``, oldest first."""
    history = resources.files("schemas").joinpath("history")
    found = sorted((int(entry.name.removeprefix(f"{name}_v").removesuffix(".avsc")), entry)
                   for entry in history.iterdir()
                   if entry.name.startswith(f"{name}_v") and entry.name.endswith(".avsc"))
    return tuple(parse_schema_text(entry.read_text(encoding="utf-8"), f"history/{entry.name}")
                 for _, entry in found)


def known_writer_schemas(name: str, extra: Sequence[Schema] = ()) -> Mapping[str, Schema]:
    """Writer schemas a reader accepts, by fingerprint: today's, its earlier versions (records
    of them wait on retry tiers through an upgrade), and any ``extra`` ones."""
    current = load_schema(name)
    return {s.fingerprint: s for s in (current, *earlier_versions(name), *extra)}


def decode(
    cls: type[Event],
    payload: bytes | None,
    headers: HeaderList | None,
    *,
    writers: Mapping[str, Schema] | None = None,
    reader: Schema | None = None,
    schema_by_id: SchemaById | None = None,
) -> Event:
    """Decode a Kafka record value, in either framing, into ``cls``.

    A record with a ``postroom.schema`` header is schemaless, its writer one of ``writers``
    (today's schema by default); one without is in the Confluent wire format, its writer
    schema looked up with ``schema_by_id`` (None: no registry, so such records are refused).
    SchemaError says why a record is unreadable; SchemaUnavailableError (from ``schema_by_id``)
    that its writer schema cannot be had for now.
    """
    if payload is None:
        raise SchemaError("record has no value")
    raw_fp = header_value(headers, SCHEMA_HEADER)
    if raw_fp is None:
        framed = split_confluent(payload)
        if framed is None:
            raise SchemaError(f"record has no {SCHEMA_HEADER} header and is not in the "
                              "Confluent wire format")
        schema_id, payload = framed
        if schema_by_id is None:
            raise SchemaError(f"record is in the Confluent wire format (schema id {schema_id}) "
                              "but no schema registry is configured (POSTROOM_SCHEMA_REGISTRY_URL)")
        writer = schema_by_id(schema_id)
    else:
        writers = writers if writers is not None else known_writer_schemas(cls.SCHEMA_NAME)
        found = writers.get(raw_fp.decode(errors="replace"))
        if found is None:
            raise SchemaError(f"unknown writer schema fingerprint {raw_fp[:64].decode(errors='replace')}")
        writer = found
    reader = reader or load_schema(cls.SCHEMA_NAME)
    stream = io.BytesIO(payload)
    try:
        record = fastavro.schemaless_reader(stream, writer.parsed, reader.parsed)
    except (EOFError, ValueError, TypeError, IndexError, OverflowError, UnicodeDecodeError,
            fastavro.read.SchemaResolutionError) as exc:
        raise SchemaError(f"cannot decode {cls.__name__}: {exc!r}") from exc
    if stream.tell() != len(payload):
        # No writer of ours leaves bytes behind the record: a record cut from another, or
        # written by something that only looks like us.
        raise SchemaError(f"cannot decode {cls.__name__}: {len(payload) - stream.tell()} "
                          "byte(s) after the record")
    if not isinstance(record, dict):
        raise SchemaError(f"cannot decode {cls.__name__}: not a record")
    return from_record(cls, record)


def from_record(cls: type[Event], record: Mapping[str, Any]) -> Event:
    """Build ``cls`` from a decoded Avro record, ignoring fields it does not know."""
    names = _FIELD_SETS[cls]
    values = {k: v for k, v in record.items() if k in names}
    for name in ("attachments", "inline"):
        if name in values:
            values[name] = tuple(values[name])
    if cls is EmailResult and "status" in values:
        values["status"] = DeliveryStatus(values["status"])
    if len(values) == len(_FIELD_NAMES[cls]):
        # Every field is there (today's reader always gives them all): filled in directly, as
        # with_sender() copies. The dataclass's __init__ sets a frozen field at a time, a third
        # of an event's decoding.
        event = object.__new__(cls)
        event.__dict__.update(values)
        return event
    try:
        return cls(**values)
    except TypeError as exc:
        raise SchemaError(f"cannot decode {cls.__name__}: {exc}") from exc
