"""Two senders in one group each get a share of every topic's partitions, so a second sender
takes half of the mail when all of it is on one priority topic."""

from __future__ import annotations

from collections import Counter

import pytest

from postroom.devkit.wait import wait_until
from postroom.metrics import Metrics
from postroom.sender.consumer import SenderConsumer
from postroom.settings import Settings
from postroom.topics import Priority, priority_topic

pytestmark = [pytest.mark.integration, pytest.mark.partitions(3)]


def test_a_sender_that_joins_gets_half_of_every_topic(kafka_settings: Settings) -> None:
    first, second = (SenderConsumer(kafka_settings, Metrics()) for _ in range(2))
    topics = first.topics
    everything = len(topics) * kafka_settings.topic_partitions

    def holding(members: list[SenderConsumer], *, each: bool) -> bool:
        for member in members:
            member.fetch(10)  # polls: heartbeats and rebalance callbacks
        return sum(len(m._assigned) for m in members) == everything and (
            not each or all(m._assigned for m in members))

    first.start()
    try:
        wait_until(lambda: holding([first], each=False), 60, "the first sender holds everything")
        second.start()
        try:
            wait_until(lambda: holding([first, second], each=True), 60,
                       "both senders assigned every partition")
            partitions = kafka_settings.topic_partitions
            fair = {partitions // 2, (partitions + 1) // 2}
            shares = [Counter(topic for topic, _ in m._assigned) for m in (first, second)]
            # The topic all of one report's mail goes to, and every other one.
            assert priority_topic(kafka_settings.topic_prefix, Priority.NORMAL) in topics
            for topic in topics:
                assert {share[topic] for share in shares} <= fair, topic
        finally:
            second.close()
    finally:
        first.close()
