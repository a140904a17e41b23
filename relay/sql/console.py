"""What the console (`postroom web`) reads and writes beside the operators' statements: the search
over the outbox (keyset pages), one row whole, one message's counts and failures, and the audit
table of its actions."""

from __future__ import annotations

import datetime as dt
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from postroom.relay.sql.reads import READABLE_FROM_SQL, READABLE_UNTIL_SQL, readable_time
from postroom.relay.sql.tables import metadata, outbox

console_audit = sa.Table(
    "console_audit",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
    sa.Column("at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    sa.Column("who", sa.Text, nullable=False),
    sa.Column("role", sa.Text, nullable=False),
    sa.Column("action", sa.Text, nullable=False),
    sa.Column("target", sa.Text, nullable=False),
    sa.Column("row_ids", pg.ARRAY(sa.BigInteger), nullable=False, server_default="{}"),
    sa.Column("detail", sa.Text, nullable=False, server_default=""),
)

SEARCH_COLUMNS = ("id", "message_key", "recipient", "subject", "status", "attempts",
                  "created_at", "sent_at")


def search_query(*, message_key: str | None, recipient: str | None, status: str | None,
                 created_from: dt.datetime | None, created_until: dt.datetime | None,
                 after: tuple[dt.datetime, int] | None, limit: int,
                 scan_rows: int) -> sa.Select[Any]:
    """Rows newest first by (created_at, id), those after the keyset ``after`` (the last row of
    the page before), each with ``keyset_at`` (its created_at as stored), ``matched`` and
    ``scan_edge``. Each filter but the state is a plain predicate, so the planner picks the index
    that fits (migration 0016: created_at; lower(recipient), created_at; message_key).

    No index holds the state (see 0016), so a search by state walks at most ``scan_rows`` rows
    of the others' order and keeps those in the state (``matched``); when it stops there before
    ``limit`` of them, the last row it walked comes too, ``scan_edge`` (and ``matched`` only if
    it is in the state): the search goes on after it. A state no row is in costs a walk of
    ``scan_rows`` rows, not of the outbox."""
    order = (outbox.c.created_at.desc(), outbox.c.id.desc())
    where = []
    if message_key is not None:
        where.append(outbox.c.message_key == message_key)
    if recipient is not None:
        # Any spelling of the address: postroom compares recipients in lower case everywhere.
        where.append(sa.func.lower(outbox.c.recipient) == sa.func.lower(recipient))
    if created_from is not None:
        where.append(outbox.c.created_at >= created_from)
    if created_until is not None:
        where.append(outbox.c.created_at < created_until)
    if after is not None:
        where.append(sa.tuple_(outbox.c.created_at, outbox.c.id) < sa.tuple_(
            sa.literal(after[0], sa.DateTime(timezone=True)), sa.literal(after[1], sa.BigInteger)))
    columns = [readable_time(outbox.c[n]).label(n) if n.endswith("_at") else outbox.c[n]
               for n in SEARCH_COLUMNS]
    if status is None:
        return sa.select(*columns, outbox.c.created_at.label("keyset_at"),
                         sa.true().label("matched"), sa.false().label("scan_edge")).where(
            *where).order_by(*order).limit(limit)
    # The bound is written into the statement, not bound: a prepared statement's generic plan
    # does not know a parameter's LIMIT, and may sort every row the filters leave.
    bound = sa.literal_column(str(int(scan_rows)), sa.BigInteger)
    walked = sa.select(outbox.c.id, outbox.c.created_at, outbox.c.status).where(
        *where).order_by(*order).limit(bound).subquery("walked")
    numbered = sa.select(walked, sa.func.row_number().over(
        order_by=(walked.c.created_at.desc(), walked.c.id.desc())).label("n")).subquery("numbered")
    matched = numbered.c.status == status
    edge = numbered.c.n == bound
    return sa.select(*columns, numbered.c.created_at.label("keyset_at"), matched.label("matched"),
                     edge.label("scan_edge")).select_from(
        numbered.join(outbox, outbox.c.id == numbered.c.id)).where(sa.or_(matched, edge)).order_by(
        numbered.c.created_at.desc(), numbered.c.id.desc()).limit(limit)


_ROW_TIMES = ("created_at", "available_at", "published_at", "sent_at", "next_attempt_at",
              "updated_at")
_ROW_COLUMNS = ("id", "idempotency_key", "message_key", "recipient", "sender", "subject",
                "priority", "status", "attempts", "last_error", "smtp_code", "enhanced_code",
                "message_id")


def row_query(row_id: int) -> sa.Select[Any]:
    """One outbox row's every column but the content (body, html, attachment paths)."""
    return sa.select(*(outbox.c[n] for n in _ROW_COLUMNS),
                     # 0010's column, which tables.outbox does not declare
                     sa.column("traceparent", sa.Text),
                     *(readable_time(outbox.c[n]).label(n) for n in _ROW_TIMES)).where(
        outbox.c.id == row_id)


# The sender's ledger entry of a row (attempt, who holds it, the Message-ID it sent).
LEDGER_OF_KEY = sa.text(f"""
    SELECT state, owner, attempt, message_id, taken_from, done_attempt,
           LEAST(updated_at, {READABLE_UNTIL_SQL}) AS updated_at
    FROM sender_ledger WHERE idempotency_key = :key
""")

# An address's suppression entry, current or expired.
SUPPRESSION_OF = sa.text(f"""
    SELECT address, reason, source, created_at, LEAST(expires_at, {READABLE_UNTIL_SQL}) AS expires_at,
           expires_at > now() AS active
    FROM suppression WHERE address = lower(:address)
""")

# One message's rows by state.
COUNTS_OF_KEY = sa.text("""
    SELECT status, count(*) AS rows FROM outbox WHERE message_key = :key
    GROUP BY status ORDER BY status
""")

# One message's rows that did not reach their recipient, as `report failures` lists them; the
# first :limit (NULL: all, for the CSV).
FAILURES_OF_KEY = sa.text(f"""
    SELECT id, recipient, message_key, idempotency_key, subject, status, attempts, last_error,
           LEAST(COALESCE(updated_at, created_at), {READABLE_UNTIL_SQL}) AS updated_at
    FROM outbox
    WHERE message_key = :key AND status IN ('failed', 'dead', 'bounced', 'suppressed')
    ORDER BY id LIMIT :limit
""")

# The suppression page: addresses suppressed now whose address or reason holds :contains (any
# case; NULL: every one), by address, the first :limit. A page, never the whole list.
SUPPRESSION_PAGE = sa.text(f"""
    SELECT address, reason, source,
           LEAST(GREATEST(created_at, {READABLE_FROM_SQL}), {READABLE_UNTIL_SQL}) AS created_at,
           LEAST(expires_at, {READABLE_UNTIL_SQL}) AS expires_at
    FROM suppression
    WHERE expires_at > now()
      AND (CAST(:contains AS text) IS NULL
           OR strpos(address, lower(CAST(:contains AS text))) > 0
           OR strpos(lower(reason), lower(CAST(:contains AS text))) > 0)
    ORDER BY address LIMIT :limit
""")

AUDIT_INSERT = sa.text("""
    INSERT INTO console_audit (who, role, action, target, row_ids, detail)
    VALUES (:who, :role, :action, :target, CAST(:row_ids AS bigint[]), :detail)
""")


def audit_query(before_id: int | None, limit: int) -> sa.Select[Any]:
    """The audit entries newest first, those older than ``before_id`` (keyset)."""
    query = sa.select(console_audit)
    if before_id is not None:
        query = query.where(console_audit.c.id < before_id)
    return query.order_by(console_audit.c.id.desc()).limit(limit)


# Emails enqueued and sent per minute over the last hour (minutes without any are absent). Sent
# rows are found among those created in the last day (the created_at index): an email sent after
# more than a day of retries is not counted.
THROUGHPUT_LAST_HOUR = sa.text("""
    SELECT minute, sum(enqueued) AS enqueued, sum(sent) AS sent FROM (
        SELECT date_trunc('minute', created_at) AS minute, 1 AS enqueued, 0 AS sent FROM outbox
        WHERE created_at >= date_trunc('minute', now()) - interval '59 minutes'
        UNION ALL
        SELECT date_trunc('minute', sent_at), 0, 1 FROM outbox
        WHERE created_at >= now() - interval '1 day'
          AND sent_at >= date_trunc('minute', now()) - interval '59 minutes'
    ) AS counted GROUP BY minute ORDER BY minute
""")


# The console's sessions (migrations 0017, 0018), by the SHA-256 of the id their cookie carries. A
# session is live while it was seen in the last :idle_s seconds and signed in within the last
# :lifetime_s, both by the database's clock (every replica's the same); ``stale`` says it was not
# seen in the last :touch_s, when a request that counts as activity writes the time again (not each
# request). ``token_mac`` ties it to the token that signed it in (the console checks it).
SESSION_OPEN = sa.text("""
    INSERT INTO console_session (id_sha256, who, role, token_mac)
    VALUES (:id, :who, :role, :token_mac)
""")
SESSIONS_ENDED_DELETE = sa.text("""
    DELETE FROM console_session
    WHERE seen_at <= now() - make_interval(secs => :idle_s)
       OR signed_in_at <= now() - make_interval(secs => :lifetime_s)
""")
SESSION_OF = sa.text("""
    SELECT who, role, token_mac, seen_at <= now() - make_interval(secs => :touch_s) AS stale
    FROM console_session
    WHERE id_sha256 = :id AND seen_at > now() - make_interval(secs => :idle_s)
      AND signed_in_at > now() - make_interval(secs => :lifetime_s)
""")
SESSION_SEEN = sa.text("UPDATE console_session SET seen_at = now() WHERE id_sha256 = :id")
SESSION_CLOSE = sa.text("DELETE FROM console_session WHERE id_sha256 = :id RETURNING who, role")
