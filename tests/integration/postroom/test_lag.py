"""`postroom lag`'s reading of the real broker: seconds from the first unconsumed record's own
timestamp, retry tiers as waiting with their overdue part, group members; and the sender
committing what it finished once idle, so a delivered pipeline shows no lag."""

from __future__ import annotations

import dataclasses
import datetime as dt
import time

import pytest
import sqlalchemy as sa
from confluent_kafka import Consumer, Producer, TopicPartition

from postroom import enqueue
from postroom.devkit.devsmtp import DevSmtpServer
from postroom.devkit.wait import wait_until
from postroom.lag import LagReader, postroom_groups
from postroom.lagrules import Verdict
from postroom.schemas.codec import EmailRequested, encode
from postroom.schemas.framing import headers_for
from postroom.settings import Settings, TlsMode
from postroom.topics import Priority, priority_topic, retry_topic
from support.foreign import produce_raw
from support.pipeline import Pipeline, outbox_rows

pytestmark = pytest.mark.integration

HOUR_S = 3600.0


def event(n: int, not_before: dt.datetime | None, attempt: int = 1) -> EmailRequested:
    return EmailRequested(
        idempotency_key=f"k|r{n}@example.com", message_key="k", outbox_id=n,
        recipient=f"r{n}@example.com", sender="", subject="S", body="b", attachments=(),
        priority="normal", created_at=dt.datetime.now(dt.UTC), attempt=attempt,
        not_before=not_before)


def produce(settings: Settings, topic: str, events: list[EmailRequested],
            timestamp_ms: int | None = None) -> None:
    producer = Producer(settings.kafka_client_config())
    for e in events:
        # One partition, so the records are in offset order as a tier's are.
        producer.produce(topic, key=e.idempotency_key, value=encode(e), partition=0,
                         headers=headers_for(e), **({"timestamp": timestamp_ms}
                                                    if timestamp_ms else {}))
    assert producer.flush(30) == 0


def commit(settings: Settings, group: str, topic: str, offset: int) -> None:
    committer = Consumer({**settings.kafka_client_config(), "group.id": group})
    try:
        committer.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
    finally:
        committer.close()


def test_lag_seconds_come_from_the_first_unconsumed_records_timestamp(
        kafka_settings: Settings) -> None:
    settings = dataclasses.replace(kafka_settings, sender_group=f"g-{time.time_ns()}")
    high = priority_topic(settings.topic_prefix, Priority.HIGH)
    an_hour_ago_ms = int((time.time() - HOUR_S) * 1000)
    # A burst: one record an hour old, then 50 fresh ones. Interpolating between offsets would
    # put the group anywhere; the first unconsumed record says it is an hour behind.
    produce(settings, high, [event(0, None)], timestamp_ms=an_hour_ago_ms)
    produce(settings, high, [event(n, None) for n in range(1, 51)])
    later_s = [0.0]
    reader = LagReader(settings, postroom_groups(settings, settings.sender_group),
                       clock=lambda: time.time() + later_s[0])
    try:
        started = time.time()
        [group] = reader.sample()
        row = next(p for p in group.partitions if (p.topic, p.partition) == (high, 0))
        assert (row.committed, row.end, row.lag) == (None, 51, 51)
        assert HOUR_S <= row.lag_seconds <= HOUR_S + (time.time() - started) + 5
        commit(settings, settings.sender_group, high, 1)  # the old one is done
        [group] = reader.sample()
        row = next(p for p in group.partitions if (p.topic, p.partition) == (high, 0))
        assert (row.committed, row.lag) == (1, 50)
        assert 0 <= row.lag_seconds < 120
        assert (group.state, group.members) in {("empty", ()), ("dead", ())}
        # Nobody commits any more and lag stays: STOP once longer has passed than the window
        # spans (two samples, seconds apart here; a minute later by the reader's clock).
        later_s[0] = 60.0
        [group] = reader.sample()
        assert group.verdict is Verdict.STOP
    finally:
        reader.close()


