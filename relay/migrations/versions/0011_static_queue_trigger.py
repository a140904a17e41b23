"""The queue's insert trigger in static SQL, with the relay's wake-up in it, and the queue's foreign
key replaced by delete and truncate triggers: what each enqueue statement paid for the queue.

Revision ID: 0011

Measured with psycopg alone on the local stack (``python -m bench.queue_triggers``, medians of 5
rounds; docs/benchmarks.md, "Enqueue benchmark"): a one-row INSERT took 257 µs as 0010 has it and
204 as this revision leaves it; 10,000-row INSERTs went at 61,972 rows/s and now 84,252.

- 0004's trigger built its INSERT with ``EXECUTE format(...)`` to find the queue beside whatever
  outbox fired it; PL/pgSQL plans such a statement anew at every call. Each schema's function now
  names its own schema's queue, written in when this migration runs, so the plan is cached for the
  session. Each function refuses to run for any table but its schema's outbox, so after ``ALTER
  SCHEMA ... RENAME`` every insert, delete and truncate of the outbox fails, changing nothing,
  until the two functions are created again with the new name (docs/operations.md); they never
  act on another schema's queue.
- The wake-up (0001's ``outbox_notify``, a second trigger on every statement) is sent from the
  same function, and only when the statement queued a row.
- The foreign key from ``outbox_queue.id`` to ``outbox.id`` checked every new queue row with a
  ``SELECT ... FOR KEY SHARE`` of the outbox row just inserted, which writes that row once more.
  What it was there for, a deleted outbox row taking its queue row with it, is now a statement
  trigger on the outbox's deletes (and one on TRUNCATE), run as the migration's owner, so
  ``postroom purge`` needs no DELETE on the queue. Nothing else puts an id in the queue: the
  insert trigger and ``redrive`` (which holds the outbox row FOR UPDATE) queue existing rows only.
"""

from __future__ import annotations

from alembic import op

from postroom.relay.migrations.triggers import (
    create_queue_function,
    current_schema,
    only_the_outbox,
    quoted,
)

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    name = current_schema()
    schema, guard = quoted(name), only_the_outbox(name)
    op.execute("DROP TRIGGER outbox_notify ON outbox")
    op.execute("DROP FUNCTION postroom_outbox_notify()")
    create_queue_function(name, with_attempt=False)
    # SECURITY DEFINER: the deleting role needs no privilege on the queue, as with the foreign
    # key's cascade; the names it uses are qualified and its search path fixed. PostgreSQL checks
    # EXECUTE only when a trigger is created, so without the guard and the REVOKE any role could
    # hang it on a table of its own and delete queue rows through it.
    op.execute(f"""
        CREATE FUNCTION postroom_outbox_unqueue() RETURNS trigger LANGUAGE plpgsql
        SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
        BEGIN
            {guard}
            IF TG_OP = 'TRUNCATE' THEN
                -- DELETE, not TRUNCATE: `TRUNCATE outbox, outbox_queue` (what the foreign key
                -- asked for) holds the queue open, and a TRUNCATE of it here would fail.
                DELETE FROM {schema}.outbox_queue;
            ELSE
                DELETE FROM {schema}.outbox_queue AS q USING old_rows AS o WHERE q.id = o.id;
            END IF;
            RETURN NULL;
        END $$""")
    op.execute("REVOKE EXECUTE ON FUNCTION postroom_outbox_unqueue() FROM PUBLIC")
    op.execute("""CREATE TRIGGER outbox_unqueue AFTER DELETE ON outbox
                  REFERENCING OLD TABLE AS old_rows
                  FOR EACH STATEMENT EXECUTE FUNCTION postroom_outbox_unqueue()""")
    op.execute("""CREATE TRIGGER outbox_truncate AFTER TRUNCATE ON outbox
                  FOR EACH STATEMENT EXECUTE FUNCTION postroom_outbox_unqueue()""")
    op.execute("ALTER TABLE outbox_queue DROP CONSTRAINT outbox_queue_id_fkey")


def downgrade() -> None:
    op.execute("DELETE FROM outbox_queue AS q WHERE NOT EXISTS "
               "(SELECT 1 FROM outbox AS o WHERE o.id = q.id)")
    op.execute("""ALTER TABLE outbox_queue ADD CONSTRAINT outbox_queue_id_fkey
                  FOREIGN KEY (id) REFERENCES outbox (id) ON DELETE CASCADE""")
    op.execute("DROP TRIGGER outbox_truncate ON outbox")
    op.execute("DROP TRIGGER outbox_unqueue ON outbox")
    op.execute("DROP FUNCTION postroom_outbox_unqueue()")
    op.execute("""
        CREATE OR REPLACE FUNCTION postroom_outbox_queue() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            EXECUTE format('INSERT INTO %I.outbox_queue (id, available_at) '
                           'SELECT id, available_at FROM new_rows WHERE published_at IS NULL',
                           TG_TABLE_SCHEMA);
            RETURN NULL;
        END $$""")
    op.execute("""
        CREATE FUNCTION postroom_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('postroom_outbox', TG_TABLE_SCHEMA);
            RETURN NULL;
        END $$""")
    op.execute("""CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
                  FOR EACH STATEMENT EXECUTE FUNCTION postroom_outbox_notify()""")
