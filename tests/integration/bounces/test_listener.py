"""`postroom bounces` over real SMTP, PostgreSQL and Kafka: a DSN becomes a result on the results
topic; a Kafka that does not acknowledge is a 451 (the MTA keeps the report); a report over the
size limit is refused 552 and counted; an auto-reply is taken and ignored."""

from __future__ import annotations

import dataclasses
import datetime as dt
import smtplib
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from postroom import enqueue
from postroom.bounces.adapters import DatabaseRows, KafkaResults
from postroom.bounces.intake import UnavailableError
from postroom.bounces.limits import report_max_bytes
from postroom.bounces.service import BounceIntake
from postroom.devkit.ports import free_port
from postroom.devkit.wait import wait_until
from postroom.errors import PostroomError
from postroom.metrics import Metrics
from postroom.relay import suppression
from postroom.relay.recorder import Recorder
from postroom.schemas.codec import DeliveryStatus, EmailResult
from postroom.schemas.decoding import decode
from postroom.schemas.framing import SCHEMALESS
from postroom.settings import Settings
from postroom.topics import results_topic
from postroom.verp import make_token, return_path
from support.bounce_reports import feedback_report, original_with_attachment
from support.metrics import counter
from support.postfix import IntakeThread

pytestmark = pytest.mark.integration

BOUNCE = "bounces@bounce.example.com"
SECRET = b"integration-bounce-secret-0123456789"
FIXTURES = Path(__file__).parents[2] / "fixtures" / "bounces"


@pytest.fixture
def bounce_settings(settings: Settings) -> Settings:
    return dataclasses.replace(settings, bounce_address=BOUNCE, bounce_secrets=(SECRET,),
                               bounce_listen=("127.0.0.1", free_port()))


@pytest.fixture
def row_token(engine: sa.Engine) -> tuple[int, str]:
    with engine.begin() as conn:
        enqueue(conn, key="k", recipients=["gone@example.com"], subject="S", body="b")
        outbox_id = conn.execute(sa.text("SELECT id FROM outbox")).scalar_one()
    return outbox_id, make_token(outbox_id, SECRET, dt.datetime.now(dt.UTC))


def dsn(token: str, name: str = "postfix_failed.eml") -> bytes:
    return (FIXTURES / name).read_bytes().replace(b"1-a-aaaa", token.encode()).replace(
        b"TOKEN", token.encode())


def send(port: int, token: str, raw: bytes) -> None:
    with smtplib.SMTP("127.0.0.1", port, timeout=30) as client:
        client.sendmail("", [return_path(BOUNCE, token)], raw)


def test_a_dsn_becomes_a_bounced_result_on_the_results_topic(
        bounce_settings: Settings, engine: sa.Engine, row_token: tuple[int, str],
        consume: Callable[..., list]) -> None:
    outbox_id, token = row_token
    with IntakeThread(bounce_settings, engine) as intake:
        send(bounce_settings.bounce_listen[1], token, dsn(token))
    [record] = consume(bounce_settings, [results_topic(bounce_settings.topic_prefix)], 1)
    result = decode(EmailResult, record.value, record.headers)
    assert (result.outbox_id, result.status, result.enhanced_code, result.smtp_code,
            result.recipient, result.attempt) == (
        outbox_id, DeliveryStatus.BOUNCED, "5.1.1", 550, "gone@example.com", 1)
    assert counter(intake.metrics, "bounce_reports_total", status="bounced") == 1


@pytest.fixture
def unreachable_kafka_intake(bounce_settings: Settings,
                             engine: sa.Engine) -> Iterator[tuple[IntakeThread, Metrics]]:
    down = dataclasses.replace(bounce_settings, kafka_bootstrap_servers="127.0.0.1:1")
    thread = IntakeThread(bounce_settings, engine, rows=DatabaseRows(engine),
                          results=KafkaResults(down, SCHEMALESS, timeout_s=1.0))
    with thread:
        yield thread, thread.metrics


def test_a_kafka_that_does_not_acknowledge_holds_the_report(
        unreachable_kafka_intake: tuple[IntakeThread, Metrics], bounce_settings: Settings,
        row_token: tuple[int, str]) -> None:
    _thread, metrics = unreachable_kafka_intake
    _outbox_id, token = row_token
    with pytest.raises(smtplib.SMTPDataError) as held:
        send(bounce_settings.bounce_listen[1], token, dsn(token))
    assert held.value.smtp_code == 451
    assert counter(metrics, "bounce_held_total") == 1


