"""Idempotency keys say unambiguously which message key and recipient they stand for.

Revision ID: 0005

A key was ``message_key|recipient``, so ``("k|a", "b@x")`` and ``("k", "a|b@x")`` shared one and the
second email was dropped as a duplicate. Keys now escape ``\\`` and ``|`` in the message key with a
``\\`` (relay.validation.idempotency_key). Rows whose message key has neither keep their key as it
was; the others are rewritten here, so a rerun of their job still finds them. Their events already
in Kafka carry the old key: the sender's ledger stays keyed by it (so a redelivery is still
recognised), and the recorder matches a result by row id and either form of the key.
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_LEGACY = "message_key || '|' || lower(recipient)"
_ESCAPED = "replace(replace(message_key, '\\', '\\\\'), '|', '\\|') || '|' || lower(recipient)"


def upgrade() -> None:
    op.execute(f"""
        UPDATE outbox SET idempotency_key = {_ESCAPED}
        WHERE (strpos(message_key, '|') > 0 OR strpos(message_key, '\\') > 0)
          AND idempotency_key = {_LEGACY}""")


def downgrade() -> None:
    # Only where the old form is free: two rows the old form cannot tell apart keep the new one.
    op.execute(f"""
        UPDATE outbox AS o SET idempotency_key = {_LEGACY}
        WHERE (strpos(message_key, '|') > 0 OR strpos(message_key, '\\') > 0)
          AND idempotency_key = {_ESCAPED}
          AND NOT EXISTS (SELECT 1 FROM outbox AS other
                          WHERE other.idempotency_key = o.message_key || '|' || lower(o.recipient))""")
