"""The sender's consumer puts back what a fetch read from partitions its priority plan paused."""

from __future__ import annotations

import asyncio
import datetime as dt
from dataclasses import dataclass, field
from typing import Any, cast

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

from postroom.kafka import Record
from postroom.metrics import Metrics
from postroom.sender.consumer import SenderConsumer
from postroom.settings import Settings
from postroom.topics import Priority, priority_topic


@dataclass
class _Message:
    _topic: str
    _partition: int
    _offset: int
    _error: Any = None

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def error(self) -> Any:
        return self._error


@dataclass
class _Consumer:
    seeks: list[tuple[str, int, int]] = field(default_factory=list)

    def seek(self, tp: TopicPartition) -> None:
        self.seeks.append((tp.topic, tp.partition, tp.offset))


def test_records_of_paused_partitions_are_put_back_from_their_first() -> None:
    consumer = SenderConsumer(Settings.from_env({}), Metrics())
    fake = _Consumer()
    consumer._consumer = cast(Consumer, fake)
    consumer._priority_paused = {("email.low", 0), ("email.normal", 1)}
    messages = [_Message("email.low", 0, 7), _Message("email.high", 0, 3),
                _Message("email.low", 0, 8), _Message("email.normal", 1, 40),
                _Message("email.normal", 0, 2), _Message("email.low", 0, 9, _error="eof")]
    kept = consumer.put_back_paused(cast(list[Message], messages))
    assert [(m.topic(), m.partition(), m.offset()) for m in kept] == [
        ("email.high", 0, 3), ("email.normal", 0, 2), ("email.low", 0, 9)]  # errors go on
    assert sorted(fake.seeks) == [("email.low", 0, 7), ("email.normal", 1, 40)]


SETTINGS = Settings.from_env({})
HIGH = priority_topic(SETTINGS.topic_prefix, Priority.HIGH)
NORMAL = priority_topic(SETTINGS.topic_prefix, Priority.NORMAL)


@dataclass
class _Broker:
    """position and cached high watermark per partition; records what was paused."""

    positions: dict[tuple[str, int], int]
    highs: dict[tuple[str, int], int]
    paused: list[tuple[str, int]] = field(default_factory=list)
    resumed: list[tuple[str, int]] = field(default_factory=list)

    def position(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(t.topic, t.partition, self.positions[(t.topic, t.partition)])
                for t in tps]

    def get_watermark_offsets(self, tp: TopicPartition, **_: Any) -> tuple[int, int]:
        return 0, self.highs[(tp.topic, tp.partition)]

    def pause(self, tps: list[TopicPartition]) -> None:
        self.paused += [(t.topic, t.partition) for t in tps]

    def resume(self, tps: list[TopicPartition]) -> None:
        self.resumed += [(t.topic, t.partition) for t in tps]

    def seek(self, tp: TopicPartition) -> None:
        pass


def test_records_fetched_and_not_handed_out_count_in_their_priority_backlog() -> None:
    """The fetch that brought the assignment read the whole high backlog: our position is at
    its high watermark, yet those records are still to be sent, so normal waits for them."""
    async def plan(fetched: list[_Message]) -> list[tuple[str, int]]:
        consumer = SenderConsumer(SETTINGS, Metrics())
        broker = _Broker(positions={(HIGH, 0): 10, (NORMAL, 0): 5},
                         highs={(HIGH, 0): 10, (NORMAL, 0): 20})
        consumer._consumer = cast(Consumer, broker)
        consumer._assigned = {(HIGH, 0), (NORMAL, 0)}
        await consumer.apply_priority(cast(list[Message], fetched))
        return broker.paused

    high_batch = [_Message(HIGH, 0, n) for n in range(10)]
    assert asyncio.run(plan(high_batch)) == [(NORMAL, 0)]
    assert asyncio.run(plan([])) == []  # nothing of high left to send: normal goes on


NOW = dt.datetime(2026, 12, 2, 19, 0, tzinfo=dt.UTC)


def test_a_partition_held_at_a_record_and_paused_by_priority_resumes_only_when_both_allow() -> None:
    """A partition held at a record waiting for the schema registry is not resumed by its
    priority's turn before it is due; one its priority paused is not resumed by coming due."""
    async def run() -> _Broker:
        consumer = SenderConsumer(SETTINGS, Metrics())
        broker = _Broker(positions={(HIGH, 0): 5, (NORMAL, 0): 5},
                         highs={(HIGH, 0): 5, (NORMAL, 0): 20})
        consumer._consumer = cast(Consumer, broker)
        consumer._assigned = {(HIGH, 0), (NORMAL, 0)}
        consumer._priority_paused = {(NORMAL, 0)}  # paused by priority earlier
        consumer.hold_until_due(Record(NORMAL, 0, 5, None, None, []),
                                NOW + dt.timedelta(seconds=10))
        consumer.hold_until_due(Record(HIGH, 0, 5, None, None, []), NOW + dt.timedelta(seconds=10))
        await consumer.apply_priority()  # nothing of high to send: normal's turn
        assert broker.resumed == []  # normal is held at its record
        consumer.resume_due(NOW + dt.timedelta(seconds=10))
        return broker

    broker = asyncio.run(run())
    assert sorted(broker.resumed) == [(HIGH, 0), (NORMAL, 0)]


def test_a_held_partition_its_priority_paused_meanwhile_stays_paused_when_due() -> None:
    consumer = SenderConsumer(SETTINGS, Metrics())
    broker = _Broker(positions={}, highs={})
    consumer._consumer = cast(Consumer, broker)
    consumer.hold_until_due(Record(NORMAL, 0, 5, None, None, []), NOW)
    consumer._priority_paused = {(NORMAL, 0)}  # its priority's turn ended while it waited
    consumer.resume_due(NOW)
    assert broker.resumed == []
    assert consumer._waiting == {}


@dataclass
class _Listing:
    names: list[str]

    def list_topics(self, timeout: float) -> Any:
        if not self.names:
            raise KafkaException("broker down")
        return type("Metadata", (), {"topics": {name: None for name in self.names}})()


def test_retry_tiers_beyond_the_delays_that_the_broker_still_has_are_read() -> None:
    settings = Settings.from_env({"POSTROOM_TOPIC_PREFIX": "p.", "POSTROOM_RETRY_DELAYS": "1m,5m"})
    consumer = SenderConsumer(settings, Metrics())
    consumer._consumer = cast(Consumer, _Listing([
        "p.email.retry.1", "p.email.retry.2", "p.email.retry.5", "p.email.retry.3",
        "p.email.retry.03", "q.email.retry.4", "p.email.normal", "p.email.retry.x"]))
    assert consumer.removed_tiers() == ["p.email.retry.3", "p.email.retry.5"]
    consumer._consumer = cast(Consumer, _Listing([]))
    assert consumer.removed_tiers() == []  # logged; today's tiers only
