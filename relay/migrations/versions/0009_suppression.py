"""Bounces and the suppression list: two final states of a row, ``bounced`` (a delivery status
notification said the accepted email failed) and ``suppressed`` (not sent: its address is on the
list); the list itself; and the soft bounces counted towards it.

Revision ID: 0009

``suppression`` holds one row per address, normalised as relay/suppression.py says (lower case,
the whole address). ``soft_bounces`` keeps, per address, the rows that ended ``dead`` since the
address last took an email: one per outbox row, so a result read twice counts once.
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

_STATES = ("'pending', 'published', 'retrying', 'sent', 'failed', 'dead'")


def upgrade() -> None:
    # The new check holds for every row already (it allows more), but it is validated with the
    # ALTER's ACCESS EXCLUSIVE lock still held: relay.db.upgrade runs every migration in its one
    # transaction (its migration lock lasts as long), so NOT VALID then VALIDATE here is no
    # lighter than one ADD CONSTRAINT, and the outbox's writers and readers wait for the scan of
    # every row. Validating in an autocommit block would need upgrade() to commit per migration
    # under a session lock; docs/operations.md says to run this one when the jobs are quiet.
    op.execute(f"""
        ALTER TABLE outbox DROP CONSTRAINT outbox_status_check,
            ADD CONSTRAINT outbox_status_check CHECK (status IN
                ({_STATES}, 'bounced', 'suppressed')) NOT VALID""")
    op.execute("ALTER TABLE outbox VALIDATE CONSTRAINT outbox_status_check")
    op.execute("""
        CREATE TABLE suppression (
            address    text PRIMARY KEY,
            reason     text NOT NULL,
            source     text NOT NULL CHECK (source IN ('bounce', 'complaint', 'soft',
                                                       'operator')),
            created_at timestamptz NOT NULL DEFAULT now(),
            expires_at timestamptz NOT NULL,
            updated_at timestamptz NOT NULL DEFAULT now()
        )""")
    op.execute("""
        CREATE TABLE soft_bounces (
            address     text NOT NULL,
            outbox_id   bigint NOT NULL,
            occurred_at timestamptz NOT NULL,
            PRIMARY KEY (address, outbox_id)
        )""")


def downgrade() -> None:
    op.execute("DROP TABLE soft_bounces")
    op.execute("DROP TABLE suppression")
    # Rows in the new states go back to the nearest old one: a bounce was sent, a suppressed
    # row was never attempted and ends failed, its last_error saying why.
    op.execute("UPDATE outbox SET status = 'sent' WHERE status = 'bounced'")
    op.execute("UPDATE outbox SET status = 'failed' WHERE status = 'suppressed'")
    op.execute(f"""
        ALTER TABLE outbox DROP CONSTRAINT outbox_status_check,
            ADD CONSTRAINT outbox_status_check CHECK (status IN ({_STATES}))""")
