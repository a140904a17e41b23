"""enqueue's fast path (INSERT_ROW for one recipient, statements on the psycopg connection with
lists of strings in binary) writes the same rows, returns the same counts and raises the same
refusals as the reference, every statement through SQLAlchemy (issue 26)."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.rows import dict_row, tuple_row
from sqlalchemy.orm import Session

from postroom import Email, enqueue, enqueue_many
from postroom.relay import inserts, outbox
from postroom.relay.errors import EnqueueError, SchemaNotReadyError
from support.enqueue_strategies import ROW_COLUMNS, email_kwargs
from support.fuzz import examples

pytestmark = pytest.mark.integration

CHUNK_ROWS = outbox.INSERT_CHUNK_ROWS

@dataclasses.dataclass(frozen=True)
class Call:
    """One enqueue (emails of one) or one enqueue_many (emails of several)."""

    many: bool
    emails: tuple[dict[str, Any], ...]


@st.composite
def calls(draw: st.DrawFn, files: list[str]) -> list[Call]:
    made = [Call(many=draw(st.booleans()),
                 emails=tuple(email_kwargs(draw, files) for _ in range(draw(st.integers(1, 3)))))
            for _ in range(draw(st.integers(1, 4)))]
    return made + draw(st.lists(st.sampled_from(made), max_size=2))  # reruns of some


def _run(conn: sa.Connection | Session, call: Call) -> object:
    try:
        if call.many:
            return enqueue_many(conn, [Email(**email) for email in call.emails])
        return [enqueue(conn, **email) for email in call.emails]
    except EnqueueError as exc:
        return type(exc).__name__, str(exc)


def _outcomes(engine: sa.Engine, script: list[Call], *, fast: bool, session: bool,
              chunk_rows: int) -> tuple[list[object], list[tuple[Any, ...]], int]:
    """The calls' results, the rows they wrote and their queue entries, rolled back after;
    ``chunk_rows`` small makes several statements of a call (pipelined on the fast path)."""
    outbox.FAST_PATH, outbox.INSERT_CHUNK_ROWS = fast, chunk_rows
    with engine.connect() as connection:
        transaction = connection.begin()
        conn: sa.Connection | Session = Session(connection) if session else connection
        try:
            results = []
            for call in script:
                with _savepoint(conn):
                    results.append(_run(conn, call))
            rows = [tuple(row) for row in _connection(conn).execute(sa.text(
                f"SELECT {', '.join(ROW_COLUMNS)}, available_at = created_at, "
                "available_at - created_at > interval '1 day' FROM outbox ORDER BY id"))]
            queued = int(_connection(conn).execute(sa.text(
                "SELECT count(*) FROM outbox_queue JOIN outbox USING (id)")).scalar_one())
        finally:
            outbox.FAST_PATH, outbox.INSERT_CHUNK_ROWS = True, CHUNK_ROWS
            transaction.rollback()
    return results, rows, queued


def _connection(conn: sa.Connection | Session) -> sa.Connection:
    return conn.connection() if isinstance(conn, Session) else conn


@contextlib.contextmanager
def _savepoint(conn: sa.Connection | Session) -> Iterator[None]:
    """Each call in a savepoint of its own, as a job that goes on after a refusal would."""
    with conn.begin_nested():
        yield


@pytest.fixture
def files(tmp_path: Path) -> list[str]:
    made = []
    for name in ("report.pdf", 'a "quoted", {braced} name.txt', "back\\slash.csv"):
        path = tmp_path / name
        path.write_bytes(b"data")
        made.append(str(path))
    return made


def test_fast_path_and_reference_agree(engine: sa.Engine, files: list[str]) -> None:
    @settings(max_examples=examples(60), deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(script=calls(files), session=st.booleans(),
           chunk_rows=st.sampled_from([1, 2, CHUNK_ROWS]))
    def agree(script: list[Call], session: bool, chunk_rows: int) -> None:
        reference = _outcomes(engine, script, fast=False, session=session, chunk_rows=chunk_rows)
        assert _outcomes(engine, script, fast=True, session=session,
                         chunk_rows=chunk_rows) == reference

    agree()


def test_the_fast_path_is_taken(engine: sa.Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not a vacuous agreement: a job's psycopg connection gets the statement itself."""
    taken: list[str] = []
    one_row, chunk = inserts.insert_row_on_driver, inserts.insert_on_driver

    def row_spy(connection: Any, driver: Any, statement: str,
                params: dict[str, Any]) -> int:
        taken.append("INSERT_ROW")
        return one_row(connection, driver, statement, params)

    def chunk_spy(driver: Any, dialect: Any, statement: str,
                  params: dict[str, Any]) -> int:
        taken.append("INSERT_ROWS")
        return chunk(driver, dialect, statement, params)

    monkeypatch.setattr(inserts, "insert_row_on_driver", row_spy)
    monkeypatch.setattr(inserts, "insert_on_driver", chunk_spy)
    with engine.begin() as conn:
        assert enqueue(conn, key="k", recipients=["a@example.com"], subject="s", body="b") == 1
        assert enqueue(conn, key="k", recipients=["a@example.com", "b@example.com"],
                       subject="s", body="b") == 1
    assert taken == ["INSERT_ROW", "INSERT_ROWS"]


