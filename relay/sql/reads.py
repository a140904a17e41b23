"""What probes and the CLI read of the outbox: the backlog, and the rows of a message."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from postroom.relay.sql.tables import outbox

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


# The times Python can hold, a day inside years 1 and 9999 (a session's time zone may move them
# by hours): a time written by hand as 'infinity' or out of that range is read as the nearest.
READABLE_FROM_SQL = "TIMESTAMPTZ '0001-01-02 00:00:00+00'"
READABLE_UNTIL_SQL = "TIMESTAMPTZ '9999-12-30 00:00:00+00'"
READABLE_FROM: sa.ColumnElement[Any] = sa.literal_column(READABLE_FROM_SQL)
READABLE_UNTIL: sa.ColumnElement[Any] = sa.literal_column(READABLE_UNTIL_SQL)
_TIMES = frozenset({"created_at", "published_at", "sent_at", "next_attempt_at"})


def readable_time(column: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
    """``column`` (a timestamptz) within what Python's datetime holds, NULL kept (GREATEST
    and LEAST pass over a NULL)."""
    return sa.case((column.is_(None), None),
                   else_=sa.func.least(sa.func.greatest(column, READABLE_FROM), READABLE_UNTIL))


def status_query(message_key: str | None, limit: int | None) -> sa.Select[Any]:
    """Rows of one message (or the newest of all), one per recipient; a time SQL wrote as
    'infinity' is shown as the last one Python can read, not an error."""
    query = sa.select(*(readable_time(outbox.c[name]).label(name) if name in _TIMES
                        else outbox.c[name] for name in STATUS_COLUMNS))
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
