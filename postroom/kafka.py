"""Thin wrappers around confluent-kafka: client configs, topic creation, errors translated to ours."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Iterator
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from postroom.errors import KafkaClientError
from postroom.settings import PRODUCER_MESSAGE_TIMEOUT_MS, Settings, mask_kafka_config
from postroom.topics import all_topics, results_topic, sender_topics

log = logging.getLogger(__name__)

Headers = list[tuple[str, str | bytes | None]]

CONSUMER_FETCH_WAIT_MS = 50


def _log_error(err: KafkaError) -> None:
    # librdkafka reports broker outages here and keeps retrying by itself; say it, don't stop.
    log.warning("kafka client error code=%s: %s", err.name(), err.str())


def translate(exc: KafkaException | KafkaError, message: str) -> KafkaClientError:
    """Our error for a librdkafka one, keeping its code."""
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else exc
    if isinstance(err, KafkaError):
        return KafkaClientError(f"{message}: {err.str()}", code=err.name(),
                                retriable=err.retriable())
    return KafkaClientError(f"{message}: {exc}")


def producer_config(settings: Settings, **overrides: Any) -> dict[str, Any]:
    """An idempotent, acks=all producer config; overrides win."""
    return {
        **settings.kafka_client_config(),
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "compression.type": "lz4",
        "message.timeout.ms": PRODUCER_MESSAGE_TIMEOUT_MS,
        "error_cb": _log_error,
        **overrides,
    }


def consumer_config(settings: Settings, group_id: str, **overrides: Any) -> dict[str, Any]:
    """A consumer that commits only what the caller stores as done, rebalancing cooperatively."""
    return {
        # A paused retry tier resumes with a fresh fetch; the broker's default wait (500 ms)
        # made retries fire late. POSTROOM_KAFKA_CONFIG may change it.
        "fetch.wait.max.ms": CONSUMER_FETCH_WAIT_MS,
        **settings.kafka_client_config(),
        "group.id": group_id,
        "enable.auto.commit": True,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "partition.assignment.strategy": "cooperative-sticky",
        "error_cb": _log_error,
        **overrides,
    }


def make_producer(settings: Settings, **overrides: Any) -> Producer:
    config = producer_config(settings, **overrides)
    log.debug("producer config %s", mask_kafka_config(config))
    try:
        return Producer(config)
    except KafkaException as exc:
        raise translate(exc, "cannot create Kafka producer") from exc


def make_consumer(settings: Settings, group_id: str, **overrides: Any) -> Consumer:
    config = consumer_config(settings, group_id, **overrides)
    log.debug("consumer config %s", mask_kafka_config(config))
    try:
        return Consumer(config)
    except KafkaException as exc:
        raise translate(exc, "cannot create Kafka consumer") from exc


def make_admin(settings: Settings) -> AdminClient:
    try:
        config: dict[str, Any] = {**settings.kafka_client_config(), "error_cb": _log_error}
        return AdminClient(config)
    except KafkaException as exc:
        raise translate(exc, "cannot create Kafka admin client") from exc


def check_reachable(settings: Settings, timeout_s: float = 10.0) -> None:
    """Raise KafkaClientError unless a broker answers a metadata request in time."""
    try:
        make_admin(settings).list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise translate(exc, f"no Kafka broker answered at {settings.kafka_bootstrap_servers}") from exc


def check_topics(settings: Settings, timeout_s: float = 10.0) -> str:
    """What ``postroom check`` says of Kafka: the broker answers and every topic exists."""
    check_reachable(settings, timeout_s)
    wanted = all_topics(settings.topic_prefix, len(settings.retry_delays_s))
    try:
        existing = set(make_admin(settings).list_topics(timeout=timeout_s).topics)
    except KafkaException as exc:
        raise translate(exc, "cannot list topics") from exc
    missing = [t for t in wanted if t not in existing]
    if missing:
        raise KafkaClientError(f"missing topics (run `postroom topics create`): "
                               f"{', '.join(missing)}")
    return f"broker answers; all {len(wanted)} topics exist"


def create_topics(
    settings: Settings,
    names: Iterable[str] | None = None,
    *,
    timeout_s: float = 30.0,
) -> dict[str, str]:
    """Create each topic that does not exist yet; return ``{topic: "created" | "exists"}``."""
    wanted = list(names) if names is not None else all_topics(
        settings.topic_prefix, len(settings.retry_delays_s))
    admin = make_admin(settings)
    try:
        existing = set(admin.list_topics(timeout=timeout_s).topics)
    except KafkaException as exc:
        raise translate(exc, "cannot list topics") from exc
    result = {name: "exists" for name in wanted if name in existing}
    missing = [
        NewTopic(name, num_partitions=settings.topic_partitions,
                 replication_factor=settings.topic_replication_factor,
                 config=dict(settings.topic_config))
        for name in wanted if name not in existing
    ]
    if missing:
        futures = admin.create_topics(missing, request_timeout=timeout_s)
        for name, future in futures.items():
            try:
                future.result()
                result[name] = "created"
            except KafkaException as exc:
                err = exc.args[0]
                # Another process may have created it between our listing and our request.
                if isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    result[name] = "exists"
                else:
                    raise translate(exc, f"cannot create topic {name}") from exc
    return {name: result[name] for name in wanted}


@dataclasses.dataclass(frozen=True)
class Record:
    """What the sender needs of one consumed Kafka message."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers

    @property
    def tp(self) -> tuple[str, int]:
        return (self.topic, self.partition)

    @classmethod
    def from_message(cls, msg: Message) -> Record:
        raw = msg.headers() or []
        headers: Headers = list(raw.items()) if isinstance(raw, dict) else list(raw)
        key = msg.key()
        value = msg.value()
        return cls(msg.topic() or "", msg.partition() or 0, msg.offset() or 0,
                   key.encode() if isinstance(key, str) else key,
                   value.encode() if isinstance(value, str) else value, headers)


