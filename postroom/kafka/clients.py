"""Building confluent-kafka's clients (producer, consumer, reader, admin), librdkafka's errors
at creation translated to ours; a role's producer and group member watch for the fatal state
(postroom.kafka.fatal)."""

from __future__ import annotations

import logging
import time
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from postroom.kafka.config import (
    client_config,
    consumer_config,
    named_protocol,
    producer_config,
    reader_config,
)
from postroom.kafka.errors import creation_error
from postroom.kafka.fatal import WatchedConsumer, WatchedProducer
from postroom.kafka.group_protocol import group_protocol
from postroom.settings import Settings, mask_kafka_config

log = logging.getLogger(__name__)


def make_producer(settings: Settings, **overrides: Any) -> Producer:
    config = producer_config(settings, **overrides)
    log.debug("producer config %s", mask_kafka_config(config))
    try:
        return WatchedProducer(config)
    except KafkaException as exc:
        raise creation_error(exc, settings, "producer", "cannot create Kafka producer") from exc


def make_consumer(settings: Settings, group_id: str, **overrides: Any) -> Consumer:
    """A group member (:func:`consumer_config`). With no ``group.protocol`` in the settings or
    the overrides, the cluster is asked which one the group is to use (postroom.kafka.
    group_protocol), and the answer and its reason are logged."""
    if named_protocol(settings.kafka_consumer_config, overrides) is None:
        choice = group_protocol(settings, group_id, make_admin(settings))
        log.info("consumer group %s joins with the %s protocol: %s", group_id, choice.protocol,
                 choice.reason)
        overrides = {**overrides, "group.protocol": choice.protocol}
    config = consumer_config(settings, group_id, **overrides)
    log.debug("consumer config %s", mask_kafka_config(config))
    try:
        return WatchedConsumer(config)
    except KafkaException as exc:
        raise creation_error(exc, settings, "consumer", "cannot create Kafka consumer") from exc


def make_reader(settings: Settings, group_id: str, **overrides: Any) -> Consumer:
    """A consumer that only reads what it is assigned (:func:`reader_config`): ``postroom lag``
    and the redrive, with every client's error callback and librdkafka's errors translated."""
    config = reader_config(settings, group_id, **overrides)
    log.debug("reader config %s", mask_kafka_config(config))
    try:
        return Consumer(config)
    except KafkaException as exc:
        raise creation_error(exc, settings, "consumer", "cannot create Kafka consumer") from exc


def make_admin(settings: Settings) -> AdminClient:
    try:
        return AdminClient(client_config(settings))
    except KafkaException as exc:
        raise creation_error(exc, settings, "admin", "cannot create Kafka admin client") from exc


# Refusals that pass once the partition has its leader (librdkafka raises them from a watermark
# query without marking them retriable).
_LEADERSHIP_MOVING = frozenset({
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
})


def watermarks(consumer: Consumer, tp: TopicPartition, timeout_s: float) -> tuple[int, int]:
    """The (low, high) watermarks of ``tp``, asked again while the broker's refusal is
    retriable (NOT_LEADER_FOR_PARTITION while a new topic's leader takes over, or a leader moves
    after a broker restart) until ``timeout_s`` has passed; the last refusal is raised."""
    deadline = time.monotonic() + timeout_s
    pause_s = 0.05
    while True:
        try:
            low, high = consumer.get_watermark_offsets(
                tp, timeout=max(deadline - time.monotonic(), 0.1))
            return int(low), int(high)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if not (isinstance(error, KafkaError) and error.code() in _LEADERSHIP_MOVING) \
                    or time.monotonic() + pause_s >= deadline:
                raise
            log.debug("watermarks of %s[%d] refused, asking again: %s", tp.topic, tp.partition,
                      error)
            time.sleep(pause_s)
            pause_s = min(pause_s * 2, 1.0)
