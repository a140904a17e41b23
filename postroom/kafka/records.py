"""Consumed messages as postroom's records: headers read safely, consumer errors logged."""

from __future__ import annotations

import ctypes
import dataclasses
import logging
from collections.abc import Iterable, Iterator

from confluent_kafka import KafkaError, Message

from postroom.headers import UNREADABLE_HEADERS

log = logging.getLogger(__name__)

Headers = list[tuple[str, str | bytes | None]]


@dataclasses.dataclass(frozen=True)
class Record:
    """What the sender needs of one consumed Kafka message."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    timestamp_ms: int = 0  # as the broker gave it (0 when it has none)

    @property
    def tp(self) -> tuple[str, int]:
        return (self.topic, self.partition)

    @classmethod
    def from_message(cls, msg: Message) -> Record:
        headers = message_headers(msg)
        key = msg.key()
        value = msg.value()
        _kind, timestamp_ms = msg.timestamp()
        return cls(msg.topic() or "", msg.partition() or 0, msg.offset() or 0,
                   key.encode() if isinstance(key, str) else key,
                   value.encode() if isinstance(value, str) else value, headers,
                   max(timestamp_ms, 0))


# CPython's tuple layout: its item pointers follow the object's fixed part.
_TUPLE_ITEMS_AT = tuple.__basicsize__


def message_headers(msg: Message) -> Headers:
    """``msg.headers()`` as a list; ``[(UNREADABLE_HEADERS, None)]`` when confluent-kafka could
    not decode a header name (not UTF-8, as a Go or C producer may write). It then returns a list
    whose pair holds NULL for the name and leaves the decode error pending: raised as SystemError
    by an unspecialised call, silently kept by a specialised one (or dropped by a garbage
    collection), and any later touch of that name crashes the process. So each name is checked
    to be there, by its pointer, before the list is used, and a pending error is cleared."""
    try:
        raw = msg.headers()
        if not raw:
            return []
        pairs = list(raw.items()) if isinstance(raw, dict) else list(raw)
        for pair in pairs:
            if type(pair) is not tuple or ctypes.c_void_p.from_address(
                    id(pair) + _TUPLE_ITEMS_AT).value is None:
                ctypes.pythonapi.PyErr_Clear()
                return [(UNREADABLE_HEADERS, None)]
    except (SystemError, UnicodeDecodeError):  # the pending error, raised (itself or wrapped)
        # by the first call that checks for one
        return [(UNREADABLE_HEADERS, None)]
    return pairs


def readable_records(messages: Iterable[Message]) -> Iterator[Record]:
    """The records among consumed messages; consumer errors are logged (partition EOF silently)."""
    for msg in messages:
        err = msg.error()
        if err is None:
            yield Record.from_message(msg)
        elif err.code() != KafkaError._PARTITION_EOF:
            log.warning("consumer error: %s", err.str())
