"""Schema migrations over data: what a deployment at an older revision has survives the upgrade."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from postroom import enqueue
from postroom.devkit.scratch import scratch, scratch_env
from postroom.devkit.wait import wait_until
from postroom.relay import sql
from postroom.relay.db import (
    MIGRATION_LOCK_CLASS,
    check_schema,
    downgrade,
    lock_migrations,
    make_engine,
    upgrade,
)
from postroom.relay.errors import SchemaNotReadyError
from postroom.settings import Settings
from support.commands import run_postroom, start_postroom

pytestmark = pytest.mark.integration

HEAD = "0018"  # the newest revision

ROWS_AT_0003 = sa.text("""
    INSERT INTO outbox (idempotency_key, message_key, recipient, subject, body, priority,
                        status, published_at, claimed_until)
    VALUES ('sent|a', 'sent', 'a@example.com', 'S', 'b', 'normal', 'sent', now(), NULL),
           ('waiting|b', 'waiting', 'b@example.com', 'S', 'b', 'normal', 'pending', NULL, NULL),
           ('claimed|c', 'claimed', 'c@example.com', 'S', 'b', 'high', 'pending', NULL,
            now() + interval '1 minute')""")

QUEUE = sa.text("""
    SELECT o.message_key, q.claimed_until IS NOT NULL AS claimed
    FROM outbox_queue AS q JOIN outbox AS o USING (id) ORDER BY o.message_key""")


def test_0004_moves_unpublished_rows_and_their_claims_to_the_queue_and_back(
        engine: sa.Engine) -> None:
    assert downgrade(engine, "0003") == "0003"
    with engine.begin() as conn:
        conn.execute(ROWS_AT_0003)

    assert upgrade(engine) == HEAD  # to the head: enqueue() writes today's columns
    with engine.begin() as conn:
        assert conn.execute(QUEUE).all() == [("claimed", True), ("waiting", False)]
        # New rows enter the queue through the insert trigger, published ones do not.
        enqueue(conn, key="new", recipients=["d@example.com"], subject="S", body="b")
        assert [row.message_key for row in conn.execute(QUEUE)] == ["claimed", "new", "waiting"]
        # Deleting an outbox row takes it off the queue.
        conn.execute(sa.text("DELETE FROM outbox WHERE message_key = 'waiting'"))
        assert [row.message_key for row in conn.execute(QUEUE)] == ["claimed", "new"]

    assert downgrade(engine, "0003") == "0003"
    with engine.begin() as conn:
        claims = conn.execute(sa.text(
            "SELECT message_key, claimed_until IS NOT NULL FROM outbox "
            "WHERE published_at IS NULL ORDER BY message_key")).all()
        indexes = set(conn.execute(sa.text(
            "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()")).scalars())
        queue = conn.execute(sa.text("SELECT to_regclass('outbox_queue')")).scalar_one()
    assert claims == [("claimed", True), ("new", False)]
    assert {"outbox_unpublished", "outbox_undelivered"} <= indexes
    assert queue is None


ROWS_AT_0004 = sa.text("""
    INSERT INTO outbox (idempotency_key, message_key, recipient, subject, body, priority)
    VALUES ('plain|a@example.com', 'plain', 'A@example.com', 'S', 'b', 'normal'),
           ('k|a|b@example.com', 'k|a', 'b@example.com', 'S', 'b', 'normal'),
           ('back\\slash|c@example.com', 'back\\slash', 'c@example.com', 'S', 'b', 'normal')""")
KEYS = sa.text("SELECT message_key, idempotency_key FROM outbox ORDER BY message_key")


def test_0005_rewrites_only_the_keys_the_old_encoding_made_ambiguous(engine: sa.Engine) -> None:
    assert downgrade(engine, "0004") == "0004"
    with engine.begin() as conn:
        conn.execute(ROWS_AT_0004)

    assert upgrade(engine) == HEAD  # through 0005, to the head enqueue() writes
    with engine.begin() as conn:
        assert conn.execute(KEYS).all() == [
            ("back\\slash", "back\\\\slash|c@example.com"),
            ("k|a", "k\\|a|b@example.com"),
            ("plain", "plain|a@example.com")]
        # A rerun of each job finds its row; the pair the old form confused is a new email.
        assert enqueue(conn, key="k|a", recipients=["b@example.com"], subject="S", body="b") == 0
        assert enqueue(conn, key="back\\slash", recipients=["c@example.com"], subject="S",
                       body="b") == 0
        assert enqueue(conn, key="plain", recipients=["a@example.com"], subject="S", body="b") == 0
        assert enqueue(conn, key="k", recipients=["a|b@example.com"], subject="S", body="b") == 1

    assert downgrade(engine, "0004") == "0004"
    with engine.begin() as conn:
        # ('k', 'a|b@...') holds the old form of ('k|a', 'b@...'), which keeps its new one.
        assert conn.execute(KEYS).all() == [
            ("back\\slash", "back\\slash|c@example.com"),
            ("k", "k|a|b@example.com"),
            ("k|a", "k\\|a|b@example.com"),
            ("plain", "plain|a@example.com")]


# -- several upgrades at once (pods starting together), and a schema never migrated -------------

@pytest.fixture
def fresh(stack_settings: Settings) -> Iterator[Settings]:
    """Settings naming a schema nothing has created (dropped afterwards)."""
    with scratch(stack_settings, "mig", kafka=False) as settings:
        yield settings


def head_of(settings: Settings) -> str:
    engine = make_engine(settings)
    try:
        check_schema(engine)  # raises unless at the newest revision
        with engine.connect() as conn:
            return str(conn.execute(sa.text("SELECT version_num FROM alembic_version"))
                       .scalar_one())
    finally:
        engine.dispose()


def test_four_upgrades_at_the_same_moment_all_succeed(fresh: Settings) -> None:
    """Without the lock, three of four fail with UniqueViolation (CREATE SCHEMA, or the
    tables): the four start together, past a barrier."""
    engines = [make_engine(fresh) for _ in range(4)]
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def migrate(engine: sa.Engine) -> None:
        barrier.wait()
        try:
            upgrade(engine, fresh.database_schema)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=migrate, args=(engine,)) for engine in engines]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    for engine in engines:
        engine.dispose()
    assert errors == []
    assert head_of(fresh) == HEAD


def test_four_db_upgrade_processes_started_at_once_all_succeed(fresh: Settings,
                                                                tmp_path: Path) -> None:
    """As several pods run it at start-up. The test holds the migration lock until all four
    wait for it, so they do run at the same moment; each then finds the schema as the one
    before left it."""
    env = {**os.environ, **scratch_env(fresh)}
    holder = make_engine(fresh)
    conn = holder.connect()
    tx = conn.begin()
    lock_migrations(conn)
    logs = [tmp_path / f"upgrade{n}.log" for n in range(4)]
    try:
        processes = [start_postroom("db", "upgrade", env=env, log=log) for log in logs]
        waiting = sa.text("""
            SELECT count(*) FROM pg_locks
            WHERE locktype = 'advisory' AND classid = :lock_class AND NOT granted
              AND objid = CAST(hashtext(current_setting('search_path')) AS oid)""")
        with holder.connect() as probe:
            wait_until(lambda: probe.execute(waiting, {"lock_class": MIGRATION_LOCK_CLASS})
                       .scalar_one() == 4, 60, "four upgrades waiting for the migration lock")
    finally:
        tx.rollback()
        conn.close()
        holder.dispose()
    deadline = time.monotonic() + 120
    codes = [process.wait(max(1.0, deadline - time.monotonic())) for process in processes]
    outputs = [log.read_text() for log in logs]
    assert codes == [0, 0, 0, 0], outputs
    assert all("Traceback" not in out for out in outputs), outputs
    # One created it, the others found nothing to do; each said that it waited its turn.
    assert sorted(out.splitlines()[1] for out in outputs) == [
        f"created the outbox schema at revision {HEAD} ({int(HEAD)} migrations)",
        *[f"outbox schema is at revision {HEAD}, the newest: nothing to do"] * 3], outputs
    assert all(out.startswith("waiting for another migration of this schema to finish (0s")
               for out in outputs), outputs
    assert head_of(fresh) == HEAD


def test_a_schema_never_migrated_is_not_migrated_not_at_revision_none(fresh: Settings) -> None:
    engine = make_engine(fresh)
    try:
        with pytest.raises(SchemaNotReadyError) as refused:
            check_schema(engine)
    finally:
        engine.dispose()
    assert str(refused.value) == "the outbox schema is not migrated: run `postroom db upgrade`"


def test_0009_adds_bounced_and_suppressed_and_the_list_and_goes_back(engine: sa.Engine) -> None:
    assert downgrade(engine, "0008") == "0008"
    with engine.begin() as conn:
        enqueue(conn, key="k", recipients=["a@example.com", "b@example.com"], subject="S",
                body="b")
        with pytest.raises(sa.exc.IntegrityError):
            with conn.begin_nested():
                conn.execute(sa.text("UPDATE outbox SET status = 'bounced'"))
    assert upgrade(engine) == HEAD
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE outbox SET status = 'bounced' WHERE recipient = 'a@example.com'"))
        conn.execute(sa.text("UPDATE outbox SET status = 'suppressed', last_error = 'suppressed' "
                             "WHERE recipient = 'b@example.com'"))
        conn.execute(sa.text("INSERT INTO suppression (address, reason, source, expires_at) "
                             "VALUES ('a@example.com', 'bounced', 'bounce', now())"))
        with pytest.raises(sa.exc.IntegrityError):
            with conn.begin_nested():
                conn.execute(sa.text("INSERT INTO suppression (address, reason, source, "
                                     "expires_at) VALUES ('c@example.com', 'x', 'guess', now())"))
    assert downgrade(engine, "0008") == "0008"
    with engine.connect() as conn:
        states = conn.execute(sa.text("SELECT recipient, status, last_error FROM outbox "
                                      "ORDER BY recipient")).all()
        table = conn.execute(sa.text("SELECT to_regclass('suppression')")).scalar_one()
    assert states == [("a@example.com", "sent", None), ("b@example.com", "failed", "suppressed")]
    assert table is None


def test_0010_adds_the_trace_context_columns_and_an_untraced_job_still_enqueues_at_0009(
        engine: sa.Engine) -> None:
    assert downgrade(engine, "0009") == "0009"
    with engine.begin() as conn:  # an untraced enqueue writes only the columns of before
        assert enqueue(conn, key="k", recipients=["a@example.com"], subject="S", body="b") == 1
    assert upgrade(engine) == HEAD
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE outbox SET traceparent = 'x', tracestate = 'y'"))
        assert conn.execute(sa.text("SELECT traceparent, tracestate FROM outbox")).one() == (
            "x", "y")
    assert downgrade(engine, "0009") == "0009"
    with engine.connect() as conn:
        columns = conn.execute(sa.text(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'outbox' "
            "AND table_schema = current_schema() AND column_name LIKE 'trace%'")).all()
    assert columns == []


QUEUED = sa.text("SELECT o.recipient FROM outbox_queue AS q JOIN outbox AS o USING (id) "
                 "ORDER BY o.recipient")
QUEUE_IDS = sa.text("SELECT count(*) FROM outbox_queue")
FOREIGN_KEYS = sa.text("""SELECT count(*) FROM pg_constraint
                          WHERE conrelid = to_regclass('outbox_queue') AND contype = 'f'""")
TRIGGERS = sa.text("""SELECT tgname FROM pg_trigger
                      WHERE tgrelid = to_regclass('outbox') AND NOT tgisinternal""")


def _wake_ups(listener: sa.Connection, schema: str | None) -> list[str]:
    """The relay's wake-ups for ``schema`` the listening connection has received since the last
    call (the channel is the database's: other tests' schemas are woken on it too)."""
    driver = listener.connection.driver_connection
    listener.execute(sa.text("SELECT 1"))  # reads what the server has sent meanwhile
    return [n.payload for n in driver.notifies(timeout=0.2)  # type: ignore[union-attr]
            if n.payload == schema]


def test_0011_queues_through_static_sql_and_deletes_and_truncates_take_queue_rows_with_them(
        engine: sa.Engine, db_settings: Settings) -> None:
    schema = db_settings.database_schema
    with engine.connect() as listener:
        listener.execute(sa.text("LISTEN postroom_outbox"))
        listener.commit()
        with engine.begin() as conn:
            assert conn.execute(FOREIGN_KEYS).scalar_one() == 0
            assert set(conn.execute(TRIGGERS).scalars()) == {
                "outbox_queue", "outbox_unqueue", "outbox_truncate"}
            enqueue(conn, key="k", recipients=["a@example.com", "b@example.com"], subject="S",
                    body="b")
        assert _wake_ups(listener, schema) == [schema]
        with engine.begin() as conn:  # a rerun queues nothing and wakes nobody
            assert enqueue(conn, key="k", recipients=["a@example.com"], subject="S", body="b") == 0
        assert _wake_ups(listener, schema) == []
    # The queue beside the outbox, whatever the inserting connection's search path says.
    with engine.begin() as conn:
        conn.execute(sa.text("SET LOCAL search_path = pg_catalog"))
        conn.execute(sa.text(
            f'INSERT INTO "{schema}".outbox (idempotency_key, message_key, recipient, subject, '
            "body, priority) VALUES ('c|c@example.com', 'c', 'c@example.com', 'S', 'b', 'normal')"))
    with engine.begin() as conn:
        assert conn.execute(QUEUED).scalars().all() == [
            "a@example.com", "b@example.com", "c@example.com"]
        conn.execute(sa.text("DELETE FROM outbox WHERE recipient = 'a@example.com'"))
        assert conn.execute(QUEUED).scalars().all() == ["b@example.com", "c@example.com"]
        assert conn.execute(QUEUE_IDS).scalar_one() == 2  # no queue row left without its row
        conn.execute(sa.text("TRUNCATE outbox"))
        assert conn.execute(QUEUE_IDS).scalar_one() == 0
    with engine.begin() as conn:  # both at once, as the foreign key asked
        enqueue(conn, key="k", recipients=["f@example.com"], subject="S", body="b")
        conn.execute(sa.text("TRUNCATE outbox, outbox_queue RESTART IDENTITY"))
        assert conn.execute(QUEUE_IDS).scalar_one() == 0

    with engine.begin() as conn:
        enqueue(conn, key="k", recipients=["d@example.com"], subject="S", body="b")
    assert downgrade(engine, "0010") == "0010"
    with engine.begin() as conn:
        assert conn.execute(FOREIGN_KEYS).scalar_one() == 1
        assert set(conn.execute(TRIGGERS).scalars()) == {"outbox_queue", "outbox_notify"}
        enqueue(conn, key="k", recipients=["e@example.com"], subject="S", body="b")
        conn.execute(sa.text("DELETE FROM outbox WHERE recipient = 'd@example.com'"))
        assert conn.execute(QUEUED).scalars().all() == ["e@example.com"]
    assert upgrade(engine) == HEAD


QUEUE_ATTEMPTS = sa.text("SELECT o.recipient, q.attempt FROM outbox_queue AS q JOIN outbox AS o "
                         "USING (id) ORDER BY o.recipient")
QUEUE_FUNCTION = sa.text("""SELECT prosrc FROM pg_proc WHERE proname = 'postroom_outbox_queue'
                            AND pronamespace = to_regnamespace(quote_ident(:schema))""")
# The queue trigger function each revision creates, blanks collapsed and its schema <schema>: a
# released revision's SQL is frozen (relay/migrations/triggers.py writes both).
_GUARD = ("IF TG_TABLE_SCHEMA <> '<schema>' OR TG_TABLE_NAME <> 'outbox' THEN RAISE EXCEPTION "
          "'postroom: % is the trigger function of %.outbox only, not of %.%', TG_NAME, "
          "'<schema>', TG_TABLE_SCHEMA, TG_TABLE_NAME USING HINT = 'after ALTER SCHEMA ... "
          "RENAME, create the outbox''s trigger ' 'functions again (docs/operations.md)'; END IF;")
_NOTIFY = ("GET DIAGNOSTICS queued = ROW_COUNT; IF queued > 0 THEN PERFORM "
           "pg_notify('postroom_outbox', TG_TABLE_SCHEMA); END IF; RETURN NULL; END")
QUEUE_FUNCTIONS = {
    "0011": f"DECLARE queued bigint; BEGIN {_GUARD} INSERT INTO \"<schema>\".outbox_queue "
            "(id, available_at) SELECT id, available_at FROM new_rows WHERE published_at IS "
            f"NULL; {_NOTIFY}",
    "0012": f"DECLARE queued bigint; BEGIN {_GUARD} INSERT INTO \"<schema>\".outbox_queue "
            "(id, available_at, attempt) SELECT id, available_at, CAST(attempts AS bigint) + 1 "
            f"FROM new_rows WHERE published_at IS NULL; {_NOTIFY}",
}
QUEUE_FUNCTIONS["0013"] = QUEUE_FUNCTIONS["0012"]  # 0013 changes the queue table only
QUEUE_FUNCTIONS["0014"] = (
    f"DECLARE queued bigint; BEGIN {_GUARD} INSERT INTO \"<schema>\".outbox_queue "
    "(id, available_at, attempt) SELECT id, available_at, CAST(attempts AS bigint) + 1 "
    "FROM new_rows WHERE published_at IS NULL AND status NOT IN ('sent', 'failed', 'dead', "
    f"'bounced', 'suppressed'); {_NOTIFY}")
QUEUE_FUNCTIONS["0015"] = QUEUE_FUNCTIONS["0014"]  # 0015 rewrites addresses only
QUEUE_FUNCTIONS["0016"] = QUEUE_FUNCTIONS["0015"]  # 0016 adds the console's table and indexes
QUEUE_FUNCTIONS["0017"] = QUEUE_FUNCTIONS["0016"]  # 0017 adds the console's sessions
QUEUE_FUNCTIONS["0018"] = QUEUE_FUNCTIONS["0017"]  # 0018 ties them to their tokens


def _queue_function(conn: sa.Connection, schema: str) -> str:
    text = conn.execute(QUEUE_FUNCTION, {"schema": schema}).scalar_one()
    return " ".join(str(text).replace(schema, "<schema>").split())


def test_0012_gives_queued_rows_their_attempt_from_then_on_and_goes_back(
        engine: sa.Engine, db_settings: Settings) -> None:
    schema = db_settings.database_schema or ""
    with engine.connect() as conn:
        assert _queue_function(conn, schema) == QUEUE_FUNCTIONS[HEAD]
    assert downgrade(engine, "0011") == "0011"
    with engine.begin() as conn:  # queued at 0011: a new row, and one redriven after 3 attempts
        assert _queue_function(conn, schema) == QUEUE_FUNCTIONS["0011"]
        enqueue(conn, key="k", recipients=["a@example.com", "b@example.com"], subject="S",
                body="b")
        conn.execute(sa.text("UPDATE outbox SET attempts = 3 WHERE recipient = 'b@example.com'"))
    assert upgrade(engine) == HEAD
    with engine.begin() as conn:
        # Not backfilled: those rows go out as their attempts + 1, as they did at 0011.
        assert conn.execute(QUEUE_ATTEMPTS).all() == [("a@example.com", None),
                                                      ("b@example.com", None)]
        assert sorted(r.attempt for r in sql.claim_due(conn, 10, 60)) == [1, 4]
        # The trigger writes it from now on, in bigint: attempts at the int limit still insert.
        conn.execute(sa.text(
            "INSERT INTO outbox (idempotency_key, message_key, recipient, subject, body, priority,"
            " attempts) VALUES ('c|c@example.com', 'c', 'c@example.com', 'S', 'b', 'normal',"
            " 2147483647)"))
        assert conn.execute(QUEUE_ATTEMPTS).all()[-1] == ("c@example.com", 2147483648)
    assert downgrade(engine, "0011") == "0011"
    with engine.begin() as conn:
        enqueue(conn, key="k", recipients=["d@example.com"], subject="S", body="b")
        assert conn.execute(QUEUED).scalars().all() == [
            "a@example.com", "b@example.com", "c@example.com", "d@example.com"]
        assert conn.execute(sa.text(
            "SELECT count(*) FROM information_schema.columns WHERE table_name = 'outbox_queue' "
            "AND table_schema = current_schema() AND column_name = 'attempt'")).scalar_one() == 0
    assert upgrade(engine) == HEAD


def test_0011_s_trigger_functions_serve_their_own_outbox_only(
        engine: sa.Engine, db_settings: Settings) -> None:
    schema = db_settings.database_schema
    unqueue = f'"{schema}".postroom_outbox_unqueue()'
    with engine.begin() as conn:
        enqueue(conn, key="k", recipients=["a@example.com"], subject="S", body="b")
    role = f"postroom_t_{uuid.uuid4().hex[:8]}"
    with engine.connect() as conn:
        conn.execute(sa.text(f'CREATE ROLE {role}; GRANT USAGE ON SCHEMA "{schema}" TO {role}'))
        conn.commit()
        try:
            # A role of no privilege cannot hang the SECURITY DEFINER function on its own table.
            with pytest.raises(sa.exc.ProgrammingError, match="permission denied for function"), \
                    conn.begin():
                conn.execute(sa.text(f"SET LOCAL ROLE {role}"))
                conn.execute(sa.text("CREATE TEMP TABLE mine (id bigint)"))
                conn.execute(sa.text("CREATE TRIGGER t AFTER TRUNCATE ON mine "
                                     f"FOR EACH STATEMENT EXECUTE FUNCTION {unqueue}"))
            # Nor would it run there for a role that may execute it.
            with pytest.raises(sa.exc.ProgrammingError, match=r"trigger function of .*outbox only"), \
                    conn.begin():
                conn.execute(sa.text("CREATE TEMP TABLE mine (id bigint)"))
                conn.execute(sa.text("CREATE TRIGGER t AFTER TRUNCATE ON mine "
                                     f"FOR EACH STATEMENT EXECUTE FUNCTION {unqueue}"))
                conn.execute(sa.text("TRUNCATE mine"))
        finally:
            conn.rollback()
            conn.execute(sa.text(f'REVOKE USAGE ON SCHEMA "{schema}" FROM {role}; DROP ROLE {role}'))
            conn.commit()
    # Renamed, the schema's outbox refuses inserts and deletes instead of using another's queue.
    with engine.connect() as conn:
        conn.execute(sa.text(f'ALTER SCHEMA "{schema}" RENAME TO "{schema}_renamed"'))
        conn.commit()
        try:
            for statement in (
                    f'DELETE FROM "{schema}_renamed".outbox',
                    f'INSERT INTO "{schema}_renamed".outbox (idempotency_key, message_key, '
                    "recipient, subject, body, priority) VALUES ('x', 'x', 'x@example.com', 'S', "
                    "'b', 'normal')"):
                with pytest.raises(sa.exc.ProgrammingError, match=r"not of .*_renamed\.outbox"), \
                        conn.begin():
                    conn.execute(sa.text(statement))
        finally:
            conn.rollback()
            conn.execute(sa.text(f'ALTER SCHEMA "{schema}_renamed" RENAME TO "{schema}"'))
            conn.commit()
    with engine.connect() as conn:
        assert conn.execute(QUEUE_IDS).scalar_one() == 1  # the row queued before is still there


def test_a_schema_a_newer_release_migrated_is_named_so_not_a_traceback(engine: sa.Engine,
                                                                        db_settings: Settings
                                                                        ) -> None:
    """A release run against a database a newer one migrated: the roles' check and
    `postroom db upgrade` say so in one line (alembic said only "Can't locate revision", and
    `db upgrade` raised it as a traceback)."""
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = '9999'"))
    try:
        with pytest.raises(SchemaNotReadyError, match="revision 9999, which this release"):
            check_schema(engine)
        done = run_postroom("db", "upgrade", env={**os.environ, **scratch_env(db_settings)},
                            timeout_s=60)
        assert done.returncode == 1, done.stderr
        assert "Traceback" not in done.stderr
        [line] = done.stderr.strip().splitlines()
        assert "revision 9999, which this release of postroom does not know" in line
        assert f"its newest is {HEAD}" in line
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE alembic_version SET version_num = :head"), {"head": HEAD})


def test_0014_queues_rows_inserted_unfinished_only_and_goes_back(
        engine: sa.Engine, db_settings: Settings) -> None:
    """Rows a restore brings back in a final state are not published again (a suppressed one
    would reach its address); unfinished ones are queued as before."""
    schema = db_settings.database_schema or ""
    insert = sa.text(
        "INSERT INTO outbox (idempotency_key, message_key, recipient, subject, body, priority, "
        "status) VALUES (:who || '|' || :who || '@example.com', :who, :who || '@example.com', "
        "'S', 'b', 'normal', :status)")
    states = ("pending", "published", "retrying", "sent", "failed", "dead", "bounced",
              "suppressed")
    with engine.begin() as conn:
        assert _queue_function(conn, schema) == QUEUE_FUNCTIONS["0014"]
        for status in states:
            conn.execute(insert, {"who": status, "status": status})
        assert conn.execute(QUEUED).scalars().all() == [
            "pending@example.com", "published@example.com", "retrying@example.com"]
    assert downgrade(engine, "0013") == "0013"
    with engine.begin() as conn:
        assert _queue_function(conn, schema) == QUEUE_FUNCTIONS["0013"]
        conn.execute(insert, {"who": "old", "status": "suppressed"})
        assert "old@example.com" in conn.execute(QUEUED).scalars().all()  # as 0013 did
    assert upgrade(engine) == HEAD


CONSOLE_OBJECTS = sa.text("""
    SELECT c.relname FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
    WHERE n.nspname = :schema AND c.relname IN ('console_audit', 'outbox_created',
                                                'outbox_recipient')
    ORDER BY c.relname""")


def test_0016_adds_the_consoles_audit_table_and_search_indexes_and_goes_back(
        engine: sa.Engine, db_settings: Settings) -> None:
    schema = db_settings.database_schema or ""
    with engine.connect() as conn:
        assert list(conn.scalars(CONSOLE_OBJECTS, {"schema": schema})) == [
            "console_audit", "outbox_created", "outbox_recipient"]
    assert downgrade(engine, "0015") == "0015"
    with engine.connect() as conn:
        assert list(conn.scalars(CONSOLE_OBJECTS, {"schema": schema})) == []
    assert upgrade(engine) == HEAD


def test_0017_adds_the_consoles_sessions_and_goes_back(engine: sa.Engine,
                                                      db_settings: Settings) -> None:
    schema = db_settings.database_schema or ""
    named = sa.text("SELECT to_regclass(:name) IS NOT NULL")
    with engine.connect() as conn:
        assert conn.scalar(named, {"name": f'"{schema}".console_session'})
    assert downgrade(engine, "0016") == "0016"
    with engine.connect() as conn:
        assert not conn.scalar(named, {"name": f'"{schema}".console_session'})
        assert conn.scalar(named, {"name": f'"{schema}".console_audit'})
    assert upgrade(engine) == HEAD


def test_0018_ties_the_consoles_sessions_to_their_tokens_and_goes_back(
        engine: sa.Engine, db_settings: Settings) -> None:
    schema = db_settings.database_schema or ""
    columns = sa.text("SELECT column_name FROM information_schema.columns WHERE table_schema = "
                      ":schema AND table_name = 'console_session' ORDER BY ordinal_position")
    with engine.connect() as conn:
        assert list(conn.scalars(columns, {"schema": schema}))[-1] == "token_mac"
    assert downgrade(engine, "0017") == "0017"
    with engine.begin() as conn:
        assert "token_mac" not in list(conn.scalars(columns, {"schema": schema}))
        conn.execute(sa.text("INSERT INTO console_session (id_sha256, who, role) "
                             "VALUES ('h', 'operator token', 'operator')"))
    assert upgrade(engine) == HEAD
    with engine.connect() as conn:  # a session from before names no token: it is over
        assert conn.scalar(sa.text("SELECT count(*) FROM console_session")) == 0
        assert list(conn.scalars(columns, {"schema": schema}))[-1] == "token_mac"