def test_a_retry_tier_is_waiting_and_counts_what_is_overdue(kafka_settings: Settings) -> None:
    settings = dataclasses.replace(kafka_settings, sender_group=f"g-{time.time_ns()}")
    tier = retry_topic(settings.topic_prefix, 2)
    now = dt.datetime.now(dt.UTC)
    overdue_since = now - dt.timedelta(seconds=100)
    events = [event(0, overdue_since), event(1, now - dt.timedelta(seconds=90)),
              event(2, now - dt.timedelta(seconds=80)),
              *(event(n, now + dt.timedelta(hours=1)) for n in range(3, 10))]
    produce(settings, tier, events)
    reader = LagReader(settings, postroom_groups(settings, settings.sender_group))
    try:
        started = time.time()
        [group] = reader.sample()
        row = next(p for p in group.partitions if (p.topic, p.partition) == (tier, 0))
        assert (row.tier, row.lag, row.overdue) == (2, 10, 3)
        assert 100 <= (row.overdue_seconds or 0) <= 100 + (time.time() - started) + 5
        assert row.lag_seconds == row.overdue_seconds
        # The three overdue ones consumed: seven wait, none is overdue, nothing is late.
        commit(settings, settings.sender_group, tier, 3)
        [group] = reader.sample()
        row = next(p for p in group.partitions if (p.topic, p.partition) == (tier, 0))
        assert (row.lag, row.overdue, row.overdue_seconds, row.lag_seconds) == (7, 0, 0.0, 0.0)
        assert row.verdict is Verdict.OK  # a waiting tier is not a stuck consumer
    finally:
        reader.close()


def test_a_delivered_pipeline_shows_no_lag_without_waiting_for_the_auto_commit(
        settings: Settings, engine: sa.Engine) -> None:
    """The demo's closing `postroom lag` showed `total lag 1` on a retry partition: the sender
    had stored the offset of the last record it delivered, and librdkafka commits stored offsets
    only every auto.commit.interval.ms. Here that interval is ten minutes, so only the sender's
    commit when it falls idle can make the lag zero."""
    server = DevSmtpServer(port=0, defer={"ops@example.com": 1})
    server.start()
    settings = dataclasses.replace(
        settings, smtp_host="127.0.0.1", smtp_port=server.port, smtp_tls=TlsMode.NONE,
        smtp_connect_timeout_s=2.0, smtp_timeout_s=5.0, retry_delays_s=(1.0, 2.0, 4.0, 8.0),
        sender_group=f"s-{time.time_ns()}",
        kafka_consumer_config={"auto.commit.interval.ms": "600000"})
    pipeline = Pipeline(settings, engine).start()
    reader = LagReader(settings, postroom_groups(settings, settings.sender_group))
    try:
        with engine.begin() as conn:
            enqueue(conn, key="k", recipients=["ops@example.com", "finance@example.com"],
                    subject="S", body="b")
        wait_until(lambda: [r.status for r in outbox_rows(engine, "k")] == ["sent", "sent"], 60,
                 "both rows sent, ops@ after one retry")

        def sender_lag() -> list[tuple[str, int, int]]:
            [group] = reader.sample()
            return [(p.topic, p.partition, p.lag) for p in group.partitions if p.lag]

        wait_until(lambda: sender_lag() == [], 20, "the sender group's lag to be 0")
        [group] = reader.sample()
        assert len(group.members) == 1
        assert group.state == "stable"
        assert sum(p.end for p in group.partitions if p.tier == 1) == 1
    finally:
        reader.close()
        pipeline.stop()
        server.stop()


def test_a_retry_tier_headed_by_a_record_whose_header_name_is_not_utf8_is_still_sampled(
        kafka_settings: Settings) -> None:
    """Any client on the platform may write such a record; confluent-kafka's headers() left a
    NULL name behind it (a SystemError, or a crash at the next touch). The lag reader takes it
    as a head with no readable not_before, as the sender takes it as poison."""
    settings = dataclasses.replace(kafka_settings, sender_group=f"g-{time.time_ns()}")
    tier = retry_topic(settings.topic_prefix, 1)
    produce_raw(settings, tier, 0, b"foreign", b"\x07not avro", [(b"\xff\xfe trace", b"1")])
    produce(settings, tier, [event(1, dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))])
    reader = LagReader(settings, postroom_groups(settings, settings.sender_group))
    try:
        for _ in range(3):  # read again: the interpreter specialises a call it repeats
            [group] = reader.sample()
            row = next(p for p in group.partitions if (p.topic, p.partition) == (tier, 0))
            assert (row.tier, row.lag) == (1, 2)
    finally:
        reader.close()
