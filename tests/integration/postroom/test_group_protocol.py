"""The group protocol chosen against a real broker: classic while the group's KIP-848 session is
Kafka's 45 s default; KIP-848 once the group's own ``consumer.session.timeout.ms`` is set to
postroom's 10 s, and the sender's group then runs on it (the broker says the group's type)."""

from __future__ import annotations

import pytest

from postroom.devkit.wait import wait_until
from postroom.kafka import make_admin
from postroom.kafka.group_protocol import ask_cluster
from postroom.metrics import Metrics
from postroom.sender.consumer import SenderConsumer
from postroom.settings import Settings

pytestmark = pytest.mark.integration


def set_group_session(settings: Settings, group: str, session_ms: int) -> None:
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    entry = ConfigEntry("consumer.session.timeout.ms", str(session_ms),
                        incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[entry])
    admin = make_admin(settings)  # kept until the futures are done: its end fails them
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)


def group_type(settings: Settings, group: str) -> str:
    admin = make_admin(settings)
    future = admin.describe_consumer_groups([group], request_timeout=30)[group]
    return str(future.result().type.name)


def test_a_group_left_at_kafka_s_session_joins_with_the_classic_protocol(
        kafka_settings: Settings) -> None:
    choice = ask_cluster(make_admin(kafka_settings), kafka_settings.sender_group)
    assert choice.protocol == "classic"
    assert "would be 45 s" in choice.reason


def test_a_group_whose_session_the_platform_set_to_10_s_runs_on_kip848(
        kafka_settings: Settings) -> None:
    group = kafka_settings.sender_group
    set_group_session(kafka_settings, group, 10_000)
    # The broker answers DescribeConfigs with the new value a moment after the change returns.
    admin = make_admin(kafka_settings)
    wait_until(lambda: ask_cluster(admin, group).protocol == "consumer", 30,
               "the group's new session to be described")
    choice = ask_cluster(admin, group)
    assert (choice.protocol, choice.reason) == (
        "consumer", "KIP-848: the group's session is 10 s (consumer.session.timeout.ms)")

    sender = SenderConsumer(kafka_settings, Metrics())
    everything = len(sender.topics) * kafka_settings.topic_partitions

    def holding() -> bool:
        sender.fetch(10)  # polls: heartbeats and assignment callbacks
        return len(sender._assigned) == everything

    sender.start()
    try:
        wait_until(holding, 60, "the sender holds every partition")
        assert group_type(kafka_settings, group) == "CONSUMER"
    finally:
        sender.close()
