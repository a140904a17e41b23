"""Unreadable records are dead-lettered with their reason while the rest is delivered; a backlog of
high-priority mail goes out before normal and low."""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import random
import re
import statistics
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from confluent_kafka import Producer

from postroom import enqueue
from postroom.devkit.devsmtp import DevSmtpServer
from postroom.devkit.wait import wait_until
from postroom.relay.publisher import Relay
from postroom.schemas.codec import EmailRequested, encode, load_schema
from postroom.schemas.framing import SCHEMA_HEADER, headers_for
from postroom.sender.routing import DLQ_CLASS_HEADER, DLQ_OFFSET_HEADER, DLQ_REASON_HEADER, DLQ_TOPIC_HEADER
from postroom.settings import Settings, TlsMode
from postroom.topics import dead_letter_topic, priority_topic, retry_topic
from support.metrics import counter
from support.pipeline import Pipeline, SenderThread, outbox_rows
from support.rounds import publish_round

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
    assert counter(pipeline.sender.sender.metrics, "poison_total") == 3


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
    while publish_round(relay):
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
    # The assignment's priorities are planned before any record is handed out (the backlog
    # asked of the broker): every high email goes first, none of what a fast first fetch read.
    assert order[:per_priority] == ["high"] * per_priority, order


def forged(**changes: Any) -> EmailRequested:
    """An event as another producer on the topics could write it."""
    values: dict[str, Any] = {
        "idempotency_key": "forged|x@example.com", "message_key": "forged", "outbox_id": 999_999,
        "recipient": "x@example.com", "sender": "", "subject": "S", "body": "b",
        "attachments": (), "priority": "normal", "created_at": dt.datetime.now(dt.UTC)}
    return EmailRequested(**{**values, **changes})


def test_events_that_break_the_rules_are_poison_and_hold_nothing_back(
        settings: Settings, engine: sa.Engine, consume: Callable[..., Any]) -> None:
    """Issue 10: attempt 0, a recipient list or a name with another address, a record over the
    size cap: each is dead-lettered as poison with its reason and never sent, and the due record
    behind them on the same partition goes out. A not_before further ahead than the longest
    delay (issue 23: POSTROOM_RETRY_DELAYS shortened while it waited) is attempted at once."""
    server = DevSmtpServer(port=0)
    server.start()
    prefix = settings.topic_prefix
    now = dt.datetime.now(dt.UTC)
    tier = retry_topic(prefix, 1)
    bad = [
        (tier, forged(attempt=0), "attempt 0 is outside"),
        (tier, forged(attempt=2, recipient="a@b.com, eve@evil.example"), "local part"),
        (tier, forged(attempt=2, recipient="ceo@corp.example <eve@evil.example>"), "local part"),
        (tier, forged(attempt=2, body="x" * 80_000), "over the limit"),
    ]
    late = forged(attempt=2, not_before=now + dt.timedelta(days=365),
                  recipient="late@example.com", idempotency_key="late|late@example.com")
    good = forged(attempt=2, recipient="due@example.com", idempotency_key="due|due@example.com")
    producer = Producer(settings.kafka_client_config())
    schema = headers_for(EmailRequested)
    producer.produce(tier, key=b"same", value=encode(late), headers=schema)
    for topic, event, _ in bad:
        producer.produce(topic, key=b"same", value=encode(event), headers=schema)
    producer.produce(tier, key=b"same", value=encode(good), headers=schema)
    assert producer.flush(10) == 0
    sender = SenderThread(smtp(settings, server, event_max_bytes=4096), engine).start()
    try:
        wait_until(lambda: server.count() >= 2, 60, "the due retries to be delivered")
        dead = consume(settings, [dead_letter_topic(prefix)], expected=len(bad), timeout_s=30)
    finally:
        sender.stop()
        server.stop()
    assert sorted(m.rcpt for m in server.messages) == ["due@example.com", "late@example.com"]
    assert len(dead) == len(bad)
    for record, (_, _, reason) in zip(sorted(dead, key=lambda r: int(dict(r.headers)[
            DLQ_OFFSET_HEADER])), bad, strict=True):
        headers = dict(record.headers)
        assert headers[DLQ_CLASS_HEADER] == b"poison"
        assert reason in headers[DLQ_REASON_HEADER].decode()
    oversized = max(dead, key=lambda r: int(dict(r.headers)[DLQ_OFFSET_HEADER]))
    assert oversized.value is None  # too large to copy; it stays in its source topic


