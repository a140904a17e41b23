"""enqueue() against the real database: idempotence, the caller's transaction, validation."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from postroom import Email, enqueue, enqueue_many
from postroom.devkit.scratch import drop_schema, unique_name
from postroom.relay.errors import InvalidAttachmentError, InvalidEmailError, SchemaNotReadyError
from postroom.settings import Settings

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
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
    ({"attachments": ["/"]}, InvalidAttachmentError, "does not name a file"),
    ({"attachments": ["/tmp"]}, InvalidAttachmentError, "not a regular file"),  # noqa: S108
    ({"attachments": ["/proc/self/environ"]}, InvalidAttachmentError, "pseudo file system"),
    ({"attachments": ["/dev/zero"]}, InvalidAttachmentError, "pseudo file system"),
    # issue 10: an encoded word that decodes to a line break, and None where text belongs
    ({"subject": "Invoice =?utf-8?q?=0D=0AReply-To:_attacker@evil.example?="}, InvalidEmailError,
     "Subject header would hold a line break"),
    ({"subject": "Report\u2028Bcc: x@evil.com"}, InvalidEmailError, "line break"),
    ({"subject": "Report\x85Bcc: x@evil.com"}, InvalidEmailError, "line break"),
    ({"subject": None}, InvalidEmailError, "subject must be a string, not NoneType"),
    ({"body": None}, InvalidEmailError, "body must be a string, not NoneType"),
    ({"key": None, "subject": None}, InvalidEmailError, "must be a string"),
    ({"recipients": None}, InvalidEmailError, "not NoneType"),
    ({"recipients": [None]}, InvalidEmailError, "recipient must be a string"),
    ({"sender": 42}, InvalidEmailError, "sender must be a string"),
    ({"attachments": None}, InvalidEmailError, "not NoneType"),
    ({"attachments": [None]}, InvalidAttachmentError, "must be a path"),
    ({"recipients": ["a@b.com, eve@evil.example"]}, InvalidEmailError, "one bare address"),
    ({"recipients": ["ceo@corp.example <eve@evil.example>"]}, InvalidEmailError, "local part"),
    ({"body": "x" * (512 * 1024 + 1)}, InvalidEmailError, "over the limit of 524288"),
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


def test_an_encoded_line_break_in_an_attachment_name_is_refused(
        engine: sa.Engine, tmp_path: Path) -> None:
    name = tmp_path / "=?utf-8?q?a=0D=0AX-Evil:_1?=.pdf"
    name.write_bytes(b"%PDF")
    with pytest.raises(InvalidEmailError, match="line break"), engine.begin() as conn:
        enqueue(conn, key="k", recipients=TEAM, subject="S", body="b", attachments=[name])
    assert count(engine) == 0


def test_keys_that_the_old_encoding_confused_are_two_emails(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        first = enqueue(conn, key="k|a", recipients=["b@example.com"], subject="S", body="b")
        second = enqueue(conn, key="k", recipients=["a|b@example.com"], subject="S", body="b")
        third = enqueue(conn, key="k\\", recipients=["|b@example.com"], subject="S", body="b")
    assert (first, second, third) == (1, 1, 1)
    with engine.connect() as conn:
        keys = set(conn.execute(sa.text("SELECT idempotency_key FROM outbox")).scalars())
    assert keys == {"k\\|a|b@example.com", "k|a|b@example.com", "k\\\\||b@example.com"}


def test_an_ordinary_key_keeps_the_form_it_always_had(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        enqueue(conn, key="sales-report-2026-09", recipients=["Finance@Example.com"],
                subject="S", body="b")
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT idempotency_key FROM outbox")).scalar_one() == \
            "sales-report-2026-09|finance@example.com"


@pytest.mark.parametrize("address", ["user@bücher.example", "josé@example.com"])
def test_internationalised_addresses_are_accepted(engine: sa.Engine, address: str) -> None:
    with engine.begin() as conn:
        assert enqueue(conn, key="k", recipients=[address], subject="S", body="b") == 1


def test_an_event_over_the_size_limit_is_refused(engine: sa.Engine) -> None:
    from postroom.rules import SizeLimits

    limits = SizeLimits(event_max_bytes=2000)
    with engine.begin() as conn:
        assert enqueue(conn, key="k", recipients=TEAM, subject="S", body="b" * 1500,
                       limits=limits) == len(TEAM)
    with pytest.raises(InvalidEmailError, match="over the limit of 2000"), \
            engine.begin() as conn:
        enqueue(conn, key="k2", recipients=TEAM, subject="S", body="b" * 2000, limits=limits)
    assert count(engine) == len(TEAM)


def test_the_caps_of_the_jobs_environment_are_enqueues_when_it_is_given_none(
        engine: sa.Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job run with the roles' POSTROOM_*_MAX_BYTES refuses what the sender would; limits
    given to the call win; a malformed variable is named."""
    from postroom.errors import ConfigError
    from postroom.relay.batch import Batch
    from postroom.rules import SizeLimits

    def batch_of_one(conn: sa.Connection, **email: Any) -> None:
        with Batch(conn) as batch:
            batch.enqueue(**email)

    (tmp_path / "a.csv").write_bytes(b"x" * 600)
    monkeypatch.setenv("POSTROOM_BODY_MAX_BYTES", "100")
    monkeypatch.setenv("POSTROOM_ATTACHMENT_MAX_BYTES", "500")
    for call in (lambda conn: enqueue(conn, key="k", recipients=TEAM, subject="S", body="b" * 101),
                 lambda conn: enqueue_many(conn, [Email(key="k", recipients=TEAM, subject="S",
                                                        body="b" * 101)]),
                 lambda conn: batch_of_one(conn, key="k", recipients=TEAM, subject="S",
                                           body="b" * 101)):
        with pytest.raises(InvalidEmailError, match="100"), engine.begin() as conn:
            call(conn)
    with pytest.raises(InvalidAttachmentError, match="500"), engine.begin() as conn:
        enqueue(conn, key="k", recipients=TEAM, subject="S", body="b",
                attachments=[tmp_path / "a.csv"])
    assert count(engine) == 0
    with engine.begin() as conn:
        assert enqueue(conn, key="k", recipients=TEAM, subject="S", body="b" * 101,
                       limits=SizeLimits()) == len(TEAM)
    monkeypatch.setenv("POSTROOM_BODY_MAX_BYTES", "a lot")
    with pytest.raises(ConfigError, match="POSTROOM_BODY_MAX_BYTES"), engine.begin() as conn:
        enqueue(conn, key="k2", recipients=TEAM, subject="S", body="b")
    monkeypatch.delenv("POSTROOM_BODY_MAX_BYTES")
    with engine.begin() as conn:  # unset: the default (512 KiB)
        assert enqueue(conn, key="k3", recipients=TEAM, subject="S", body="b" * 1000) == len(TEAM)


