"""Batch: one call per email whose rows go to the database together. It writes the rows, counts
and refusals that enqueue, called once per email, writes (the reference), and a refused email
leaves nothing of itself in the batch (issue 26)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy.orm import Session

from postroom import Batch, enqueue
from postroom.relay import batch as batch_module
from postroom.relay import inserts, outbox
from postroom.relay.errors import EnqueueError, InvalidEmailError, SchemaNotReadyError
from support.enqueue_strategies import ROW_COLUMNS, email_kwargs
from support.fuzz import examples

pytestmark = pytest.mark.integration

CHUNK_ROWS = outbox.INSERT_CHUNK_ROWS
ROWS = sa.text(f"SELECT {', '.join(ROW_COLUMNS)}, available_at = created_at FROM outbox "
               "ORDER BY id")
QUEUED = sa.text("SELECT count(*) FROM outbox_queue JOIN outbox USING (id)")


@st.composite
def jobs(draw: st.DrawFn, files: list[str]) -> list[dict[str, Any]]:
    emails = [email_kwargs(draw, files) for _ in range(draw(st.integers(1, 6)))]
    return emails + draw(st.lists(st.sampled_from(emails), max_size=2))  # reruns of some


def _refusal(exc: EnqueueError) -> tuple[str, str]:
    return type(exc).__name__, str(exc)


def _rows(conn: sa.Connection) -> tuple[list[tuple[Any, ...]], int]:
    return [tuple(row) for row in conn.execute(ROWS)], int(conn.execute(QUEUED).scalar_one())


def _by_batch(engine: sa.Engine, emails: list[dict[str, Any]]) -> tuple[object, ...]:
    refused: list[tuple[int, tuple[str, str]]] = []
    with engine.connect() as conn, conn.begin() as transaction:
        with Batch(conn) as batch:
            for n, email in enumerate(emails):
                try:
                    batch.enqueue(**email)
                except EnqueueError as exc:  # the job goes on without it
                    refused.append((n, _refusal(exc)))
        outcome = (batch.new, refused, *_rows(conn))
        transaction.rollback()
    return outcome


def _one_by_one(engine: sa.Engine, emails: list[dict[str, Any]]) -> tuple[object, ...]:
    refused: list[tuple[int, tuple[str, str]]] = []
    new = 0
    with engine.connect() as conn, conn.begin() as transaction:
        for n, email in enumerate(emails):
            try:
                with conn.begin_nested():
                    new += enqueue(conn, **email)
            except EnqueueError as exc:
                refused.append((n, _refusal(exc)))
        outcome = (new, refused, *_rows(conn))
        transaction.rollback()
    return outcome


@pytest.fixture
def files(tmp_path: Path) -> list[str]:
    made = []
    for name in ("report.pdf", 'a "quoted", {braced} name.txt'):
        path = tmp_path / name
        path.write_bytes(b"data")
        made.append(str(path))
    return made


@pytest.fixture
def chunk_rows() -> Iterator[None]:
    yield
    outbox.INSERT_CHUNK_ROWS = CHUNK_ROWS


@pytest.mark.parametrize("fast", [True, False])
def test_a_batch_writes_what_enqueue_once_per_email_writes(
        engine: sa.Engine, files: list[str], chunk_rows: None, fast: bool,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(outbox, "FAST_PATH", fast)

    @settings(max_examples=examples(40), deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(emails=jobs(files), rows_per_statement=st.sampled_from([1, 2, 3, CHUNK_ROWS]))
    # Two refusals in one email, in different chunks: both calls must name the first chunk's
    # (enqueue read the second chunk's recipients before the first chunk's event).
    @example(emails=[{"key": None, "recipients": ["a@example.com", "bad"], "subject": "Invoice",
                      "body": "", "sender": None, "html": "\ud800", "attachments": [],
                      "priority": "normal", "send_after": None}], rows_per_statement=1)
    def agree(emails: list[dict[str, Any]], rows_per_statement: int) -> None:
        # Small statements: an email's rows span several, and several emails share one.
        outbox.INSERT_CHUNK_ROWS = rows_per_statement
        assert _by_batch(engine, emails) == _one_by_one(engine, emails)

    agree()


def count(conn: sa.Connection) -> int:
    return int(conn.execute(sa.text("SELECT count(*) FROM outbox")).scalar_one())


def test_a_refused_email_leaves_nothing_of_itself_even_past_its_first_statement(
        engine: sa.Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(outbox, "INSERT_CHUNK_ROWS", 2)
    with engine.begin() as conn:
        with Batch(conn) as batch:
            batch.enqueue(key="a", recipients=["a@example.com"], subject="S", body="b")
            with pytest.raises(InvalidEmailError, match="bad"):  # in its third chunk
                batch.enqueue(key="team", subject="S", body="b", recipients=[
                    "t1@example.com", "t2@example.com", "t3@example.com", "t4@example.com",
                    "bad"])
            batch.enqueue(key="c", recipients=["c@example.com", "d@example.com"], subject="S",
                          body="b")
        assert batch.new == 3
        recipients = conn.execute(sa.text("SELECT recipient FROM outbox ORDER BY id")).scalars()
        assert list(recipients) == ["a@example.com", "c@example.com", "d@example.com"]


def test_an_exception_leaving_the_block_writes_nothing_of_the_batch(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        enqueue(conn, key="before", recipients=["x@example.com"], subject="S", body="b")
        with pytest.raises(KeyError), Batch(conn) as batch:
            batch.enqueue(key="a", recipients=["a@example.com"], subject="S", body="b")
            raise KeyError("the job's own failure")
        assert count(conn) == 1  # the job's earlier row is kept; the caller decides
    with pytest.raises(RuntimeError, match="outside its with block"):
        batch.enqueue(key="late", recipients=["l@example.com"], subject="S", body="b")
    with pytest.raises(RuntimeError, match="a Batch is used once"), \
            engine.begin() as conn, batch:
        pass  # the rows of its first block are not written by a second


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("session", [False, True])
def test_the_jobs_own_statements_inside_the_block_run_as_without_a_batch(
        engine: sa.Engine, monkeypatch: pytest.MonkeyPatch, fast: bool, session: bool) -> None:
    """The job marks its invoices as it queues them: its statements wait for the batch's one in
    flight (a pipeline left open gave a SELECT no result and an UPDATE a rowcount of -1)."""
    monkeypatch.setattr(outbox, "FAST_PATH", fast)
    monkeypatch.setattr(outbox, "INSERT_CHUNK_ROWS", 2)
    with engine.connect() as connection, connection.begin():
        connection.execute(sa.text("CREATE TEMP TABLE invoices (n int PRIMARY KEY, mailed bool)"))
        connection.execute(sa.text("INSERT INTO invoices SELECT n, false FROM generate_series(0, 4) n"))
        conn: sa.Connection | Session = Session(connection) if session else connection
        with Batch(conn) as batch:
            for n in range(5):
                batch.enqueue(key=f"inv-{n}", recipients=[f"c{n}@example.com"], subject="S",
                              body="b")
                updated = conn.execute(sa.text("UPDATE invoices SET mailed = true WHERE n = :n"),
                                       {"n": n})
                assert updated.rowcount == 1  # type: ignore[attr-defined]
                queued = conn.execute(sa.text("SELECT count(*) FROM outbox")).scalar_one()
                assert queued == 2 * ((n + 1) // 2)  # what the full statements wrote so far
        assert batch.new == 5
        assert conn.execute(sa.text("SELECT count(*) FROM invoices WHERE mailed")).scalar_one() == 5


def test_a_database_error_is_raised_once_sent_and_the_batch_takes_no_more(
        engine: sa.Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(outbox, "INSERT_CHUNK_ROWS", 1)
    refused: list[str] = []
    with pytest.raises(SchemaNotReadyError), engine.begin() as conn, \
            Batch(conn, schema="nosuch") as batch:
        for n in range(3):
            try:
                batch.enqueue(key=f"k{n}", recipients=[f"c{n}@example.com"], subject="S", body="b")
            except (SchemaNotReadyError, RuntimeError) as exc:  # the job goes on regardless
                refused.append(type(exc).__name__)
    # The first email's statement fails when the second is sent; the third is not taken; the
    # block's end raises the first error again.
    assert refused == ["SchemaNotReadyError", "RuntimeError"]


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The rows of each statement a batch sends, in order."""
    rows: list[int] = []
    real = inserts.Inserts.add

    def spy(self: inserts.Inserts, statement: str, params: dict[str, Any]) -> None:
        rows.append(len(params["recipient"]))
        real(self, statement, params)

    monkeypatch.setattr(inserts.Inserts, "add", spy)
    return rows


