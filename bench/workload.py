"""The benchmarks' messages: one 500-byte plain-text body, distinct recipients, chunked enqueue calls."""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from relay.outbox import enqueue

SUBJECT = "Sales report - September 2026"
_LINE = "The September sales report is ready; figures by region are in the attached workbook.\n"
BODY = (_LINE * 6)[:499] + "\n"
assert len(BODY.encode()) == 500
MAIL_FROM = "reports@example.com"

# enqueue() sends one multi-row INSERT with 8 bind parameters per recipient, and PostgreSQL accepts
# at most 65,535 parameters in a statement: one call with more than 8,191 recipients fails. Larger
# transactions are therefore written as several calls of at most this many recipients.
ENQUEUE_CALL_MAX = 5_000


def recipients(count: int, first: int = 0, tag: str = "r") -> list[str]:
    """``count`` distinct addresses, numbered from ``first``."""
    return [f"{tag}{n}@example.com" for n in range(first, first + count)]


def enqueue_rows(conn: sa.Connection, key: str, addresses: Sequence[str]) -> int:
    """Queue BODY to ``addresses`` under message key ``key`` in the caller's transaction."""
    queued = 0
    for start in range(0, len(addresses), ENQUEUE_CALL_MAX):
        queued += enqueue(conn, key=key, recipients=addresses[start:start + ENQUEUE_CALL_MAX],
                          subject=SUBJECT, body=BODY, sender=MAIL_FROM)
    return queued