def _cjk(n: int, seed: int) -> str:
    """``n`` CJK characters (three bytes each in UTF-8) that do not compress: PostgreSQL
    compresses an index entry that would not fit, so a repeated one would hide the limit."""
    import random

    rng = random.Random(seed)
    return "".join(chr(rng.randrange(0x4E00, 0x9FA0)) for _ in range(n))


def test_keys_are_held_to_what_the_database_can_index(engine: sa.Engine) -> None:
    """A key within KEY_MAX_BYTES is indexed by the outbox (its idempotency key and message key
    indexes); one past it, or a long non-ASCII subject standing for the key, is an EnqueueError
    before the statement, and the job's transaction goes on."""
    from postroom.rules import KEY_MAX_BYTES

    key = _cjk(850, 1)  # 2,550 bytes: its idempotency keys 2,564
    with engine.begin() as conn:
        assert enqueue(conn, key=key, recipients=["a@example.com"], subject="S", body="b") == 1
        for bad in ({"key": _cjk(867, 2)},                               # 2,601 bytes
                    {"key": _cjk(864, 3)},                    # 2,592 bytes; its keys 2,606
                    {"subject": _cjk(950, 4)}):               # the key, 2,850 bytes
            with pytest.raises(InvalidEmailError, match=str(KEY_MAX_BYTES)):
                enqueue(conn, recipients=["a@example.com"], body="b", **{"subject": "S", **bad})
        assert enqueue(conn, key="after", recipients=["a@example.com"], subject="S", body="b") == 1
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM outbox WHERE message_key = :k"),
                            {"k": key}).scalar_one() == 1
    assert count(engine) == 2


