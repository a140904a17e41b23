"""Every metric postroom declares, and reading a role's metrics back in a test."""

from __future__ import annotations

from postroom import metrics as _metrics
from postroom.metrics import Metrics, MetricSpec

# Every MetricSpec postroom/metrics.py declares, by name (the alerts, the dashboard and the docs
# may use only these).
DECLARED: list[MetricSpec] = [v for v in vars(_metrics).values() if isinstance(v, MetricSpec)]
CATALOGUE: dict[str, MetricSpec] = {spec.name: spec for spec in DECLARED}


def counter(metrics: Metrics, name: str | MetricSpec, /, **labels: str) -> float:
    """The value of counter ``name`` with exactly ``labels`` (0 before its first increment)."""
    return metrics.counters(name).get(tuple(sorted(labels.items())), 0.0)
