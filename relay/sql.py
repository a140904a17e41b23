"""Every SQL statement postroom runs against the outbox, in one place.

The relay never scans the outbox: unpublished rows are also in ``outbox_queue`` (an insert trigger
puts them there) until Kafka has acknowledged them, so the relay's cost follows the backlog, not
the history, and the outbox row itself is written once when published, in place.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

NOTIFY_CHANNEL = "postroom_outbox"

metadata = sa.MetaData()

outbox = sa.Table(
    "outbox",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
    sa.Column("idempotency_key", sa.Text, nullable=False, unique=True),
    sa.Column("message_key", sa.Text, nullable=False),
    sa.Column("recipient", sa.Text, nullable=False),
    sa.Column("sender", sa.Text),
    sa.Column("subject", sa.Text, nullable=False),
    sa.Column("body", sa.Text, nullable=False),
    sa.Column("attachments", pg.ARRAY(sa.Text), nullable=False, server_default="{}"),
    sa.Column("html", sa.Text),
    sa.Column("inline", pg.ARRAY(sa.Text), nullable=False, server_default="{}"),
    sa.Column("priority", sa.Text, nullable=False),
    sa.Column("status", sa.Text, nullable=False, server_default="pending"),
    sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
    sa.Column("last_error", sa.Text),
    sa.Column("smtp_code", sa.Integer),
    sa.Column("enhanced_code", sa.Text),
    sa.Column("message_id", sa.Text),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False,
              server_default=sa.func.now()),
    sa.Column("available_at", sa.DateTime(timezone=True), nullable=False,
              server_default=sa.func.now()),
    sa.Column("published_at", sa.DateTime(timezone=True)),
    sa.Column("sent_at", sa.DateTime(timezone=True)),
    sa.Column("next_attempt_at", sa.DateTime(timezone=True)),
    sa.Column("updated_at", sa.DateTime(timezone=True)),
)

# Claims due, unpublished rows no other relay holds. SKIP LOCKED lets several relays share the
# backlog; the claim (not a held transaction) keeps a row theirs while Kafka acknowledges it.
# It returns each row as the email-requested event's fields, in the contract's order and named
# as there, so the relay encodes a row as it comes (the relay checks the names). created_at comes
# as the contract's timestamp-millis, milliseconds since the epoch, rounded down as the codec
# rounds a datetime: the database computes it for less than the relay's parsing of a timestamp
# (exactly: extract() returns numeric since PostgreSQL 14). The attempt goes on from the row's
# recorded attempts: 1 for a new row, n + 1 for a row redriven after n attempts. A row written by
# SQL may hold what no event can carry: an infinite created_at comes as NULL and the attempt as a
# bigint, so the claim itself never fails on a row and relay.rows refuses it as poison.
CLAIM_DUE = sa.text("""
    WITH claimed AS (
        UPDATE outbox_queue
        SET claimed_until = now() + make_interval(secs => :ttl_s)
        WHERE ctid = ANY(ARRAY(
            SELECT ctid FROM outbox_queue
            WHERE available_at <= now()
              AND (claimed_until IS NULL OR claimed_until < now())
            ORDER BY available_at, id
            LIMIT :limit
            FOR UPDATE SKIP LOCKED))
        RETURNING id
    )
    SELECT o.idempotency_key, o.message_key, o.id AS outbox_id, o.recipient,
           COALESCE(o.sender, '') AS sender, o.subject, o.body, o.attachments, o.priority,
           CASE WHEN isfinite(o.created_at)
                THEN CAST(floor(extract(epoch FROM o.created_at) * 1000) AS bigint) END
               AS created_at,
           CAST(o.attempts AS bigint) + 1 AS attempt, CAST(NULL AS timestamptz) AS not_before,
           o.html, o.inline, o.traceparent, o.tracestate
    FROM outbox AS o
    WHERE o.id = ANY(ARRAY(SELECT id FROM claimed))