def test_a_key_lowering_makes_longer_than_the_relay_takes_is_refused(engine: sa.Engine) -> None:
    """'İ' lowers to two characters: the idempotency key is checked as written, after lowering."""
    from postroom.rules import IDEMPOTENCY_KEY_MAX_CHARS

    recipient = "\u0130" * 32 + "@" + ".".join(["d" * 60] * 3) + ".example"  # 223 characters
    key = "|" * 1000  # escaped: 2,000 characters
    assert len(key) * 2 + 1 + len(recipient) <= IDEMPOTENCY_KEY_MAX_CHARS < (
        len(key) * 2 + 1 + len(recipient.lower()))
    with pytest.raises(InvalidEmailError, match="idempotency key is longer"), \
            engine.begin() as conn:
        enqueue(conn, key=key, recipients=[recipient], subject="S", body="b")
    assert count(engine) == 0


def test_the_event_cap_leaves_room_for_how_the_relay_frames_the_event(engine: sa.Engine) -> None:
    """The smallest POSTROOM_EVENT_MAX_BYTES enqueue takes an email at also holds the event as
    the relay may publish it: with the Schema Registry's prefix, as a requeued row's last
    attempt, with the largest id (enqueue's count is of the largest event a row can become)."""
    from postroom.relay.rows import ATTEMPT_MAX
    from postroom.rules import SizeLimits
    from postroom.schemas.codec import EmailRequested, encode
    from postroom.schemas.framing import confluent_prefix

    def takes(limit: int) -> bool:
        with engine.connect() as conn, conn.begin() as txn:
            try:
                enqueue(conn, key="edge", recipients=["a@example.com"], subject="S",
                        body="b" * 1000, limits=SizeLimits(event_max_bytes=limit))
            except InvalidEmailError:
                return False
            finally:
                txn.rollback()
            return True

    low, high = 900, 2000  # refused at low, taken at high
    assert not takes(low) and takes(high)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if takes(middle) else (middle, high)
    framed = confluent_prefix(2**31 - 1) + encode(EmailRequested(
        idempotency_key="edge|a@example.com", message_key="edge", outbox_id=2**63 - 1,
        recipient="a@example.com", sender="", subject="S", body="b" * 1000, attachments=(),
        priority="normal", created_at=dt.datetime.now(dt.UTC), attempt=ATTEMPT_MAX))
    assert len(framed) <= high


def test_attachments_over_the_total_limit_are_refused(engine: sa.Engine, tmp_path: Path) -> None:
    from postroom.rules import SizeLimits

    for name in ("a.csv", "b.csv"):
        (tmp_path / name).write_bytes(b"x" * 600)
    limits = SizeLimits(attachment_max_bytes=1000, attachments_total_max_bytes=1000)
    with pytest.raises(InvalidAttachmentError, match="over the limit of 1000"), \
            engine.begin() as conn:
        enqueue(conn, key="k", recipients=TEAM, subject="S", body="b",
                attachments=[tmp_path / "a.csv", tmp_path / "b.csv"], limits=limits)
    assert count(engine) == 0


def test_a_large_recipient_list_is_one_call(engine: sa.Engine) -> None:
    # Over PostgreSQL's 65,535 bind parameters if it were sent as a single statement.
    recipients = [f"user{i}@example.com" for i in range(10_000)]
    with engine.begin() as conn:
        assert enqueue(conn, key="all-staff", recipients=recipients, subject="S", body="b") == 10_000
    with engine.begin() as conn:
        assert enqueue(conn, key="all-staff", recipients=recipients, subject="S", body="b") == 0
    assert count(engine) == 10_000


def test_the_home_of_an_unknown_user_is_refused(engine: sa.Engine) -> None:
    # Path.expanduser raises RuntimeError for "~name" when no such user exists.
    with pytest.raises(InvalidAttachmentError, match="unknown user"), engine.begin() as conn:
        enqueue(conn, key="k", recipients=TEAM, subject="S", body="b",
                attachments=["~no-such-user-of-postroom/report.xlsx"])
    assert count(engine) == 0


def test_the_html_counts_in_the_event_size_at_enqueue(engine: sa.Engine) -> None:
    """Issue 23: 300 KiB of text and 500 KiB of HTML passed enqueue (the HTML was left out of
    the event's size) and the relay failed the row later."""
    with pytest.raises(InvalidEmailError, match=r"over the limit of 786432 "
                                                r"\(POSTROOM_EVENT_MAX_BYTES\)"), \
            engine.begin() as conn:
        enqueue(conn, key="k", recipients=TEAM, subject="S", body="t" * 300 * 1024,
                html="<p>" + "h" * 500 * 1024 + "</p>")
    assert count(engine) == 0
    with engine.begin() as conn:  # each alone fits
        assert enqueue(conn, key="text", recipients=TEAM, subject="S",
                       body="t" * 300 * 1024) == len(TEAM)
        assert enqueue(conn, key="html", recipients=TEAM, subject="S", body="t",
                       html="<p>" + "h" * 500 * 1024 + "</p>") == len(TEAM)


