"""The lag metrics under kafka-lag-exporter's names, and the loop of `postroom lag --watch` that
samples and hands each report on."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from postroom.lag.reader import LagReader, read_report
from postroom.lag.report import LagReport, OutboxBacklog
from postroom.metrics import (
    CONSUMERGROUP_MEMBERS,
    CONSUMERGROUP_STATUS,
    KAFKA_CONSUMERGROUP_GROUP_LAG,
    KAFKA_CONSUMERGROUP_GROUP_LAG_SECONDS,
    KAFKA_CONSUMERGROUP_GROUP_MAX_LAG,
    KAFKA_CONSUMERGROUP_GROUP_MAX_LAG_SECONDS,
    KAFKA_CONSUMERGROUP_GROUP_SUM_LAG,
    LAG_PARTITIONS_UNAVAILABLE,
    OUTBOX_BACKLOG,
    OUTBOX_BACKLOG_AGE_SECONDS,
    RETRY_OVERDUE,
    RETRY_OVERDUE_SECONDS,
    RETRY_WAITING,
    TOPIC_PARTITIONS_BELOW_MIN_INSYNC_REPLICAS,
    TOPIC_PARTITIONS_OFFLINE,
    TOPIC_PARTITIONS_UNDER_REPLICATED,
    Metrics,
    MetricSpec,
)

log = logging.getLogger(__name__)


_RETRY_SERIES = (RETRY_WAITING, RETRY_OVERDUE, RETRY_OVERDUE_SECONDS)


def _set_known(metrics: Metrics, name: MetricSpec, value: float | None, labels: dict[str, str]) -> None:
    """The gauge at ``value``; no series when it is unknown (a record not read in time)."""
    if value is None:
        metrics.remove(name, **labels)
    else:
        metrics.set(name, value, **labels)


def export(metrics: Metrics, report: LagReport, cluster: str) -> None:
    """Set the lag metrics: kafka-lag-exporter's names and labels, plus postroom's own."""
    for group in report.groups:
        for p in group.partitions:
            labels = {"cluster_name": cluster, "group": group.group, "topic": p.topic,
                      "partition": str(p.partition)}
            where = {"topic": p.topic, "partition": str(p.partition)}
            if p.unavailable is not None:
                # Unknown is no series, not the last value or 0: an alert's expression then
                # misses it rather than reading a lag that may be stale.
                for name in (KAFKA_CONSUMERGROUP_GROUP_LAG, KAFKA_CONSUMERGROUP_GROUP_LAG_SECONDS):
                    metrics.remove(name, **labels)
                if p.tier is not None:
                    for name in _RETRY_SERIES:
                        metrics.remove(name, **where)
                continue
            metrics.set(KAFKA_CONSUMERGROUP_GROUP_LAG, p.lag, **labels)
            _set_known(metrics, KAFKA_CONSUMERGROUP_GROUP_LAG_SECONDS, p.lag_seconds, labels)
            if p.tier is not None:
                metrics.set(RETRY_WAITING, p.lag, **where)
                _set_known(metrics, RETRY_OVERDUE, p.overdue, where)
                _set_known(metrics, RETRY_OVERDUE_SECONDS, p.overdue_seconds, where)
        of_group = {"cluster_name": cluster, "group": group.group}
        # A group none of whose partitions was read keeps its last totals and status: 0 and OK
        # would resolve its alerts, and so would removing the series; their `for:` timers
        # carry on while postroom_lag_partitions_unavailable says the reading is old.
        if group.known:
            metrics.set(KAFKA_CONSUMERGROUP_GROUP_SUM_LAG, group.sum_lag, **of_group)
            metrics.set(KAFKA_CONSUMERGROUP_GROUP_MAX_LAG, group.max_lag, **of_group)
            metrics.set(KAFKA_CONSUMERGROUP_GROUP_MAX_LAG_SECONDS, group.max_lag_seconds,
                        **of_group)
            metrics.set(CONSUMERGROUP_STATUS, group.verdict.value, group=group.group)
        if group.members_known:  # not described: the count is not 0, it is unknown
            metrics.set(CONSUMERGROUP_MEMBERS, len(group.members), group=group.group)
        metrics.set(LAG_PARTITIONS_UNAVAILABLE, group.unavailable, group=group.group)
    if report.replication is not None:
        for topic, health in report.replication.items():
            where = {"cluster_name": cluster, "topic": topic}
            metrics.set(TOPIC_PARTITIONS_OFFLINE, health.offline, **where)
            metrics.set(TOPIC_PARTITIONS_UNDER_REPLICATED, health.under_replicated, **where)
            metrics.set(TOPIC_PARTITIONS_BELOW_MIN_INSYNC_REPLICAS, health.below_min_isr,
                        **where)
    if report.outbox is not None:
        metrics.set(OUTBOX_BACKLOG, report.outbox.rows)
        metrics.set(OUTBOX_BACKLOG_AGE_SECONDS, report.outbox.oldest_age_s or 0.0)


def watch(reader: LagReader, outbox: Callable[[], OutboxBacklog] | None, every_s: float,
          stop: threading.Event, on_report: Callable[[LagReport], None]) -> None:
    """Sample every ``every_s`` seconds until ``stop``; a failed sample is said and retried."""
    while not stop.is_set():
        started = time.monotonic()
        try:
            on_report(read_report(reader, outbox))
        except Exception as exc:  # noqa: BLE001 - the watcher outlives a broker or database outage
            log.warning("lag sample failed (%s); trying again in %.0fs",
                        str(exc).splitlines()[0] if str(exc) else type(exc).__name__, every_s)
        stop.wait(max(0.0, every_s - (time.monotonic() - started)))
