"""A row the relay publishes twice is mailed once, a failed attempt read twice is made once, and a
graceful stop finishes what it started."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from postroom import enqueue
from postroom.devkit.devsmtp import DevSmtpServer
from postroom.devkit.wait import wait_until
from postroom.relay import sql
from postroom.relay.publisher import Relay
from postroom.schemas.codec import DeliveryStatus, EmailResult
from postroom.schemas.decoding import decode
from postroom.settings import Settings, TlsMode
from postroom.topics import results_topic
from support.metrics import counter
from support.pipeline import Pipeline, SenderThread, outbox_rows
from support.rounds import publish_round

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RECIPIENTS = [f"user{i}@example.com" for i in range(5)]


def smtp(settings: Settings, server: DevSmtpServer, **changes: Any) -> Settings:
    return dataclasses.replace(settings, smtp_host="127.0.0.1", smtp_port=server.port,
                               smtp_tls=TlsMode.NONE, smtp_timeout_s=5.0, **changes)


def test_a_row_published_twice_is_mailed_once(
        settings: Settings, engine: sa.Engine, consume: Callable[..., Any]) -> None:
    with engine.begin() as conn:
        enqueue(conn, key="twice", recipients=RECIPIENTS, subject="S", body="b")
    relay = Relay(settings, engine)
    assert publish_round(relay) == 5
    # As if the relay died between the broker's ack and its bookkeeping: published again.
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE outbox SET published_at = NULL, status = 'pending' "
                             "WHERE recipient = :r"), {"r": RECIPIENTS[0]})
        conn.execute(sa.text("INSERT INTO outbox_queue (id, available_at) SELECT id, available_at "
                             "FROM outbox WHERE recipient = :r"), {"r": RECIPIENTS[0]})
    assert publish_round(relay) == 1
    server = DevSmtpServer(port=0)
    server.start()
    pipeline = Pipeline(smtp(settings, server), engine).start()
    try:
        wait_until(lambda: all(r.status == "sent" for r in outbox_rows(engine, "twice")), 30,
                   "every row to be sent")
        results = consume(settings, [results_topic(settings.topic_prefix)], expected=6)
    finally:
        pipeline.stop()
        server.stop()
    assert sorted(m.rcpt for m in server.messages) == sorted(RECIPIENTS)
    assert len(results) == 6  # both copies were processed: nothing is stuck behind the second
    statuses = [decode(EmailResult, r.value, r.headers).status for r in results]
    assert set(statuses) == {DeliveryStatus.SENT}
    assert pipeline.sender is not None
    metrics = pipeline.sender.sender.metrics
    assert counter(metrics, "duplicates_suppressed_total") == 1
    window = metrics.summary("sent_mark_window_seconds")  # one per email sent, not the copy
    assert window is not None and window[0] == 5


def _queued(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM outbox_queue")).scalar_one())


def test_a_row_published_again_after_its_attempt_failed_is_not_mailed_again(
        settings: Settings, engine: sa.Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    # A relay killed between the broker's ack and its mark leaves the row queued; once its claim
    # runs out, a relay publishes it again, by then long after its first event failed. The copy
    # is the attempt that was made (a second publish of attempt 2 was mailed, and failed, again).
    with engine.begin() as conn:
        enqueue(conn, key="gone", recipients=["gone@example.com"], subject="S", body="b")
    with monkeypatch.context() as patch:
        patch.setattr(sql, "MARK_PUBLISHED", sa.text("SELECT CAST(:ids AS bigint[])"))
        assert publish_round(Relay(settings, engine)) == 1  # published, never marked
    server = DevSmtpServer(port=0, reject={"gone@example.com"})
    server.start()
    pipeline = Pipeline(smtp(settings, server), engine).start()
    try:
        wait_until(lambda: outbox_rows(engine, "gone")[0].status == "failed", 30, "the row failed")
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE outbox_queue SET claimed_until = now() - interval '1 s'"))
            conn.execute(sql.NOTIFY_RELAY)
        assert pipeline.sender is not None
        metrics = pipeline.sender.sender.metrics
        wait_until(lambda: counter(metrics, "repeated_attempts_suppressed_total") == 1, 30,
                   "the copy to be read and not sent")
        wait_until(lambda: _queued(engine) == 0, 30, "the copy's publish to be recorded")
    finally:
        pipeline.stop()
        server.stop()
    [row] = outbox_rows(engine, "gone")
    assert (row.status, row.attempts, row.smtp_code) == ("failed", 1, 550)
    assert server.rcpts == 1  # one transaction, its 550


def test_a_failed_attempt_read_twice_is_made_once(
        settings: Settings, engine: sa.Engine, consume: Callable[..., Any]) -> None:
    with engine.begin() as conn:
        enqueue(conn, key="again", recipients=["later@example.com"], subject="S", body="b")
    relay = Relay(settings, engine)
    assert publish_round(relay) == 1
    # Its record twice on the topic, as a copy read again after a crash or a moved partition.
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE outbox SET published_at = NULL, status = 'pending'"))
        conn.execute(sa.text("INSERT INTO outbox_queue (id, available_at) "
                             "SELECT id, available_at FROM outbox"))
    assert publish_round(relay) == 1
    server = DevSmtpServer(port=0, defer={"later@example.com": 1})  # 451 once, then accepted
    server.start()
    # The copy, read with the first, waits for its claim (a second) and asks again before the
    # retry is due.
    pipeline = Pipeline(smtp(settings, server, retry_delays_s=(3.0,)), engine).start()
    try:
        wait_until(lambda: outbox_rows(engine, "again")[0].status == "sent", 30, "the row sent")
        results = consume(settings, [results_topic(settings.topic_prefix)], expected=2)
    finally:
        pipeline.stop()
        server.stop()
    # Attempt 1 was made once (451, then its retry), not a second time from the copy, which
    # the server would have accepted as attempt 1.
    outcomes = sorted((r.attempt, r.status) for r in
                      (decode(EmailResult, c.value, c.headers) for c in results))
    assert outcomes == [(1, DeliveryStatus.RETRYING), (2, DeliveryStatus.SENT)]
    assert server.count("later@example.com") == 1
    assert pipeline.sender is not None
    assert counter(pipeline.sender.sender.metrics, "repeated_attempts_suppressed_total") == 1


def test_a_graceful_stop_finishes_in_flight_sends(
        settings: Settings, engine: sa.Engine, consume: Callable[..., Any],
        caplog: pytest.LogCaptureFixture) -> None:
    server = DevSmtpServer(port=0, latency_ms=1500)
    server.start()
    with engine.begin() as conn:
        enqueue(conn, key="slow", recipients=RECIPIENTS[:4], subject="S", body="b")
    relay = Relay(settings, engine)
    while publish_round(relay):
        pass
    sender = SenderThread(smtp(settings, server, smtp_concurrency=4), engine).start()
    try:
        wait_until(lambda: _sending(engine) == 4, 30, "four sends in flight")
    finally:
        with caplog.at_level(logging.WARNING, logger="postroom.sender.service"):
            sender.stop()
        server.stop()
    assert server.count() == 4
    assert not [r for r in caplog.records if "abandoned" in r.getMessage()]
    results = consume(settings, [results_topic(settings.topic_prefix)], expected=4)
    assert len(results) == 4  # each in-flight send's result was produced before the exit


def _sending(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text(
            "SELECT count(*) FROM sender_ledger WHERE state = 'sending'")).scalar_one())