def test_inline_images_count_in_the_attachments_total_at_enqueue(
        engine: sa.Engine, tmp_path: Path) -> None:
    """Issue 23: inline images were checked one by one only; 100 of 25 MiB passed."""
    from postroom.rules import SizeLimits

    (tmp_path / "report.csv").write_bytes(b"x" * 600)
    for name in ("a.png", "b.png"):
        (tmp_path / name).write_bytes(b"x" * 300)
    limits = SizeLimits(attachment_max_bytes=1000, attachments_total_max_bytes=1000)
    html = '<img src="cid:a.png"><img src="cid:b.png">'
    with pytest.raises(InvalidAttachmentError, match="the attachments and inline images come to "
                                                     "1200 bytes or more, over the limit of 1000"), \
            engine.begin() as conn:
        enqueue(conn, key="k", recipients=TEAM, subject="S", body="b", html=html,
                attachments=[tmp_path / "report.csv"],
                inline=[tmp_path / "a.png", tmp_path / "b.png"], limits=limits)
    for name in ("c.png", "d.png"):
        (tmp_path / name).write_bytes(b"x" * 300)
    images = [tmp_path / name for name in ("a.png", "b.png", "c.png", "d.png")]
    with pytest.raises(InvalidAttachmentError, match="the attachments and inline images come to "
                                                     "1200 bytes or more"), engine.begin() as conn:
        enqueue(conn, key="k", recipients=TEAM, subject="S", body="b", html=html, inline=images,
                limits=limits)
    assert count(engine) == 0
    with engine.begin() as conn:
        assert enqueue(conn, key="k", recipients=TEAM, subject="S", body="b", html=html,
                       attachments=[tmp_path / "report.csv"], inline=[tmp_path / "a.png"],
                       limits=limits) == len(TEAM)


# -- POSTROOM_DATABASE_SCHEMA: a job's own engine, the roles' schema (issue 29) -----------------

@pytest.fixture
def job_engine(db_settings: Settings) -> Iterator[sa.Engine]:
    """An engine as a job builds one: POSTROOM_DATABASE_URL alone, no search path of ours."""
    engine = sa.create_engine(sa.make_url(db_settings.require("database_url")))
    yield engine
    engine.dispose()


