"""Names of the Kafka headers postroom writes beside the Avro value. Pure."""

from __future__ import annotations

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


def attempt_base(headers: list[tuple[str, str | bytes | None]] | None) -> int:
    """The attempt base a record carries (0 when it carries none or an unreadable one)."""
    found = 0
    for key, value in headers or ():
        if key == ATTEMPT_BASE_HEADER and value is not None:
            text = value.decode(errors="replace") if isinstance(value, bytes) else value
            found = int(text) if text.isdigit() else 0
    return found
