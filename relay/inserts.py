"""Enqueue's statements on a job's SQLAlchemy Connection or Session: one at a time through
SQLAlchemy, or on the psycopg connection under it, a call's chunks pipelined (the fast path,
relay.outbox.FAST_PATH), psycopg's errors raised as SQLAlchemy's."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any

import psycopg
import sqlalchemy as sa
from psycopg import pq
from psycopg.rows import tuple_row

from postroom.relay.connectors import schema_ready
from postroom.relay.errors import InvalidConnectionError
from postroom.relay.pgdriver import binary_names, driver_sql, query_of, savepoint

# SQLAlchemy's ORM is imported when a job passes something other than a Connection (a Session
# it has imported itself): enqueue on a Connection, and the `postroom enqueue` command, start
# without it.
if TYPE_CHECKING:
    from sqlalchemy.orm import Session

# The key of a psycopg connection's cursor for one-row inserts (with the thread it serves), in the
# info of the pooled connection that holds it (which lives and goes with the psycopg connection).
KEPT_CURSOR = "postroom.enqueue.cursor"

text_of = functools.cache(sa.text)  # a statement as SQLAlchemy runs it


# What a job may hold instead of a Connection or Session, and what to pass instead.
_ASYNC_ADVICE = ("enqueue is synchronous; call it on the sync side of an AsyncConnection or "
                 "AsyncSession in the job's transaction: "
                 "await conn.run_sync(lambda sync_conn: enqueue(sync_conn, ...))")
_ENGINE_ADVICE = ("pass a Connection in the job's transaction "
                  "(with engine.begin() as conn: enqueue(conn, ...))")
_SESSIONMAKER_ADVICE = ("pass a Session in the job's transaction "
                        "(with Session() as session, session.begin(): enqueue(session, ...))")


def job_connection(conn: object) -> sa.Connection | Session:
    """The job's SQLAlchemy Connection or Session (a ``scoped_session``'s current Session, as
    Flask-SQLAlchemy's ``db.session`` is); InvalidConnectionError, saying what to pass, for
    another SQLAlchemy object (an Engine, an async object, ...) or a Session bound to no one
    engine."""
    if isinstance(conn, sa.Connection):
        return conn
    from sqlalchemy.orm import Session, scoped_session, sessionmaker

    if isinstance(conn, scoped_session):
        conn = conn()
    if isinstance(conn, Session):
        try:
            conn.get_bind()
        except sa.exc.UnboundExecutionError:
            raise InvalidConnectionError(
                "conn is a Session bound to no engine, or to one per mapper or table: pass the "
                "connection the rows go through (session.connection(bind_arguments="
                "{'mapper': Model}))") from None
        return conn
    cls = type(conn)
    if cls.__module__.startswith("sqlalchemy.ext.asyncio"):
        advice = _ASYNC_ADVICE
    else:
        advice = (_ENGINE_ADVICE if isinstance(conn, sa.Engine)
                  else _SESSIONMAKER_ADVICE if isinstance(conn, sessionmaker)
                  else "enqueue takes a SQLAlchemy Connection or Session")
    raise InvalidConnectionError(f"conn is a SQLAlchemy {cls.__name__}: {advice}")


class SQLAlchemyConnector:
    """enqueue's statements on a SQLAlchemy Connection or Session (relay.connectors.Connector):
    ``fast``, on its psycopg connection where it has one."""

    def __init__(self, conn: sa.Connection | Session, schema: str | None, *, fast: bool) -> None:
        self.conn, self.schema, self.fast = conn, schema, fast

    def savepoint(self) -> contextlib.AbstractContextManager[object]:
        driver = idle_autocommit_driver(self.conn)
        if driver is None:
            return self.conn.begin_nested()
        return own_transaction(driver, sa_connection(self.conn).dialect)

    def scalar(self, statement: str, params: dict[str, Any]) -> Any:
        return self.conn.execute(text_of(statement), params).scalar_one()

    def insert_row(self, statement: str, params: dict[str, Any]) -> int:
        return insert_row(self.conn, statement, params, self.schema)

    def insert_rows(self, statement: str, params: dict[str, Any]) -> int:
        return insert_one(self.conn, statement, params, self.schema, fast=self.fast)

    def inserts(self) -> Inserts:
        return Inserts(self.conn, self.schema, fast=self.fast)


def idle_autocommit_driver(conn: sa.Connection | Session) -> psycopg.Connection[Any] | None:
    """The psycopg connection under the caller's when it is in autocommit mode outside a
    transaction (``isolation_level="AUTOCOMMIT"``), where no savepoint can be; else None."""
    driver = sa_connection(conn).connection.driver_connection
    if (isinstance(driver, psycopg.Connection) and driver.autocommit
            and driver.info.transaction_status == pq.TransactionStatus.IDLE):
        return driver
    return None


@contextlib.contextmanager
def own_transaction(driver: psycopg.Connection[Any], dialect: sa.Dialect) -> Iterator[None]:
    """A transaction of the block's own on a connection in autocommit mode, as enqueue has on a
    psycopg connection in that mode; its errors as SQLAlchemy's."""
    with as_sqlalchemy_errors(None, None, dialect), savepoint(driver):
        yield