def queued(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM outbox_queue")).scalar_one())


def test_a_job_engine_enqueues_into_the_schema_it_names(
        db_settings: Settings, engine: sa.Engine, job_engine: sa.Engine) -> None:
    schema = db_settings.database_schema
    with job_engine.begin() as conn:
        assert enqueue(conn, key="k", recipients=TEAM, subject="S", body="b", schema=schema) == 4
        assert enqueue(conn, key="k", recipients=TEAM, subject="S", body="b", schema=schema) == 0
    with Session(job_engine) as session, session.begin():
        assert enqueue(session, key="orm", recipients=TEAM[:1], subject="S", body="b",
                       schema=schema) == 1
    assert count(engine) == queued(engine) == 5  # in the schema's outbox, and on its queue


@pytest.fixture
def bare_job_engine(db_settings: Settings) -> Iterator[sa.Engine]:
    """A job's engine whose search path holds no outbox: an empty schema of this test's own, not
    the database's default path, where README's by-hand steps create one."""
    empty = unique_name("t_empty")
    url = sa.make_url(db_settings.require("database_url"))
    engine = sa.create_engine(url, connect_args={"options": f"-csearch_path={empty}"})
    with engine.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{empty}"'))
    yield engine
    engine.dispose()
    drop_schema(db_settings, empty)


def test_a_job_engine_without_the_schema_is_told_how_to_name_it(
        bare_job_engine: sa.Engine, engine: sa.Engine) -> None:
    with pytest.raises(SchemaNotReadyError, match=r"there is no outbox table in the connection's "
                                                  r"search path: pass enqueue\(\.\.\., schema="
                                                  r"\.\.\.\) the POSTROOM_DATABASE_SCHEMA"), \
            bare_job_engine.begin() as conn:
        enqueue(conn, key="k", recipients=TEAM, subject="S", body="b")
    absent = unique_name("t_absent")  # a name no one else has created
    with pytest.raises(SchemaNotReadyError, match=f"no outbox table in schema {absent}"), \
            bare_job_engine.begin() as conn:
        enqueue(conn, key="k", recipients=TEAM, subject="S", body="b", schema=absent)
    with pytest.raises(InvalidEmailError, match="schema must be a schema name"), \
            bare_job_engine.begin() as conn:
        enqueue(conn, key="k", recipients=TEAM, subject="S", body="b", schema=5)  # type: ignore[arg-type]
    assert count(engine) == 0


def readme_job_snippet(block: int = 0) -> str:
    """The ``block``-th Python block of README's "Using it from a job", as written."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Using it from a job"):]
    section = section[:section.index("\n## ", 1)]
    return section.split("```python\n")[block + 1].split("```", 1)[0]


def test_the_readme_job_snippet_works_with_postroom_database_schema_set(
        db_settings: Settings, engine: sa.Engine, job_engine: sa.Engine, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    report = tmp_path / "sales_2026-09.xlsx"
    report.write_bytes(b"PK")
    code = readme_job_snippet()
    assert '"/reports/sales_2026-09.xlsx"' in code
    monkeypatch.setenv("POSTROOM_DATABASE_SCHEMA", db_settings.database_schema or "")
    exec(code.replace("/reports/sales_2026-09.xlsx", str(report)),  # noqa: S102 - README's own
         {"engine": job_engine, "team": TEAM})
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT message_key, attachments FROM outbox")).all()
    assert rows == [("sales-report-2026-09", [str(report)])] * len(TEAM)
    assert queued(engine) == len(TEAM)


def test_the_readme_batch_snippet_queues_each_invoice(engine: sa.Engine,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    invoices = [types.SimpleNamespace(number=n, email=f"c{n}@example.com", text=f"Due: {n} EUR")
                for n in range(3)]
    exec(readme_job_snippet(2), {"engine": engine, "invoices": invoices})  # noqa: S102
    assert capsys.readouterr().out == "3 rows queued\n"
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT message_key, recipient, body FROM outbox "
                                    "ORDER BY id")).all()
    assert rows == [(f"invoice-{n}", f"c{n}@example.com", f"Due: {n} EUR") for n in range(3)]
    assert queued(engine) == 3


# -- many recipients: chunks of one statement each (issue 26) ------------------------------------

def test_recipients_go_in_chunks_in_their_order_duplicates_skipped(
        engine: sa.Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    import postroom.relay.outbox

    monkeypatch.setattr(postroom.relay.outbox, "INSERT_CHUNK_ROWS", 2)
    given = ["a@example.com", "b@example.com", "A@example.com", "c@example.com",
             " b@example.com ", "d@example.com", "e@example.com"]
    with engine.begin() as conn:
        assert enqueue(conn, key="k", recipients=iter(given), subject="S", body="b") == 5
        assert enqueue(conn, key="k", recipients=iter(given), subject="S", body="b") == 0
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT recipient FROM outbox ORDER BY id")).scalars().all()
        queue = conn.execute(sa.text("SELECT count(*) FROM outbox_queue")).scalar_one()
    # The first of each address kept, as given (ids follow the order given).
    assert rows == ["a@example.com", "b@example.com", "c@example.com", "d@example.com",
                    "e@example.com"]
    assert queue == 5


def test_a_bad_recipient_in_a_later_chunk_writes_nothing(
        engine: sa.Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    import postroom.relay.outbox

    monkeypatch.setattr(postroom.relay.outbox, "INSERT_CHUNK_ROWS", 2)

    def recipients() -> Iterator[str]:
        yield from (f"user{n}@example.com" for n in range(5))
        yield "not an address"

    with engine.begin() as conn:
        enqueue(conn, key="before", recipients=["x@example.com"], subject="S", body="b")
        with pytest.raises(InvalidEmailError, match="'not an address' is not of the form"):
            enqueue(conn, key="k", recipients=recipients(), subject="S", body="b")
        # The caller's transaction goes on: its own rows and later calls stay.
        enqueue(conn, key="after", recipients=["y@example.com"], subject="S", body="b")
    with engine.connect() as conn:
        keys = conn.execute(sa.text("SELECT message_key FROM outbox ORDER BY id")).scalars().all()
        queue = conn.execute(sa.text("SELECT count(*) FROM outbox_queue")).scalar_one()
    assert keys == ["before", "after"]
    assert queue == 2


# -- enqueue_many: many personalised emails, their rows together (issue 26) ---------------------

def outbox_rows(engine: sa.Engine) -> list[sa.Row[Any]]:
    with engine.connect() as conn:
        return conn.execute(sa.text(
            "SELECT idempotency_key, message_key, recipient, sender, subject, body, attachments, "
            "html, inline, priority, available_at, created_at FROM outbox ORDER BY id")).all()


def test_enqueue_many_writes_the_rows_enqueue_writes(
        engine: sa.Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import postroom.relay.outbox

    (tmp_path / "inv.pdf").write_bytes(b"%PDF")
    (tmp_path / "logo.png").write_bytes(b"PNG")
    later = dt.datetime(2030, 1, 1, 7, 0, tzinfo=dt.UTC)
    emails = [
        Email(key=f"inv-{n}", recipients=[f"c{n}@example.com", f"C{n}@example.com"],
              subject=f"Invoice {n}", body=f"Dear customer {n}",
              attachments=[tmp_path / "inv.pdf"] if n % 2 else [],
              html="<img src='cid:logo.png'>" if n % 3 == 0 else None,
              inline=[tmp_path / "logo.png"] if n % 3 == 0 else [],
              priority="high" if n == 4 else "normal", send_after=later if n == 5 else None,
              sender="billing@example.com" if n == 2 else None)
        for n in range(7)
    ]
    monkeypatch.setattr(postroom.relay.outbox, "INSERT_CHUNK_ROWS", 3)  # several statements
    with engine.begin() as conn:
        assert enqueue_many(conn, iter(emails)) == 7
        assert enqueue_many(conn, emails) == 0  # a rerun queues nothing twice
    many = outbox_rows(engine)
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM outbox"))
        for email in emails:
            enqueue(conn, **dataclasses.asdict(email))
    one_by_one = outbox_rows(engine)

    def comparable(row: sa.Row[Any]) -> tuple[Any, ...]:
        *values, available_at, _created_at = row
        return (*values, available_at if available_at == later else "now")

    assert [comparable(r) for r in many] == [comparable(r) for r in one_by_one]
    assert len(many) == 7
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM outbox_queue")).scalar_one() == 7


def test_enqueue_many_writes_nothing_when_one_email_is_bad(
        engine: sa.Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    import postroom.relay.outbox

    monkeypatch.setattr(postroom.relay.outbox, "INSERT_CHUNK_ROWS", 2)
    emails = [Email(key=f"k{n}", recipients=[f"r{n}@example.com"], subject="S", body="b")
              for n in range(5)]
    with engine.begin() as conn:
        with pytest.raises(InvalidEmailError, match="subject contains a line break"):
            enqueue_many(conn, [*emails, Email(recipients=["x@example.com"],
                                               subject="a\r\nBcc: y@example.com", body="b")])
        with pytest.raises(InvalidEmailError, match="an email must be an Email, not dict"):
            enqueue_many(conn, [{"recipients": ["x@example.com"]}])  # type: ignore[list-item]
        with pytest.raises(InvalidEmailError, match="emails must be a list of Email"):
            enqueue_many(conn, emails[0])  # type: ignore[arg-type]
        assert enqueue_many(conn, []) == 0
    assert count(engine) == 0


@pytest.mark.parametrize(("field", "value"), [
    ("subject", "Invoice \udc80"),  # composable (unknown-8bit), but no event can carry it
    ("subject", "Invoice é\udc80"),  # the standard library cannot write it (UnicodeEncodeError)
    ("body", "Dear \ud800"),
    ("html", "<p>\udfff</p>"),
    ("recipients", ["ok@example.com", "a\udc80@example.com"]),  # UnicodeEncodeError before
    ("sender", "r\ud800@example.com"),
])
def test_text_no_event_can_carry_is_refused_and_nothing_written(
        engine: sa.Engine, field: str, value: str) -> None:
    """A lone surrogate passes postroom.rules; enqueue raised SchemaError or UnicodeEncodeError
    for it instead of the EnqueueError it documents."""
    call: dict[str, Any] = {"key": "k", "recipients": TEAM, "subject": "S", "body": "b",
                            field: value}
    with pytest.raises(InvalidEmailError), engine.begin() as conn:
        enqueue(conn, **call)
    with pytest.raises(InvalidEmailError), engine.begin() as conn:
        enqueue_many(conn, [Email(**call)])
    assert count(engine) == 0