def _one(conn: sa.Connection, key: str = "k") -> int:
    return enqueue(conn, key=key, recipients=["a@example.com"], subject="s", body="b")


def _kept(conn: sa.Connection) -> Any:
    """The cursor kept for one-row inserts on ``conn`` (for whichever thread made it)."""
    return conn.info[inserts.KEPT_CURSOR][1]


def test_one_row_calls_share_a_cursor_per_connection(engine: sa.Engine) -> None:
    """The cursor kept in the pooled connection's info serves every call on that connection,
    across transactions; another connection gets its own."""
    with engine.connect() as conn, engine.connect() as other:
        with conn.begin():
            assert _one(conn, "k1") == 1
            kept = _kept(conn)
            assert kept.connection is conn.connection.driver_connection
            assert _one(conn, "k2") == 1
            assert _kept(conn) is kept
        with conn.begin():
            assert _one(conn, "k1") == 0
            assert _kept(conn) is kept
        with other.begin():
            assert _one(other, "k3") == 1
            assert _kept(other) is not kept


def test_another_thread_gets_a_cursor_of_its_own(engine: sa.Engine) -> None:
    """A connection handed to another thread (one at a time, as SQLAlchemy allows) is not
    served the first thread's cursor: two threads on one connection at once would otherwise
    read each other's results."""
    with engine.connect() as conn, conn.begin():
        assert _one(conn, "k1") == 1
        mine = _kept(conn)
        counts: list[int] = []
        worker = threading.Thread(target=lambda: counts.extend([_one(conn, "k2"),
                                                                _one(conn, "k2")]))
        worker.start()
        worker.join()
        assert counts == [1, 0]
        assert _kept(conn) is not mine
        assert _one(conn, "k3") == 1
        assert _kept(conn) is not mine  # replaced again: this thread's own, a new one


def test_a_closed_or_stale_kept_cursor_is_replaced(engine: sa.Engine) -> None:
    """A cursor the job closed, or one of a psycopg connection the pool has since replaced (the
    old one invalidated), is not used again."""
    with engine.connect() as conn:
        with conn.begin():
            assert _one(conn, "k1") == 1
        first = _kept(conn)
        first.close()
        with conn.begin():
            assert _one(conn, "k2") == 1
        kept = conn.info[inserts.KEPT_CURSOR]
        assert kept[1] is not first and not kept[1].closed
        stale = conn.connection.driver_connection
        conn.invalidate()
        conn.info[inserts.KEPT_CURSOR] = kept  # as if the info outlived its connection
        with conn.begin():
            assert _one(conn, "k3") == 1
            assert conn.connection.driver_connection is not stale
        assert _kept(conn) is not kept[1]