def test_a_retry_kafka_refuses_as_too_large_ends_as_a_recorded_failure(
        settings: Settings, engine: sa.Engine, consume: Callable[..., Any]) -> None:
    """Issue 10: the retry of an event the broker's first tier refuses as too large (its topic's
    max.message.bytes is below the record) used to be produced again every 2 s, forever, and its
    partition's commit point never moved. Now it ends as a failed result and a dead letter."""
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
    )

    from postroom.kafka import make_admin
    from postroom.schemas.codec import EmailResult
    from postroom.schemas.decoding import decode
    from postroom.topics import results_topic

    prefix = settings.topic_prefix
    tier = retry_topic(prefix, 1)
    admin = make_admin(settings)
    resource = ConfigResource("topic", tier, incremental_configs=[ConfigEntry(
        "max.message.bytes", "1000", incremental_operation=AlterConfigOpType.SET)])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)

    def applied() -> bool:
        # The broker serves the new limit a moment after the change returns.
        described = admin.describe_configs([ConfigResource("topic", tier)], request_timeout=10)
        return all(f.result()["max.message.bytes"].value == "1000" for f in described.values())

    wait_until(applied, 30, f"the broker to apply max.message.bytes to {tier}")
    server = DevSmtpServer(port=0, defer={"late@example.com": 5})
    server.start()
    # Incompressible: the producer compresses, and a record is measured compressed.
    body = base64.b64encode(random.randbytes(3000)).decode()
    event = forged(recipient="late@example.com", idempotency_key="big|late@example.com",
                   body=body)
    producer = Producer(settings.kafka_client_config())
    producer.produce(priority_topic(prefix, "normal"), key=b"big|late@example.com",
                     value=encode(event), headers=headers_for(EmailRequested))
    assert producer.flush(10) == 0
    sender = SenderThread(smtp(settings, server), engine).start()
    try:
        dead = consume(settings, [dead_letter_topic(prefix)], expected=1, timeout_s=60)
        results = consume(settings, [results_topic(prefix)], expected=2, timeout_s=30)
    finally:
        sender.stop()
        server.stop()
    assert len(dead) == 1
    assert dead[0].value is None
    headers = dict(dead[0].headers)
    assert headers[DLQ_CLASS_HEADER] == b"permanent"
    assert b"too large for Kafka" in headers[DLQ_REASON_HEADER]
    statuses = [decode(EmailResult, r.value, r.headers).status.value for r in results]
    assert statuses == ["retrying", "failed"]
    assert consume(settings, [tier], expected=1, timeout_s=3) == []


