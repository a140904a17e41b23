"""Process metrics through prometheus-client (served by postroom.health).

Each metric is declared once below, with its type, HELP text and label names, and call sites pass
that object (``metrics.inc(OUTCOMES_TOTAL, status="sent")``): a misspelt metric is a NameError, not
a series exported under a wrong name.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import threading
from collections.abc import Mapping
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)

log = logging.getLogger(__name__)
# The *_created series double every counter and histogram; kafka-lag-exporter has none.
disable_created_metrics()  # type: ignore[no-untyped-call]

NAMESPACE = "postroom"

# Latency buckets in seconds: SMTP replies and ledger writes are milliseconds to a minute.
LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# The duplicate window: fractions of a millisecond to tens of milliseconds, fine enough that a
# bucket bound reads as a p50 or p99 in ms; the tail up to a ledger retry (2 s) and beyond.
WINDOW_BUCKETS_S = (0.0005, 0.001, 0.0015, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.015, 0.02,
                    0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# Retry lateness and publish delay: from a few milliseconds to minutes.
DELAY_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0)


class Kind(enum.StrEnum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


@dataclasses.dataclass(frozen=True)
class MetricSpec:
    """One exported metric; ``name`` without the namespace (``postroom_``)."""

    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = LATENCY_BUCKETS_S
    namespaced: bool = True  # False: exported under the bare name (kafka-lag-exporter's)


C, G, H = Kind.COUNTER, Kind.GAUGE, Kind.HISTOGRAM
LAG_LABELS = ("cluster_name", "group", "topic", "partition")

# Every metric postroom exports.
# relay
RELAY_PUBLISHED_TOTAL = MetricSpec(
    "relay_published_total", C, "Rows published and acknowledged by the broker.")
RELAY_TOO_LARGE_TOTAL = MetricSpec(
    "relay_too_large_total",
    C, "Rows whose event is over POSTROOM_EVENT_MAX_BYTES or refused by Kafka as too large "
       "(marked failed).")
RELAY_POISON_TOTAL = MetricSpec(
    "relay_poison_total",
    C, "Rows that can never become an event (marked failed, 'poison: <reason>').")
RELAY_UNACKNOWLEDGED_TOTAL = MetricSpec(
    "relay_unacknowledged_total",
    C, "Rows the broker did not acknowledge (their claim is released and retried).")
RELAY_PUBLISH_DELAY_SECONDS = MetricSpec(
    "relay_publish_delay_seconds",
    H, "From a row's commit (available_at) to the broker's acknowledgement.",
    buckets=DELAY_BUCKETS_S)
# sender
OUTCOMES_TOTAL = MetricSpec(
    "outcomes_total", C, "Results written, by status: sent, retrying, failed, dead.", ("status",))
ATTEMPTS_TOTAL = MetricSpec("attempts_total", C, "SMTP attempts by verdict.", ("verdict",))
SERVER_FAULTS_TOTAL = MetricSpec(
    "server_faults_total",
    C, "Failures blamed on the server or our configuration, by SMTP stage.", ("stage",))
DUPLICATES_SUPPRESSED_TOTAL = MetricSpec(
    "duplicates_suppressed_total",
    C, "Redelivered events the ledger stopped from being sent again.")
REPEATED_ATTEMPTS_SUPPRESSED_TOTAL = MetricSpec(
    "repeated_attempts_suppressed_total",
    C, "Redelivered copies of a failed attempt whose outcome was published, not made again.")
ERRORS_AFTER_ACCEPTED_TOTAL = MetricSpec(
    "errors_after_accepted_total",
    C, "Errors of the sender's own after a server accepted an email (its mark, its "
       "bookkeeping): logged, and the email still recorded as sent.")
POISON_TOTAL = MetricSpec(
    "poison_total",
    C, "Records refused at admission (poison): dead-lettered, their row ended failed.")
POISON_REPEATED_TOTAL = MetricSpec(
    "poison_repeated_total",
    C, "Poison records read again (after a rebalance or a restart before their commit) whose "
       "dead letter was published already: not dead-lettered again.")
POISON_UNKEYED_TOTAL = MetricSpec(
    "poison_unkeyed_total",
    C, "Poison records with no readable key: dead-lettered only, no result published.")
REGISTRY_UNAVAILABLE_TOTAL = MetricSpec(
    "registry_unavailable_total",
    C, "Records held back, their partition paused, because the Schema Registry could not "
       "give their writer schema (read again after a pause).")
PRODUCE_FAILURES_TOTAL = MetricSpec(
    "produce_failures_total", C, "Failed writes to Kafka (retried).", ("topic",))
BACKLOG = MetricSpec(
    "backlog", G, "Records waiting on this sender's partitions of a priority.", ("priority",))
RETRY_LATENESS_SECONDS = MetricSpec(
    "retry_lateness_seconds",
    H, "How late a retry started after its not_before.", buckets=DELAY_BUCKETS_S)
SMTP_REPLY_SECONDS = MetricSpec(
    "smtp_reply_seconds",
    H, "Time from sending an SMTP transaction to the reply that ended it, by the stage "
       "of that reply.", ("stage",))
LEDGER_MARK_SECONDS = MetricSpec(
    "ledger_mark_seconds",
    H, "Time to record a delivery in the ledger (mark sent or release).", ("operation",))
SENT_MARK_WINDOW_SECONDS = MetricSpec(
    "sent_mark_window_seconds",
    H, "The duplicate window, bounded above: from the final reply of an accepted email "
       "being read to the sender reading its sent mark's commit (a crash before the commit "
       "sends it again).",
    buckets=WINDOW_BUCKETS_S)
CLAIMS_RENEWED_TOTAL = MetricSpec(
    "claims_renewed_total",
    C, "Ledger claims renewed as their send started, having waited long for their turn or "
       "been taken on a ledger session that ended since; kept, or lost to another sender "
       "(not sent here).", ("result",))
THROTTLED_TOTAL = MetricSpec(
    "throttled_total",
    C, "Sends a server throttled, deferred without counting as an attempt.")
ATTACHMENTS_WAITING_TOTAL = MetricSpec(
    "attachments_waiting_total",
    C, "Emails with attachments or inline images put back on their retry tier, not "
       "counted as an attempt, because POSTROOM_ATTACHMENTS_ROOT is not set.")
DESTINATIONS_PAUSED = MetricSpec("destinations_paused", G, "Destinations paused by a throttling reply.")
# recorder
RECORDED_TOTAL = MetricSpec("recorded_total", C, "Results applied to the outbox, by status.", ("status",))
UNDELIVERABLE_TOTAL = MetricSpec(
    "undeliverable_total", C, "Results that ended failed, dead or bounced.", ("status",))
# the suppression list (relay/suppression.py)
SUPPRESSED_ADDRESSES_TOTAL = MetricSpec(
    "suppressed_addresses_total",
    C, "Addresses the recorder put on the suppression list or kept there longer, by source: "
       "bounce, complaint, soft (POSTROOM_SOFT_BOUNCE_LIMIT dead emails in a row).",
    ("source",))
RELAY_SUPPRESSED_TOTAL = MetricSpec(
    "relay_suppressed_total",
    C, "Emails the relay finished as suppressed, not published: their address is on the "
       "suppression list.")
RECORDER_UNREADABLE_TOTAL = MetricSpec(
    "recorder_unreadable_total", C, "Results that could not be decoded (skipped).")
RECORDER_REFUSED_TOTAL = MetricSpec(
    "recorder_refused_total",
    C, "Results whose attempt, status and times do not fit together (skipped).")
RECORDER_UNRECORDABLE_TOTAL = MetricSpec(
    "recorder_unrecordable_total",
    C, "Results the database refused, recorded one by one beside the rest (skipped).")
# bounces (postroom bounces)
BOUNCE_REPORTS_TOTAL = MetricSpec(
    "bounce_reports_total",
    C, "Results published from delivery status notifications and feedback reports, by "
       "status: bounced, delayed, complained.", ("status",))
BOUNCE_REFUSED_TOTAL = MetricSpec(
    "bounce_refused_total",
    C, "Addresses and reports the bounce intake refused or ignored, changing no row, by "
       "reason (forged_token, expired_token, unknown_row, auto_reply, too_large, ...).",
    ("reason",))
BOUNCE_HELD_TOTAL = MetricSpec(
    "bounce_held_total",
    C, "Reports answered 451 because the database or Kafka could not take them (the MTA "
       "tries again).")
BOUNCE_SESSIONS_TOTAL = MetricSpec(
    "bounce_sessions_total",
    C, "SMTP sessions the bounce intake was asked for, by outcome: admitted, too_many "
       "(POSTROOM_BOUNCE_MAX_SESSIONS open) or too_many_from_client (answered 421).",
    ("outcome",))
BOUNCE_REPLIES_TOTAL = MetricSpec(
    "bounce_replies_total",
    C, "Replies the bounce intake's SMTP listener sent, by code (one per command; aiosmtpd's "
       "line per command is off).", ("code",))
# lag (postroom lag --watch), under kafka-lag-exporter's names and labels
KAFKA_CONSUMERGROUP_GROUP_LAG = MetricSpec(
    "kafka_consumergroup_group_lag",
    G, "Messages a group has not committed yet, per partition.", LAG_LABELS, namespaced=False)
KAFKA_CONSUMERGROUP_GROUP_LAG_SECONDS = MetricSpec(
    "kafka_consumergroup_group_lag_seconds",
    G, "Age of the first record the group has not committed (on a retry tier: how long the "
       "first due record is overdue), per partition.", LAG_LABELS, namespaced=False)
KAFKA_CONSUMERGROUP_GROUP_MAX_LAG = MetricSpec(
    "kafka_consumergroup_group_max_lag",
    G, "The largest lag of any partition of the group.", ("cluster_name", "group"),
    namespaced=False)
KAFKA_CONSUMERGROUP_GROUP_MAX_LAG_SECONDS = MetricSpec(
    "kafka_consumergroup_group_max_lag_seconds",
    G, "The largest lag in seconds of any partition of the group.",
    ("cluster_name", "group"), namespaced=False)
KAFKA_CONSUMERGROUP_GROUP_SUM_LAG = MetricSpec(
    "kafka_consumergroup_group_sum_lag",
    G, "The sum of the lag of every partition of the group.", ("cluster_name", "group"),
    namespaced=False)
CONSUMERGROUP_STATUS = MetricSpec(
    "consumergroup_status",
    G, "Burrow-style verdict of a group: 0 OK, 1 WARN, 2 STALL, 3 STOP.", ("group",))
CONSUMERGROUP_MEMBERS = MetricSpec("consumergroup_members", G, "Members of a consumer group.", ("group",))
RETRY_WAITING = MetricSpec(
    "retry_waiting", G, "Records waiting on a retry tier partition.", ("topic", "partition"))
RETRY_OVERDUE = MetricSpec(
    "retry_overdue", G, "Records on a retry tier past their not_before, unconsumed.", ("topic", "partition"))
RETRY_OVERDUE_SECONDS = MetricSpec(
    "retry_overdue_seconds",
    G, "How long the first overdue record of a retry tier partition is past its not_before.",
    ("topic", "partition"))
LAG_PARTITIONS_UNAVAILABLE = MetricSpec(
    "lag_partitions_unavailable",
    G, "Partitions of a group whose lag the last sample could not read (a broker down); "
       "their lag series are absent meanwhile.", ("group",))
TOPIC_PARTITIONS_OFFLINE = MetricSpec(
    "topic_partitions_offline",
    G, "Partitions of a postroom topic without a leader.", ("cluster_name", "topic"))
TOPIC_PARTITIONS_UNDER_REPLICATED = MetricSpec(
    "topic_partitions_under_replicated",
    G, "Partitions of a postroom topic with fewer replicas in sync than assigned.",
    ("cluster_name", "topic"))
TOPIC_PARTITIONS_BELOW_MIN_INSYNC_REPLICAS = MetricSpec(
    "topic_partitions_below_min_insync_replicas",
    G, "Partitions of a postroom topic with fewer replicas in sync than "
       "min.insync.replicas: acks=all writes to them are refused.", ("cluster_name", "topic"))
OUTBOX_BACKLOG = MetricSpec("outbox_backlog", G, "Outbox rows due and not yet published.")
OUTBOX_BACKLOG_AGE_SECONDS = MetricSpec(
    "outbox_backlog_age_seconds", G, "Age of the oldest due unpublished outbox row.")
# every role
READY = MetricSpec("ready", G, "1 when the role's last readiness check passed.", ("check",))


class Metrics:
    """The declared counters, gauges and histograms of one registry (one per process role);
    read back (``counters``, ``summary``) by object or by name."""

    def __init__(self, *, process: bool = False) -> None:
        self.registry = CollectorRegistry()
        if process:
            ProcessCollector(registry=self.registry)
            PlatformCollector(registry=self.registry)
        self._lock = threading.Lock()
        self._metrics: dict[str, Counter | Gauge | Histogram] = {}
        # (name, kind, labels) -> the labelled series, checked to be of that kind: prometheus-
        # client's labels() and our checks, done per call, were 2-3% of the sender's CPU.
        self._series: dict[tuple[str, Kind, tuple[tuple[str, str], ...]], Any] = {}
        self._max: dict[str, float] = {}

    def _metric(self, spec: MetricSpec, labels: Mapping[str, str]) -> Counter | Gauge | Histogram:
        with self._lock:
            found = self._metrics.get(spec.name)
            if found is None:
                full = f"{NAMESPACE}_{spec.name}" if spec.namespaced else spec.name
                if spec.kind is Kind.COUNTER:
                    # prometheus-client adds _total itself.
                    found = Counter(full.removesuffix("_total"), spec.help, spec.labels,
                                    registry=self.registry)
                elif spec.kind is Kind.GAUGE:
                    found = Gauge(full, spec.help, spec.labels, registry=self.registry)
                else:
                    found = Histogram(full, spec.help, spec.labels, buckets=spec.buckets,
                                      registry=self.registry)
                self._metrics[spec.name] = found
            return found.labels(**labels) if labels else found

    def _typed(self, spec: MetricSpec, kind: Kind, labels: Mapping[str, str]) -> Any:
        try:
            key = (spec.name, kind, tuple(labels.items()))
        except AttributeError:
            raise TypeError(f"metrics are named by their declared object in postroom.metrics, "
                            f"not by {spec!r}") from None
        series = self._series.get(key)
        if series is None:
            if spec.kind is not kind:
                raise TypeError(f"metric {spec.name} is a {spec.kind}, not a {kind}")
            series = self._metric(spec, labels)
            with self._lock:
                self._series[key] = series
        return series

    def inc(self, spec: MetricSpec, amount: float = 1.0, **labels: str) -> None:
        self._typed(spec, Kind.COUNTER, labels).inc(amount)

    def set(self, spec: MetricSpec, value: float, **labels: str) -> None:
        self._typed(spec, Kind.GAUGE, labels).set(value)

    def observe(self, spec: MetricSpec, value: float, **labels: str) -> None:
        self._typed(spec, Kind.HISTOGRAM, labels).observe(value)
        with self._lock:
            self._max[spec.name] = max(self._max.get(spec.name, float("-inf")), value)

    def remove(self, spec: MetricSpec, **labels: str) -> None:
        """Drop one labelled series (a partition no longer reported)."""
        with self._lock:
            found = self._metrics.get(spec.name)
            for key in [k for k in self._series if k[0] == spec.name and dict(k[2]) == labels]:
                del self._series[key]
        if found is not None:
            try:
                found.remove(*(labels[k] for k in found._labelnames))
            except KeyError:
                pass

    def _samples(self, metric: str | MetricSpec,
                 suffix: str = "") -> list[tuple[dict[str, str], float]]:
        name = metric.name if isinstance(metric, MetricSpec) else metric
        with self._lock:
            found = self._metrics.get(name)
        if found is None:
            return []
        wanted = found._name + suffix
        return [(s.labels, s.value) for family in found.collect() for s in family.samples
                if s.name == wanted]

    def counters(self, name: str | MetricSpec) -> Mapping[tuple[tuple[str, str], ...], float]:
        """Every labelled value of counter ``name``."""
        return {tuple(sorted(labels.items())): value
                for labels, value in self._samples(name, "_total")}

    def summary(self, name: str | MetricSpec) -> tuple[int, float, float] | None:
        """(count, sum, max) of a histogram, or None before the first observation."""
        count = sum(v for _, v in self._samples(name, "_count"))
        if not count:
            return None
        total = sum(v for _, v in self._samples(name, "_sum"))
        with self._lock:
            return int(count), total, self._max[name if isinstance(name, str) else name.name]

    def render(self) -> str:
        """Prometheus text exposition (HELP and TYPE lines included)."""
        return generate_latest(self.registry).decode()
