"""The console (`postroom web`): its audit table, and the indexes its search pages walk.

Revision ID: 0016
Revises: 0015 (the mailbox identity rewrite, landing beside this one)

``console_audit`` holds one row per action taken in the console (who, with which role, what, on
which outbox rows). The search orders by (created_at, id) and filters by message key (its index
is 0001's), recipient in any spelling, state and time: ``outbox_created`` serves the time order
and ``outbox_recipient`` the recipient. Both index columns no update changes, so the relay's and
recorder's updates of the outbox stay HOT (fillfactor 50, 0003); no index holds ``status`` for
that reason, and a search by state walks ``outbox_created``. Building the indexes reads the
whole outbox under a lock that holds its writers: run this migration when the jobs are quiet.
"""

from __future__ import annotations

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        CREATE TABLE console_audit (
            id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            at      timestamptz NOT NULL DEFAULT now(),
            who     text NOT NULL,
            role    text NOT NULL,
            action  text NOT NULL,
            target  text NOT NULL,
            row_ids bigint[] NOT NULL DEFAULT '{}',
            detail  text NOT NULL DEFAULT ''
        )""")
    op.execute("CREATE INDEX outbox_created ON outbox (created_at, id)")
    op.execute("CREATE INDEX outbox_recipient ON outbox (lower(recipient), created_at, id)")


def downgrade() -> None:
    op.execute("DROP INDEX outbox_recipient")
    op.execute("DROP INDEX outbox_created")
    op.execute("DROP TABLE console_audit")
