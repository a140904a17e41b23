"""The reader `postroom lag` and the redrive use: built by the adapter like every client, with its
error callback and log handling, and librdkafka's refusal at creation translated to ours."""

from __future__ import annotations

from typing import Any

import pytest

from postroom.errors import KafkaClientError
from postroom.kafka import (
    ClientLog,
    KafkaError,
    KafkaException,
    TopicPartition,
    clients,
    config,
    make_reader,
    reader_config,
)
from postroom.settings import Settings


def settings() -> Settings:
    return Settings.from_env({"POSTROOM_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1",
                              "POSTROOM_KAFKA_CONSUMER_CONFIG": "fetch.min.bytes=7"})


def test_the_reader_config_has_every_clients_callbacks_and_reads_only() -> None:
    built = reader_config(settings(), "r-1", **{"fetch.wait.max.ms": 10})
    assert built["error_cb"] is config._log_error
    assert isinstance(built["logger"], ClientLog)
    assert built["group.id"] == "r-1"
    assert (built["enable.auto.commit"], built["enable.partition.eof"]) == (False, False)
    assert built["fetch.min.bytes"] == "7"  # the settings' consumer tuning reaches it
    assert built["fetch.wait.max.ms"] == 10  # and the caller's overrides win
    assert built["bootstrap.servers"] == "127.0.0.1:1"


def test_make_reader_creates_the_consumer_from_that_config(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[dict[str, Any]] = []
    monkeypatch.setattr(clients, "Consumer", lambda conf: made.append(conf) or conf)
    make_reader(settings(), "r-2")
    assert made == [reader_config(settings(), "r-2")]
    assert made[0]["error_cb"] is config._log_error


def test_a_refusal_at_creation_is_our_error_with_its_code() -> None:
    with pytest.raises(KafkaClientError, match="cannot create Kafka consumer") as raised:
        make_reader(settings(), "r-3", **{"no.such.property": "1"})
    assert raised.value.code == "_INVALID_ARG"


class Refusing:
    """A consumer whose watermark query is refused with each of ``codes`` in turn, then answered."""

    def __init__(self, *codes: int) -> None:
        self.codes = list(codes)
        self.asked = 0

    def get_watermark_offsets(self, tp: Any, timeout: float) -> tuple[int, int]:
        self.asked += 1
        if self.codes:
            raise KafkaException(KafkaError(self.codes.pop(0)))
        return 3, 9


def test_the_watermarks_are_asked_again_while_the_leader_takes_the_partition_over() -> None:
    consumer = Refusing(KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
                        KafkaError.UNKNOWN_TOPIC_OR_PART)
    assert clients.watermarks(consumer, TopicPartition("t", 0), 30.0) == (3, 9)
    assert consumer.asked == 4


def test_a_refusal_that_does_not_pass_is_raised_at_once() -> None:
    consumer = Refusing(KafkaError.TOPIC_AUTHORIZATION_FAILED)
    with pytest.raises(KafkaException):
        clients.watermarks(consumer, TopicPartition("t", 0), 30.0)
    assert consumer.asked == 1


def test_a_leader_that_never_comes_is_raised_at_the_deadline() -> None:
    consumer = Refusing(*[KafkaError.NOT_LEADER_FOR_PARTITION] * 1000)
    with pytest.raises(KafkaException) as raised:
        clients.watermarks(consumer, TopicPartition("t", 0), 0.3)
    assert raised.value.args[0].code() == KafkaError.NOT_LEADER_FOR_PARTITION
    assert 2 <= consumer.asked < 1000
