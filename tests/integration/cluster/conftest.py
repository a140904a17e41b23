"""The three-broker stack of `make services-cluster` (scripts/services.sh with
POSTROOM_DEV_BROKERS=3), whose brokers these tests stop and start: `make cluster-test` runs them,
never `make test`. Each test gets a topic prefix and groups of its own; every broker it stopped
is started again afterwards and the test waits until its partitions are back in sync.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator

import pytest

from postroom.devkit.scratch import scratch
from postroom.settings import Settings
from support.cluster import BROKERS, Brokers


@pytest.fixture(scope="session")
def cluster_settings() -> Settings:
    """Settings of the three-broker stack; fails (never skips) when it is not the one sourced."""
    settings = Settings.from_env()
    addresses = (settings.kafka_bootstrap_servers or "").split(",")
    if len(addresses) < BROKERS or os.environ.get("POSTROOM_DEV_BROKERS") != str(BROKERS):
        pytest.fail("these tests need the three-broker stack: run `make cluster-test` (it starts "
                    "it and sources .dev-cluster/env)")
    return dataclasses.replace(settings, retry_delays_s=(1.0, 2.0))


@pytest.fixture
def brokers(cluster_settings: Settings) -> Iterator[Brokers]:
    held = Brokers(cluster_settings)
    try:
        yield held
    finally:
        held.restore()


@pytest.fixture
def topics(cluster_settings: Settings, brokers: Brokers) -> Iterator[Settings]:
    """A prefix of this test's own with every topic created (replication factor 3); the
    brokers are restored before the topics are deleted."""
    with scratch(cluster_settings, "c", database=False) as settings:
        yield settings
        brokers.restore()
