"""Reading a role's metrics back in a test."""

from __future__ import annotations

from postroom.metrics import Metrics, MetricSpec


def counter(metrics: Metrics, name: str | MetricSpec, /, **labels: str) -> float:
    """The value of counter ``name`` with exactly ``labels`` (0 before its first increment)."""
    return metrics.counters(name).get(tuple(sorted(labels.items())), 0.0)
