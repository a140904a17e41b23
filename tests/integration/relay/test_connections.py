"""enqueue, enqueue_many and Batch on each connection a job may hold: a SQLAlchemy Connection or
Session, a psycopg 3 connection, Django's connection (tests/django_project). The same emails make
the same rows through each, and the rows commit or roll back with the job's transaction."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from postroom import Batch, Email, enqueue, enqueue_many
from postroom.relay import outbox
from postroom.relay.db import libpq_conninfo
from postroom.relay.errors import InvalidEmailError, SchemaNotReadyError
from postroom.settings import Settings

pytestmark = pytest.mark.integration

KINDS = ("sqlalchemy", "session", "psycopg", "django")
COLUMNS = ("idempotency_key", "message_key", "recipient", "sender", "subject", "body",
           "attachments", "html", "inline", "priority", "status", "attempts")
SEND_AFTER = dt.datetime(2030, 1, 2, 7, 0, tzinfo=dt.UTC)


@pytest.fixture(scope="module")
def django_connection() -> Iterator[Any]:
    """Django's ``connection``, set up once from tests/django_project/settings.py."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_SETTINGS_MODULE", "django_project.settings")
        import django

        django.setup()
        from django.db import connection

        yield connection
        connection.close()


@pytest.fixture
def job(engine: sa.Engine, db_settings: Settings,
        django_connection: Any) -> Callable[[str], contextlib.AbstractContextManager[Any]]:
    """``job(kind)``: a transaction of the job's own on a connection of that kind, committed when
    the block ends, rolled back when an exception leaves it."""
    conninfo = libpq_conninfo(engine)

    @contextlib.contextmanager
    def transaction(kind: str) -> Iterator[Any]:
        if kind == "sqlalchemy":
            with engine.begin() as conn:
                yield conn
        elif kind == "session":
            with Session(engine) as session, session.begin():
                yield session
        elif kind == "psycopg":
            with psycopg.connect(conninfo) as conn:  # commits at the block's end, or rolls back
                yield conn
        else:
            from django.db import transaction as django_transaction

            with django_transaction.atomic():
                yield django_connection
    return transaction


def rows(engine: sa.Engine) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [tuple(row) for row in conn.execute(sa.text(
            f"SELECT {', '.join(COLUMNS)}, available_at = :later AS later FROM outbox "
            "ORDER BY id"), {"later": SEND_AFTER})]


def _script(conn: Any, schema: str, report: Path) -> list[int]:
    """The table of calls every kind runs: each call's new rows."""
    team = ["finance@example.com", "Ops@Example.com", "ceo@example.com"]
    counts = [
        # one recipient: INSERT_ROW
        enqueue(conn, key="one", recipients=["a@example.com"], subject="One", body="b",
                schema=schema, priority="high", sender="reports@example.com",
                send_after=SEND_AFTER, html="<p>b</p>"),
        # several recipients, one twice in another case: INSERT_ROWS
        enqueue(conn, key="team", recipients=[*team, "ops@example.com"], subject="Team",
                body="The report.", attachments=[report], schema=schema),
        # over a chunk (INSERT_CHUNK_ROWS is 2 here): chunks in a savepoint
        enqueue(conn, key="chunks", recipients=[f"c{n}@example.com" for n in range(5)],
                subject="Chunks", body="b", schema=schema, priority="low"),
        enqueue_many(conn, [Email(key=f"invoice-{n}", recipients=[f"i{n}@example.com"],
                                  subject=f"Invoice {n}", body=f"Invoice {n} is attached.",
                                  attachments=[report]) for n in range(3)], schema=schema),
        # a rerun queues nothing
        enqueue(conn, key="team", recipients=team, subject="Team", body="The report.",
                attachments=[report], schema=schema),
    ]
    with Batch(conn, schema=schema) as batch:
        for n in range(4):
            batch.enqueue(key=f"batch-{n}", recipients=[f"b{n}@example.com", "x@example.com"],
                          subject=f"Batch {n}", body="b", inline=[], html=None)
        with pytest.raises(InvalidEmailError):  # refused, and the batch goes on
            batch.enqueue(key="bad", recipients=["not an address"], subject="s", body="b")
    return [*counts, batch.new]


