"""The relay's statements: claim due rows, mark them published, failed or suppressed, release
claims."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

# Claims due, unpublished rows no other relay holds. SKIP LOCKED lets several relays share the
# backlog; the claim (not a held transaction) keeps a row theirs while Kafka acknowledges it.
# It returns each row as the email-requested event's fields, in the contract's order and named
# as there, so the relay encodes a row as it comes (the relay checks the names). created_at comes
# as the contract's timestamp-millis, milliseconds since the epoch, rounded down as the codec
# rounds a datetime: the database computes it for less than the relay's parsing of a timestamp
# (exactly: extract() returns numeric since PostgreSQL 14). The attempt is the queue row's, fixed
# when the row was queued (migration 0012): 1 for a new row, n + 1 for a row redriven after n
# attempts, the same at every claim, so a row published again after its claim ran out is the same
# attempt again however far its first event went meanwhile. A queue row of a release before 0012
# has none and goes on from the row's recorded attempts. A row written by SQL may hold what no
# event can carry: an infinite created_at comes as NULL and the attempt as a bigint, so the claim
# itself never fails on a row and relay.rows refuses it as poison. The rows come in no set order
# (the claimed queue rows' order on their pages): each is its own key's only record.
# A claim names its owner (migration 0013): the key of the advisory lock the claiming session
# holds (take_claims_owner). A row another owner claimed is free before its claim runs out when
# that lock can be taken for the statement: the session that held it has ended (its relay was
# killed, or its connection cut), so that relay can no longer publish or mark the row. A row it
# had published already goes out again as the same attempt, which the ledger sends once, as after
# a claim ran out; the ledger also sends each key and attempt once when a round that failed part
# way left records in flight (relay/producing.py waits for them first). A session's own claims are
# left alone by its own claims: its lock would be granted to it again, so the CASE tries the lock
# only for another owner's. A claim without an owner (NULL) is free only when it runs out. The
# server frees a lock when it sees its session end: at once when the relay's process dies; after
# a host crash or a network cut, when its TCP keepalive gives up (relay.db's
# SERVER_KEEPALIVE_OPTIONS: about 25 s).
CLAIM_DUE = sa.text("""
    WITH claimed AS (
        UPDATE outbox_queue
        SET claimed_until = now() + make_interval(secs => :ttl_s),
            claimed_by = CAST(:owner AS bigint)
        WHERE ctid = ANY(ARRAY(
            SELECT ctid FROM outbox_queue
            WHERE available_at <= now()
              AND (claimed_until IS NULL OR claimed_until < now()
                   OR CASE WHEN claimed_by IS DISTINCT FROM CAST(:owner AS bigint)
                           THEN pg_try_advisory_xact_lock(claimed_by) ELSE false END)
            ORDER BY available_at, id
            LIMIT :limit
            FOR UPDATE SKIP LOCKED))
        RETURNING id, attempt
    )
    SELECT o.idempotency_key, o.message_key, o.id AS outbox_id, o.recipient,
           COALESCE(o.sender, '') AS sender, o.subject, o.body, o.attachments, o.priority,
           CASE WHEN isfinite(o.created_at)
                THEN CAST(floor(extract(epoch FROM o.created_at) * 1000) AS bigint) END
               AS created_at,
           COALESCE(c.attempt, CAST(o.attempts AS bigint) + 1) AS attempt,
           CAST(NULL AS timestamptz) AS not_before,
           o.html, o.inline, o.traceparent, o.tracestate
    FROM claimed AS c JOIN outbox AS o ON o.id = c.id
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


def claim_due(conn: sa.Connection, limit: int, ttl_s: float, *, owner: int | None = None,
              pinned: bool = False) -> Sequence[sa.Row[Any]]:
    """Claim up to ``limit`` due rows for ``ttl_s`` seconds (in the caller's transaction, if any).

    ``owner``: the key :func:`take_claims_owner` took on this connection; the claims are free once
    its session ends. None: they are free only when they run out. ``pinned``: the connection's
    session already has pin_claim_plan(); else it is pinned for the transaction.
    """
    if not pinned:
        pin_claim_plan(conn)
    return conn.execute(CLAIM_DUE, {"limit": limit, "ttl_s": ttl_s, "owner": owner}).all()


