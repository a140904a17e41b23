"""The suppression list as operators and retention touch it: list, add, remove, purge."""

from __future__ import annotations

import sqlalchemy as sa

from postroom.relay.sql.reads import READABLE_FROM_SQL, READABLE_UNTIL_SQL

# Retention: entries that expired before the cutoff, and soft bounces counted before it.
PURGE_SUPPRESSION = sa.text("""
    WITH expired AS (DELETE FROM suppression WHERE expires_at < :cutoff RETURNING 1),
    old AS (DELETE FROM soft_bounces WHERE occurred_at < :cutoff RETURNING 1)
    SELECT (SELECT count(*) FROM expired), (SELECT count(*) FROM old)
""")

SUPPRESSION_LIST = sa.text(f"""
    SELECT address, reason, source,
           LEAST(GREATEST(created_at, {READABLE_FROM_SQL}), {READABLE_UNTIL_SQL}) AS created_at,
           LEAST(expires_at, {READABLE_UNTIL_SQL}) AS expires_at
    FROM suppression
    WHERE expires_at > now() ORDER BY address
""")

# An operator's entry: replaces whatever the address had (the operator's word is the last).
SUPPRESSION_ADD = sa.text("""
    INSERT INTO suppression (address, reason, source, created_at, expires_at, updated_at)
    VALUES (lower(:address), :reason, 'operator', now(), now() + make_interval(secs => :expiry_s), now())
    ON CONFLICT (address) DO UPDATE
        SET reason = excluded.reason, source = excluded.source, created_at = excluded.created_at,
            expires_at = excluded.expires_at, updated_at = now()
    RETURNING address, reason, source, created_at, expires_at
""")

# Off the list, and what its address counted towards it with it.
SUPPRESSION_REMOVE = sa.text("""
    WITH gone AS (DELETE FROM suppression WHERE address = lower(:address) RETURNING address),
    forgotten AS (DELETE FROM soft_bounces WHERE address = lower(:address))
    SELECT count(*), lower(:address) FROM gone
""")