def test_the_same_emails_make_the_same_rows_through_every_connection(
        job: Callable[[str], contextlib.AbstractContextManager[Any]], engine: sa.Engine,
        db_settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(outbox, "INSERT_CHUNK_ROWS", 2)
    report = tmp_path / "report.xlsx"
    report.write_bytes(b"PK not really a workbook")
    schema = db_settings.database_schema
    assert schema
    made: dict[str, tuple[list[int], list[tuple[Any, ...]]]] = {}
    for kind in KINDS:
        with job(kind) as conn:
            counts = _script(conn, schema, report)
        made[kind] = (counts, rows(engine))
        with engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM outbox"))
    reference = made["sqlalchemy"]
    assert reference[0] == [1, 3, 5, 3, 0, 8]
    assert len(reference[1]) == 20
    for kind in KINDS:
        assert made[kind] == reference, kind


@pytest.mark.parametrize("kind", KINDS)
def test_a_rollback_of_the_job_leaves_no_row(
        kind: str, job: Callable[[str], contextlib.AbstractContextManager[Any]],
        engine: sa.Engine, db_settings: Settings) -> None:
    with pytest.raises(RuntimeError, match="the job failed"), job(kind) as conn:
        assert enqueue(conn, key="k", recipients=["a@example.com", "b@example.com"],
                       subject="s", body="b", schema=db_settings.database_schema) == 2
        with Batch(conn, schema=db_settings.database_schema) as batch:
            batch.enqueue(key="m", recipients=["c@example.com"], subject="s", body="b")
        assert batch.new == 1
        raise RuntimeError("the job failed after enqueueing")
    assert rows(engine) == []


@pytest.mark.parametrize("kind", KINDS)
def test_the_rows_are_seen_once_the_job_commits(
        kind: str, job: Callable[[str], contextlib.AbstractContextManager[Any]],
        engine: sa.Engine, db_settings: Settings) -> None:
    with job(kind) as conn:
        enqueue(conn, key="k", recipients=["a@example.com"], subject="s", body="b",
                schema=db_settings.database_schema)
        assert rows(engine) == []  # another connection: not yet committed
    assert len(rows(engine)) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_a_refused_chunk_undoes_the_call_and_keeps_the_job_s_transaction(
        kind: str, job: Callable[[str], contextlib.AbstractContextManager[Any]],
        engine: sa.Engine, db_settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bad recipient past the first chunk takes back the chunks before it (the savepoint);
    the job's transaction goes on and commits what else it wrote."""
    monkeypatch.setattr(outbox, "INSERT_CHUNK_ROWS", 1)
    schema = db_settings.database_schema
    with job(kind) as conn:
        assert enqueue(conn, key="kept", recipients=["k@example.com"], subject="s", body="b",
                       schema=schema) == 1
        with pytest.raises(InvalidEmailError, match="not an address"):
            enqueue(conn, key="bad", recipients=["a@example.com", "b@example.com",
                                                 "not an address"],
                    subject="s", body="b", schema=schema)
    assert [row[0] for row in rows(engine)] == ["kept|k@example.com"]


@pytest.mark.parametrize("kind", KINDS)
def test_no_outbox_in_the_schema_is_said_through_every_connection(
        kind: str, job: Callable[[str], contextlib.AbstractContextManager[Any]]) -> None:
    with pytest.raises(SchemaNotReadyError, match="no outbox table in schema nowhere_"), \
            contextlib.suppress(RuntimeError), job(kind) as conn:
        enqueue(conn, key="k", recipients=["a@example.com"], subject="s", body="b",
                schema=f"nowhere_{os.getpid()}")
        raise RuntimeError("not reached")


def test_psycopg_in_autocommit_mode_commits_each_call_whole(
        engine: sa.Engine, db_settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside a transaction, in autocommit mode, a call is a transaction of its own: its chunks
    all, or none of them."""
    monkeypatch.setattr(outbox, "INSERT_CHUNK_ROWS", 1)
    schema = db_settings.database_schema
    with psycopg.connect(libpq_conninfo(engine), autocommit=True) as conn:
        assert enqueue(conn, key="k", recipients=["a@example.com", "b@example.com"],
                       subject="s", body="b", schema=schema) == 2
        assert len(rows(engine)) == 2
        with pytest.raises(InvalidEmailError):
            enqueue(conn, key="bad", recipients=["c@example.com", "not an address"],
                    subject="s", body="b", schema=schema)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert len(rows(engine)) == 2


def test_django_outside_atomic_commits_each_call_whole(
        django_connection: Any, engine: sa.Engine, db_settings: Settings,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(outbox, "INSERT_CHUNK_ROWS", 1)
    schema = db_settings.database_schema
    assert django_connection.get_autocommit()
    assert enqueue(django_connection, key="k", recipients=["a@example.com", "b@example.com"],
                   subject="s", body="b", schema=schema) == 2
    with pytest.raises(InvalidEmailError):
        enqueue(django_connection, key="bad", recipients=["c@example.com", "not an address"],
                subject="s", body="b", schema=schema)
    assert len(rows(engine)) == 2


def test_django_s_database_errors_are_django_s(
        django_connection: Any, engine: sa.Engine, db_settings: Settings) -> None:
    """A statement refused by the server raises what Django's own queries raise."""
    from django.db import DatabaseError, transaction

    with engine.begin() as conn:  # a trigger that refuses every row
        conn.execute(sa.text(
            "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS "
            "$$BEGIN RAISE EXCEPTION 'refused by the test'; END$$; "
            "CREATE TRIGGER refuse BEFORE INSERT ON outbox FOR EACH ROW EXECUTE FUNCTION refuse()"))
    with pytest.raises(DatabaseError, match="refused by the test"), transaction.atomic():
        enqueue(django_connection, key="k", recipients=["a@example.com"], subject="s", body="b",
                schema=db_settings.database_schema)


def _readme_block(block: int) -> str:
    """The ``block``-th Python block of README's "Using it from a job", as written."""
    text = (Path(__file__).resolve().parents[3] / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Using it from a job"):]
    section = section[:section.index("\n## ", 1)]
    return section.split("```python\n")[block + 1].split("```", 1)[0]


def test_the_readme_snippets_for_the_three_connections(
        django_connection: Any, engine: sa.Engine, db_settings: Settings, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    report = tmp_path / "sales_2026-09.xlsx"
    report.write_bytes(b"PK")
    monkeypatch.setenv("POSTROOM_DATABASE_SCHEMA", db_settings.database_schema or "")
    team = ["finance@example.com", "ops@example.com"]
    job: dict[str, Any] = {"engine": engine, "team": team, "dsn": libpq_conninfo(engine)}
    exec(_readme_block(0).replace("/reports/sales_2026-09.xlsx", str(report)), job)  # noqa: S102
    exec(_readme_block(1), job)  # noqa: S102 - README's own, in the first block's namespace
    with engine.connect() as conn:
        keys = conn.execute(sa.text("SELECT message_key FROM outbox ORDER BY id")).scalars()
        assert list(keys) == [key for key in ("sales-report-2026-09", "invoices-2026-09",
                                              "orders-2026-09") for _ in team]


def _database_error(kind: str) -> type[Exception]:
    """What the job's library raises for a statement the server refuses."""
    if kind in ("sqlalchemy", "session"):
        return sa.exc.DatabaseError
    if kind == "psycopg":
        return psycopg.DatabaseError
    from django.db import DatabaseError

    return DatabaseError  # type: ignore[no-any-return]


@pytest.mark.parametrize("kind", KINDS)
def test_a_refused_batch_is_undone_and_the_job_s_transaction_goes_on(
        kind: str, job: Callable[[str], contextlib.AbstractContextManager[Any]],
        engine: sa.Engine, db_settings: Settings) -> None:
    """The server refuses a row of the batch: the library's error, nothing of the batch kept,
    and the job's transaction still takes statements and commits them."""
    with engine.begin() as conn:
        conn.execute(sa.text(
            "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN "
            "IF NEW.recipient = 'refused@example.com' THEN RAISE EXCEPTION 'refused row'; "
            "END IF; RETURN NEW; END$$; "
            "CREATE TRIGGER refuse BEFORE INSERT ON outbox FOR EACH ROW EXECUTE FUNCTION refuse()"))
    schema = db_settings.database_schema
    with job(kind) as conn:
        with pytest.raises(_database_error(kind), match="refused row"), \
                Batch(conn, schema=schema) as batch:
            batch.enqueue(key="b", recipients=["a@example.com", "refused@example.com"],
                          subject="s", body="b")
        assert enqueue(conn, key="after", recipients=["c@example.com"], subject="s", body="b",
                       schema=schema) == 1
    assert [row[0] for row in rows(engine)] == ["after|c@example.com"]


def test_a_scoped_session_enqueues_in_its_current_session(
        engine: sa.Engine, db_settings: Settings) -> None:
    """Flask-SQLAlchemy's ``db.session`` is a scoped_session: the rows are its current
    Session's, committed or rolled back with it."""
    from sqlalchemy.orm import scoped_session, sessionmaker

    scoped = scoped_session(sessionmaker(engine))
    schema = db_settings.database_schema
    try:
        enqueue(scoped, key="gone", recipients=["a@example.com"], subject="s", body="b",
                schema=schema)
        scoped.rollback()
        assert enqueue(scoped, key="kept", recipients=["a@example.com", "b@example.com"],
                       subject="s", body="b", schema=schema) == 2
        assert rows(engine) == []
        scoped.commit()
    finally:
        scoped.remove()
    assert [row[0] for row in rows(engine)] == ["kept|a@example.com", "kept|b@example.com"]


@pytest.mark.parametrize("kind", ["connection", "session"])
def test_an_async_job_enqueues_on_the_sync_side_of_its_connection(
        kind: str, engine: sa.Engine, db_settings: Settings) -> None:
    """What the refusal of an async object says to do (api.md): run_sync, in the async
    transaction, which commits or rolls back the rows."""
    import asyncio

    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    schema = db_settings.database_schema

    def job(conn: Any, key: str) -> int:
        return enqueue(conn, key=key, recipients=["a@example.com", "b@example.com"],
                       subject="s", body="b", schema=schema)

    async def run() -> list[int]:
        async_engine = create_async_engine(engine.url)
        counts = []
        try:
            for key, commit in (("gone", False), ("kept", True)):
                if kind == "connection":
                    async with async_engine.connect() as conn:
                        counts.append(await conn.run_sync(job, key))
                        await (conn.commit() if commit else conn.rollback())
                else:
                    async with AsyncSession(async_engine) as session:
                        counts.append(await session.run_sync(job, key))
                        await (session.commit() if commit else session.rollback())
        finally:
            await async_engine.dispose()
        return counts

    assert asyncio.run(run()) == [2, 2]
    assert [row[0] for row in rows(engine)] == ["kept|a@example.com", "kept|b@example.com"]


@pytest.mark.parametrize("kind", ["connection", "session"])
@pytest.mark.parametrize("fast", [True, False])
def test_sqlalchemy_in_autocommit_mode_commits_each_call_whole(
        kind: str, fast: bool, engine: sa.Engine, db_settings: Settings,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """isolation_level="AUTOCOMMIT", as psycopg's autocommit mode: a call or a Batch of several
    statements is a transaction of its own, all its rows or none, and the connection stays in
    autocommit mode."""
    monkeypatch.setattr(outbox, "INSERT_CHUNK_ROWS", 1)
    monkeypatch.setattr(outbox, "FAST_PATH", fast)
    schema = db_settings.database_schema
    autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
    with contextlib.ExitStack() as stack:
        conn: Any = stack.enter_context(autocommit.connect() if kind == "connection"
                                        else Session(autocommit))
        assert enqueue(conn, key="k", recipients=["a@example.com", "b@example.com"],
                       subject="s", body="b", schema=schema) == 2
        assert len(rows(engine)) == 2  # seen by another connection: committed
        with pytest.raises(InvalidEmailError):
            enqueue(conn, key="bad", recipients=["c@example.com", "not an address"],
                    subject="s", body="b", schema=schema)
        with Batch(conn, schema=schema) as batch:
            batch.enqueue(key="b", recipients=["d@example.com", "e@example.com"], subject="s",
                          body="b")
        assert batch.new == 2
        with pytest.raises(RuntimeError, match="left"), Batch(conn, schema=schema) as batch:
            batch.enqueue(key="gone", recipients=["f@example.com"], subject="s", body="b")
            raise RuntimeError("left the block")
        driver = sa_driver(conn)
        assert driver.autocommit
        assert driver.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert [row[0] for row in rows(engine)] == ["k|a@example.com", "k|b@example.com",
                                                "b|d@example.com", "b|e@example.com"]


def sa_driver(conn: sa.Connection | Session) -> psycopg.Connection[Any]:
    connection = conn.connection() if isinstance(conn, Session) else conn
    driver = connection.connection.driver_connection
    assert isinstance(driver, psycopg.Connection)
    return driver


def test_psycopg_in_autocommit_and_pipeline_mode_commits_each_call_whole(
        engine: sa.Engine, db_settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job's own statement still in flight in its pipeline (the connection's transaction
    status is then ACTIVE) does not make a call take a savepoint outside any transaction."""
    monkeypatch.setattr(outbox, "INSERT_CHUNK_ROWS", 1)
    schema = db_settings.database_schema
    with psycopg.connect(libpq_conninfo(engine), autocommit=True) as conn, conn.pipeline():
        mine = conn.execute("SELECT 'the job''s own'")
        assert enqueue(conn, key="k", recipients=["a@example.com", "b@example.com"],
                       subject="s", body="b", schema=schema) == 2
        assert mine.fetchone() == ("the job's own",)
        conn.execute("SELECT 1")
        with pytest.raises(InvalidEmailError):
            enqueue(conn, key="bad", recipients=["c@example.com", "not an address"],
                    subject="s", body="b", schema=schema)
        conn.execute("SELECT 1")
        with Batch(conn, schema=schema) as batch:
            batch.enqueue(key="b", recipients=["d@example.com"], subject="s", body="b")
        assert batch.new == 1
        assert conn.execute("SELECT 2").fetchone() == (2,)
    assert [row[0] for row in rows(engine)] == ["k|a@example.com", "k|b@example.com",
                                                "b|d@example.com"]


def _savepoint(kind: str, conn: Any) -> contextlib.AbstractContextManager[Any]:
    """A savepoint of the job's own, as api.md names them."""
    if kind in ("sqlalchemy", "session"):
        return conn.begin_nested()  # type: ignore[no-any-return]
    if kind == "psycopg":
        return conn.transaction()  # type: ignore[no-any-return]
    from django.db import transaction

    return transaction.atomic()


@pytest.mark.parametrize("kind", KINDS)
def test_a_refused_one_statement_call_in_a_savepoint_of_the_job_s_own_keeps_its_transaction(
        kind: str, job: Callable[[str], contextlib.AbstractContextManager[Any]],
        engine: sa.Engine, db_settings: Settings) -> None:
    """A one-statement call takes no savepoint (api.md): the job's own keeps its transaction
    going after a refusal."""
    with job(kind) as conn:
        with pytest.raises(SchemaNotReadyError), _savepoint(kind, conn):
            enqueue(conn, key="k", recipients=["a@example.com"], subject="s", body="b",
                    schema=f"nowhere_{os.getpid()}")
        assert enqueue(conn, key="after", recipients=["a@example.com"], subject="s", body="b",
                       schema=db_settings.database_schema) == 1
    assert [row[0] for row in rows(engine)] == ["after|a@example.com"]


@pytest.mark.parametrize("kind", KINDS)
def test_an_outbox_that_is_not_postroom_s_is_said_through_every_connection(
        kind: str, job: Callable[[str], contextlib.AbstractContextManager[Any]],
        engine: sa.Engine, db_settings: Settings) -> None:
    """A job's own table named outbox (the transactional outbox pattern's name), or one older
    than the release: SchemaNotReadyError saying so, not the server's missing column."""
    foreign = f"{db_settings.database_schema}_foreign"
    with engine.begin() as conn:
        conn.execute(sa.text(f"CREATE SCHEMA {foreign}; CREATE TABLE {foreign}.outbox "
                             "(id bigserial PRIMARY KEY, topic text, payload jsonb)"))
    try:
        for recipients in (["a@example.com"], ["a@example.com", "b@example.com"]):
            with pytest.raises(SchemaNotReadyError, match=(
                    rf"^the outbox table in schema {foreign} is not postroom's, or is older than "
                    r"this release \(column \"idempotency_key\" of relation \"outbox\" does not "
                    r"exist\): pass enqueue\(\.\.\., schema=\.\.\.\) the POSTROOM_DATABASE_SCHEMA "
                    r"the roles use, or run `postroom db upgrade`$")), \
                    contextlib.suppress(RuntimeError), job(kind) as conn:
                enqueue(conn, key="k", recipients=recipients, subject="s", body="b",
                        schema=foreign)
                raise RuntimeError("not reached")
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text(f"DROP SCHEMA {foreign} CASCADE"))


@pytest.mark.parametrize("kind", ["sqlalchemy", "psycopg"])
def test_the_job_s_connection_settings_are_left_as_they_were(
        kind: str, engine: sa.Engine, db_settings: Settings,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A psycopg connection of client-side cursors, no prepared statements (what a pool in
    transaction mode, pgbouncer's, asks for) and, on psycopg's own, dict rows (SQLAlchemy's
    dialect reads tuples): each call, over a chunk, a Batch, leaves them so, prepares nothing on
    the server and leaves no savepoint of its own open."""
    monkeypatch.setattr(outbox, "INSERT_CHUNK_ROWS", 1)
    schema = db_settings.database_schema
    settings: dict[str, Any] = {"cursor_factory": psycopg.ClientCursor,
                                "prepare_threshold": None}
    rows_as = psycopg.rows.dict_row if kind == "psycopg" else psycopg.rows.tuple_row
    with contextlib.ExitStack() as stack:
        if kind == "psycopg":
            conn: Any = stack.enter_context(psycopg.connect(libpq_conninfo(engine),
                                                            row_factory=rows_as, **settings))
            driver = conn
        else:
            job_engine = sa.create_engine(engine.url, connect_args=settings,
                                          poolclass=sa.pool.NullPool)
            conn = stack.enter_context(job_engine.connect())
            driver = sa_driver(conn)
        for n in range(7):  # past psycopg's prepare_threshold default of 5
            enqueue(conn, key=f"one-{n}", recipients=["a@example.com"], subject="s", body="b",
                    schema=schema)
            enqueue(conn, key=f"two-{n}", recipients=["a@example.com", "b@example.com"],
                    subject="s", body="b", schema=schema)
            with Batch(conn, schema=schema) as batch:
                batch.enqueue(key=f"batch-{n}", recipients=["c@example.com"], subject="s",
                              body="b")
        assert (driver.row_factory, driver.cursor_factory, driver.prepare_threshold,
                driver.autocommit) == (rows_as, psycopg.ClientCursor, None, False)
        assert driver.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        check = psycopg.ClientCursor(driver, row_factory=psycopg.rows.tuple_row)
        check.execute("SELECT count(*) FROM pg_prepared_statements")
        assert check.fetchone() == (0,)
        # no savepoint of postroom's is open: the job's own rollback to one of its own works
        check.execute("SAVEPOINT the_job_s; ROLLBACK TO SAVEPOINT the_job_s")
        conn.commit()
    assert len(rows(engine)) == 7 * 4


@pytest.mark.parametrize("kind", KINDS)
def test_rows_follow_a_savepoint_of_the_job_s_rolled_back(
        kind: str, job: Callable[[str], contextlib.AbstractContextManager[Any]],
        engine: sa.Engine, db_settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """A nested atomic() (a begin_nested(), a psycopg transaction()) rolled back takes back the
    rows of the calls inside it, one statement or several, and only those."""
    monkeypatch.setattr(outbox, "INSERT_CHUNK_ROWS", 1)
    schema = db_settings.database_schema
    with job(kind) as conn:
        enqueue(conn, key="outer", recipients=["a@example.com"], subject="s", body="b",
                schema=schema)
        with contextlib.suppress(RuntimeError), _savepoint(kind, conn):
            enqueue(conn, key="inner", recipients=["a@example.com"], subject="s", body="b",
                    schema=schema)
            enqueue(conn, key="chunks", recipients=["a@example.com", "b@example.com"],
                    subject="s", body="b", schema=schema)
            with Batch(conn, schema=schema) as batch:
                batch.enqueue(key="batch", recipients=["a@example.com"], subject="s", body="b")
            raise RuntimeError("the inner block fails")
        with _savepoint(kind, conn):
            enqueue(conn, key="kept", recipients=["a@example.com"], subject="s", body="b",
                    schema=schema)
    assert [row[0] for row in rows(engine)] == ["outer|a@example.com", "kept|a@example.com"]