# A session-level advisory lock on a key of one bigint (pg_locks' objsubid 1), apart from the
# two-int keys relay.db's migration lock takes; false when some session holds it already.
TAKE_CLAIMS_OWNER = sa.text("SELECT pg_try_advisory_lock(CAST(:key AS bigint))")
OWNER_KEY_TRIES = 8


def take_claims_owner(conn: sa.Connection) -> int:
    """A random key whose advisory lock this connection's session now holds, to name its claims
    (:func:`claim_due`); held until the session ends (its claims are then free). The caller must
    not hand the connection back to a pool."""
    for _ in range(OWNER_KEY_TRIES):
        key = secrets.randbits(63)
        if conn.execute(TAKE_CLAIMS_OWNER, {"key": key}).scalar_one():
            return key
    raise RuntimeError(f"no free advisory lock key in {OWNER_KEY_TRIES} random tries")


# Takes acknowledged rows off the queue and records them published; only queue entries this
# relay's claim still names (``:owner``; NULL for a claim made without one): a row another
# relay claimed meanwhile (its claim had expired), or queued again since (a requeue's next
# attempt), is left as that relay or the requeue wrote it. A result may have been recorded
# already (the sender can be faster than this update): its status is kept.
MARK_PUBLISHED = sa.text("""
    WITH done AS (DELETE FROM outbox_queue
                  WHERE id = ANY(:ids) AND claimed_by IS NOT DISTINCT FROM CAST(:owner AS bigint)
                  RETURNING id)
    UPDATE outbox
    SET published_at = now(), updated_at = now(),
        status = CASE WHEN status = 'pending' THEN 'published' ELSE status END
    WHERE id = ANY(ARRAY(SELECT id FROM done))
""")

# Rows that can never be published (no event can carry them, relay.rows, or theirs is too large):
# off the queue, failed with the reason, one per row; as MARK_PUBLISHED, only while our claim
# names them.
MARK_FAILED = sa.text("""
    WITH refused AS (
        SELECT * FROM unnest(CAST(:ids AS bigint[]), CAST(:errors AS text[])) AS r(id, error)
    ), done AS (
        DELETE FROM outbox_queue
        WHERE id IN (SELECT id FROM refused)
          AND claimed_by IS NOT DISTINCT FROM CAST(:owner AS bigint)
        RETURNING id
    )
    UPDATE outbox AS o
    SET status = 'failed', last_error = r.error, updated_at = now()
    FROM refused AS r
    WHERE o.id = r.id AND o.id IN (SELECT id FROM done) AND o.status IN ('pending', 'published')
""")

RELEASE_CLAIMS = sa.text("""
    UPDATE outbox_queue SET claimed_until = NULL, claimed_by = NULL
    WHERE id = ANY(:ids) AND claimed_by IS NOT DISTINCT FROM CAST(:owner AS bigint)
""")
# The relay's one look at the list per claimed batch: claimed rows whose address is suppressed
# now are taken off the queue and end 'suppressed', never published, the entry's source, expiry
# and reason as their last error. Returns their ids. :addresses are the rows' recipients, one per
# id, each with its domain in IDNA form (rules.ascii_domain_address: the relay computes it, as no
# SQL can); lowered here as an entry is (SUPPRESSION_ADD, the recorder's reports), so the local
# part is compared as it always was.
MARK_SUPPRESSED = sa.text("""
    WITH hit AS (
        SELECT o.id, s.source, s.reason, s.expires_at
        FROM unnest(CAST(:ids AS bigint[]), CAST(:addresses AS text[])) AS c(id, address)
        JOIN outbox AS o ON o.id = c.id
        JOIN suppression AS s ON s.address = lower(c.address)
        WHERE o.status IN ('pending', 'published') AND s.expires_at > now()
    ), done AS (
        DELETE FROM outbox_queue
        WHERE id IN (SELECT id FROM hit) AND claimed_by IS NOT DISTINCT FROM CAST(:owner AS bigint)
        RETURNING id
    )
    UPDATE outbox AS o
    SET status = 'suppressed', updated_at = now(),
        last_error = 'suppressed (' || h.source || ', until '
                     || CASE WHEN isfinite(h.expires_at)
                             THEN to_char(h.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI')
                                  || ' UTC'
                             ELSE 'further notice' END
                     || '): ' || h.reason
    FROM hit AS h
    WHERE o.id = h.id AND o.id IN (SELECT id FROM done)
    RETURNING o.id
""")

