"""The relay's queue: unpublished rows move out of the outbox into a narrow table of their own.

Revision ID: 0004

Publishing used to write each outbox row twice: the claim (a new version of the whole row, body
included) and the mark, which had to add an entry to every index of the outbox because
``published_at`` was in the relay's partial index. Now the claim updates a row of three columns,
the mark deletes it, and the outbox row's own update (published_at, status) touches no indexed
column, so PostgreSQL rewrites it in place (a HOT update), as it does each result the recorder
writes.
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # claimed_until is not indexed, so a claim is a HOT update with room on the page.
    op.execute("""
        CREATE TABLE outbox_queue (
            id            bigint PRIMARY KEY REFERENCES outbox (id) ON DELETE CASCADE,
            available_at  timestamptz NOT NULL,
            claimed_until timestamptz
        ) WITH (fillfactor = 70)""")
    op.execute("CREATE INDEX outbox_queue_due ON outbox_queue (available_at, id)")
    op.execute("""INSERT INTO outbox_queue (id, available_at, claimed_until)
                  SELECT id, available_at, claimed_until FROM outbox WHERE published_at IS NULL""")
    # Every insert queues its unpublished rows, whoever writes them and however the table is
    # named; rows skipped by ON CONFLICT DO NOTHING are not in new_rows.
    op.execute("""
        CREATE FUNCTION postroom_outbox_queue() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            EXECUTE format('INSERT INTO %I.outbox_queue (id, available_at) '
                           'SELECT id, available_at FROM new_rows WHERE published_at IS NULL',
                           TG_TABLE_SCHEMA);
            RETURN NULL;
        END $$""")
    op.execute("""CREATE TRIGGER outbox_queue AFTER INSERT ON outbox
                  REFERENCING NEW TABLE AS new_rows
                  FOR EACH STATEMENT EXECUTE FUNCTION postroom_outbox_queue()""")
    # Indexes on published_at or status would make every status change rewrite all indexes.
    op.execute("DROP INDEX outbox_unpublished")
    op.execute("DROP INDEX outbox_undelivered")
    op.execute("ALTER TABLE outbox DROP COLUMN claimed_until")


def downgrade() -> None:
    op.execute("ALTER TABLE outbox ADD COLUMN claimed_until timestamptz")
    op.execute("""UPDATE outbox AS o SET claimed_until = q.claimed_until
                  FROM outbox_queue AS q WHERE q.id = o.id""")
    op.execute("""CREATE INDEX outbox_unpublished ON outbox (available_at, id)
                  WHERE published_at IS NULL""")
    op.execute("CREATE INDEX outbox_undelivered ON outbox (status) "
               "WHERE status IN ('failed', 'dead', 'retrying')")
    op.execute("DROP TRIGGER outbox_queue ON outbox")
    op.execute("DROP FUNCTION postroom_outbox_queue()")
    op.execute("DROP TABLE outbox_queue")
