"""The seed's story with bounces, through relay, sender and recorder on the local stack and the
dev SMTP server offering DSN: each email goes out under its signed return path with the DSN
request, a bounce result for old.manager@ (as `postroom bounces` publishes it) ends that row
bounced, and the next run's email to it ends suppressed with no attempt at the server."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from confluent_kafka import Producer

from postroom import enqueue
from postroom.devkit.devsmtp import DevSmtpServer
from postroom.devkit.wait import wait_until
from postroom.schemas.codec import DeliveryStatus, EmailResult, encode
from postroom.schemas.framing import headers_for
from postroom.settings import Settings
from postroom.topics import results_topic
from postroom.verp import read_token
from support.pipeline import Pipeline, fast_pipeline, outbox_rows

pytestmark = pytest.mark.integration

SECRET = b"0123456789abcdef-story-secret"
BOUNCES = "bounces@bounce.example.com"
RECIPIENTS = ["finance@example.com", "old.manager@example.com"]


@pytest.fixture
def server() -> Iterator[DevSmtpServer]:
    with DevSmtpServer(port=0, dsn=True) as dev:
        yield dev


@pytest.fixture
def pipeline(settings: Settings, engine: sa.Engine, server: DevSmtpServer) -> Iterator[Pipeline]:
    bouncing = dataclasses.replace(settings, bounce_address=BOUNCES, bounce_secrets=(SECRET,))
    running = fast_pipeline(bouncing, engine, server.port, "story")
    try:
        yield running
    finally:
        running.stop()


def states(engine: sa.Engine, key: str) -> dict[str, str]:
    return {row.recipient: row.status for row in outbox_rows(engine, key)}


def test_a_bounce_ends_the_row_bounced_and_the_next_run_is_suppressed(
        pipeline: Pipeline, engine: sa.Engine, server: DevSmtpServer) -> None:
    settings = pipeline.settings
    with engine.begin() as conn:
        enqueue(conn, key="sales-2026-09", recipients=RECIPIENTS, subject="September",
                body="Revenue 1,200", sender="reports@example.com")
    wait_until(lambda: set(states(engine, "sales-2026-09").values()) == {"sent"}, 60,
               "September to be sent")

    with engine.connect() as conn:
        ids = {row.recipient: row.id
               for row in conn.execute(sa.text("SELECT recipient, id FROM outbox"))}
    received = {m.rcpt: m for m in server.messages}
    assert set(received) == set(RECIPIENTS)
    now = dt.datetime.now(dt.UTC)
    for recipient, message in received.items():
        assert read_token(message.mail_from, BOUNCES, [SECRET], now,
                          dt.timedelta(days=1)) == ids[recipient]
        assert "RET=HDRS" in message.mail_options
        assert message.rcpt_options == ("NOTIFY=FAILURE,DELAY", f"ORCPT=RFC822;{recipient.upper()}")
        assert b"From: reports@example.com" in message.raw

    # what postroom bounces publishes for the relay's DSN
    [row] = [r for r in outbox_rows(engine, "sales-2026-09") if r.recipient == RECIPIENTS[1]]
    bounce = EmailResult(
        idempotency_key=f"sales-2026-09|{RECIPIENTS[1]}", outbox_id=ids[RECIPIENTS[1]],
        recipient=RECIPIENTS[1], status=DeliveryStatus.BOUNCED, attempt=row.attempts,
        occurred_at=now, smtp_code=550, enhanced_code="5.1.1",
        error="smtp; 550 5.1.1 <old.manager@example.com>: Recipient address rejected")
    producer = Producer(settings.kafka_client_config())
    producer.produce(results_topic(settings.topic_prefix), encode(bounce),
                     bounce.idempotency_key.encode(), headers=headers_for(bounce))
    assert producer.flush(10) == 0
    wait_until(lambda: states(engine, "sales-2026-09")[RECIPIENTS[1]] == "bounced", 30,
               "old.manager's row to be bounced")

    server.reset()
    with engine.begin() as conn:
        enqueue(conn, key="sales-2026-10", recipients=RECIPIENTS, subject="October",
                body="Revenue 1,300", sender="reports@example.com")
    wait_until(lambda: states(engine, "sales-2026-10") == {
        RECIPIENTS[0]: "sent", RECIPIENTS[1]: "suppressed"}, 60, "October to be settled")
    assert [m.rcpt for m in server.messages] == [RECIPIENTS[0]]
    [october] = [r for r in outbox_rows(engine, "sales-2026-10") if r.recipient == RECIPIENTS[1]]
    assert october.attempts == 0
    assert october.last_error.startswith("suppressed (bounce, until ")
    assert october.last_error.endswith("): bounced 5.1.1: smtp; 550 5.1.1 "
                                       "<old.manager@example.com>: Recipient address rejected")
