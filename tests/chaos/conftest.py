"""The failover suite's marker, registered here beside the suite (pytest runs with
--strict-markers)."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "failover: the three-broker failover scenarios; only `make chaos-cluster` runs "
                   "them, on the cluster of POSTROOM_DEV_BROKERS=3")
