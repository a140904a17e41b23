"""The sender's delivery ledger: which idempotency keys a mail server has accepted, and who is sending.

Revision ID: 0002
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        CREATE TABLE sender_ledger (
            idempotency_key text PRIMARY KEY,
            state           text NOT NULL CHECK (state IN ('sending', 'sent', 'released')),
            owner           text NOT NULL,
            lease_until     timestamptz,
            attempt         integer NOT NULL,
            message_id      text,
            updated_at      timestamptz NOT NULL DEFAULT now()
        )""")


def downgrade() -> None:
    op.execute("DROP TABLE sender_ledger")