""")

# The claim has one good plan: walk outbox_queue_due in (available_at, id) order and stop after
# :limit rows. Right after a bulk insert, before autovacuum has analyzed the table, the planner
# estimates a few dozen due rows and prefers a bitmap scan of the whole backlog plus a sort, which
# makes every batch cost the whole backlog (a drain quadratic in it). These settings leave it the
# ordered index scan only; :local keeps them to the transaction, else they last the session.
PIN_CLAIM_PLAN = sa.text("""
    SELECT set_config('enable_bitmapscan', 'off', :local),
           set_config('enable_seqscan', 'off', :local),
           set_config('enable_sort', 'off', :local)
""")


def pin_claim_plan(conn: sa.Connection, *, session: bool = False) -> None:
    """Pin the claim's plan for the caller's transaction, or for the whole ``session``."""
    conn.execute(PIN_CLAIM_PLAN, {"local": not session})


def claim_due(conn: sa.Connection, limit: int, ttl_s: float, *,
              pinned: bool = False) -> Sequence[sa.Row[Any]]:
    """Claim up to ``limit`` due rows for ``ttl_s`` seconds (in the caller's transaction, if any).

    ``pinned``: the connection's session already has pin_claim_plan(); else it is pinned for the
    transaction.
    """
    if not pinned:
        pin_claim_plan(conn)
    return conn.execute(CLAIM_DUE, {"limit": limit, "ttl_s": ttl_s}).all()


# Takes acknowledged rows off the queue and records them published; a row another relay already
# took off (its claim had expired) is left as that relay recorded it. A result may have been
# recorded already (the sender can be faster than this update): its status is kept.
MARK_PUBLISHED = sa.text("""
    WITH done AS (DELETE FROM outbox_queue WHERE id = ANY(:ids) RETURNING id)
    UPDATE outbox
    SET published_at = now(), updated_at = now(),
        status = CASE WHEN status = 'pending' THEN 'published' ELSE status END
    WHERE id = ANY(ARRAY(SELECT id FROM done))
""")

# Rows that can never be published (no event can carry them, relay.rows, or theirs is too large):
# off the queue, failed with the reason, one per row.
MARK_FAILED = sa.text("""
    WITH refused AS (
        SELECT * FROM unnest(CAST(:ids AS bigint[]), CAST(:errors AS text[])) AS r(id, error)
    ), done AS (
        DELETE FROM outbox_queue WHERE id IN (SELECT id FROM refused) RETURNING id
    )
    UPDATE outbox AS o
    SET status = 'failed', last_error = r.error, updated_at = now()
    FROM refused AS r
    WHERE o.id = r.id AND o.id IN (SELECT id FROM done) AND o.status IN ('pending', 'published')
""")

RELEASE_CLAIMS = sa.text("UPDATE outbox_queue SET claimed_until = NULL WHERE id = ANY(:ids)")

# Applies one delivery result. Results for a key arrive in order on one partition, but a replay
# or a late duplicate may bring an older one, or the row's own latest one again: it applies only
# when it is ahead of the row, ordering by attempt and then by how final the status is, so a
# replay changes nothing; 'sent' is never undone, nor is the later final state 'suppressed' (never
# attempted), nor 'bounced' (a delivery status notification came) but as said below. A result
# must name its row consistently: id, key (as now written, or as written before migration 0005,
# for events still in flight) and recipient; one written to the results topic by anyone else for
# a row it does not match changes nothing.
# A 'bounced' row still takes what the sender's results say of its attempts, so that the row ends
# the same whether the bounce was recorded before them or after (a bounce can come 31 ms after
# the 250, and a recorder batch applies its results before its reports): a 'sent' result fills
# attempts, sent_at and message_id, a 'retrying' one the attempts, each keeping the row bounced;
# the bounce's last error stays, and its SMTP and enhanced codes, the result's filling only what
# the bounce left NULL (a bounce that gave none leaves the codes of the row before it, where a
# same-batch order would have left the result's). A 'failed' or 'dead' result of the row's latest
# attempt or a later one, on a row never recorded sent, ends the row failed or dead with the
# bounce's error kept: that is what a bounce recorded after it leaves (RECORD_BOUNCE keeps a row
# the sender ended, which says what the sender saw last, and takes the notice as its error), and
# the attempts then count every attempt made. The address is suppressed in either order.
# A 'sent' result also outranks a poison refusal ('failed', 'poison: ...') of any attempt: a
# copy of the row's record that the sender refused, or a forgery under its key, must not hide
# that its event went out. A poison refusal applies to the row's next attempt at most (a forged
# postroom.attempt_base cannot push a row past its genuine results). The attempts are compared as
# bigint: a row written by SQL may hold attempts at the int limit.
RECORD_RESULT = sa.text("""
    UPDATE outbox
    SET status = CASE WHEN status = 'bounced' AND CAST(:status AS text) IN ('sent', 'retrying')
                      THEN status ELSE :status END,
        attempts = :attempt,
        last_error = CASE WHEN status = 'bounced' THEN last_error
                          ELSE COALESCE(:error, last_error) END,
        smtp_code = CASE WHEN status = 'bounced' THEN COALESCE(smtp_code, :smtp_code)
                         ELSE COALESCE(:smtp_code, smtp_code) END,
        enhanced_code = CASE WHEN status = 'bounced'
                             THEN COALESCE(enhanced_code, CAST(:enhanced_code AS text))
                             ELSE COALESCE(:enhanced_code, enhanced_code) END,
        message_id = COALESCE(:message_id, message_id),
        sent_at = CASE WHEN :status = 'sent' THEN :occurred_at ELSE sent_at END,
        next_attempt_at = CASE WHEN status = 'bounced' THEN NULL
                               ELSE CAST(:next_attempt_at AS timestamptz) END,
        updated_at = now()
    WHERE id = :outbox_id
      AND (idempotency_key = :idempotency_key
           OR message_key || '|' || lower(recipient) = :idempotency_key)
      AND lower(recipient) = lower(:recipient)
      AND status NOT IN ('sent', 'suppressed')
      AND CAST(:attempt AS bigint) <= CAST(attempts AS bigint) + CAST(:max_attempt AS bigint)
      AND (CAST(:status AS text) <> 'failed'
           OR NOT starts_with(COALESCE(CAST(:error AS text), ''), 'poison: ')
           OR CAST(:attempt AS bigint) <= CAST(attempts AS bigint) + 1)
      AND CASE WHEN status = 'bounced' THEN
               sent_at IS NULL
               AND (attempts < :attempt
                    OR (attempts = :attempt AND CAST(:status AS text) <> 'retrying'))
          ELSE
               attempts < :attempt
               OR (attempts = :attempt AND
                   (CASE status WHEN 'retrying' THEN 1 WHEN 'failed' THEN 2 WHEN 'dead' THEN 2
                                ELSE 0 END)
                   < (CASE CAST(:status AS text) WHEN 'retrying' THEN 1 ELSE 2 END))
               OR (status = 'failed' AND CAST(:status AS text) = 'sent'
                   AND starts_with(last_error, 'poison: '))
          END
""")

# -- reports that come after the server accepted an email (postroom bounces), the suppression list

# The row a report names, as RECORD_RESULT matches a result's row: id, key (either form) and
# recipient. A report naming no row of ours changes nothing. ``redriven``: pending again after it
# was published, queued by a redrive (a row pending and never marked published is one the relay
# published and Kafka acknowledged, its MARK_PUBLISHED not yet run: a redrive takes only rows off
# the queue, and a row off it was marked published, or failed by the relay unsent, tokenless).
_REPORT_ROW = """
    SELECT id, lower(recipient) AS address, status, last_error,
           status = 'pending' AND published_at IS NOT NULL AS redriven
    FROM outbox
    WHERE id = :outbox_id
      AND (idempotency_key = :idempotency_key
           OR message_key || '|' || lower(recipient) = :idempotency_key)
      AND lower(recipient) = lower(:recipient)
    FOR UPDATE
"""
# Puts an address on the suppression list until :expires_at, or keeps it there longer: an entry
# is only ever extended, so a report read again (same :expires_at) changes nothing.
_SUPPRESS_ADDRESS = """
    INSERT INTO suppression AS s (address, reason, source, created_at, expires_at, updated_at)
    SELECT address, :reason, :source, now(), :expires_at, now() FROM {rows}
    ON CONFLICT (address) DO UPDATE
        SET reason = excluded.reason, source = excluded.source, expires_at = excluded.expires_at,
            updated_at = now()
        WHERE s.expires_at < excluded.expires_at
    RETURNING address
"""

# A hard bounce: the row ends 'bounced' with the notice's status and diagnostic as its last
# error, whether it was recorded sent or not yet (a bounce can come 31 ms after the 250, before
# the sender's result is recorded; a signed token says the email went out), also a pending one
# the relay has published but not yet marked so (MARK_PUBLISHED keeps the bounced state). A row
# that ended failed or dead keeps its state, which says what the sender saw, and takes the notice
# as its last error; so does a redriven one (queued again: the relay finishes it as suppressed
# when it claims it, the address being suppressed now). A 'bounced' or 'suppressed' row is left
# alone, so a notice read twice changes nothing. The address is suppressed once, when its row
# changed. Returns (rows changed, addresses suppressed or extended).
RECORD_BOUNCE = sa.text(f"""
    WITH matched AS ({_REPORT_ROW}),
    changed AS (
        UPDATE outbox AS o
        SET status = CASE WHEN m.status IN ('failed', 'dead') OR m.redriven THEN o.status
                          ELSE 'bounced' END,
            last_error = :error,
            smtp_code = COALESCE(:smtp_code, o.smtp_code),
            enhanced_code = COALESCE(:enhanced_code, o.enhanced_code),
            next_attempt_at = NULL,
            updated_at = now()
        FROM matched AS m
        WHERE o.id = m.id AND m.status NOT IN ('bounced', 'suppressed')
          AND (NOT (m.status IN ('failed', 'dead') OR m.redriven)
               OR m.last_error IS DISTINCT FROM :error)
        RETURNING m.address
    ),
    suppressed AS ({_SUPPRESS_ADDRESS.format(rows="changed")})
    SELECT (SELECT count(*) FROM changed), (SELECT count(*) FROM suppressed)
""")

# A delay notice: the row's last error, its state unchanged. Not on a row whose final word is
# already said (bounced, suppressed, failed, dead), and not again when it says the same.
RECORD_DELAY = sa.text(f"""
    WITH matched AS ({_REPORT_ROW}),
    changed AS (
        UPDATE outbox AS o
        SET last_error = :error,
            smtp_code = COALESCE(:smtp_code, o.smtp_code),
            enhanced_code = COALESCE(:enhanced_code, o.enhanced_code),
            updated_at = now()
        FROM matched AS m
        WHERE o.id = m.id AND m.status NOT IN ('bounced', 'suppressed', 'failed', 'dead')
          AND m.last_error IS DISTINCT FROM :error
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM changed), 0
""")

# A complaint: the row's address is suppressed; the row itself was delivered and stays so.
RECORD_COMPLAINT = sa.text(f"""
    WITH matched AS ({_REPORT_ROW}),
    suppressed AS ({_SUPPRESS_ADDRESS.format(rows="matched")})
    SELECT (SELECT count(*) FROM matched), (SELECT count(*) FROM suppressed)
""")

# Soft bounces, applied per recorder batch after its results, in three statements (what one
# inserts, the next must see). First, a row that ended dead counts for its address, once (its id
# is the key), unless the address is suppressed already. Arrays: one item per dead result.
ADD_SOFT_BOUNCES = sa.text("""
    INSERT INTO soft_bounces (address, outbox_id, occurred_at)
    SELECT lower(o.recipient), o.id, r.occurred_at
    FROM unnest(CAST(:ids AS bigint[]), CAST(:recipients AS text[]),
                CAST(:occurred_at AS timestamptz[])) AS r(id, recipient, occurred_at)
    JOIN outbox AS o ON o.id = r.id AND lower(o.recipient) = lower(r.recipient)
    WHERE o.status = 'dead'
      AND NOT EXISTS (SELECT 1 FROM suppression AS s
                      WHERE s.address = lower(o.recipient) AND s.expires_at > r.occurred_at)
    ON CONFLICT DO NOTHING
""")

# Then an email sent clears what its address counted before it. Arrays: one per sent result.
CLEAR_SOFT_BOUNCES = sa.text("""
    DELETE FROM soft_bounces AS b
    USING unnest(CAST(:recipients AS text[]), CAST(:occurred_at AS timestamptz[]))
          AS r(recipient, occurred_at)
    WHERE b.address = lower(r.recipient) AND b.occurred_at <= r.occurred_at
""")

# Last, an address of :addresses that counts :soft_limit or more is suppressed (source 'soft')
# from its latest dead row on, and its count starts again. Returns the addresses suppressed.
SUPPRESS_SOFT_BOUNCES = sa.text("""
    WITH over AS (
        SELECT address, count(*) AS n, max(occurred_at) AS latest FROM soft_bounces
        WHERE address IN (SELECT lower(x) FROM unnest(CAST(:addresses AS text[])) AS x)
        GROUP BY address
        HAVING count(*) >= :soft_limit
    ), suppressed AS (
        INSERT INTO suppression AS s (address, reason, source, created_at, expires_at, updated_at)
        SELECT address, n || ' soft bounces in a row (every retry spent)', 'soft', now(),
               latest + make_interval(secs => :expiry_s), now()
        FROM over
        ON CONFLICT (address) DO UPDATE
            SET reason = excluded.reason, source = excluded.source,
                expires_at = excluded.expires_at, updated_at = now()
            WHERE s.expires_at < excluded.expires_at
        RETURNING address
    ), forgotten AS (
        DELETE FROM soft_bounces WHERE address IN (SELECT address FROM over)
    )
    SELECT address FROM suppressed
""")

# The relay's one look at the list per claimed batch: claimed rows whose address is suppressed
# now are taken off the queue and end 'suppressed', never published, the entry's source, expiry
# and reason as their last error. Returns their ids.
MARK_SUPPRESSED = sa.text("""
    WITH hit AS (
        SELECT o.id, s.source, s.reason, s.expires_at
        FROM outbox AS o JOIN suppression AS s ON s.address = lower(o.recipient)
        WHERE o.id = ANY(:ids) AND o.status IN ('pending', 'published') AND s.expires_at > now()
    ), done AS (
        DELETE FROM outbox_queue WHERE id IN (SELECT id FROM hit) RETURNING id
    )
    UPDATE outbox AS o
    SET status = 'suppressed', updated_at = now(),
        last_error = 'suppressed (' || h.source || ', until '
                     || to_char(h.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI') || ' UTC): '
                     || h.reason
    FROM hit AS h
    WHERE o.id = h.id AND o.id IN (SELECT id FROM done)
    RETURNING o.id
""")


# Retention: entries that expired before the cutoff, and soft bounces counted before it.
PURGE_SUPPRESSION = sa.text("""
    WITH expired AS (DELETE FROM suppression WHERE expires_at < :cutoff RETURNING 1),
    old AS (DELETE FROM soft_bounces WHERE occurred_at < :cutoff RETURNING 1)
    SELECT (SELECT count(*) FROM expired), (SELECT count(*) FROM old)
""")

SUPPRESSION_LIST = sa.text("""
    SELECT address, reason, source, created_at, expires_at FROM suppression
    WHERE expires_at > now() ORDER BY address
""")

# An operator's entry: replaces whatever the address had (the operator's word is the last).
SUPPRESSION_ADD = sa.text("""
    INSERT INTO suppression (address, reason, source, created_at, expires_at, updated_at)
    VALUES (:address, :reason, 'operator', now(), now() + make_interval(secs => :expiry_s), now())
    ON CONFLICT (address) DO UPDATE
        SET reason = excluded.reason, source = excluded.source, created_at = excluded.created_at,
            expires_at = excluded.expires_at, updated_at = now()
    RETURNING address, reason, source, created_at, expires_at
""")

# Off the list, and what its address counted towards it with it.
SUPPRESSION_REMOVE = sa.text("""
    WITH gone AS (DELETE FROM suppression WHERE address = :address RETURNING address),
    forgotten AS (DELETE FROM soft_bounces WHERE address = :address)
    SELECT count(*) FROM gone
""")

# The row a bounce's token names, read by postroom bounces for the result it publishes (the
# recorder stays the one writer of rows).
ROW_OF_REPORT = sa.text(
    "SELECT id, idempotency_key, recipient, attempts, status FROM outbox WHERE id = :id")

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


# One statement per chunk of one message's recipients: the rows' own columns (idempotency key,
# recipient) as two arrays, the columns they share sent once. Rows go in the given order (ids
# follow it); a second row of one idempotency key, in the chunk or before it, is skipped. It
# returns how many rows are new. An executemany of one row per recipient sent every column of
# every row, and psycopg parsed each multi-row statement of 12,000 parameters anew (most of the
# time of a call with 20,000 recipients; this statement is bound by the database's writes).
INSERT_ROWS = """
    WITH inserted AS (
        INSERT INTO {outbox} AS o (idempotency_key, message_key, recipient, sender, subject, body,
                                  attachments, html, inline, priority, available_at{trace})
        SELECT r.idempotency_key, :message_key, r.recipient, CAST(:sender AS text), :subject,
               :body, CAST(:attachments AS text[]), CAST(:html AS text),
               CAST(:inline AS text[]), :priority,
               COALESCE(CAST(:available_at AS timestamptz), now()){trace_values}
        FROM unnest(CAST(:keys AS text[]), CAST(:recipients AS text[]))
             WITH ORDINALITY AS r(idempotency_key, recipient, n)
        ORDER BY r.n
        ON CONFLICT (idempotency_key) DO NOTHING
        RETURNING 1
    )
    SELECT count(*) FROM inserted
"""


# INSERT_ROWS of one recipient (a personalised call): the same row, as VALUES, without unnest and
# its sort. 257 µs a statement against INSERT_ROWS' 291 (psycopg alone, prepared, both triggers,
# median of 5 rounds of 1,000): a personalised call is bound by its statement's round trip.
INSERT_ROW = """
    WITH inserted AS (
        INSERT INTO {outbox} AS o (idempotency_key, message_key, recipient, sender, subject, body,
                                  attachments, html, inline, priority, available_at{trace})
        VALUES (CAST(:idempotency_key AS text), :message_key, CAST(:recipient AS text),
                CAST(:sender AS text), :subject, :body, CAST(:attachments AS text[]),
                CAST(:html AS text), CAST(:inline AS text[]), :priority,
                COALESCE(CAST(:available_at AS timestamptz), now()){trace_values})
        ON CONFLICT (idempotency_key) DO NOTHING
        RETURNING 1
    )
    SELECT count(*) FROM inserted
"""

# Rows of many emails (enqueue_many), every column an array of one item per row; the paths of
# attachments and inline images as a JSON array each (arrays of arrays must be rectangular).
INSERT_EMAILS_COLUMNS = ("idempotency_key", "message_key", "recipient", "sender", "subject",
                         "body", "attachments", "html", "inline", "priority", "available_at")
INSERT_EMAILS = """
    WITH inserted AS (
        INSERT INTO {outbox} AS o (idempotency_key, message_key, recipient, sender, subject, body,
                                  attachments, html, inline, priority, available_at{trace})
        SELECT r.idempotency_key, r.message_key, r.recipient, r.sender, r.subject, r.body,
               CASE WHEN r.attachments = '[]' THEN CAST('{{}}' AS text[]) ELSE
                   ARRAY(SELECT jsonb_array_elements_text(CAST(r.attachments AS jsonb))) END,
               r.html,
               CASE WHEN r.inline = '[]' THEN CAST('{{}}' AS text[]) ELSE
                   ARRAY(SELECT jsonb_array_elements_text(CAST(r.inline AS jsonb))) END,
               r.priority, COALESCE(r.available_at, now()){trace_values}
        FROM unnest(CAST(:idempotency_key AS text[]), CAST(:message_key AS text[]),
                    CAST(:recipient AS text[]), CAST(:sender AS text[]),
                    CAST(:subject AS text[]), CAST(:body AS text[]),
                    CAST(:attachments AS text[]), CAST(:html AS text[]),
                    CAST(:inline AS text[]), CAST(:priority AS text[]),
                    CAST(:available_at AS timestamptz[]))
             WITH ORDINALITY AS r(idempotency_key, message_key, recipient, sender, subject, body,
                                  attachments, html, inline, priority, available_at, n)
        ORDER BY r.n
        ON CONFLICT (idempotency_key) DO NOTHING
        RETURNING 1
    )
    SELECT count(*) FROM inserted
"""


# Whether the outbox :outbox names has migration 0010's trace context columns (0 without the
# table: the insert then says the schema is not ready).
HAS_TRACE_COLUMNS = sa.text("""
    SELECT count(*) FROM pg_attribute
    WHERE attrelid = to_regclass(:outbox) AND attname = 'traceparent' AND NOT attisdropped
""")


def outbox_of(schema: str | None) -> str:
    """The outbox table of ``schema`` (a quoted identifier), or of the search path's."""
    return f'"{schema.replace(chr(34), chr(34) * 2)}".outbox' if schema else "outbox"


# The trace context columns (migration 0010) are written only by an enqueue in a traced job, so
# an untraced job's statement is the one of before and still runs on an outbox at 0009.
_TRACE_COLUMNS = ", traceparent, tracestate"
_TRACE_VALUES = ", CAST(:traceparent AS text), CAST(:tracestate AS text)"


@functools.cache
def insert_rows(schema: str | None, *, traced: bool = False) -> sa.TextClause:
    """INSERT_ROWS into the outbox of ``schema``, or of the search path's; ``traced``: with
    the ``:traceparent`` and ``:tracestate`` every row of the statement keeps."""
    return sa.text(INSERT_ROWS.format(outbox=outbox_of(schema),
                                      trace=_TRACE_COLUMNS if traced else "",
                                      trace_values=_TRACE_VALUES if traced else ""))


@functools.cache
def insert_row(schema: str | None, *, traced: bool = False) -> sa.TextClause:
    """INSERT_ROW into the outbox of ``schema``, or of the search path's; ``traced`` as for
    :func:`insert_rows`."""
    return sa.text(INSERT_ROW.format(outbox=outbox_of(schema),
                                     trace=_TRACE_COLUMNS if traced else "",
                                     trace_values=_TRACE_VALUES if traced else ""))

@functools.cache
def insert_emails(schema: str | None, *, traced: bool = False) -> sa.TextClause:
    """INSERT_EMAILS into the outbox of ``schema``, or of the search path's; ``traced`` as for
    :func:`insert_rows` (one context for all the emails of the call)."""
    return sa.text(INSERT_EMAILS.format(outbox=outbox_of(schema),
                                        trace=_TRACE_COLUMNS if traced else "",
                                        trace_values=_TRACE_VALUES if traced else ""))


# -- operators' commands: redrive, requeue, reports, retention ----------------------------------

FINAL_FAILURES = ("failed", "dead")
# What `report failures` lists: the rows that did not reach their recipient.
UNDELIVERED_STATES = ("failed", "dead", "bounced", "suppressed")

# Rows that ended failed or dead, matched by idempotency key or message key (and recipient),
# that are not queued already. What a redrive would send again.
REDRIVABLE = sa.text("""
    SELECT o.id, o.idempotency_key, o.message_key, o.recipient, o.status, o.attempts,
           o.last_error
    FROM outbox AS o
    WHERE o.status IN ('failed', 'dead')
      AND (o.idempotency_key = ANY(:keys) OR o.message_key = ANY(:keys))
      AND (CAST(:recipient AS text) IS NULL OR lower(o.recipient) = lower(:recipient))
      AND NOT EXISTS (SELECT 1 FROM outbox_queue AS q WHERE q.id = o.id)
    ORDER BY o.id
""")

# Puts failed or dead rows back on the relay's queue: status pending, due now. The row keeps its
# attempts and last_error; the relay publishes it as attempt attempts + 1 with a fresh retry
# budget. FOR UPDATE makes a second redrive at the same moment wait and then find the rows
# pending: each row goes back once.
REDRIVE = sa.text("""
    WITH picked AS (
        SELECT id, status FROM outbox
        WHERE id = ANY(:ids) AND status IN ('failed', 'dead')
        FOR UPDATE
    ), queued AS (
        INSERT INTO outbox_queue (id, available_at)
        SELECT id, now() FROM picked
        ON CONFLICT (id) DO NOTHING
        RETURNING id
    )
    UPDATE outbox AS o
    SET status = 'pending', available_at = now(), next_attempt_at = NULL, updated_at = now()
    FROM picked AS p
    WHERE o.id = p.id AND o.id IN (SELECT id FROM queued)
    RETURNING o.id, o.idempotency_key, o.recipient, p.status AS was, o.attempts
""")

NOTIFY_RELAY = sa.text(f"SELECT pg_notify('{NOTIFY_CHANNEL}', current_schema())")

STATES_OF_KEYS = sa.text("""
    SELECT idempotency_key, status, attempts FROM outbox WHERE idempotency_key = ANY(:keys)
""")

FAILURES_REPORT = sa.text("""
    SELECT id, recipient, message_key, idempotency_key, subject, status, attempts, last_error,
           updated_at
    FROM outbox
    WHERE status IN ('failed', 'dead', 'bounced', 'suppressed') AND updated_at >= :since
    ORDER BY updated_at, id
""")

# One bounded batch of final rows older than the cutoff, after the last id of the previous
# batch: each batch is its own short transaction, and walks the primary key from where the last
# one stopped instead of from the start.
PURGE_OUTBOX_BATCH = sa.text("""
    WITH doomed AS (
        SELECT id FROM outbox
        WHERE id > :after AND status IN ('sent', 'failed', 'dead', 'bounced', 'suppressed')
          AND COALESCE(sent_at, updated_at, created_at) < :cutoff
          AND NOT EXISTS (SELECT 1 FROM outbox_queue AS q WHERE q.id = outbox.id)
        ORDER BY id
        LIMIT :batch
        FOR UPDATE SKIP LOCKED
    )
    DELETE FROM outbox WHERE id IN (SELECT id FROM doomed)
    RETURNING id
""")
COUNT_PURGEABLE_OUTBOX = sa.text("""
    SELECT status, count(*) FROM outbox
    WHERE status IN ('sent', 'failed', 'dead', 'bounced', 'suppressed')
      AND COALESCE(sent_at, updated_at, created_at) < :cutoff
      AND NOT EXISTS (SELECT 1 FROM outbox_queue AS q WHERE q.id = outbox.id)
    GROUP BY status
""")
# Ledger rows are finished when sent or released; 'sending' is a live claim. A ledger row is
# kept while its outbox row exists (a redrive may need it) and while a topic may still hold its
# event (a consumer group reset to the beginning must find the key sent).
PURGE_LEDGER_BATCH = sa.text("""
    WITH doomed AS (
        SELECT idempotency_key FROM sender_ledger AS l
        WHERE l.state IN ('sent', 'released') AND l.updated_at < :cutoff
          AND l.idempotency_key > :after
          AND NOT EXISTS (SELECT 1 FROM outbox AS o WHERE o.idempotency_key = l.idempotency_key)
        ORDER BY l.idempotency_key
        LIMIT :batch
        FOR UPDATE SKIP LOCKED
    )
    DELETE FROM sender_ledger WHERE idempotency_key IN (SELECT idempotency_key FROM doomed)
    RETURNING idempotency_key
""")
# The same, for a dry run: rows whose outbox row the outbox purge would delete count too.
COUNT_PURGEABLE_LEDGER = sa.text("""
    SELECT count(*) FROM sender_ledger AS l
    WHERE l.state IN ('sent', 'released') AND l.updated_at < :cutoff
      AND NOT EXISTS (
          SELECT 1 FROM outbox AS o
          WHERE o.idempotency_key = l.idempotency_key
            AND NOT (o.status IN ('sent', 'failed', 'dead', 'bounced', 'suppressed')
                     AND COALESCE(o.sent_at, o.updated_at, o.created_at) < :outbox_cutoff))
""")
