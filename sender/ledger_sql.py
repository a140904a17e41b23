"""The delivery ledger's statements on ``sender_ledger`` (its table is relay/migrations'), and the
array literals their prepared forms take as text parameters."""

from __future__ import annotations

# Every sender holds this session-level advisory lock for its owner id on its claims connection.
# Taking the same lock for the length of the claim statement succeeds only when no session holds
# it: the owner's process or its connection is gone, and its claims are free.
LOCK_NAMESPACE = "postroom.sender_ledger"
TAKE_OWNER_LOCK = """
    SELECT pg_try_advisory_lock(hashtextextended(%(namespace)s || ':' || %(owner)s, 0))
"""
# Prepared once per connection and run by libpq directly, as the mark is: $1 the owner, $2 the
# lease in seconds, $3 the keys and $4 their attempts (as array literals), $5 LOCK_NAMESPACE.
CLAIM = """
    INSERT INTO sender_ledger AS l (idempotency_key, state, owner, lease_until, attempt, updated_at)
    SELECT k, 'sending', $1, now() + make_interval(secs => $2), a, now()
    FROM unnest($3::text[], $4::int[]) AS t(k, a)
    ON CONFLICT (idempotency_key) DO UPDATE
        SET state = 'sending', owner = excluded.owner, lease_until = excluded.lease_until,
            attempt = excluded.attempt, updated_at = now(),
            taken_from = CASE WHEN l.state = 'sending' THEN l.owner END
        WHERE (l.state = 'released'
               OR (l.state = 'sending' AND (
                    l.lease_until < now()
                    OR (l.owner <> excluded.owner AND pg_try_advisory_xact_lock(
                            hashtextextended($5 || ':' || l.owner, 0))))))
          -- An attempt whose outcome went out whole is not made again (a copy of its record).
          AND (l.done_attempt IS NULL OR l.done_attempt < excluded.attempt)
    RETURNING idempotency_key, taken_from
"""
CLAIM_NAME = b"postroom_claim"
PREPARE_CLAIM = f"PREPARE {CLAIM_NAME.decode()} (text, float8, text[], int[], text) AS {CLAIM}"
STATES = """
    SELECT idempotency_key, state, owner, lease_until, attempt, message_id, done_attempt
    FROM sender_ledger WHERE idempotency_key = ANY(%(keys)s)
"""
# Whoever holds the claim now: a server accepted the key, so no one may send it again.
# Prepared once per connection and written by libpq directly ($1 the keys, $2 their Message-IDs,
# as text arrays): psycopg's query conversion and parameter adaptation were most of a mark's CPU.
MARK_SENT = """
    UPDATE sender_ledger AS l
    SET state = 'sent', lease_until = NULL, message_id = t.message_id,
        updated_at = clock_timestamp()
    FROM unnest($1::text[], $2::text[]) AS t(k, message_id)
    WHERE l.idempotency_key = t.k
"""
MARK_SENT_NAME = b"postroom_mark_sent"
# Our claims that waited for their turn long enough to need a fresh lease before their send; a
# key not returned is no longer ours (its lease ran out or our session ended, and another sender
# took it, or a server accepted it meanwhile).
RENEW = """
    UPDATE sender_ledger
    SET lease_until = now() + make_interval(secs => %(lease_s)s), updated_at = now()
    WHERE idempotency_key = ANY(%(keys)s) AND owner = %(owner)s AND state = 'sending'
    RETURNING idempotency_key
"""
# Our claims given up: after an attempt whose outcome is published (its attempt becomes the
# key's done_attempt), or without an attempt (a throttled send, deferred: done NULL). A key given
# twice in one statement is updated once, with its highest attempt (max and GREATEST skip NULLs).
RELEASE = """
    UPDATE sender_ledger AS l
    SET state = 'released', lease_until = NULL, updated_at = now(),
        done_attempt = GREATEST(l.done_attempt, t.done)
    FROM (SELECT k, max(done) AS done
          FROM unnest(%(keys)s::text[], %(dones)s::int[]) AS u(k, done) GROUP BY k) AS t
    WHERE l.idempotency_key = t.k AND l.owner = %(owner)s AND l.state = 'sending'
"""
PREPARE_MARK_SENT = f"PREPARE {MARK_SENT_NAME.decode()} (text[], text[]) AS {MARK_SENT}"


def text_array(values: list[str]) -> bytes:
    """``values`` as a PostgreSQL text array literal, every element quoted (so "NULL" is text)."""
    quoted = ('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values)
    return ("{" + ",".join(quoted) + "}").encode()


def int_array(values: list[int]) -> bytes:
    """``values`` as a PostgreSQL integer array literal."""
    return ("{" + ",".join(map(str, values)) + "}").encode()
