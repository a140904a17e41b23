"""The reader `postroom lag` and the redrive use: built by the adapter like every client, with its
error callback and log handling, and librdkafka's refusal at creation translated to ours."""

from __future__ import annotations

from typing import Any

import pytest

from postroom.errors import KafkaClientError
from postroom.kafka import ClientLog, clients, config, make_reader, reader_config
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
