"""The outbox table, its relay index and the insert notification.

Revision ID: 0001
"""

from __future__ import annotations

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        CREATE TABLE outbox (
            id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            idempotency_key text NOT NULL UNIQUE,
            message_key     text NOT NULL,
            recipient       text NOT NULL,
            sender          text,
            subject         text NOT NULL,
            body            text NOT NULL,
            attachments     text[] NOT NULL DEFAULT '{}',
            priority        text NOT NULL CHECK (priority IN ('high', 'normal', 'low')),
            status          text NOT NULL DEFAULT 'pending' CHECK (status IN
                              ('pending', 'published', 'retrying', 'sent', 'failed', 'dead')),
            attempts        integer NOT NULL DEFAULT 0,
            last_error      text,
            smtp_code       integer,
            enhanced_code   text,
            message_id      text,
            created_at      timestamptz NOT NULL DEFAULT now(),
            available_at    timestamptz NOT NULL DEFAULT now(),
            claimed_until   timestamptz,
            published_at    timestamptz,
            sent_at         timestamptz,
            next_attempt_at timestamptz,
            updated_at      timestamptz
        )""")
    # Only unpublished rows are in it: the relay's query costs what the backlog costs.
    op.execute("""CREATE INDEX outbox_unpublished ON outbox (available_at, id)
                  WHERE published_at IS NULL""")
    op.execute("CREATE INDEX outbox_message_key ON outbox (message_key, id)")
    op.execute("CREATE INDEX outbox_undelivered ON outbox (status) "
               "WHERE status IN ('failed', 'dead', 'retrying')")
    # Delivered at commit, once per transaction and payload, so a rolled-back insert wakes nobody.
    op.execute("""
        CREATE FUNCTION postroom_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('postroom_outbox', TG_TABLE_SCHEMA);
            RETURN NULL;
        END $$""")
    op.execute("""CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
                  FOR EACH STATEMENT EXECUTE FUNCTION postroom_outbox_notify()""")


def downgrade() -> None:
    op.execute("DROP TABLE outbox")
    op.execute("DROP FUNCTION postroom_outbox_notify()")
