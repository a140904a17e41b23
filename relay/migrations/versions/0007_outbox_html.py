"""Version 2 of the email contract: an HTML body and inline images beside the text body.

Revision ID: 0007
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A nullable column and one with a constant default: both are catalog changes only
    # (PostgreSQL 11+), so a large outbox is not rewritten and the lock is brief.
    op.execute("ALTER TABLE outbox ADD COLUMN html text, "
               "ADD COLUMN inline text[] NOT NULL DEFAULT '{}'")


def downgrade() -> None:
    op.execute("ALTER TABLE outbox DROP COLUMN inline, DROP COLUMN html")
