"""How long the topics keep a record, as `postroom purge` reads it from the real broker: a
segment goes only once its newest record is past retention.ms, so segment.ms counts too."""

from __future__ import annotations

import dataclasses

import pytest

from postroom.devkit.scratch import scratch
from postroom.kafka import TopicRetention, topic_retention
from postroom.kafka.topics import RETENTION_CHECK_MARGIN_S
from postroom.settings import Settings
from postroom.topics import all_topics

pytestmark = pytest.mark.integration

DAY_MS, HOUR_MS = 86_400_000, 3_600_000


@pytest.mark.parametrize(("config", "kept"), [
    # Kafka's defaults: seven days, segments rolled weekly.
    ({}, TopicRetention(7 * DAY_MS / 1000,
                        (7 * DAY_MS + 7 * DAY_MS) / 1000 + RETENTION_CHECK_MARGIN_S)),
    ({"retention.ms": str(DAY_MS), "segment.ms": str(HOUR_MS)},
     TopicRetention(DAY_MS / 1000, (DAY_MS + HOUR_MS) / 1000 + RETENTION_CHECK_MARGIN_S)),
    ({"retention.ms": "-1"}, None),
])
def test_a_record_is_kept_for_the_retention_and_its_segments_time(
        stack_settings: Settings, config: dict[str, str], kept: TopicRetention | None) -> None:
    base = dataclasses.replace(stack_settings, topic_config=config)
    with scratch(base, "ret", database=False) as settings:
        topics = all_topics(settings.topic_prefix, len(settings.retry_delays_s))
        assert topic_retention(settings, topics) == kept
