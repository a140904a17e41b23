"""The consumer config under either group protocol: KIP-848's (group.protocol=consumer) leaves the
session timing and the assignment to the broker, and librdkafka refuses a consumer given the
classic protocol's keys with it. The configs are dicts; the consumers made of them are only
created, never connected."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, KafkaException

from postroom.kafka import (
    CONSUMER_HEARTBEAT_INTERVAL_MS,
    CONSUMER_SESSION_TIMEOUT_MS,
    consumer_config,
)
from postroom.settings import Settings

CLASSIC_ONLY = ("session.timeout.ms", "heartbeat.interval.ms", "partition.assignment.strategy")


def settings_of(consumer: str = "") -> Settings:
    env = {"POSTROOM_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9"}
    if consumer:
        env["POSTROOM_KAFKA_CONSUMER_CONFIG"] = consumer
    return Settings.from_env(env)


def created(config: dict[str, object]) -> None:
    """librdkafka accepts the config (a Consumer connects only when it is used)."""
    Consumer({**config, "log_level": 0}).close()


@pytest.mark.parametrize(("overrides", "assignor"), [
    ({}, "uniform"),                                           # relay's and recorder's groups
    ({"partition.assignment.strategy": "range"}, "range"),    # the sender's (sender/consumer.py)
])
def test_kip848_leaves_timing_and_assignment_to_the_broker(
        overrides: dict[str, str], assignor: str) -> None:
    config = consumer_config(settings_of("group.protocol=consumer"), "g", **overrides)
    assert not set(CLASSIC_ONLY) & set(config), config
    assert config["group.remote.assignor"] == assignor
    created(config)


def test_kip848_may_be_asked_for_by_the_caller_too() -> None:
    config = consumer_config(settings_of(), "g", **{"group.protocol": "consumer"})
    assert not set(CLASSIC_ONLY) & set(config), config
    created(config)


def test_an_assignor_of_the_settings_wins() -> None:
    config = consumer_config(settings_of("group.protocol=consumer;group.remote.assignor=uniform"),
                             "g", **{"partition.assignment.strategy": "range"})
    assert config["group.remote.assignor"] == "uniform"


@pytest.mark.parametrize("consumer", ["", "group.protocol=classic", "group.protocol=CLASSIC"])
def test_the_classic_protocol_keeps_postroom_timing(consumer: str) -> None:
    config = consumer_config(settings_of(consumer), "g")
    assert (config["session.timeout.ms"], config["heartbeat.interval.ms"],
            config["partition.assignment.strategy"]) == (
        CONSUMER_SESSION_TIMEOUT_MS, CONSUMER_HEARTBEAT_INTERVAL_MS, "cooperative-sticky")
    assert "group.remote.assignor" not in config
    created(config)


def test_a_classic_key_set_by_the_operator_with_kip848_is_refused_by_librdkafka() -> None:
    """Not dropped in silence: the operator asked for a timing the broker would not apply."""
    config = consumer_config(settings_of("group.protocol=consumer;session.timeout.ms=30000"), "g")
    assert config["session.timeout.ms"] == "30000"
    with pytest.raises(KafkaException, match=r"session\.timeout\.ms"):
        created(config)
