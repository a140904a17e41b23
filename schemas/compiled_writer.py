"""The contract's own Avro writer: a function per record type, generated once from its schema's
field types, that writes a record from its field values in the schema's order. Pure.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from operator import attrgetter
from typing import Any

from postroom.schemas.errors import SchemaError

# The relay encodes every outbox row, straight from the claimed row (the field values in the
# schema's order), without building a dict or a dataclass per row. Our records get a writer built
# once from the schema, for the few types the contract uses: one small function per field, and one
# function for the whole record, generated from the fields' types, that does the common cases (a
# str, a small int) in line and calls the field's function for the rest. A schema with any other
# type gets no writer, and encode() (schemas/codec.py) hands it to fastavro.
# tests/unit/schemas/test_codec.py checks the bytes are fastavro's; `python -m bench codec` times
# the three.

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
MILLISECOND = dt.timedelta(milliseconds=1)
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
        value = (value - EPOCH) // MILLISECOND
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
