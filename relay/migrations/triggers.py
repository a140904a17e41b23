"""The SQL of the outbox's queue trigger function, which more than one revision writes: each
revision creates the function as it leaves the schema, and its downgrade the one before.

A revision's SQL is frozen once released: create_queue_function's forms (with_attempt False for
0011, True for 0012) must keep writing what they write; a revision that changes the function
adds a form of its own. tests/integration/relay/test_migrations.py checks each form's function
text."""

from __future__ import annotations

from alembic import op


def current_schema() -> str:
    """The migrated schema's name (the connection's search path leads there)."""
    return str(op.get_bind().exec_driver_sql("SELECT current_schema()").scalar_one())


def quoted(name: str) -> str:
    """``name`` as a quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def only_the_outbox(name: str) -> str:
    """PL/pgSQL that refuses to run for any table but ``name``'s outbox: a trigger of another
    table calling the function, or this schema's outbox after the schema was renamed (the
    queue it names is then another's)."""
    literal = "'" + name.replace("'", "''") + "'"
    return f"""IF TG_TABLE_SCHEMA <> {literal} OR TG_TABLE_NAME <> 'outbox' THEN
                RAISE EXCEPTION 'postroom: % is the trigger function of %.outbox only, not of %.%',
                    TG_NAME, {literal}, TG_TABLE_SCHEMA, TG_TABLE_NAME
                    USING HINT = 'after ALTER SCHEMA ... RENAME, create the outbox''s trigger '
                                 'functions again (docs/operations.md)';
            END IF;"""


# The states a row ends in (0009's check allows these and 'pending', 'published', 'retrying').
FINAL_STATES_SQL = "'sent', 'failed', 'dead', 'bounced', 'suppressed'"


def create_queue_function(name: str, *, with_attempt: bool, unfinished_only: bool = False) -> None:
    """(Re)create ``postroom_outbox_queue()`` for schema ``name``: it queues the statement's
    unpublished rows and wakes the relays. ``with_attempt`` (0012 on): each queue row also holds
    the attempt its events carry, the row's attempts + 1 (bigint: a row written by SQL may hold
    attempts at the int limit, and the relay, not the insert, refuses it). ``unfinished_only``
    (0014 on): a row inserted in a final state (rows restored or copied by SQL) is not queued:
    it was never to be published again."""
    columns, values = "id, available_at", "id, available_at"
    if with_attempt:
        columns += ", attempt"
        values += ", CAST(attempts AS bigint) + 1"
    which = "published_at IS NULL"
    if unfinished_only:
        which += f" AND status NOT IN ({FINAL_STATES_SQL})"
    # Rows skipped by ON CONFLICT DO NOTHING are not in new_rows; a NOTIFY is delivered at commit,
    # once per transaction and payload, so a rolled-back insert wakes nobody.
    op.execute(f"""
        CREATE OR REPLACE FUNCTION postroom_outbox_queue() RETURNS trigger LANGUAGE plpgsql AS $$
        DECLARE
            queued bigint;
        BEGIN
            {only_the_outbox(name)}
            INSERT INTO {quoted(name)}.outbox_queue ({columns})
            SELECT {values} FROM new_rows WHERE {which};
            GET DIAGNOSTICS queued = ROW_COUNT;
            IF queued > 0 THEN
                PERFORM pg_notify('postroom_outbox', TG_TABLE_SCHEMA);
            END IF;
            RETURN NULL;
        END $$""")
