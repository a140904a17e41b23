"""Enqueue's statements on the caller's psycopg connection itself (the fast path), with psycopg's
errors raised as SQLAlchemy's, and no outbox table as SchemaNotReadyError."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import sqlalchemy as sa
from psycopg.rows import tuple_row
from sqlalchemy.orm import Session

from postroom.relay.errors import SchemaNotReadyError

UNDEFINED_TABLE = "42P01"  # SQLSTATE of a relation that does not exist
# The key of a psycopg connection's cursor for one-row inserts (with the thread it serves), in the
# info of the pooled connection that holds it (which lives and goes with the psycopg connection).
KEPT_CURSOR = "postroom.enqueue.cursor"


@contextlib.contextmanager
def schema_ready(schema: str | None) -> Iterator[None]:
    """SchemaNotReadyError for the statement's error when there is no outbox table."""
    try:
        yield
    except sa.exc.ProgrammingError as exc:
        if getattr(exc.orig, "sqlstate", None) != UNDEFINED_TABLE:
            raise
        where = f"schema {schema}" if schema else "the connection's search path"
        raise SchemaNotReadyError(
            f"there is no outbox table in {where}: pass enqueue(..., schema=...) the "
            "POSTROOM_DATABASE_SCHEMA the roles use, or run `postroom db upgrade`") from None


def sa_connection(conn: sa.Connection | Session) -> sa.Connection:
    return conn.connection() if isinstance(conn, Session) else conn


def psycopg_connection(conn: sa.Connection | Session) -> psycopg.Connection[Any] | None:
    """The psycopg 3 connection under the caller's, when its transaction has begun (an
    execution on the driver does not begin one SQLAlchemy knows of); None: use SQLAlchemy."""
    connection = sa_connection(conn)
    if not connection.in_transaction():
        return None
    driver = connection.connection.driver_connection
    return driver if isinstance(driver, psycopg.Connection) else None


@functools.cache
def driver_sql(text: str, dialect: sa.Dialect, binary: frozenset[str]) -> str:
    """The statement as the dialect renders it for psycopg (``%(name)s``), the parameters named
    in ``binary`` sent in binary (``%(name)b``)."""
    query = str(sa.text(text).compile(dialect=dialect))
    for name in binary:
        query = query.replace(f"%({name})s", f"%({name})b")
    return query


def binary_names(params: dict[str, Any]) -> frozenset[str]:
    """The parameters that are lists of strings: psycopg writes them in binary 4 to 40 times
    faster than as array literals, whose every item it searches for quotes (10,000 bodies of
    500 bytes: 6.5 ms against 248)."""
    return frozenset(name for name, value in params.items()
                     if type(value) is list and value and all(type(v) is str for v in value))


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
                      statement: sa.TextClause, params: dict[str, Any]) -> int:
    """conn.execute(statement, params).scalar_one() run on the psycopg connection itself: the
    statement SQLAlchemy would send, with the same parameters (lists of strings in binary),
    without its execution context. Errors come as SQLAlchemy's, as they would."""
    query = driver_sql(statement.text, dialect, binary_names(params))
    with as_sqlalchemy_errors(query, params, dialect), \
            driver.cursor(row_factory=tuple_row) as cursor:
        cursor.execute(query, params)
        row = cursor.fetchone()
    if row is None:
        raise sa.exc.NoResultFound("No row was found when one was required")
    return int(row[0])


def insert_row_on_driver(connection: sa.Connection, driver: psycopg.Connection[Any],
                         statement: sa.TextClause, params: dict[str, Any]) -> int:
    """One INSERT_ROW (a row back when its row is new) run as :func:`insert_on_driver` runs a
    statement, on the cursor :func:`kept_cursor` keeps: 1 when the row is new, else 0."""
    query = driver_sql(statement.text, connection.dialect, binary_names(params))
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
