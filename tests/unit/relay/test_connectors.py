"""Which connections enqueue takes, and the statements as psycopg gets them without SQLAlchemy
(held to what SQLAlchemy's text() compiles for its psycopg dialect)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from postroom import Batch, enqueue, enqueue_many
from postroom.relay import sql
from postroom.relay.connectors import connector_for, kind_of
from postroom.relay.errors import InvalidConnectionError
from postroom.relay.inserts import SQLAlchemyConnector
from postroom.relay.pgdriver import driver_sql

DIALECT = postgresql.psycopg.dialect()  # type: ignore[attr-defined]
STATEMENTS = [build(schema, traced=traced)
              for build, schema, traced in itertools.product(
                  (sql.insert_row, sql.insert_rows, sql.insert_emails),
                  (None, "reports", 'we"ird'), (False, True))] + [sql.HAS_TRACE_COLUMNS]


@pytest.mark.parametrize("statement", STATEMENTS)
def test_the_driver_sql_is_sqlalchemy_s(statement: str) -> None:
    reference = str(sa.text(statement).compile(dialect=DIALECT))
    assert driver_sql(statement, frozenset()) == reference


@pytest.mark.parametrize("text", [
    "SELECT :a, :b_2, CAST(:c AS text[]), 'x%y', a::text, :d::int, ':e', \\:f",
    "SELECT 100 % :n",
])
def test_odd_text_compiles_as_sqlalchemy_compiles_it(text: str) -> None:
    assert driver_sql(text, frozenset()) == str(sa.text(text).compile(dialect=DIALECT))


def test_lists_of_strings_go_in_binary() -> None:
    query = driver_sql(sql.insert_rows(None), frozenset({"keys", "recipients"}))
    assert "CAST(%(keys)b AS text[])" in query and "CAST(%(recipients)b AS text[])" in query
    assert "%(subject)s" in query


class _Session(Session):
    """A job's own subclass: still SQLAlchemy's."""


def test_kinds_are_known_by_their_library_subclasses_too() -> None:
    engine = sa.create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none")
    assert kind_of(_Session(engine)) == "sqlalchemy"
    assert kind_of(object()) is None


@pytest.mark.parametrize("conn", [object(), "postgresql://localhost/db", None])
def test_anything_else_is_refused_in_one_line(conn: object) -> None:
    for call in (lambda: enqueue(conn, recipients=["a@example.com"], subject="s", body="b"),  # type: ignore[arg-type]
                 lambda: enqueue_many(conn, []),  # type: ignore[arg-type]
                 lambda: Batch(conn)):  # type: ignore[arg-type]
        with pytest.raises(InvalidConnectionError, match=r"^conn must be a SQLAlchemy Connection "
                           r"or Session, a psycopg 3 Connection or Django's connection, not "):
            call()


def test_an_async_psycopg_connection_is_refused() -> None:
    import psycopg

    fake = psycopg.AsyncConnection.__new__(psycopg.AsyncConnection)
    with pytest.raises(InvalidConnectionError, match="not an AsyncConnection"):
        connector_for(fake, None, fast=True)


ENGINE_URL = "postgresql+psycopg://nobody@127.0.0.1:1/none"  # never connected to


def _refusal(conn: object) -> str:
    """The one line each of enqueue, enqueue_many and Batch refuses ``conn`` with (the same)."""
    lines = set()
    for call in (lambda: enqueue(conn, recipients=["a@example.com"], subject="s", body="b"),  # type: ignore[arg-type]
                 lambda: enqueue_many(conn, []),  # type: ignore[arg-type]
                 lambda: Batch(conn)):  # type: ignore[arg-type]
        with pytest.raises(InvalidConnectionError) as caught:
            call()
        lines.add(str(caught.value))
    [line] = lines
    assert "\n" not in line
    return line


def test_an_engine_is_refused_saying_to_pass_a_connection() -> None:
    assert _refusal(sa.create_engine(ENGINE_URL)) == (
        "conn is a SQLAlchemy Engine: pass a Connection in the job's transaction "
        "(with engine.begin() as conn: enqueue(conn, ...))")


def test_a_sessionmaker_is_refused_saying_to_pass_a_session() -> None:
    from sqlalchemy.orm import sessionmaker

    assert _refusal(sessionmaker(sa.create_engine(ENGINE_URL))) == (
        "conn is a SQLAlchemy sessionmaker: pass a Session in the job's transaction "
        "(with Session() as session, session.begin(): enqueue(session, ...))")


def test_another_sqlalchemy_object_is_refused_naming_it() -> None:
    from sqlalchemy.pool import _ConnectionFairy

    fairy = _ConnectionFairy.__new__(_ConnectionFairy)  # what Connection.connection gives
    assert _refusal(fairy) == ("conn is a SQLAlchemy _ConnectionFairy: enqueue takes a "
                               "SQLAlchemy Connection or Session")
    assert _refusal(sa.text("SELECT 1")).startswith("conn is a SQLAlchemy TextClause: ")


@pytest.mark.parametrize("name", ["AsyncConnection", "AsyncSession", "AsyncEngine",
                                  "async_scoped_session"])
def test_sqlalchemy_s_async_objects_are_refused_saying_to_use_run_sync(name: str) -> None:
    from sqlalchemy.ext import asyncio

    fake = object.__new__(getattr(asyncio, name))
    assert _refusal(fake) == (
        f"conn is a SQLAlchemy {name}: enqueue is synchronous; call it on the sync side of an "
        "AsyncConnection or AsyncSession in the job's transaction: "
        "await conn.run_sync(lambda sync_conn: enqueue(sync_conn, ...))")


def test_a_session_bound_to_no_single_engine_is_refused() -> None:
    class Base(DeclarativeBase):
        pass

    class Report(Base):
        __tablename__ = "report"
        id: Mapped[int] = mapped_column(primary_key=True)

    expected = ("conn is a Session bound to no engine, or to one per mapper or table: pass the "
                "connection the rows go through (session.connection(bind_arguments="
                "{'mapper': Model}))")
    assert _refusal(Session()) == expected
    assert _refusal(Session(binds={Report: sa.create_engine(ENGINE_URL)})) == expected


def test_a_scoped_session_is_its_current_session() -> None:
    from sqlalchemy.orm import scoped_session, sessionmaker

    scoped = scoped_session(sessionmaker(sa.create_engine(ENGINE_URL)))
    connector = connector_for(scoped, None, fast=True)
    assert isinstance(connector, SQLAlchemyConnector)
    assert connector.conn is scoped()


@pytest.mark.parametrize("make", [
    lambda django: django.db.connections,
    lambda django: django.db.transaction.atomic(),
    lambda django: django.db.models.Model,  # the class itself: Django's too
])
def test_a_django_object_that_is_no_connection_is_refused(make: Any) -> None:
    import django.db.models
    import django.db.transaction

    thing = make(django)
    assert _refusal(thing) == (
        f"conn is Django's {type(thing).__qualname__}, not a connection: pass "
        "django.db.connection (or django.db.connections[alias])")


@pytest.mark.parametrize(("module", "name", "says"), [
    ("psycopg2.extensions", "connection",
     "conn is a psycopg2 connection: enqueue takes psycopg 3's (pip install 'psycopg[binary]'; "
     "psycopg.connect(...)), or a SQLAlchemy Connection or Session"),
    ("psycopg_pool.pool", "ConnectionPool",
     "conn is a psycopg_pool ConnectionPool: take a connection from the pool "
     "(with pool.connection() as conn: enqueue(conn, ...))"),
])
def test_neighbours_of_psycopg_are_refused_saying_what_to_pass(module: str, name: str,
                                                               says: str) -> None:
    fake = type(name, (), {"__module__": module})()
    assert _refusal(fake) == says


def _django_wrapper(vendor: str, driver: object) -> object:
    """What enqueue uses of a Django DatabaseWrapper of ``vendor`` over ``driver``."""
    return type("DatabaseWrapper", (), {
        "__module__": f"django.db.backends.{vendor}.base", "vendor": vendor,
        "connection": driver, "ensure_connection": lambda self: None,
        "validate_no_broken_transaction": lambda self: None})()


def test_django_on_another_database_is_refused() -> None:
    assert _refusal(_django_wrapper("sqlite", None)) == (
        "Django's connection is to sqlite: postroom's outbox is in PostgreSQL")


def test_django_on_psycopg2_is_refused_saying_to_install_psycopg_3() -> None:
    driver = type("connection", (), {"__module__": "psycopg2.extensions"})()
    assert _refusal(_django_wrapper("postgresql", driver)) == (
        "Django's connection uses psycopg2.extensions: postroom needs Django's psycopg 3 backend "
        "(pip install 'psycopg[binary]', and uninstall psycopg2)")
