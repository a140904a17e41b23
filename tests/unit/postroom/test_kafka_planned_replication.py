"""`postroom topics create`'s check of the replication factor against min.insync.replicas as the
admin's ACLs allow it: the broker's config needs DescribeConfigs on the cluster, which the admin
role lacks, so an existing postroom topic's effective value stands in, or the command says it
could not check. A fake admin client: no broker."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import ConfigResource, ResourceType  # type: ignore[attr-defined]

from postroom.kafka import planned_replication
from postroom.replication import replication_refusal
from postroom.settings import Settings


@dataclasses.dataclass
class Entry:
    value: str


@dataclasses.dataclass
class Metadata:
    brokers: Mapping[int, Any]
    topics: Mapping[str, Any]


class Admin:
    """describe_configs as a broker answers the admin role: no BROKER configs, topic ones."""

    def __init__(self, topic_min: Mapping[str, str], broker: Mapping[str, str] | None = None) -> None:
        self.topic_min, self.broker = topic_min, broker

    def describe_configs(self, resources: Sequence[ConfigResource], request_timeout: float,
                         ) -> dict[ConfigResource, concurrent.futures.Future[Any]]:
        answers: dict[ConfigResource, concurrent.futures.Future[Any]] = {}
        for resource in resources:
            future: concurrent.futures.Future[Any] = concurrent.futures.Future()
            if resource.restype == ResourceType.BROKER and self.broker is None:
                future.set_exception(KafkaException(KafkaError(
                    KafkaError.CLUSTER_AUTHORIZATION_FAILED, "Broker: Cluster authorization failed")))
            elif resource.restype == ResourceType.BROKER:
                future.set_result({k: Entry(v) for k, v in self.broker.items()})
            elif resource.name in self.topic_min:
                future.set_result({"min.insync.replicas": Entry(self.topic_min[resource.name])})
            else:
                future.set_exception(KafkaException(KafkaError(
                    KafkaError.TOPIC_AUTHORIZATION_FAILED, "Broker: Topic authorization failed")))
            answers[resource] = future
        return answers


SETTINGS = Settings(kafka_bootstrap_servers="k1:9092", topic_replication_factor=1)
BROKERS = {1: None, 2: None, 3: None}


def test_the_broker_config_is_taken_when_readable() -> None:
    admin = Admin({}, broker={"min.insync.replicas": "2", "default.replication.factor": "3"})
    assert planned_replication(SETTINGS, admin, Metadata(BROKERS, {}))[2] == 2  # type: ignore[arg-type]


def test_an_existing_postroom_topic_stands_in_for_the_unreadable_broker_config() -> None:
    # As postroom-admin: DescribeConfigs on postroom.email.* only. The refusal must still come.
    metadata = Metadata(BROKERS, {"postroom.email.high": None, "other.topic": None})
    admin = Admin({"postroom.email.high": "2", "other.topic": "1"})
    planned = planned_replication(SETTINGS, admin, metadata)  # type: ignore[arg-type]
    assert planned[2] == 2
    refusal = replication_refusal(*planned)
    assert refusal is not None and "below the cluster's min.insync.replicas=2" in refusal


def test_without_a_source_it_says_it_could_not_check(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        planned = planned_replication(SETTINGS, Admin({}), Metadata(BROKERS, {}))  # type: ignore[arg-type]
    assert planned[2] is None
    assert "could not check" in caplog.text
    assert "DescribeConfigs" in caplog.text