def test_calls_do_not_wait_the_rows_go_in_few_statements(
        engine: sa.Engine, monkeypatch: pytest.MonkeyPatch, sent: list[int]) -> None:
    """Not a vacuous agreement: seven emails, three statements of up to three rows."""
    monkeypatch.setattr(outbox, "INSERT_CHUNK_ROWS", 3)
    with engine.begin() as conn, Batch(conn) as batch:
        for n in range(7):
            batch.enqueue(key=f"k{n}", recipients=[f"c{n}@example.com"], subject="S", body="b")
        assert batch.new == 0  # not counted before the block ends
    assert sent == [3, 3, 1]
    assert batch.new == batch.given == 7


def test_one_recipient_emails_go_in_statements_of_statement_rows_and_a_big_email_whole(
        engine: sa.Engine, monkeypatch: pytest.MonkeyPatch, sent: list[int]) -> None:
    """STATEMENT_ROWS bounds a statement of many emails; one email's chunk of recipients (up
    to INSERT_CHUNK_ROWS) is never split across statements."""
    monkeypatch.setattr(batch_module, "STATEMENT_ROWS", 4)
    monkeypatch.setattr(outbox, "INSERT_CHUNK_ROWS", 6)
    with engine.begin() as conn, Batch(conn) as batch:
        for n in range(9):
            batch.enqueue(key=f"k{n}", recipients=[f"c{n}@example.com"], subject="S", body="b")
        batch.enqueue(key="team", recipients=[f"t{n}@example.com" for n in range(7)],
                      subject="S", body="b")
    assert sent == [4, 4, 1, 6, 1]  # the team's 7 recipients: chunks of 6 and 1
    assert batch.new == batch.given == 16


def test_no_outbox_is_told_when_the_block_ends(engine: sa.Engine) -> None:
    with pytest.raises(SchemaNotReadyError, match="no outbox table in schema nosuch"), \
            engine.begin() as conn, Batch(conn, schema="nosuch") as batch:
        batch.enqueue(key="k", recipients=["a@example.com"], subject="S", body="b")
