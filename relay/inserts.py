"""Enqueue's statements run: one at a time, or a call's chunks pipelined on the caller's psycopg
connection (the fast path, relay.outbox.FAST_PATH)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import TracebackType
from typing import Any

import psycopg
import sqlalchemy as sa
from psycopg.rows import tuple_row
from sqlalchemy.orm import Session

from postroom.relay import pgdriver


def insert_one(conn: sa.Connection | Session, statement: sa.TextClause, params: dict[str, Any],
               schema: str | None, *, fast: bool) -> int:
    """Insert one chunk's rows; how many are new. SchemaNotReadyError when there is no outbox."""
    with pgdriver.schema_ready(schema):
        driver = pgdriver.psycopg_connection(conn) if fast else None
        if driver is None:
            return int(conn.execute(statement, params).scalar_one())
        return pgdriver.insert_on_driver(driver, pgdriver.sa_connection(conn).dialect, statement, params)


def insert_row(conn: sa.Connection | Session, statement: sa.TextClause, params: dict[str, Any],
               schema: str | None) -> int:
    """Insert one row with INSERT_ROW (on the psycopg connection when it can); 1 if it is new,
    else 0. SchemaNotReadyError when there is no outbox."""
    with pgdriver.schema_ready(schema):
        connection = pgdriver.sa_connection(conn)
        driver = pgdriver.psycopg_connection(connection)
        if driver is None:
            return len(conn.execute(statement, params).all())
        return pgdriver.insert_row_on_driver(connection, driver, statement, params)


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
        self._driver = pgdriver.psycopg_connection(conn) if fast else None
        self._connection = pgdriver.sa_connection(conn)
        self._dialect = self._connection.dialect
        self._pipeline: contextlib.ExitStack | None = None
        self._pending: tuple[psycopg.Cursor[Any], str, dict[str, Any]] | None = None

    def __enter__(self) -> Inserts:
        if self._driver is not None:
            sa.event.listen(self._connection, "before_cursor_execute", self._before_statement)
        return self

    def add(self, statement: sa.TextClause, params: dict[str, Any]) -> None:
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
        query = pgdriver.driver_sql(statement.text, self._dialect, pgdriver.binary_names(params))
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
        with pgdriver.schema_ready(self.schema), \
                pgdriver.as_sqlalchemy_errors(query, params, self._dialect):
            yield