def test_counts_whatever_row_factory_the_jobs_connection_has(
        engine: sa.Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """enqueue's own cursors read tuples, whatever row factory the job set on its psycopg
    connection (a dict_row one has no row[0]): one row, one chunk, chunks pipelined."""
    monkeypatch.setattr(outbox, "INSERT_CHUNK_ROWS", 2)
    team = [f"user{n}@example.com" for n in range(5)]
    with engine.begin() as conn:
        driver = conn.connection.driver_connection
        driver.row_factory = dict_row
        try:
            assert _one(conn, "k1") == 1
            assert _one(conn, "k1") == 0
            assert enqueue(conn, key="pair", recipients=team[:2], subject="s", body="b") == 2
            assert enqueue(conn, key="team", recipients=team, subject="s", body="b") == 5
            assert enqueue(conn, key="team", recipients=team, subject="s", body="b") == 0
        finally:
            driver.row_factory = tuple_row


def test_a_one_row_call_counts_in_the_jobs_pipeline_mode(engine: sa.Engine) -> None:
    """A job that opened psycopg's pipeline mode gets the same counts: the new row is read
    from the statement's result, which the fetch waits for (a row count would not be known
    yet)."""
    with engine.begin() as conn:
        driver = conn.connection.driver_connection
        with driver.pipeline():
            assert _one(conn, "k1") == 1
            assert _one(conn, "k1") == 0
            assert _one(conn, "k2") == 1
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM outbox")).scalar_one() == 2


def test_a_failed_one_row_call_leaves_the_kept_cursor_usable(engine: sa.Engine) -> None:
    """A refusal from the server (no outbox in the schema named) rolls the transaction back;
    the next transaction's calls on the same connection, on the same cursor, still count right."""
    with engine.connect() as conn:
        with pytest.raises(SchemaNotReadyError), conn.begin():
            assert _one(conn, "k1") == 1
            kept = _kept(conn)
            enqueue(conn, key="k", recipients=["a@example.com"], subject="s", body="b",
                    schema="nosuch")
        with conn.begin():
            assert _one(conn, "k1") == 1
            assert _one(conn, "k1") == 0
            assert _kept(conn) is kept


def test_a_connection_outside_a_transaction_goes_through_sqlalchemy(engine: sa.Engine) -> None:
    """Its autobegun transaction is one the caller's commit() commits."""
    with engine.connect() as conn:
        assert not conn.in_transaction()
        assert enqueue(conn, key="k", recipients=["a@example.com"], subject="s", body="b") == 1
        conn.commit()
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM outbox")).scalar_one() == 1
        conn.commit()
        assert not conn.in_transaction()
        assert enqueue(conn, key="k", recipients=["a@example.com"], subject="s", body="b") == 0
        conn.rollback()



@pytest.mark.parametrize("fast", [True, False])
def test_no_outbox_is_told_from_a_pipelined_call_too(
        engine: sa.Engine, monkeypatch: pytest.MonkeyPatch, fast: bool) -> None:
    """Several statements in flight when the first finds no table: the same refusal."""
    monkeypatch.setattr(outbox, "INSERT_CHUNK_ROWS", 2)
    monkeypatch.setattr(outbox, "FAST_PATH", fast)
    team = [f"user{n}@example.com" for n in range(7)]
    with pytest.raises(SchemaNotReadyError, match="no outbox table in schema nosuch"), \
            engine.begin() as conn:
        enqueue(conn, key="k", recipients=team, subject="S", body="b", schema="nosuch")
    with pytest.raises(SchemaNotReadyError, match="no outbox table in schema nosuch"), \
            engine.begin() as conn:
        enqueue_many(conn, [Email(key=f"k{n}", recipients=[a], subject="S", body="b")
                            for n, a in enumerate(team)], schema="nosuch")
