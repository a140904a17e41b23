"""How long the topics keep a record, as `postroom purge` reads it from the real broker: a
segment goes only once its newest record is past retention.ms, so segment.ms counts too."""

from __future__ import annotations

import dataclasses

import pytest

from postroom.devkit.scratch import scratch
from postroom.kafka import topic_retention_s
from postroom.kafka.topics import RETENTION_CHECK_MARGIN_S
from postroom.settings import Settings
from postroom.topics import all_topics

pytestmark = pytest.mark.integration

DAY_MS, HOUR_MS = 86_400_000, 3_600_000


@pytest.mark.parametrize(("config", "kept_s"), [
    # Kafka's defaults: seven days, segments rolled weekly.
    ({}, (7 * DAY_MS + 7 * DAY_MS) / 1000 + RETENTION_CHECK_MARGIN_S),
    ({"retention.ms": str(DAY_MS), "segment.ms": str(HOUR_MS)},
     (DAY_MS + HOUR_MS) / 1000 + RETENTION_CHECK_MARGIN_S),
    ({"retention.ms": "-1"}, None),
])
def test_a_record_is_kept_for_the_retention_and_its_segments_time(
        stack_settings: Settings, config: dict[str, str], kept_s: float | None) -> None:
    base = dataclasses.replace(stack_settings, topic_config=config)
    with scratch(base, "ret", database=False) as settings:
        topics = all_topics(settings.topic_prefix, len(settings.retry_delays_s))
        assert topic_retention_s(settings, topics) == kept_s