def sa_connection(conn: sa.Connection | Session) -> sa.Connection:
    return conn if isinstance(conn, sa.Connection) else conn.connection()


def psycopg_connection(conn: sa.Connection | Session) -> psycopg.Connection[Any] | None:
    """The psycopg 3 connection under the caller's, when its transaction has begun (an
    execution on the driver does not begin one SQLAlchemy knows of); None: use SQLAlchemy."""
    connection = sa_connection(conn)
    if not connection.in_transaction():
        return None
    driver = connection.connection.driver_connection
    return driver if isinstance(driver, psycopg.Connection) else None


@contextlib.contextmanager
def as_sqlalchemy_errors(query: str | None, params: dict[str, Any] | None,
                         dialect: sa.Dialect) -> Iterator[None]:
    """psycopg's errors raised as SQLAlchemy raises them for ``query`` (its parameters hidden), so
    a statement run on the driver fails as it would through SQLAlchemy."""
    try:
        yield
    except psycopg.Error as exc:
        raise sa.exc.DBAPIError.instance(query, params, exc, psycopg.Error,
                                         hide_parameters=True, dialect=dialect) from exc


def insert_on_driver(driver: psycopg.Connection[Any], dialect: sa.Dialect,
                     statement: str, params: dict[str, Any]) -> int:
    """conn.execute(text(statement), params).scalar_one() run on the psycopg connection itself:
    the statement SQLAlchemy would send, with the same parameters (lists of strings in binary),
    without its execution context. Errors come as SQLAlchemy's, as they would."""
    query = query_of(statement, params)
    with as_sqlalchemy_errors(query, params, dialect), \
            driver.cursor(row_factory=tuple_row) as cursor:
        cursor.execute(query, params)
        row = cursor.fetchone()
    if row is None:
        raise sa.exc.NoResultFound("No row was found when one was required")
    return int(row[0])


def insert_row_on_driver(connection: sa.Connection, driver: psycopg.Connection[Any],
                         statement: str, params: dict[str, Any]) -> int:
    """One INSERT_ROW (a row back when its row is new) run as :func:`insert_on_driver` runs a
    statement, on the cursor :func:`kept_cursor` keeps: 1 when the row is new, else 0."""
    query = query_of(statement, params)
    with as_sqlalchemy_errors(query, params, connection.dialect):
        cursor = kept_cursor(connection, driver)
        cursor.execute(query, params)
        return 0 if cursor.fetchone() is None else 1


def kept_cursor(connection: sa.Connection, driver: psycopg.Connection[Any]) -> psycopg.Cursor[Any]:
    """A cursor of ``driver`` for this thread, kept in ``connection``'s info for the thread's next
    one-row insert. psycopg sets a cursor up again for each new query; the same cursor given the
    same query (one string per statement, driver_sql's) keeps that set-up: 24 µs of a one-row
    insert's 190 (psycopg alone, 9 rounds of 2,000, 6 December). A job that alternates statements
    (traced and not, with files and without, schemas) sets it up each time, as before. A cursor
    of another thread is not shared (a connection used by two threads at once, which SQLAlchemy
    does not allow, would read each other's results), nor one closed or of another psycopg
    connection. The cursor holds its last statement's parameters (the last email's values) until
    the next insert on that connection or the connection's close."""
    info, thread = connection.info, threading.get_ident()
    kept = info.get(KEPT_CURSOR)
    if kept is not None:
        owner, cursor = kept
        if owner == thread and not cursor.closed and cursor.connection is driver:
            return cursor  # type: ignore[no-any-return]
    cursor = driver.cursor(row_factory=tuple_row)
    info[KEPT_CURSOR] = (thread, cursor)
    return cursor