def committed_offset(settings: Settings, topic: str, partition: int) -> int:
    """The sender group's committed offset of one partition (-1001 when none)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**settings.kafka_client_config(), "group.id": settings.sender_group,
                         "enable.auto.commit": False})
    try:
        [found] = consumer.committed([TopicPartition(topic, partition)], timeout=10)
        return int(found.offset)
    finally:
        consumer.close()


def test_headers_int_refuses_are_poison_and_the_partition_goes_on(
        settings: Settings, engine: sa.Engine, consume: Callable[..., Any]) -> None:
    """Issue 23's crash loop: a postroom.attempt_base that str.isdigit() accepts and int()
    refuses ('²', 5,000 nines) raised ValueError in the sender's loop; it exited before storing
    the offset, and the next member of the group died the same way. Now each hostile record
    (those headers, a NUL, invalid UTF-8, a row id that is not one, a key that is not UTF-8) is
    dead-lettered, the genuine email behind them on the same partition is delivered, and the
    group's offset is committed past them."""
    server = DevSmtpServer(port=0)
    server.start()
    prefix = settings.topic_prefix
    topic = priority_topic(prefix, "normal")
    schema = headers_for(EmailRequested)
    value = encode(forged(attempt=1))
    hostile: list[tuple[bytes, list[tuple[str, str | bytes]]]] = [
        (b"forged|x@example.com", [*schema, ("postroom.attempt_base", "²")]),
        (b"forged|x@example.com", [*schema, ("postroom.attempt_base", "9" * 5000)]),
        (b"forged|x@example.com", [*schema, ("postroom.attempt_base", b"\x00")]),
        (b"forged|x@example.com", [*schema, ("postroom.attempt_base", b"\xff\xfe")]),
        (b"forged|x@example.com", [*schema, ("postroom.row_id", b"\xc2\xb2")]),
        (b"\xff\xfe\x00", [*schema, ("postroom.attempt_base", b"1" * 30)]),
    ]
    producer = Producer(settings.kafka_client_config())
    for key, headers in hostile:
        producer.produce(topic, partition=0, key=key, value=value, headers=headers)
    good = forged(recipient="next@example.com", idempotency_key="next|next@example.com")
    producer.produce(topic, partition=0, key=b"next|next@example.com", value=encode(good),
                     headers=schema)
    assert producer.flush(10) == 0
    sender = SenderThread(smtp(settings, server), engine).start()
    try:
        wait_until(lambda: server.count() >= 1, 60, "the genuine email to be delivered")
        dead = consume(settings, [dead_letter_topic(prefix)], expected=len(hostile),
                       timeout_s=30)
        wait_until(lambda: committed_offset(settings, topic, 0) == len(hostile) + 1, 30,
                   "the group's offset to be committed past the hostile records")
    finally:
        sender.stop()  # raises when the sender crashed
        server.stop()
    assert [m.rcpt for m in server.messages] == ["next@example.com"]
    assert sorted(int(dict(r.headers)[DLQ_OFFSET_HEADER]) for r in dead) == list(
        range(len(hostile)))
    assert {dict(r.headers)[DLQ_CLASS_HEADER] for r in dead} == {b"poison"}
    metrics = sender.sender.metrics
    assert counter(metrics, "poison_total") == len(hostile)
    assert counter(metrics, "poison_unkeyed_total") == 1  # the key that is not UTF-8


def test_a_refused_email_ends_failed_in_its_row(
        settings: Settings, engine: sa.Engine, consume: Callable[..., Any]) -> None:
    """Issue 23: a record refused at admission published no result, so its row stayed
    `published` for ever. The simplest trigger: enqueue() under its default body cap, a sender
    run with POSTROOM_BODY_MAX_BYTES=100000. The row now ends `failed`, its last error saying
    `poison: ...`, through a result the recorder applies; the email beside it is delivered."""
    from postroom.schemas.codec import EmailResult
    from postroom.schemas.decoding import decode
    from postroom.topics import results_topic

    server = DevSmtpServer(port=0)
    server.start()
    with engine.begin() as conn:
        enqueue(conn, key="big", recipients=["big@example.com"], subject="S",
                body="x" * 150_000)
        enqueue(conn, key="small", recipients=["small@example.com"], subject="S", body="b")
    pipeline = Pipeline(smtp(settings, server, body_max_bytes=100_000), engine).start()
    try:
        wait_until(lambda: [r.status for r in outbox_rows(engine, "big")] == ["failed"], 60,
                   "the refused email's row to end failed")
        wait_until(lambda: [r.status for r in outbox_rows(engine, "small")] == ["sent"], 60,
                   "the other email to be delivered")
        results = consume(settings, [results_topic(settings.topic_prefix)], expected=2)
    finally:
        pipeline.stop()
        server.stop()
    [row] = outbox_rows(engine, "big")
    assert row.last_error.startswith("poison: ")
    assert "over the limit of 100000" in row.last_error
    assert [m.rcpt for m in server.messages] == ["small@example.com"]
    failed = [decode(EmailResult, r.value, r.headers) for r in results
              if r.key == b"big|big@example.com"]
    assert [(f.status.value, f.attempt, f.recipient) for f in failed] == [
        ("failed", 1, "big@example.com")]


