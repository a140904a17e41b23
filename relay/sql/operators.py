"""Operators' commands: redrive, requeue, reports, retention."""

from __future__ import annotations

import sqlalchemy as sa

from postroom.relay.sql.reads import READABLE_UNTIL_SQL
from postroom.relay.sql.tables import NOTIFY_CHANNEL

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
# attempts and last_error; its queue row holds attempts + 1, the attempt the relay publishes it
# as, with a fresh retry budget. FOR UPDATE makes a second redrive at the same moment wait and
# then find the rows pending: each row goes back once.
REDRIVE = sa.text("""
    WITH picked AS (
        SELECT id, status, attempts FROM outbox
        WHERE id = ANY(:ids) AND status IN ('failed', 'dead')
        FOR UPDATE
    ), queued AS (
        INSERT INTO outbox_queue (id, available_at, attempt)
        SELECT id, now(), CAST(attempts AS bigint) + 1 FROM picked
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

FAILURES_REPORT = sa.text(f"""
    SELECT id, recipient, message_key, idempotency_key, subject, status, attempts, last_error,
           -- an 'infinity' written by SQL, read as the last time Python holds (reads.py)
           LEAST(updated_at, {READABLE_UNTIL_SQL}) AS updated_at
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
          AND GREATEST(sent_at, updated_at, created_at) < :cutoff
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
      AND GREATEST(sent_at, updated_at, created_at) < :cutoff
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
                     AND GREATEST(o.sent_at, o.updated_at, o.created_at) < :outbox_cutoff))
""")
