"""The connection a job holds, whichever kind it is (a SQLAlchemy Connection or Session, a psycopg 3
Connection, Django's connection): :func:`connector_for` picks the adapter that runs enqueue's
statements on it, in the job's transaction. Light: an adapter is imported only when a connection
of its kind is given, when the job has loaded its library already.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import AbstractContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from postroom.relay.errors import InvalidConnectionError, SchemaNotReadyError

if TYPE_CHECKING:
    import psycopg
    import sqlalchemy as sa
    from sqlalchemy.orm import Session, scoped_session

UNDEFINED_TABLE = "42P01"  # SQLSTATE of a relation that does not exist
UNDEFINED_COLUMN = "42703"  # SQLSTATE of a column that does not exist
# The libraries whose connections enqueue takes, by the top-level package that defines them.
KINDS = ("sqlalchemy", "psycopg", "django")


class DjangoConnection(Protocol):
    """What enqueue uses of ``django.db.connection`` (or ``connections[alias]``)."""

    vendor: str

    def ensure_connection(self) -> None: ...
    def validate_no_broken_transaction(self) -> None: ...


# What enqueue, enqueue_many and Batch take as ``conn``.
JobConnection: TypeAlias = ("sa.Connection | Session | scoped_session[Any] | psycopg.Connection[Any]"
                            " | DjangoConnection")


class Inserts(Protocol):
    """The statements of one call or batch, in order, and how many rows they made new."""

    new: int

    def add(self, statement: str, params: dict[str, Any]) -> None: ...
    def __enter__(self) -> Inserts: ...
    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None: ...


class Connector(Protocol):
    """enqueue's statements on one job connection; errors come as its library raises them."""

    def savepoint(self) -> AbstractContextManager[object]:
        """A block whose statements are undone together if an exception leaves it (a connection
        in autocommit mode, outside a transaction: the block is the call's own transaction)."""
        ...

    def scalar(self, statement: str, params: dict[str, Any]) -> Any:
        """The one value of a one-row statement."""
        ...

    def insert_row(self, statement: str, params: dict[str, Any]) -> int:
        """INSERT_ROW: 1 when its row is new, else 0."""
        ...

    def insert_rows(self, statement: str, params: dict[str, Any]) -> int:
        """INSERT_ROWS: how many rows are new."""
        ...

    def inserts(self) -> Inserts:
        """The chunk statements of one call or batch."""
        ...


def kind_of(conn: object) -> str | None:
    """The library of ``conn``'s class or of a class it derives from (a job's own Session
    subclass, say), among :data:`KINDS`; None for any other object."""
    for cls in type(conn).__mro__:
        root = cls.__module__.partition(".")[0]
        if root in KINDS:
            return root
    return None


def connector_for(conn: object, schema: str | None, *, fast: bool) -> Connector:
    """The adapter for the job's connection; InvalidConnectionError for anything else.
    ``fast``: a SQLAlchemy connection's statements run on its psycopg connection (relay.outbox's
    FAST_PATH); the other kinds run on theirs always."""
    kind = kind_of(conn)
    if kind == "sqlalchemy":
        from postroom.relay.inserts import SQLAlchemyConnector, job_connection

        return SQLAlchemyConnector(job_connection(conn), schema, fast=fast)
    if kind == "psycopg":
        from postroom.relay.pgdriver import psycopg_connector

        return psycopg_connector(conn, schema)
    if kind == "django":
        return django_connector(conn, schema)
    cls = type(conn)
    root = cls.__module__.partition(".")[0]
    if root == "psycopg2":
        raise InvalidConnectionError(
            f"conn is a psycopg2 {cls.__name__}: enqueue takes psycopg 3's (pip install "
            "'psycopg[binary]'; psycopg.connect(...)), or a SQLAlchemy Connection or Session")
    if root == "psycopg_pool":
        raise InvalidConnectionError(
            f"conn is a psycopg_pool {cls.__name__}: take a connection from the pool "
            "(with pool.connection() as conn: enqueue(conn, ...))")
    raise InvalidConnectionError(
        "conn must be a SQLAlchemy Connection or Session, a psycopg 3 Connection or Django's "
        f"connection, not {cls.__module__}.{cls.__qualname__}")


def django_connector(conn: object, schema: str | None) -> Connector:
    """The connector of Django's connection (``django.db.connection``, a proxy of it, or
    ``connections[alias]``); InvalidConnectionError for another of Django's objects (the
    ``connections`` handler, a cursor, an ``atomic()``)."""
    if not (isinstance(getattr(conn, "vendor", None), str)
            and callable(getattr(conn, "ensure_connection", None))):
        raise InvalidConnectionError(
            f"conn is Django's {type(conn).__qualname__}, not a connection: pass "
            "django.db.connection (or django.db.connections[alias])")
    from postroom.relay.pgdriver import django_connector as connector

    return connector(conn, schema)  # type: ignore[arg-type]


def driver_error_of(exc: BaseException) -> BaseException | None:
    """The driver's error of a database error: psycopg's own, or the one under SQLAlchemy's
    (``orig``) or Django's (``__cause__``); None for another error."""
    for error in (exc, getattr(exc, "orig", None), exc.__cause__):
        if isinstance(getattr(error, "sqlstate", None), str):
            return error
    return None


def sqlstate_of(exc: BaseException) -> str | None:
    """The SQLSTATE of a database error (its driver's error's)."""
    error = driver_error_of(exc)
    return None if error is None else getattr(error, "sqlstate", None)


@contextlib.contextmanager
def schema_ready(schema: str | None) -> Iterator[None]:
    """SchemaNotReadyError for the statement's error when there is no outbox table, or one
    without postroom's columns (a job's own table named outbox, or one older than the release)."""
    try:
        yield
    except Exception as exc:
        state = sqlstate_of(exc)
        if state not in (UNDEFINED_TABLE, UNDEFINED_COLUMN):
            raise
        where = f"schema {schema}" if schema else "the connection's search path"
        advice = ("pass enqueue(..., schema=...) the POSTROOM_DATABASE_SCHEMA the roles use, or "
                  "run `postroom db upgrade`")
        if state == UNDEFINED_TABLE:
            raise SchemaNotReadyError(f"there is no outbox table in {where}: {advice}") from None
        diag = getattr(driver_error_of(exc), "diag", None)
        said = getattr(diag, "message_primary", None) or "a column is missing"
        raise SchemaNotReadyError(f"the outbox table in {where} is not postroom's, or is older "
                                  f"than this release ({said}): {advice}") from None
