"""librdkafka's fatal state (postroom.kafka.fatal): a client that can never work again is noted
once, raised as KafkaFatalError from the calls a role's loop makes, and makes the role unready;
on librdkafka's own mock cluster (``test.mock.num.brokers``), with the fatal error forced by its
test hook."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest

from postroom import kafka
from postroom.errors import KafkaFatalError
from postroom.health import Readiness
from postroom.kafka import KafkaError, fatal
from postroom.metrics import Metrics
from postroom.sender.producer import AcknowledgedProducer
from postroom.settings import Settings
from support.foreign import force_fatal

MOCK = {"test.mock.num.brokers": 1, "logger": logging.getLogger("test.librdkafka")}


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[fatal.FatalState]:
    """Each test its own process state: a fatal error here must not stop other tests' roles."""
    state = fatal.FatalState()
    monkeypatch.setattr(fatal, "FATAL", state)
    yield state


def settings() -> Settings:
    return Settings.from_env({"POSTROOM_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1"})


def test_a_fatal_producer_is_raised_as_ours_noted_once_and_makes_the_role_unready() -> None:
    producer = kafka.make_producer(settings(), **MOCK)
    force_fatal(producer, KafkaError.INVALID_PRODUCER_EPOCH)
    with pytest.raises(KafkaFatalError) as raised:
        producer.poll(1.0)
    assert raised.value.code == "INVALID_PRODUCER_EPOCH"
    assert "fatal state" in str(raised.value) and "\n" not in str(raised.value)
    # Every later produce is refused: the same error, not a retry.
    with pytest.raises(KafkaFatalError) as again:
        producer.produce("t", b"x")
    assert again.value is raised.value
    with pytest.raises(KafkaFatalError):
        kafka.raise_if_fatal()
    metrics = Metrics()
    readiness = Readiness([("database", lambda: "ok")], metrics,
                          live=[("kafka clients", kafka.fatal_check)])
    [*_, live] = readiness.results()
    assert (live.name, live.ok) == ("kafka clients", False)
    assert "INVALID_PRODUCER_EPOCH" in live.detail
    assert 'postroom_ready{check="kafka clients"} 0.0' in metrics.render()


def test_a_healthy_client_is_ready_and_raises_nothing() -> None:
    producer = kafka.make_producer(settings(), **MOCK)
    producer.poll(0)
    kafka.raise_if_fatal()
    readiness = Readiness([], Metrics(), live=[("kafka clients", kafka.fatal_check)])
    assert [(r.name, r.ok) for r in readiness.results()] == [("kafka clients", True)]


def test_a_fenced_group_member_raises_from_its_read() -> None:
    consumer = kafka.make_consumer(settings(), "g", **{**MOCK, "group.protocol": "classic"})
    try:
        consumer.subscribe(["t"])
        consumer.consume(1, 0.1)
        force_fatal(consumer, KafkaError.FENCED_INSTANCE_ID)
        with pytest.raises(KafkaFatalError) as raised:
            for _ in range(50):
                consumer.consume(10, 0.1)
        assert "group.instance.id" in str(raised.value)
    finally:
        del consumer  # closing a mock cluster's consumer in its fatal state may wait long


def test_the_senders_producer_stops_at_a_fatal_error_instead_of_retrying_for_ever() -> None:
    producer = AcknowledgedProducer(settings(), Metrics())
    producer._producer = kafka.make_producer(settings(), **MOCK)
    force_fatal(producer._producer, KafkaError.INVALID_PRODUCER_EPOCH)

    # Before, librdkafka's refusal was retried every 2 s for ever: the sender lived on unable to
    # publish an outcome.
    with pytest.raises(KafkaFatalError):
        asyncio.run(asyncio.wait_for(producer.produce("t", "k", b"v", []), 5))