def test_too_large_and_auto_replies_are_counted(bounce_settings: Settings, engine: sa.Engine,
                                                row_token: tuple[int, str]) -> None:
    _outbox_id, token = row_token
    # Small caps on an email, so the largest report taken is small too.
    small = dataclasses.replace(bounce_settings, body_max_bytes=10_000,
                                attachment_max_bytes=10_000, attachments_total_max_bytes=10_000)
    limit = report_max_bytes(small.size_limits())
    huge = dsn(token) + b"x" * 998 + b"\r\n" * 1 + (b"y" * 998 + b"\r\n") * (limit // 1000 + 1)
    with IntakeThread(small, engine) as intake:
        port = small.bounce_listen[1]
        with pytest.raises(smtplib.SMTPException) as refused:
            send(port, token, huge)
        assert "552" in str(refused.value)
        assert intake.refused("too_large") >= 1
        send(port, token, dsn(token, "vacation.eml"))  # taken (250), nothing recorded
        assert intake.refused("auto_reply") == 1
        assert counter(intake.metrics, "bounce_reports_total", status="bounced") == 0


def test_a_complaint_about_an_email_with_a_3_3_mb_attachment_is_recorded_and_suppresses(
        bounce_settings: Settings, engine: sa.Engine, row_token: tuple[int, str]) -> None:
    """RFC 5965 reports enclose the whole email: one of 4.5 MB (a 3.3 MB attachment in base64)
    sent to the bare address is taken (552 before: over 4 MiB), its token read from the
    enclosed email's headers, and the recorder suppresses the address."""
    outbox_id, token = row_token
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE outbox SET status = 'sent', attempts = 1 WHERE id = :id"),
                     {"id": outbox_id})
    raw = feedback_report(original_with_attachment(
        3_300_000, return_path=return_path(BOUNCE, token), recipient="gone@example.com"))
    assert len(raw) > 4 * 1024 * 1024
    with IntakeThread(bounce_settings, engine) as intake, smtplib.SMTP(
            "127.0.0.1", bounce_settings.bounce_listen[1], timeout=30) as client:
        client.sendmail("", [BOUNCE], raw)
        assert counter(intake.metrics, "bounce_reports_total", status="complained") == 1
    recorder = Recorder(dataclasses.replace(bounce_settings, recorder_group=f"rec-{outbox_id}"),
                        engine)
    thread = threading.Thread(target=recorder.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: recorder.stats.applied >= 1, 60, "the complaint recorded")
    finally:
        recorder.stop()
        thread.join(30)
    with engine.connect() as conn:
        assert [e.address for e in suppression.entries(conn)] == ["gone@example.com"]


def test_a_producer_setting_librdkafka_refuses_stops_the_role_at_start_in_one_line(
        bounce_settings: Settings, engine: sa.Engine) -> None:
    """Before, the producer was built at the first report: the role listened and answered
    every report 451 for ever."""
    refused = dataclasses.replace(bounce_settings,
                                  kafka_producer_config={"no.such.property": "1"})
    thread = IntakeThread(refused, engine)
    thread.thread.start()
    thread.thread.join(30)  # it ends at once; before, it listened until stopped
    listened = thread.intake.listening.is_set() and thread.error is None
    if thread.thread.is_alive():
        thread.intake.stop()
        thread.thread.join(30)
    assert not listened, "the intake listened with a producer librdkafka refuses"
    assert isinstance(thread.error, PostroomError)
    assert "no.such.property" in str(thread.error)
    assert "\n" not in str(thread.error)


def test_a_port_in_use_stops_the_role_with_one_line(bounce_settings: Settings,
                                                    engine: sa.Engine) -> None:
    host, port = bounce_settings.bounce_listen
    with socket.socket() as taken:
        taken.bind((host, port))
        taken.listen()
        with pytest.raises(PostroomError) as stopped:
            BounceIntake(bounce_settings, engine).run()
    assert str(stopped.value).startswith(f"cannot listen on {host}:{port} (POSTROOM_BOUNCE_LISTEN)")
    assert "\n" not in str(stopped.value)


def test_a_global_dsn_over_smtputf8_is_taken(bounce_settings: Settings, engine: sa.Engine,
                                             row_token: tuple[int, str]) -> None:
    """The DSN of an email to a UTF-8 address comes with SMTPUTF8 (RFC 6531, 6533)."""
    _outbox_id, token = row_token
    raw = dsn(token).replace(b"message/delivery-status", b"message/global-delivery-status")
    with IntakeThread(bounce_settings, engine) as intake:
        with smtplib.SMTP("127.0.0.1", bounce_settings.bounce_listen[1], timeout=30) as client:
            client.ehlo("mx.example.com")
            assert client.has_extn("smtputf8")
            client.sendmail("", [return_path(BOUNCE, token)], raw, mail_options=["SMTPUTF8"])
        assert counter(intake.metrics, "bounce_reports_total", status="bounced") == 1


def test_a_database_that_does_not_answer_is_unavailable_within_the_read_timeout(
        engine: sa.Engine, row_token: tuple[int, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A database that does not answer gets the MTA a 451 (docs/architecture.md): the read of
    the token's row gives up after READ_TIMEOUT_S. Without a statement timeout a migration's
    ACCESS EXCLUSIVE lock on the outbox held it for as long as the lock (issue 24's review)."""
    monkeypatch.setattr("postroom.bounces.adapters.READ_TIMEOUT_S", 0.5, raising=False)
    outbox_id, _ = row_token
    rows = DatabaseRows(engine)
    with engine.connect() as conn:
        default = conn.execute(sa.text("SHOW statement_timeout")).scalar_one()
    outcome: list[object] = []

    def read() -> None:
        try:
            outcome.append(rows.row(outbox_id))
        except UnavailableError as exc:
            outcome.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    with engine.connect() as locker:
        locker.execute(sa.text("LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE"))
        reader.start()
        reader.join(10)
        still_waiting = reader.is_alive()
        locker.rollback()
    reader.join(10)
    assert not still_waiting, "the read waited for the lock past its timeout"
    [found] = outcome
    assert isinstance(found, UnavailableError) and "statement timeout" in str(found)
    row = rows.row(outbox_id)  # the lock gone, the same pool reads it
    assert row is not None and row.outbox_id == outbox_id
    with engine.connect() as conn:  # the timeout was the read's transaction's only
        assert conn.execute(sa.text("SHOW statement_timeout")).scalar_one() == default
