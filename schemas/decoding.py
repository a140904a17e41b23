"""Reads a record back, in either framing: its writer schema (known by fingerprint, today's or an
earlier version, or fetched by id) resolved to the reader's, then the event. Pure.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Mapping, Sequence
from functools import cache
from importlib import resources
from typing import Any

import fastavro

from postroom.schemas.codec import (
    DeliveryStatus,
    EmailRequested,
    EmailResult,
    Event,
    Schema,
    load_schema,
    parse_schema_text,
)
from postroom.schemas.errors import SchemaError
from postroom.schemas.framing import SCHEMA_HEADER, HeaderList, SchemaById, header_value, split_confluent

_FIELD_SETS = {cls: frozenset(f.name for f in dataclasses.fields(cls))
               for cls in (EmailRequested, EmailResult)}


@cache
def earlier_versions(name: str) -> tuple[Schema, ...]:
    """The contract's earlier versions of ``schemas/<name>.avsc``, kept in ``schemas/history/``
    as ``<name>_v<n>.avsc``, oldest first."""
    history = resources.files("postroom.schemas").joinpath("history")
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
    if len(values) == len(names):
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
