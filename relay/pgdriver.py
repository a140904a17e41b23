"""Enqueue's statements on a psycopg 3 connection: the job's own, Django's, or the one under a
SQLAlchemy connection (the fast path). Imports psycopg, not SQLAlchemy."""

from __future__ import annotations

import contextlib
import functools
import itertools
import re
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any

import psycopg
from psycopg import pq
from psycopg.rows import tuple_row

from postroom.relay.connectors import DjangoConnection, schema_ready
from postroom.relay.errors import InvalidConnectionError

# A parameter of SQLAlchemy's text(): a colon and a name, not after a colon, word character or
# backslash, nor before a colon (its TextClause's own pattern).
_BIND = re.compile(r"(?<![:\w\\]):(\w+)(?!:)")
_ESCAPED_COLON = re.compile(r"\\(:[\w$]*)(?![:\w$])")  # ``\:name``: the text ``:name``
_SAVEPOINTS = itertools.count(1)  # savepoint names, unique in the process


@functools.cache
def driver_sql(text: str, binary: frozenset[str]) -> str:
    """A statement with ``:name`` parameters as psycopg takes it: ``%(name)s``, or ``%(name)b``
    for the parameters named in ``binary``, and ``%`` doubled. What SQLAlchemy's text() compiles
    to for its psycopg dialect (a differential test holds it to that), without SQLAlchemy."""
    def placeholder(match: re.Match[str]) -> str:
        name = match.group(1)
        return f"%({name})b" if name in binary else f"%({name})s"
    return _ESCAPED_COLON.sub(r"\1", _BIND.sub(placeholder, text.replace("%", "%%")))


def binary_names(params: dict[str, Any]) -> frozenset[str]:
    """The parameters that are lists of strings: psycopg writes them in binary 4 to 40 times
    faster than as array literals, whose every item it searches for quotes (10,000 bodies of
    500 bytes: 6.5 ms against 248)."""
    return frozenset(name for name, value in params.items()
                     if type(value) is list and value and all(type(v) is str for v in value))


def query_of(statement: str, params: dict[str, Any]) -> str:
    return driver_sql(statement, binary_names(params))


def new_cursor(driver: psycopg.Connection[Any]) -> psycopg.Cursor[Any]:
    """A server-side binding cursor of tuples, whatever the connection's own factories are
    (Django's is a ClientCursor, which sends no parameter in binary)."""
    return psycopg.Cursor(driver, row_factory=tuple_row)


@contextlib.contextmanager
def savepoint(driver: psycopg.Connection[Any]) -> Iterator[None]:
    """A savepoint in the connection's transaction (begun first if none is: psycopg begins one
    before a statement outside autocommit mode); in autocommit mode outside a transaction, a
    transaction of the block's own, committed when it ends well."""
    if driver.autocommit and driver.info.transaction_status == pq.TransactionStatus.ACTIVE:
        # the job's statements in flight in its pipeline: once they end, the status tells
        # whether they left a transaction open
        with driver.pipeline() as pipeline:
            pipeline.sync()
    if driver.autocommit and driver.info.transaction_status == pq.TransactionStatus.IDLE:
        with driver.transaction():
            yield
        return
    name = f"postroom_enqueue_{next(_SAVEPOINTS)}"
    driver.execute(f"SAVEPOINT {name}")
    try:
        yield
    except BaseException:
        if not driver.closed:
            driver.execute(f"ROLLBACK TO SAVEPOINT {name}")
            driver.execute(f"RELEASE SAVEPOINT {name}")
        raise
    driver.execute(f"RELEASE SAVEPOINT {name}")


class PsycopgConnector:
    """enqueue's statements on a psycopg 3 connection, one at a time, errors in ``errors``
    (a context that raises psycopg's as the caller's library does; none for psycopg's own)."""

    def __init__(self, driver: psycopg.Connection[Any], schema: str | None,
                 errors: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext,
                 ) -> None:
        self.driver, self.schema, self._errors = driver, schema, errors

    def _fetch(self, statement: str, params: dict[str, Any]) -> tuple[Any, ...] | None:
        with schema_ready(self.schema), self._errors(), new_cursor(self.driver) as cursor:
            cursor.execute(query_of(statement, params), params)
            row: tuple[Any, ...] | None = cursor.fetchone()
        return row

    @contextlib.contextmanager
    def savepoint(self) -> Iterator[None]:
        with self._errors(), savepoint(self.driver):
            yield

    def scalar(self, statement: str, params: dict[str, Any]) -> Any:
        row = self._fetch(statement, params)
        return None if row is None else row[0]

    def insert_row(self, statement: str, params: dict[str, Any]) -> int:
        return 0 if self._fetch(statement, params) is None else 1

    def insert_rows(self, statement: str, params: dict[str, Any]) -> int:
        row = self._fetch(statement, params)
        if row is None:
            raise psycopg.ProgrammingError("the insert returned no count")
        return int(row[0])

    def inserts(self) -> StatementInserts:
        return StatementInserts(self)


class StatementInserts:
    """A call's or a batch's chunk statements on a :class:`PsycopgConnector`, each run when it
    is added (no pipeline: the job's own statements between them run as they would alone)."""

    def __init__(self, connector: PsycopgConnector) -> None:
        self.connector, self.new = connector, 0

    def __enter__(self) -> StatementInserts:
        return self

    def add(self, statement: str, params: dict[str, Any]) -> None:
        self.new += self.connector.insert_rows(statement, params)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        return None


def psycopg_connector(conn: object, schema: str | None) -> PsycopgConnector:
    """The job's own psycopg 3 connection: its errors are psycopg's."""
    if not isinstance(conn, psycopg.Connection):
        raise InvalidConnectionError(
            f"conn is a psycopg {type(conn).__name__}: enqueue takes a psycopg.Connection "
            "(not an AsyncConnection, a cursor or a pool: take a connection from the pool)")
    return PsycopgConnector(conn, schema)


def django_connector(connection: DjangoConnection, schema: str | None) -> PsycopgConnector:
    """Django's connection (``django.db.connection``): its psycopg 3 connection, errors raised as
    Django's (``django.db.IntegrityError``, ...). Inside ``transaction.atomic()`` the rows are
    the atomic block's; outside it (autocommit), each call commits its own."""
    if connection.vendor != "postgresql":
        raise InvalidConnectionError(f"Django's connection is to {connection.vendor}: "
                                     "postroom's outbox is in PostgreSQL")
    connection.validate_no_broken_transaction()  # TransactionManagementError, as Django's
    connection.ensure_connection()
    driver = getattr(connection, "connection", None)
    if not isinstance(driver, psycopg.Connection):
        raise InvalidConnectionError(
            f"Django's connection uses {type(driver).__module__}: postroom needs Django's "
            "psycopg 3 backend (pip install 'psycopg[binary]', and uninstall psycopg2)")
    wrapper: AbstractContextManager[object] = getattr(connection, "wrap_database_errors")  # noqa: B009
    return PsycopgConnector(driver, schema, errors=lambda: wrapper)
