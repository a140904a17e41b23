"""The recorder's statements: delivery results, the reports that come after acceptance (bounces,
delays, complaints) and the soft bounces that suppress an address."""

from __future__ import annotations

import sqlalchemy as sa

# Applies one delivery result. Results for a key arrive in order on one partition, but a replay
# or a late duplicate may bring an older one, or the row's own latest one again: it applies only
# when it is ahead of the row, ordering by attempt and then by how final the status is, so a
# replay changes nothing; 'sent' is never undone, nor is the later final state 'suppressed' (never
# attempted), nor 'bounced' (a delivery status notification came) but as said below. A result
# must name its row consistently: id, key (as now written, or as written before migration 0005,
# for events still in flight) and recipient, each as written or as migration 0015 spells it
# (results.spellings); one written to the results topic by anyone else for a row it does not
# match changes nothing.
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
      AND (idempotency_key IN (:idempotency_key, :mailbox_key)
           OR message_key || '|' || lower(recipient) = :idempotency_key)
      AND lower(recipient) IN (lower(:recipient), lower(:mailbox))
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
# recipient; its address is the mailbox's spelling (the domain as A-labels), however the row
# spells it. A report naming no row of ours changes nothing. ``redriven``: pending again after it
# was published, queued by a redrive (a row pending and never marked published is one the relay
# published and Kafka acknowledged, its MARK_PUBLISHED not yet run: a redrive takes only rows off
# the queue, and a row off it was marked published, or failed by the relay unsent, tokenless).
_REPORT_ROW = """
    SELECT id, lower(CAST(:mailbox AS text)) AS address, status, last_error,
           status = 'pending' AND published_at IS NOT NULL AS redriven
    FROM outbox
    WHERE id = :outbox_id
      AND (idempotency_key IN (:idempotency_key, :mailbox_key)
           OR message_key || '|' || lower(recipient) = :idempotency_key)
      AND lower(recipient) IN (lower(:recipient), lower(:mailbox))
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
# is the key), unless the address is suppressed already. Arrays: one item per dead result, its
# recipient as written and as its mailbox (the domain as A-labels), which is what counts.
ADD_SOFT_BOUNCES = sa.text("""
    INSERT INTO soft_bounces (address, outbox_id, occurred_at)
    SELECT lower(r.mailbox), o.id, r.occurred_at
    FROM unnest(CAST(:ids AS bigint[]), CAST(:recipients AS text[]), CAST(:mailboxes AS text[]),
                CAST(:occurred_at AS timestamptz[])) AS r(id, recipient, mailbox, occurred_at)
    JOIN outbox AS o
        ON o.id = r.id AND lower(o.recipient) IN (lower(r.recipient), lower(r.mailbox))
    WHERE o.status = 'dead'
      AND NOT EXISTS (SELECT 1 FROM suppression AS s
                      WHERE s.address = lower(r.mailbox) AND s.expires_at > r.occurred_at)
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
# The row a bounce's token names, read by postroom bounces for the result it publishes (the
# recorder stays the one writer of rows).
ROW_OF_REPORT = sa.text(
    "SELECT id, idempotency_key, recipient, attempts, status FROM outbox WHERE id = :id")