def insert_one(conn: sa.Connection | Session, statement: str, params: dict[str, Any],
               schema: str | None, *, fast: bool) -> int:
    """Insert one chunk's rows; how many are new. SchemaNotReadyError when there is no outbox."""
    with schema_ready(schema):
        driver = psycopg_connection(conn) if fast else None
        if driver is None:
            return int(conn.execute(text_of(statement), params).scalar_one())
        return insert_on_driver(driver, sa_connection(conn).dialect, statement, params)


def insert_row(conn: sa.Connection | Session, statement: str, params: dict[str, Any],
               schema: str | None) -> int:
    """Insert one row with INSERT_ROW (on the psycopg connection when it can); 1 if it is new,
    else 0. SchemaNotReadyError when there is no outbox."""
    with schema_ready(schema):
        connection = sa_connection(conn)
        driver = psycopg_connection(connection)
        if driver is None:
            return len(conn.execute(text_of(statement), params).all())
        return insert_row_on_driver(connection, driver, statement, params)


class Inserts:
    """The chunk statements of one call or batch, in order, and how many rows they made new.

    On the fast path they are pipelined on the psycopg connection (its pipeline mode): a chunk
    is sent once the one before it is written, and the caller checks and builds the next while
    the server writes it, so the job's CPU and the server's work in parallel. Any other statement
    on the connection meanwhile (the job's own, a Session's flush) first waits for the one in
    flight and leaves the pipeline, so it runs as without one; the next chunk opens it again.
    Elsewhere each runs through :func:`insert_one`. A refusal raised between chunks leaves after
    the statement in flight has ended; the caller's savepoint then takes back what it wrote.
    """

    def __init__(self, conn: sa.Connection | Session, schema: str | None, *, fast: bool) -> None:
        self.conn, self.schema, self.new = conn, schema, 0
        self._driver = psycopg_connection(conn) if fast else None
        self._connection = sa_connection(conn)
        self._dialect = self._connection.dialect
        self._pipeline: contextlib.ExitStack | None = None
        self._pending: tuple[psycopg.Cursor[Any], str, dict[str, Any]] | None = None

    def __enter__(self) -> Inserts:
        if self._driver is not None:
            sa.event.listen(self._connection, "before_cursor_execute", self._before_statement)
        return self

    def add(self, statement: str, params: dict[str, Any]) -> None:
        """Send one chunk's statement, once the one before it is written."""
        if self._driver is None:
            self.new += insert_one(self.conn, statement, params, self.schema, fast=False)
            return
        if self._pipeline is None:
            pipeline = contextlib.ExitStack()
            with self._errors(None, None):
                pipeline.enter_context(self._driver.pipeline())
            self._pipeline = pipeline
        self._collect()
        query = driver_sql(statement, binary_names(params))
        cursor = self._driver.cursor(row_factory=tuple_row)
        self._pending = (cursor, query, params)
        with self._errors(query, params):
            cursor.execute(query, params)

    def _collect(self) -> None:
        if self._pending is None:
            return
        cursor, query, params = self._pending
        self._pending = None
        with self._errors(query, params), cursor:
            row = cursor.fetchone()
        if row is None:
            raise sa.exc.NoResultFound("No row was found when one was required")
        self.new += int(row[0])

    def _before_statement(self, *_: object) -> None:
        self._leave(None, None, None)

    def _leave(self, kind: type[BaseException] | None, exc: BaseException | None,
               traceback: TracebackType | None) -> None:
        """Wait for the statement in flight (unless leaving on ``exc``) and leave the pipeline."""
        pipeline, self._pipeline = self._pipeline, None
        if pipeline is None:
            return
        pending = self._pending
        where = (None, None) if pending is None else (pending[1], pending[2])
        try:
            if kind is None:
                self._collect()
        except BaseException as error:
            # leaving the pipeline waits for what is in flight; given an exception, it logs a
            # second error instead of raising it
            with self._errors(*where):
                pipeline.__exit__(type(error), error, error.__traceback__)
            raise
        with self._errors(*where):
            pipeline.__exit__(kind, exc, traceback)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if self._driver is not None:
            sa.event.remove(self._connection, "before_cursor_execute", self._before_statement)
        self._leave(kind, exc, traceback)

    @contextlib.contextmanager
    def _errors(self, query: str | None, params: dict[str, Any] | None) -> Iterator[None]:
        """psycopg's errors as SQLAlchemy's, and no outbox as SchemaNotReadyError."""
        with schema_ready(self.schema), as_sqlalchemy_errors(query, params, self._dialect):
            yield
