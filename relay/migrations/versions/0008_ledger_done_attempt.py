"""The sender's ledger remembers the last attempt whose outcome went out whole.

Revision ID: 0008

``done_attempt`` is the last attempt of a key whose result, and its retry or dead letter, the
broker acknowledged before the claim was given up. A copy of such an attempt's record read again
(after a sender died before its offset was committed, or while a partition moved with the record
in flight) is not attempted again: without this, each such copy sent the attempt again and
forwarded it to the next tier again, and under repeated kills the retry tiers filled with copies.
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE sender_ledger ADD COLUMN done_attempt integer")


def downgrade() -> None:
    op.execute("ALTER TABLE sender_ledger DROP COLUMN done_attempt")
