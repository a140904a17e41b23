"""What probes and the CLI read of the outbox: the backlog, and the rows of a message."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from relay.sql.tables import outbox

# The relay's backlog: due rows not yet acknowledged by the broker (claimed ones included).
OUTBOX_BACKLOG = sa.text("""
    SELECT count(*), extract(epoch FROM now() - min(available_at))
    FROM outbox_queue WHERE available_at <= now()
""")


def outbox_backlog(conn: sa.Connection) -> tuple[int, float | None]:
    """(rows due and unpublished, age in seconds of the oldest; None when there are none)."""
    count, age = conn.execute(OUTBOX_BACKLOG).one()
    return int(count), None if age is None else float(age)


STATUS_COLUMNS = ("message_key", "recipient", "subject", "priority", "status", "attempts",
                  "last_error", "created_at", "published_at", "sent_at", "next_attempt_at",
                  "idempotency_key")


def status_query(message_key: str | None, limit: int | None) -> sa.Select[Any]:
    """Rows of one message (or the newest of all), one per recipient."""
    query = sa.select(*(outbox.c[name] for name in STATUS_COLUMNS))
    if message_key is not None:
        query = query.where(outbox.c.message_key == message_key).order_by(outbox.c.id)
    else:
        query = query.order_by(outbox.c.id.desc())
    if limit is not None:
        query = query.limit(limit)
    return query


def status_count_query() -> sa.Select[Any]:
    """How many rows the outbox holds: what `status` says when it shows only the newest."""
    return sa.select(sa.func.count()).select_from(outbox)
