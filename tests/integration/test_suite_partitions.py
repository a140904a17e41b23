"""A test's topics have one partition each unless it asks for more with
@pytest.mark.partitions(n) (tests/conftest.py), and the settings and the environment its
`postroom` processes start in say the same count."""

from __future__ import annotations

import os

import pytest
from conftest import SUITE_PARTITIONS

from postroom.kafka import make_admin
from postroom.settings import Settings
from postroom.topics import all_topics

pytestmark = pytest.mark.integration


def partition_counts(settings: Settings) -> set[int]:
    metadata = make_admin(settings).list_topics(timeout=10)
    names = all_topics(settings.topic_prefix, len(settings.retry_delays_s))
    return {len(metadata.topics[name].partitions) for name in names}


def test_a_tests_topics_have_the_suites_partitions(settings: Settings) -> None:
    assert SUITE_PARTITIONS == 1
    assert partition_counts(settings) == {SUITE_PARTITIONS}
    assert settings.topic_partitions == SUITE_PARTITIONS
    assert Settings.from_env().topic_partitions == SUITE_PARTITIONS
    assert os.environ["POSTROOM_TOPIC_PARTITIONS"] == str(SUITE_PARTITIONS)


@pytest.mark.partitions(3)
def test_a_test_that_asks_for_partitions_gets_them(settings: Settings) -> None:
    assert partition_counts(settings) == {3}
    assert settings.topic_partitions == 3
    assert os.environ["POSTROOM_TOPIC_PARTITIONS"] == "3"
