"""Unreadable records are dead-lettered with their reason while the rest is delivered; a backlog of
high-priority mail goes out before normal and low."""

from __future__ import annotations

import dataclasses
import re
import statistics
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from confluent_kafka import Producer

from postroom import enqueue
from postroom.devkit.wait import wait_until
from postroom.settings import Settings, TlsMode
from postroom.topics import dead_letter_topic, priority_topic, retry_topic
from relay.publisher import Relay
from schemas.codec import SCHEMA_HEADER, load_schema
from sender.devsmtp import DevSmtpServer
from sender.routing import DLQ_CLASS_HEADER, DLQ_OFFSET_HEADER, DLQ_REASON_HEADER, DLQ_TOPIC_HEADER
from support.pipeline import Pipeline, SenderThread, outbox_rows

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def smtp(settings: Settings, server: DevSmtpServer, **changes: Any) -> Settings:
    return dataclasses.replace(settings, smtp_host="127.0.0.1", smtp_port=server.port,
                               smtp_tls=TlsMode.NONE, smtp_connect_timeout_s=2.0,
                               smtp_timeout_s=5.0, **changes)


def test_poison_records_are_dead_lettered_and_the_rest_delivered(
        settings: Settings, engine: sa.Engine, consume: Callable[..., Any]) -> None:
    server = DevSmtpServer(port=0)
    server.start()
    prefix = settings.topic_prefix
    producer = Producer(settings.kafka_client_config())
    fingerprint = load_schema("email_requested").fingerprint.encode()
    poison = [
        (priority_topic(prefix, "normal"), b"not avro at all", [(SCHEMA_HEADER, fingerprint)]),
        (priority_topic(prefix, "high"), b"\x02\x04", [(SCHEMA_HEADER, b"0123456789abcdef")]),
        (retry_topic(prefix, 1), b"\x00", []),
    ]
    for topic, value, headers in poison:
        producer.produce(topic, key=b"poison", value=value, headers=headers)
    assert producer.flush(10) == 0
    with engine.begin() as conn:
        enqueue(conn, key="fine", recipients=["a@example.com", "b@example.com"], subject="S",
                body="b")
    pipeline = Pipeline(smtp(settings, server), engine).start()
    try:
        wait_until(lambda: all(r.status == "sent" for r in outbox_rows(engine, "fine")), 60,
                   "the readable email to be delivered")
        dead = consume(settings, [dead_letter_topic(prefix)], expected=3, timeout_s=30)
    finally:
        pipeline.stop()
        server.stop()
    assert sorted(m.rcpt for m in server.messages) == ["a@example.com", "b@example.com"]
    assert len(dead) == 3
    by_topic = {dict(r.headers)[DLQ_TOPIC_HEADER].decode(): r for r in dead}
    assert set(by_topic) == {topic for topic, _, _ in poison}
    for topic, value, _ in poison:
        record = by_topic[topic]
        headers = dict(record.headers)
        assert record.value == value  # kept as it was, for inspection and replay
        assert headers[DLQ_CLASS_HEADER] == b"poison"
        assert headers[DLQ_OFFSET_HEADER] == b"0"
    reasons = {topic: dict(r.headers)[DLQ_REASON_HEADER].decode() for topic, r in by_topic.items()}
    assert "cannot decode" in reasons[priority_topic(prefix, "normal")]
    assert "unknown writer schema" in reasons[priority_topic(prefix, "high")]
    assert "no postroom.schema header" in reasons[retry_topic(prefix, 1)]
    assert pipeline.sender is not None
    assert pipeline.sender.sender.metrics.counter("poison_total") == 3


def test_a_high_priority_backlog_goes_out_first(
        settings: Settings, engine: sa.Engine) -> None:
    server = DevSmtpServer(port=0, latency_ms=20)
    server.start()
    per_priority = 30
    with engine.begin() as conn:
        for priority in ("low", "normal", "high"):  # the least urgent is queued first
            enqueue(conn, key=priority, subject="S", body="b", priority=priority,
                    recipients=[f"{priority}{i}@example.com" for i in range(per_priority)])
    relay = Relay(settings, engine)
    while relay.publish_once():
        pass
    sender = SenderThread(smtp(settings, server, smtp_concurrency=1), engine).start()
    try:
        wait_until(lambda: server.count() >= 3 * per_priority, 60, "every email to be delivered")
    finally:
        sender.stop()
        server.stop()
    order = [re.sub(r"\d+@.*", "", m.rcpt) for m in server.messages]
    position = {p: statistics.mean(i for i, o in enumerate(order) if o == p)
                for p in ("high", "normal", "low")}
    assert position["high"] < position["normal"] < position["low"], (position, order)
    # All but what the first fetch took before any backlog was known: high leads.
    assert order[:per_priority].count("high") >= per_priority - 5, order
