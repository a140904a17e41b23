"""The sender's consumer puts back what a fetch read from partitions its priority plan paused."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from confluent_kafka import Consumer, Message, TopicPartition

from postroom.metrics import Metrics
from postroom.settings import Settings
from sender.consumer import SenderConsumer


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