def test_retries_waiting_on_tiers_removed_from_the_delays_are_delivered_not_poison(
        settings: Settings, engine: sa.Engine, consume: Callable[..., Any]) -> None:
    """Issue 23: POSTROOM_RETRY_DELAYS shortened from four tiers to one while retries waited on
    tiers 2 to 4: the sender read only tier 1, so they waited for ever, and their attempts were
    out of its bounds. It now reads the tiers the broker still has and attempts each when due
    (a not_before set by a delay no tier has is due at once); nothing is dead-lettered."""
    server = DevSmtpServer(port=0)
    server.start()
    prefix = settings.topic_prefix
    now = dt.datetime.now(dt.UTC)
    waiting = [
        (retry_topic(prefix, 3), forged(attempt=4, not_before=now, recipient="t3@example.com",
                                        idempotency_key="t3|t3@example.com")),
        (retry_topic(prefix, 4), forged(attempt=5, not_before=now + dt.timedelta(days=2),
                                        recipient="t4@example.com",
                                        idempotency_key="t4|t4@example.com")),
    ]
    producer = Producer(settings.kafka_client_config())
    for topic, event in waiting:
        producer.produce(topic, key=event.idempotency_key.encode(), value=encode(event),
                         headers=headers_for(EmailRequested))
    assert producer.flush(10) == 0
    sender = SenderThread(smtp(settings, server, retry_delays_s=(1.0,)), engine).start()
    try:
        wait_until(lambda: server.count() >= 2, 60, "both waiting retries to be delivered")
    finally:
        sender.stop()
        server.stop()
    assert sorted(m.rcpt for m in server.messages) == ["t3@example.com", "t4@example.com"]
    assert counter(sender.sender.metrics, "poison_total") == 0
    assert consume(settings, [dead_letter_topic(prefix)], expected=1, timeout_s=3) == []


def test_an_unreadable_record_of_a_row_ends_the_row_by_its_key_and_row_id(
        settings: Settings, engine: sa.Engine) -> None:
    """A value that does not decode (a foreign writer, a corrupt copy) under the key and
    postroom.row_id the relay writes: the result that ends the row is named by them, and the
    recorder applies it."""
    import threading

    from postroom.relay.recorder import Recorder

    with engine.begin() as conn:
        enqueue(conn, key="garbled", recipients=["g@example.com"], subject="S", body="b")
        row_id, key = conn.execute(sa.text(
            "SELECT id, idempotency_key FROM outbox WHERE message_key = 'garbled'")).one()
    producer = Producer(settings.kafka_client_config())
    producer.produce(priority_topic(settings.topic_prefix, "normal"), key=key.encode(),
                     value=b"\x00\x00\x00\x00\x01 not avro",
                     headers=[(SCHEMA_HEADER, load_schema("email_requested").fingerprint.encode()),
                              ("postroom.row_id", str(row_id).encode())])
    assert producer.flush(10) == 0
    server = DevSmtpServer(port=0)
    server.start()
    recorder = Recorder(settings, engine)
    thread = threading.Thread(target=recorder.run, daemon=True)
    thread.start()
    sender = SenderThread(smtp(settings, server), engine).start()
    try:
        wait_until(lambda: [r.status for r in outbox_rows(engine, "garbled")] == ["failed"], 60,
                   "the row to end failed")
    finally:
        sender.stop()
        recorder.stop()
        thread.join(30)
        server.stop()
    [row] = outbox_rows(engine, "garbled")
    assert row.last_error.startswith("poison: cannot decode EmailRequested")
    assert row.attempts == 1
    assert server.messages == []


