"""Which connections enqueue takes, and the statements as psycopg gets them without SQLAlchemy
(held to what SQLAlchemy's text() compiles for its psycopg dialect)."""

from __future__ import annotations

import itertools

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session

from postroom import Batch, enqueue, enqueue_many
from postroom.relay import sql
from postroom.relay.connectors import connector_for, kind_of
from postroom.relay.errors import InvalidConnectionError
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
