"""The sender's ledger remembers whose claim a takeover ended, for the takeover's log and audits.

Revision ID: 0006

A claim is taken over when its owner's session lock is gone (the process died) or its lease ran
out; ``taken_from`` names the owner it was taken from, and stays until the key is claimed afresh.
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE sender_ledger ADD COLUMN taken_from text")


def downgrade() -> None:
    op.execute("ALTER TABLE sender_ledger DROP COLUMN taken_from")