def test_a_record_whose_task_fails_is_dead_lettered_and_its_row_ends(
        settings: Settings, engine: sa.Engine, consume: Callable[..., Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A fault of the sender's own on one record (a bug, here a raise in the core) neither
    leaves it unread with its partition's commits stuck behind it nor stops the rest: it is
    dead-lettered as poison naming the error, its row ends failed, the others are sent."""
    from postroom.sender.attempt import Attempts

    real = Attempts._deliver

    async def broken_for_one(self: Attempts, origin: Any, admitted: Any, hand: Any) -> Any:
        if admitted.event.recipient.startswith("boom"):
            raise RuntimeError("a fault of ours")
        return await real(self, origin, admitted, hand)

    monkeypatch.setattr(Attempts, "_deliver", broken_for_one)
    server = DevSmtpServer(port=0)
    server.start()
    with engine.begin() as conn:
        enqueue(conn, key="mixed", recipients=["a@example.com", "boom@example.com",
                                               "b@example.com"], subject="S", body="b")
    pipeline = Pipeline(smtp(settings, server), engine).start()
    try:
        wait_until(lambda: all(r.status in ("sent", "failed")
                               for r in outbox_rows(engine, "mixed")), 60, "every row to end")
        [dead] = consume(settings, [dead_letter_topic(settings.topic_prefix)], expected=1,
                         timeout_s=30)
    finally:
        pipeline.stop()
        server.stop()
    rows = {r.recipient: r for r in outbox_rows(engine, "mixed")}
    assert {k: r.status for k, r in rows.items()} == {
        "a@example.com": "sent", "boom@example.com": "failed", "b@example.com": "sent"}
    assert "the sender failed on it: RuntimeError: a fault of ours" in rows[
        "boom@example.com"].last_error
    assert dict(dead.headers)[DLQ_CLASS_HEADER] == b"poison"
    assert sorted(m.rcpt for m in server.messages) == ["a@example.com", "b@example.com"]


def rewind_group(settings: Settings, topic: str, partition: int, offset: int) -> None:
    """Set the (empty) sender group's committed offset of one partition back, as a sender killed
    before its commit, or a partition moved with records in flight, leaves it."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    from postroom.kafka import make_admin

    admin = make_admin(settings)  # held: a client collected meanwhile never answers its futures
    [future] = admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(
        settings.sender_group, [TopicPartition(topic, partition, offset)])]).values()
    future.result(timeout=30)


def test_a_poison_record_read_again_is_dead_lettered_once(
        settings: Settings, engine: sa.Engine, consume: Callable[..., Any]) -> None:
    """The chaos suite counted 7 dead letters where 4 were expected: poison records read again
    after a rebalance were dead-lettered again. The second read finds its origin done in the
    ledger; the genuine email behind it finds its key sent (its result once more, no mail)."""
    server = DevSmtpServer(port=0)
    server.start()
    prefix = settings.topic_prefix
    topic = priority_topic(prefix, "normal")
    producer = Producer(settings.kafka_client_config())
    producer.produce(topic, partition=0, key=b"poison", value=b"not avro at all",
                     headers=[(SCHEMA_HEADER, load_schema("email_requested").fingerprint)])
    good = forged(recipient="next@example.com", idempotency_key="next|next@example.com")
    producer.produce(topic, partition=0, key=b"next|next@example.com", value=encode(good),
                     headers=headers_for(EmailRequested))
    assert producer.flush(10) == 0
    try:
        for run in ("first", "read again"):
            sender = SenderThread(smtp(settings, server), engine).start()
            try:
                wait_until(lambda: committed_offset(settings, topic, 0) == 2, 60,
                           f"the {run} sender to commit past both records")
            finally:
                sender.stop()
            if run == "first":
                rewind_group(settings, topic, 0, 0)
        dead = consume(settings, [dead_letter_topic(prefix)], expected=1, timeout_s=30)
    finally:
        server.stop()
    assert len(dead) == 1, [dict(r.headers).get(DLQ_OFFSET_HEADER) for r in dead]
    assert counter(sender.sender.metrics, "poison_repeated_total") == 1
    assert counter(sender.sender.metrics, "poison_total") == 0
    assert [m.rcpt for m in server.messages] == ["next@example.com"]
