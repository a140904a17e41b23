"""Leave room in outbox pages so the relay's claim is a HOT update (no index writes).

Revision ID: 0003
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # The claim touches only claimed_until, which no index covers; with free space on the page
    # PostgreSQL rewrites the row in place instead of adding an entry to every index. The cost
    # is disk: outbox pages are half empty when first written.
    op.execute("ALTER TABLE outbox SET (fillfactor = 50)")


def downgrade() -> None:
    op.execute("ALTER TABLE outbox RESET (fillfactor)")
