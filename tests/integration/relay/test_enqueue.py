"""enqueue() against the real database: idempotence, the caller's transaction, validation."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from postroom import enqueue
from relay.errors import InvalidAttachmentError, InvalidEmailError

pytestmark = pytest.mark.integration

TEAM = ["finance@example.com", "ops@example.com", "old.manager@example.com", "ceo@example.com"]
SUBJECT = "Sales report — September 2026"


def count(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM outbox")).scalar_one())


def test_rerun_queues_nothing_twice(engine: sa.Engine, tmp_path: Path) -> None:
    report = tmp_path / "sales_2026-09.xlsx"
    report.write_bytes(b"PK\x03\x04 not really a workbook")
    with engine.begin() as conn:
        first = enqueue(conn, key="sales-2026-09", recipients=TEAM, subject=SUBJECT,
                        body="The September sales report is attached.", attachments=[report])
    with engine.begin() as conn:
        again = enqueue(conn, key="sales-2026-09", recipients=[*TEAM, "OPS@example.com"],
                        subject=SUBJECT, body="The September sales report is attached.",
                        attachments=[report])
    assert (first, again) == (4, 0)
    with engine.connect() as conn:
        rows = conn.execute(sa.text(
            "SELECT recipient, status, attachments, priority, idempotency_key FROM outbox "
            "ORDER BY id")).all()
    assert [r.recipient for r in rows] == TEAM
    assert {r.status for r in rows} == {"pending"}
    assert rows[0].attachments == [str(report)]
    assert rows[0].priority == "normal"
    assert rows[1].idempotency_key == "sales-2026-09|ops@example.com"


def test_a_new_key_is_a_new_message(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        september = enqueue(conn, key="sales-2026-09", recipients=TEAM[:1], subject="S", body="b")
        october = enqueue(conn, key="sales-2026-10", recipients=TEAM[:1], subject="S", body="b")
    assert (september, october) == (1, 1)


def test_without_key_the_subject_is_the_message_key(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        assert enqueue(conn, recipients=TEAM[:2], subject=SUBJECT, body="b") == 2
        assert enqueue(conn, recipients=TEAM[:2], subject=SUBJECT, body="b") == 0
        keys = conn.execute(sa.text("SELECT DISTINCT message_key FROM outbox")).scalars().all()
    assert keys == [SUBJECT]


def test_rollback_leaves_nothing_queued(engine: sa.Engine) -> None:
    with pytest.raises(RuntimeError, match="job failed"), engine.begin() as conn:
        assert enqueue(conn, key="k", recipients=TEAM, subject=SUBJECT, body="b") == 4
        raise RuntimeError("job failed after enqueue")
    assert count(engine) == 0


def test_works_inside_an_orm_session(engine: sa.Engine) -> None:
    with Session(engine) as session, session.begin():
        assert enqueue(session, key="k", recipients=TEAM[:1], subject="S", body="b",
                       priority="high") == 1
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT priority FROM outbox")).scalar_one() == "high"


def test_send_after_sets_when_the_row_becomes_due(engine: sa.Engine) -> None:
    later = dt.datetime(2030, 1, 1, 7, 0, tzinfo=dt.UTC)
    with engine.begin() as conn:
        enqueue(conn, key="k", recipients=TEAM[:1], subject="S", body="b", send_after=later)
        due = conn.execute(sa.text("SELECT available_at FROM outbox")).scalar_one()
    assert due == later


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"recipients": []}, InvalidEmailError, "no recipients"),
    ({"recipients": ["not-an-address"]}, InvalidEmailError, "local@domain"),
    ({"recipients": [""]}, InvalidEmailError, "empty"),
    ({"recipients": ["a@b.com\r\nBcc: x@evil.com"]}, InvalidEmailError, "control character"),
    ({"recipients": ["a b@example.com"]}, InvalidEmailError, "local part"),
    ({"recipients": ["a@-bad-.com"]}, InvalidEmailError, "domain"),
    ({"recipients": "a@example.com"}, InvalidEmailError, "list of addresses"),
    ({"subject": "Report\r\nBcc: x@evil.com"}, InvalidEmailError, "control character"),
    ({"subject": "   "}, InvalidEmailError, "subject is empty"),
    ({"priority": "urgent"}, InvalidEmailError, "unknown priority"),
    ({"attachments": ["/nonexistent/report.xlsx"]}, InvalidAttachmentError, "does not exist"),
    ({"attachments": ["/"]}, InvalidAttachmentError, "not a regular file"),
    ({"send_after": dt.datetime(2030, 1, 1)}, InvalidEmailError, "timezone-aware"),  # noqa: DTZ001
    ({"sender": "bad sender"}, InvalidEmailError, "sender"),
])
def test_bad_input_is_refused_and_nothing_written(
        engine: sa.Engine, kwargs: dict[str, object], error: type[Exception],
        message: str) -> None:
    call: dict[str, object] = {"key": "k", "recipients": TEAM, "subject": "S", "body": "b", **kwargs}
    with pytest.raises(error, match=message), engine.begin() as conn:
        enqueue(conn, **call)  # type: ignore[arg-type]
    assert count(engine) == 0


def test_oversized_attachment_is_refused(engine: sa.Engine, tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    with big.open("wb") as f:
        f.truncate(2048)
    with pytest.raises(InvalidAttachmentError, match="over the limit of 1024"), \
            engine.begin() as conn:
        enqueue(conn, key="k", recipients=TEAM, subject="S", body="b", attachments=[big],
                attachment_max_bytes=1024)
    assert count(engine) == 0


def test_unreadable_attachment_is_refused(engine: sa.Engine, tmp_path: Path) -> None:
    if os.geteuid() == 0:
        # root reads any file; a dangling symlink is the unreadable case root still has.
        target = tmp_path / "gone.xlsx"
        link = tmp_path / "link.xlsx"
        link.symlink_to(target)
        path = link
    else:
        path = tmp_path / "secret.xlsx"
        path.write_bytes(b"x")
        path.chmod(0)
    with pytest.raises(InvalidAttachmentError), engine.begin() as conn:
        enqueue(conn, key="k", recipients=TEAM, subject="S", body="b", attachments=[path])
    assert count(engine) == 0


def test_a_large_recipient_list_is_one_call(engine: sa.Engine) -> None:
    # Over PostgreSQL's 65,535 bind parameters if it were sent as a single statement.
    recipients = [f"user{i}@example.com" for i in range(10_000)]
    with engine.begin() as conn:
        assert enqueue(conn, key="all-staff", recipients=recipients, subject="S", body="b") == 10_000
    with engine.begin() as conn:
        assert enqueue(conn, key="all-staff", recipients=recipients, subject="S", body="b") == 0
    assert count(engine) == 10_000
