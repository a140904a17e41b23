"""Producer and consumer settings apart: which config reaches which client, and what may not be
changed. Pure: the configs are dicts; no client is created."""

from __future__ import annotations

from postroom.kafka import PRODUCER_MESSAGE_TIMEOUT_MS, consumer_config, producer_config
from postroom.settings import Settings

P = "POSTROOM_"


def settings_of(**env: str) -> Settings:
    return Settings.from_env({P + "KAFKA_BOOTSTRAP_SERVERS": "k:9092",
                              **{P + name: value for name, value in env.items()}})


def test_producer_and_consumer_settings_reach_only_their_clients() -> None:
    settings = settings_of(KAFKA_CONFIG="security.protocol=SASL_SSL",
                           KAFKA_PRODUCER_CONFIG="linger.ms=50;batch.size=200000",
                           KAFKA_CONSUMER_CONFIG="session.timeout.ms=10000;"
                                                 "auto.commit.interval.ms=1000")
    producer = producer_config(settings)
    consumer = consumer_config(settings, "g")
    assert producer["security.protocol"] == consumer["security.protocol"] == "SASL_SSL"
    assert (producer["linger.ms"], producer["batch.size"]) == ("50", "200000")
    assert "session.timeout.ms" not in producer and "auto.commit.interval.ms" not in producer
    assert (consumer["session.timeout.ms"], consumer["auto.commit.interval.ms"]) == (
        "10000", "1000")
    assert "linger.ms" not in consumer and "batch.size" not in consumer


def test_the_role_settings_win_over_the_shared_ones_and_postroom_defaults() -> None:
    settings = settings_of(KAFKA_CONFIG="client.id=shared;fetch.wait.max.ms=200",
                           KAFKA_PRODUCER_CONFIG="client.id=producer;compression.type=zstd",
                           KAFKA_CONSUMER_CONFIG="client.id=consumer;fetch.wait.max.ms=100")
    assert producer_config(settings)["client.id"] == "producer"
    assert producer_config(settings)["compression.type"] == "zstd"
    assert consumer_config(settings, "g")["client.id"] == "consumer"
    assert consumer_config(settings, "g")["fetch.wait.max.ms"] == "100"


def test_what_delivery_relies_on_cannot_be_changed_by_settings() -> None:
    settings = settings_of(
        KAFKA_PRODUCER_CONFIG="acks=1;enable.idempotence=false;message.timeout.ms=999999",
        KAFKA_CONSUMER_CONFIG="enable.auto.offset.store=true;group.id=other;"
                              "auto.offset.reset=latest")
    producer = producer_config(settings)
    assert (producer["acks"], producer["enable.idempotence"], producer["message.timeout.ms"]) == (
        "all", True, PRODUCER_MESSAGE_TIMEOUT_MS)
    consumer = consumer_config(settings, "g")
    assert (consumer["enable.auto.offset.store"], consumer["group.id"],
            consumer["auto.offset.reset"]) == (False, "g", "earliest")


def test_secrets_of_the_role_settings_are_masked() -> None:
    settings = settings_of(KAFKA_PRODUCER_CONFIG="sasl.password=hunter2",
                           KAFKA_CONSUMER_CONFIG="sasl.password=hunter3")
    assert "hunter" not in repr(settings)