@dataclasses.dataclass(frozen=True)
class PartitionLag:
    topic: str
    partition: int
    committed: int | None  # None: the group has committed nothing here yet
    high_watermark: int
    lag: int


def group_lag(settings: Settings, group_id: str, topics: Iterable[str],
              timeout_s: float = 10.0) -> list[PartitionLag]:
    """Committed offset, high watermark and lag of ``group_id`` on every partition of ``topics``."""
    from confluent_kafka import TopicPartition

    consumer = Consumer({**settings.kafka_client_config(), "group.id": group_id,
                         "enable.auto.commit": False})
    try:
        metadata = consumer.list_topics(timeout=timeout_s)
        partitions = [TopicPartition(topic, p) for topic in topics
                      if topic in metadata.topics for p in sorted(metadata.topics[topic].partitions)]
        committed = consumer.committed(partitions, timeout=timeout_s) if partitions else []
        watermarks = [consumer.get_watermark_offsets(tp, timeout=timeout_s) for tp in committed]
    except KafkaException as exc:
        raise translate(exc, f"cannot read the offsets of group {group_id}") from exc
    finally:
        consumer.close()
    rows = []
    for tp, (low, high) in zip(committed, watermarks, strict=True):
        done = tp.offset if tp.offset >= 0 else None
        rows.append(PartitionLag(tp.topic, tp.partition, done, high,
                                 high - (done if done is not None else low)))
    return rows


def postroom_group_lag(settings: Settings) -> dict[str, list[PartitionLag]]:
    """:func:`group_lag` of the sender group on what it reads and the recorder on the results."""
    prefix = settings.topic_prefix
    groups = {settings.sender_group: sender_topics(prefix, len(settings.retry_delays_s)),
              settings.recorder_group: [results_topic(prefix)]}
    return {group: group_lag(settings, group, topics) for group, topics in groups.items()}


def readable_records(messages: Iterable[Message]) -> Iterator[Record]:
    """The records among consumed messages; consumer errors are logged (partition EOF silently)."""
    for msg in messages:
        err = msg.error()
        if err is None:
            yield Record.from_message(msg)
        elif err.code() != KafkaError._PARTITION_EOF:
            log.warning("consumer error: %s", err.str())
