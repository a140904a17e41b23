"""A histogram read off a process's /metrics page, and the bucket bound that holds a quantile:
how the benchmarks and the chaos suite turn a sender's duplicate window into a p50 and a p99.

A Prometheus histogram keeps cumulative counts per upper bound, not the observations, so a
quantile is known only to lie in a bucket: ``Buckets.quantile_bound`` gives that bucket's upper
bound, a figure the quantile does not exceed.
"""

from __future__ import annotations

import dataclasses
import math
import urllib.request
from collections.abc import Iterable

from prometheus_client.parser import text_string_to_metric_families

HOST = "127.0.0.1"
SCRAPE_TIMEOUT_S = 10.0
# The senders' duplicate window (postroom.metrics' sent_mark_window_seconds), as exported.
SENT_MARK_WINDOW = "postroom_sent_mark_window_seconds"


@dataclasses.dataclass(frozen=True)
class Buckets:
    """One histogram: cumulative counts by upper bound, ascending, the last one +Inf."""

    bounds: tuple[tuple[float, float], ...]  # (le, observations <= le)

    @property
    def count(self) -> float:
        return self.bounds[-1][1] if self.bounds else 0.0

    def quantile_bound(self, q: float) -> float | None:
        """The upper bound of the bucket that holds the ``q``-quantile (0 < q <= 1): the
        smallest bound with at least ``q`` of the observations at or below it. None when there
        are none; inf when it lies past the last finite bound."""
        if not 0 < q <= 1:
            raise ValueError(f"q must be in (0, 1], not {q}")
        if not self.count:
            return None
        # The rank of the observation that is the quantile, 1-based; the tolerance keeps a
        # product such as 0.07 * 100 = 7.000000000000001 at rank 7.
        rank = max(1, math.ceil(q * self.count - 1e-9))
        return next(le for le, below in self.bounds if below >= rank)

    def __add__(self, other: Buckets) -> Buckets:
        """Two processes' histograms of the same metric, as one."""
        return self._combine(other, 1.0)

    def __sub__(self, other: Buckets) -> Buckets:
        """What was observed after ``other``, an earlier reading of the same histogram."""
        return self._combine(other, -1.0)

    def _combine(self, other: Buckets, sign: float) -> Buckets:
        if not other.bounds:
            return self
        if not self.bounds:
            return Buckets(tuple((le, sign * n) for le, n in other.bounds))
        if [le for le, _ in self.bounds] != [le for le, _ in other.bounds]:
            raise ValueError("the histograms have different buckets")
        return Buckets(tuple((le, n + sign * m)
                             for (le, n), (_, m) in zip(self.bounds, other.bounds, strict=True)))


def parse_histogram(text: str, name: str, **labels: str) -> Buckets:
    """Histogram ``name`` (as exported, e.g. ``postroom_sent_mark_window_seconds``) from the
    Prometheus text exposition ``text``: its series whose labels include ``labels``, summed;
    no bounds when it has none."""
    counts: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != name or family.type != "histogram":
            continue
        for sample in family.samples:
            if sample.name != f"{name}_bucket":
                continue
            if any(sample.labels.get(k) != v for k, v in labels.items()):
                continue
            le = float(sample.labels["le"])
            counts[le] = counts.get(le, 0.0) + sample.value
    return Buckets(tuple(sorted(counts.items())))


def scrape(port: int, host: str = HOST) -> str:
    """The /metrics page a postroom process serves on ``port`` (POSTROOM_METRICS_PORT)."""
    with urllib.request.urlopen(f"http://{host}:{port}/metrics",
                                timeout=SCRAPE_TIMEOUT_S) as response:
        text: str = response.read().decode()
    return text


def scrape_histogram(ports: Iterable[int], name: str) -> Buckets:
    """Histogram ``name`` of the processes serving /metrics on ``ports``, summed."""
    total = Buckets(())
    for port in ports:
        total += parse_histogram(scrape(port), name)
    return total
