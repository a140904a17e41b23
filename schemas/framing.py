"""How a record is framed on a topic (:class:`Framing`): schemaless Avro with the writer schema's
CRC-64-AVRO fingerprint in the ``postroom.schema`` header, or the Confluent wire format (magic
byte 0, the registry's 4-byte schema id, the same Avro body). Pure.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable, Mapping, Sequence

from postroom.schemas.codec import EmailRequested, EmailResult, Schema, encode, load_schema
from postroom.schemas.errors import SchemaError

SCHEMA_HEADER = "postroom.schema"


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
