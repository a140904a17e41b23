"""Records another client on the platform can write and confluent-kafka's Python client cannot:
a header name that is not UTF-8 (a Go or C producer sends names as bytes). librdkafka is driven
through ctypes here, as such a producer would. The sender dead-letters the record and goes on."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from confluent_kafka import Producer

from postroom.devkit.devsmtp import DevSmtpServer
from postroom.devkit.wait import wait_until
from postroom.schemas.codec import EmailRequested, encode
from postroom.schemas.framing import headers_for
from postroom.sender.routing import DLQ_CLASS_HEADER, DLQ_REASON_HEADER
from postroom.settings import Settings, TlsMode
from postroom.topics import dead_letter_topic, priority_topic
from support.foreign import produce_raw
from support.pipeline import SenderThread

pytestmark = [pytest.mark.integration]


def event(name: str) -> EmailRequested:
    return EmailRequested(
        idempotency_key=f"{name}|{name}@example.com", message_key=name, outbox_id=0,
        recipient=f"{name}@example.com", sender="", subject="S", body="b", attachments=(),
        priority="normal", created_at=dt.datetime.now(dt.UTC))


def test_a_header_name_that_is_not_utf8_is_poison_not_a_crash(
        settings: Settings, engine: sa.Engine, consume: Callable[..., Any]) -> None:
    """confluent-kafka's Message.headers() gives such a record a pair whose name is NULL and
    leaves the decode error pending: a first call raised SystemError in the sender's loop, a
    call the interpreter had specialised (after a few records) returned the list, and touching
    the name crashed the process. Now the record is poison, with the bad name first or last,
    after enough records that the call is specialised, and the email behind it goes out."""
    server = DevSmtpServer(port=0)
    server.start()
    topic = priority_topic(settings.topic_prefix, "normal")
    [(schema_name, fingerprint)] = headers_for(EmailRequested)
    producer = Producer(settings.kafka_client_config())
    warm = [f"warm{n}" for n in range(12)]
    for name in warm:
        producer.produce(topic, partition=0, key=f"{name}|{name}@example.com".encode(),
                         value=encode(event(name)), headers=headers_for(EmailRequested))
    assert producer.flush(10) == 0
    bad = b"\xff\xfe trace"
    produce_raw(settings, topic, 0, b"last|last@example.com", encode(event("last")),
                [(schema_name.encode(), fingerprint), (bad, b"1")])
    produce_raw(settings, topic, 0, b"first|first@example.com", encode(event("first")),
                [(bad, b"1"), (schema_name.encode(), fingerprint), (b"postroom.row_id", b"7")])
    producer.produce(topic, partition=0, key=b"next|next@example.com",
                     value=encode(event("next")), headers=headers_for(EmailRequested))
    assert producer.flush(10) == 0
    sender = SenderThread(dataclasses.replace(
        settings, smtp_host="127.0.0.1", smtp_port=server.port, smtp_tls=TlsMode.NONE),
        engine).start()
    try:
        wait_until(lambda: server.count() >= len(warm) + 1, 60,
                   "the emails around them to be delivered")
        dead = consume(settings, [dead_letter_topic(settings.topic_prefix)], expected=2)
    finally:
        sender.stop()  # raises when the sender crashed
        server.stop()
    assert sorted(m.rcpt for m in server.messages) == sorted(
        f"{name}@example.com" for name in [*warm, "next"])
    assert len(dead) == 2
    for letter in dead:
        headers = dict(letter.headers)
        assert headers[DLQ_CLASS_HEADER] == b"poison"
        assert b"not UTF-8" in headers[DLQ_REASON_HEADER]


def test_message_headers_is_the_plain_call_for_every_other_record(
        settings: Settings) -> None:
    """The seam reads CPython's tuples by address: for records whose names decode it gives
    exactly what Message.headers() gives."""
    from confluent_kafka import Consumer

    from postroom.devkit.scratch import unique_name
    from postroom.kafka import message_headers

    topic = priority_topic(settings.topic_prefix, "low")
    producer = Producer(settings.kafka_client_config())
    sent = [[], [("a", b"1")], [("a", b"1"), ("a", None), ("ü", b"\xff" * 300), ("", b"")]]
    for headers in sent:
        producer.produce(topic, partition=0, value=b"v", headers=headers or None)
    assert producer.flush(10) == 0
    consumer = Consumer({**settings.kafka_client_config(), "group.id": unique_name("t"),
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    seen = []
    try:
        wait_until(lambda: _read_into(consumer, seen) >= len(sent), 30, "the records")
    finally:
        consumer.close()
    for msg in seen:
        assert message_headers(msg) == list(msg.headers() or [])
    assert [message_headers(msg) for msg in seen] == sent


def _read_into(consumer: Any, seen: list[Any]) -> int:
    msg = consumer.poll(0.2)
    if msg is not None and msg.error() is None:
        seen.append(msg)
    return len(seen)
