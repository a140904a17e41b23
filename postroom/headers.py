"""Names of the Kafka headers postroom writes beside the Avro value, and the one reader of the
values a role acts on (which anyone with produce rights may have written). Pure."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from postroom.errors import InvalidContentError

ROW_ID_HEADER = "postroom.row_id"
ERROR_HEADER = "postroom.error"  # one per failed attempt: "attempt=n at=<time> <reason>"
# Attempts a row had before this round of the retry chain began (set by a redrive or requeue):
# the retry tier of attempt n is n - base, so a replayed email gets a fresh budget while its
# attempt numbers, and the results' order, go on from its history.
ATTEMPT_BASE_HEADER = "postroom.attempt_base"
DLQ_TOPIC_HEADER = "postroom.dlq.topic"
DLQ_PARTITION_HEADER = "postroom.dlq.partition"
DLQ_OFFSET_HEADER = "postroom.dlq.offset"
DLQ_CLASS_HEADER = "postroom.dlq.classification"
DLQ_REASON_HEADER = "postroom.dlq.reason"
# Not written by postroom: what postroom.kafka.Record leaves of headers the Kafka client cannot
# decode (a name that is not UTF-8); read_headers refuses it.
UNREADABLE_HEADERS = "postroom.unreadable_headers"

# No row is redriven a million times; the bound also keeps int() away from 5,000 digits.
ATTEMPT_BASE_MAX = 1_000_000
ROW_ID_MAX = (1 << 63) - 1  # the outbox's bigint id
_DIGITS = frozenset(b"0123456789")

HeaderList = Sequence[tuple[str, str | bytes | None]]


@dataclasses.dataclass(frozen=True, slots=True)
class PostroomHeaders:
    """What a record's postroom headers say: the attempt base (0 without one) and the outbox row
    the relay published it from (None without one)."""

    attempt_base: int = 0
    row_id: int | None = None


def read_headers(headers: HeaderList | None) -> PostroomHeaders:
    """The postroom headers a role acts on, from any header list (names and values of any kind,
    repeated: the last one counts). InvalidContentError, and nothing else, for a value that is
    not the decimal number postroom writes; other headers are not read here."""
    base, row_id = 0, None
    for name, value in headers or ():
        if name == UNREADABLE_HEADERS:
            raise InvalidContentError("a header name is not UTF-8: the record's headers cannot "
                                      "be read")
        if value is None:
            continue
        if name == ATTEMPT_BASE_HEADER:
            base = _number(value, ATTEMPT_BASE_HEADER, 0, ATTEMPT_BASE_MAX)
        elif name == ROW_ID_HEADER:
            row_id = _number(value, ROW_ID_HEADER, 1, ROW_ID_MAX)
    return PostroomHeaders(base, row_id)


def _number(value: str | bytes, name: str, low: int, high: int) -> int:
    """``value`` as the ASCII decimal number postroom writes, within ``low..high``. Not
    ``str.isdigit()``: it takes '²' and other digits ``int()`` refuses."""
    raw = value.encode("ascii", "replace") if isinstance(value, str) else bytes(value)
    if not raw or len(raw) > len(str(high)) or not _DIGITS.issuperset(raw):
        raise InvalidContentError(f"header {name} is not a decimal number "
                                  f"({len(raw)} bytes, starting {raw[:20]!r})")
    number = int(raw)
    if not low <= number <= high:
        raise InvalidContentError(f"header {name} is {number}, outside {low}..{high}")
    return number
