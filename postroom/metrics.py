"""Process metrics through prometheus-client, and the HTTP endpoint that serves them with health.

Call sites name a metric and its labels (``metrics.inc("outcomes_total", status="sent")``); the
catalogue below gives each its type, HELP text and label names, so the exposition is documented.
``/healthz`` answers while the process runs, ``/readyz`` runs the role's readiness checks.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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
from prometheus_client.exposition import CONTENT_TYPE_LATEST

log = logging.getLogger(__name__)
# The *_created series double every counter and histogram; kafka-lag-exporter has none.
disable_created_metrics()  # type: ignore[no-untyped-call]

NAMESPACE = "postroom"
READY_CACHE_S = 5.0  # a probe every second must not mean a database round trip every second
# How long /readyz waits for the checks' answer before it says "not ready" (a Kubernetes probe's
# default timeout is 1 s; its failureThreshold rides out a slow answer).
READY_WAIT_S = 0.8
HTTP_TIMEOUT_S = 10.0  # a connection that sends no request within this is closed
HTTP_MAX_CONNECTIONS = 16  # served at once (scrapers and probes: a handful)

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
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = LATENCY_BUCKETS_S
    namespaced: bool = True  # False: exported under the bare name (kafka-lag-exporter's)


C, G, H = Kind.COUNTER, Kind.GAUGE, Kind.HISTOGRAM
LAG_LABELS = ("cluster_name", "group", "topic", "partition")

# Every metric postroom exports. A name a call site uses that is missing here is still exported
# (with a placeholder HELP), so a metric never stops a delivery; tests/unit/postroom/test_metrics.py
# fails for it.
CATALOGUE: dict[str, MetricSpec] = {
    # relay
    "relay_published_total": MetricSpec(C, "Rows published and acknowledged by the broker."),
    "relay_too_large_total": MetricSpec(
        C, "Rows whose event is over POSTROOM_EVENT_MAX_BYTES or refused by Kafka as too large "
           "(marked failed)."),
    "relay_poison_total": MetricSpec(
        C, "Rows that can never become an event (marked failed, 'poison: <reason>')."),
    "relay_unacknowledged_total": MetricSpec(
        C, "Rows the broker did not acknowledge (their claim is released and retried)."),
    "relay_publish_delay_seconds": MetricSpec(
        H, "From a row's commit (available_at) to the broker's acknowledgement.",
        buckets=DELAY_BUCKETS_S),
    # sender
    "outcomes_total": MetricSpec(C, "Results written, by status: sent, retrying, failed, dead.",
                                 ("status",)),
    "attempts_total": MetricSpec(C, "SMTP attempts by verdict.", ("verdict",)),
    "server_faults_total": MetricSpec(
        C, "Failures blamed on the server or our configuration, by SMTP stage.", ("stage",)),
    "duplicates_suppressed_total": MetricSpec(
        C, "Redelivered events the ledger stopped from being sent again."),
    "repeated_attempts_suppressed_total": MetricSpec(
        C, "Redelivered copies of a failed attempt whose outcome was published, not made again."),
    "poison_total": MetricSpec(
        C, "Records refused at admission (poison): dead-lettered, their row ended failed."),
    "poison_unkeyed_total": MetricSpec(
        C, "Poison records with no readable key: dead-lettered only, no result published."),
    "registry_unavailable_total": MetricSpec(
        C, "Records held back, their partition paused, because the Schema Registry could not "
           "give their writer schema (read again after a pause)."),
    "produce_failures_total": MetricSpec(C, "Failed writes to Kafka (retried).", ("topic",)),
    "backlog": MetricSpec(G, "Records waiting on this sender's partitions of a priority.",
                          ("priority",)),
    "retry_lateness_seconds": MetricSpec(
        H, "How late a retry started after its not_before.", buckets=DELAY_BUCKETS_S),
    "smtp_reply_seconds": MetricSpec(
        H, "Time from sending an SMTP transaction to the reply that ended it, by the stage "
           "of that reply.", ("stage",)),
    "ledger_mark_seconds": MetricSpec(
        H, "Time to record a delivery in the ledger (mark sent or release).", ("operation",)),
    "sent_mark_window_seconds": MetricSpec(
        H, "The duplicate window, bounded above: from the final reply of an accepted email "
           "being read to the sender reading its sent mark's commit (a crash before the commit "
           "sends it again).",
        buckets=WINDOW_BUCKETS_S),
    "claims_renewed_total": MetricSpec(
        C, "Ledger claims renewed as their send started, having waited long for their turn or "
           "been taken on a ledger session that ended since; kept, or lost to another sender "
           "(not sent here).", ("result",)),
    "throttled_total": MetricSpec(
        C, "Sends a server throttled, deferred without counting as an attempt."),
    "attachments_waiting_total": MetricSpec(
        C, "Emails with attachments or inline images put back on their retry tier, not "
           "counted as an attempt, because POSTROOM_ATTACHMENTS_ROOT is not set."),
    "destinations_paused": MetricSpec(G, "Destinations paused by a throttling reply."),
    # recorder
    "recorded_total": MetricSpec(C, "Results applied to the outbox, by status.", ("status",)),
    "undeliverable_total": MetricSpec(C, "Results that ended failed, dead or bounced.",
                                      ("status",)),
    # the suppression list (relay/suppression.py)
    "suppressed_addresses_total": MetricSpec(
        C, "Addresses the recorder put on the suppression list or kept there longer, by source: "
           "bounce, complaint, soft (POSTROOM_SOFT_BOUNCE_LIMIT dead emails in a row).",
        ("source",)),
    "relay_suppressed_total": MetricSpec(
        C, "Emails the relay finished as suppressed, not published: their address is on the "
           "suppression list."),
    "recorder_unreadable_total": MetricSpec(C, "Results that could not be decoded (skipped)."),
    "recorder_refused_total": MetricSpec(
        C, "Results whose attempt, status and times do not fit together (skipped)."),
    "recorder_unrecordable_total": MetricSpec(
        C, "Results the database refused, recorded one by one beside the rest (skipped)."),
    # bounces (postroom bounces)
    "bounce_reports_total": MetricSpec(
        C, "Results published from delivery status notifications and feedback reports, by "
           "status: bounced, delayed, complained.", ("status",)),
    "bounce_refused_total": MetricSpec(
        C, "Addresses and reports the bounce intake refused or ignored, changing no row, by "
           "reason (forged_token, expired_token, unknown_row, auto_reply, too_large, ...).",
        ("reason",)),
    "bounce_held_total": MetricSpec(
        C, "Reports answered 451 because the database or Kafka could not take them (the MTA "
           "tries again)."),
    # lag (postroom lag --watch), under kafka-lag-exporter's names and labels
    "kafka_consumergroup_group_lag": MetricSpec(
        G, "Messages a group has not committed yet, per partition.", LAG_LABELS, namespaced=False),
    "kafka_consumergroup_group_lag_seconds": MetricSpec(
        G, "Age of the first record the group has not committed (on a retry tier: how long the "
           "first due record is overdue), per partition.", LAG_LABELS, namespaced=False),
    "kafka_consumergroup_group_max_lag": MetricSpec(
        G, "The largest lag of any partition of the group.", ("cluster_name", "group"),
        namespaced=False),
    "kafka_consumergroup_group_max_lag_seconds": MetricSpec(
        G, "The largest lag in seconds of any partition of the group.",
        ("cluster_name", "group"), namespaced=False),
    "kafka_consumergroup_group_sum_lag": MetricSpec(
        G, "The sum of the lag of every partition of the group.", ("cluster_name", "group"),
        namespaced=False),
    "consumergroup_status": MetricSpec(
        G, "Burrow-style verdict of a group: 0 OK, 1 WARN, 2 STALL, 3 STOP.", ("group",)),
    "consumergroup_members": MetricSpec(G, "Members of a consumer group.", ("group",)),
    "retry_waiting": MetricSpec(G, "Records waiting on a retry tier partition.",
                                ("topic", "partition")),
    "retry_overdue": MetricSpec(G, "Records on a retry tier past their not_before, unconsumed.",
                                ("topic", "partition")),
    "retry_overdue_seconds": MetricSpec(
        G, "How long the first overdue record of a retry tier partition is past its not_before.",
        ("topic", "partition")),
    "lag_partitions_unavailable": MetricSpec(
        G, "Partitions of a group whose lag the last sample could not read (a broker down); "
           "their lag series are absent meanwhile.", ("group",)),
    "topic_partitions_offline": MetricSpec(
        G, "Partitions of a postroom topic without a leader.", ("cluster_name", "topic")),
    "topic_partitions_under_replicated": MetricSpec(
        G, "Partitions of a postroom topic with fewer replicas in sync than assigned.",
        ("cluster_name", "topic")),
    "topic_partitions_below_min_insync_replicas": MetricSpec(
        G, "Partitions of a postroom topic with fewer replicas in sync than "
           "min.insync.replicas: acks=all writes to them are refused.", ("cluster_name", "topic")),
    "outbox_backlog": MetricSpec(G, "Outbox rows due and not yet published."),
    "outbox_backlog_age_seconds": MetricSpec(G, "Age of the oldest due unpublished outbox row."),
    # every role
    "ready": MetricSpec(G, "1 when the role's last readiness check passed.", ("check",)),
}


class Metrics:
    """Named counters, gauges and histograms of one registry (one per process role)."""

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

    def _metric(self, name: str, kind: Kind, labels: Mapping[str, str]) -> Counter | Gauge | Histogram:
        with self._lock:
            found = self._metrics.get(name)
            if found is None:
                spec = CATALOGUE.get(name) or MetricSpec(
                    kind, f"{name} (not in postroom.metrics.CATALOGUE)", tuple(sorted(labels)))
                full = f"{NAMESPACE}_{name}" if spec.namespaced else name
                if spec.kind is Kind.COUNTER:
                    # prometheus-client adds _total itself.
                    found = Counter(full.removesuffix("_total"), spec.help, spec.labels,
                                    registry=self.registry)
                elif spec.kind is Kind.GAUGE:
                    found = Gauge(full, spec.help, spec.labels, registry=self.registry)
                else:
                    found = Histogram(full, spec.help, spec.labels, buckets=spec.buckets,
                                      registry=self.registry)
                self._metrics[name] = found
            return found.labels(**labels) if labels else found

    def _typed(self, name: str, kind: Kind, labels: Mapping[str, str]) -> Any:
        key = (name, kind, tuple(labels.items()))
        series = self._series.get(key)
        if series is None:
            series = self._metric(name, kind, labels)
            wanted = {Kind.COUNTER: Counter, Kind.GAUGE: Gauge, Kind.HISTOGRAM: Histogram}[kind]
            if not isinstance(series, wanted):
                raise TypeError(f"metric {name} is a {type(series).__name__.lower()}, "
                                f"not a {kind}")
            with self._lock:
                self._series[key] = series
        return series

    def inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        self._typed(name, Kind.COUNTER, labels).inc(amount)

    def set(self, name: str, value: float, **labels: str) -> None:
        self._typed(name, Kind.GAUGE, labels).set(value)

    def observe(self, name: str, value: float, **labels: str) -> None:
        self._typed(name, Kind.HISTOGRAM, labels).observe(value)
        with self._lock:
            self._max[name] = max(self._max.get(name, float("-inf")), value)

    def remove(self, name: str, **labels: str) -> None:
        """Drop one labelled series (a partition no longer reported)."""
        with self._lock:
            found = self._metrics.get(name)
            for key in [k for k in self._series if k[0] == name and dict(k[2]) == labels]:
                del self._series[key]
        if found is not None:
            try:
                found.remove(*(labels[k] for k in found._labelnames))
            except KeyError:
                pass

    def _samples(self, name: str, suffix: str = "") -> list[tuple[dict[str, str], float]]:
        with self._lock:
            found = self._metrics.get(name)
        if found is None:
            return []
        wanted = found._name + suffix
        return [(s.labels, s.value) for family in found.collect() for s in family.samples
                if s.name == wanted]

    def counter(self, name: str, **labels: str) -> float:
        """The value of a counter (0 before its first increment)."""
        for found, value in self._samples(name, "_total"):
            if found == labels:
                return value
        return 0.0

    def counters(self, name: str) -> Mapping[tuple[tuple[str, str], ...], float]:
        """Every labelled value of counter ``name``."""
        return {tuple(sorted(labels.items())): value
                for labels, value in self._samples(name, "_total")}

    def gauge(self, name: str, **labels: str) -> float | None:
        for found, value in self._samples(name):
            if found == labels:
                return value
        return None

    def summary(self, name: str) -> tuple[int, float, float] | None:
        """(count, sum, max) of a histogram, or None before the first observation."""
        count = sum(v for _, v in self._samples(name, "_count"))
        if not count:
            return None
        total = sum(v for _, v in self._samples(name, "_sum"))
        with self._lock:
            return int(count), total, self._max[name]

    def render(self) -> str:
        """Prometheus text exposition (HELP and TYPE lines included)."""
        return generate_latest(self.registry).decode()


@dataclasses.dataclass(frozen=True)
class CheckResult:
    name: str
    ok: bool
    detail: str


Check = tuple[str, Callable[[], str]]  # name, and a call that returns a detail or raises


class Readiness:
    """Runs a role's checks (database, broker, SMTP) at most every READY_CACHE_S seconds, on a
    thread of their own: no scrape or probe ever waits on a check. /readyz waits up to
    ``wait_s`` for a run it asked for; a check that has not answered by then is "not ready"
    (its ``postroom_ready`` 0) while it runs on. One run at a time, so a hung check ties up one
    thread, not one per probe."""

    def __init__(self, checks: Sequence[Check], metrics: Metrics,
                 clock: Callable[[], float] = time.monotonic, wait_s: float = READY_WAIT_S) -> None:
        self._checks = list(checks)
        self._metrics = metrics
        self._clock = clock
        self._wait_s = wait_s
        self._lock = threading.Condition()  # held for the state below, never while a check runs
        self._last: tuple[float, list[CheckResult]] | None = None
        self._run: list[CheckResult] | None = None  # the running run's results so far
        self._running_since = 0.0

    def refresh(self) -> None:
        """Start a run of the checks, unless one runs or the last is fresh; returns at once. A
        check running longer than ``wait_s`` has its ``postroom_ready`` set to 0 meanwhile, so a
        scrape alone shows it."""
        with self._lock:
            if self._run is not None:
                running = len(self._run)
                if (time.monotonic() - self._running_since > self._wait_s
                        and running < len(self._checks)):
                    self._metrics.set("ready", 0.0, check=self._checks[running][0])
                return
            if self._last is not None and self._clock() - self._last[0] < READY_CACHE_S:
                return
            self._run = []
            self._running_since = time.monotonic()
        threading.Thread(target=self._run_checks, name="readiness", daemon=True).start()

    def _run_checks(self) -> None:
        results: list[CheckResult] = []
        for name, check in self._checks:
            try:
                result = CheckResult(name, True, check())
            except Exception as exc:  # noqa: BLE001 - any failure means not ready; said why
                result = CheckResult(name, False, str(exc).splitlines()[0] if str(exc).strip()
                                     else type(exc).__name__)
            self._metrics.set("ready", 1.0 if result.ok else 0.0, check=name)
            results.append(result)
            with self._lock:
                self._run = list(results)
        with self._lock:
            self._last = (self._clock(), results)
            self._run = None
            self._lock.notify_all()

    def results(self) -> list[CheckResult]:
        """The checks' results, fresh within READY_CACHE_S; within ``wait_s`` at most, a check
        still running counts as failed."""
        self.refresh()
        deadline = time.monotonic() + self._wait_s
        with self._lock:
            while self._run is not None and time.monotonic() < deadline:
                self._lock.wait(max(0.0, deadline - time.monotonic()))
            if self._run is None and self._last is not None:
                return self._last[1]
            done = list(self._run or [])
            waited_s = time.monotonic() - self._running_since
        if len(done) >= len(self._checks):
            return done  # the run ended as we looked
        pending = self._checks[len(done)]
        self._metrics.set("ready", 0.0, check=pending[0])
        return [*done, CheckResult(pending[0], False, f"no answer after {waited_s:.1f}s"),
                *(CheckResult(name, False, "not checked yet")
                  for name, _ in self._checks[len(done) + 1:])]


class _BoundedHTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer with at most ``max_connections`` served at once: a connection beyond
    them is closed at once, without a thread (the stdlib server starts one per connection)."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 max_connections: int) -> None:
        super().__init__(address, handler)
        self._slots = threading.BoundedSemaphore(max_connections)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


def serve(metrics: Metrics, port: int, host: str = "127.0.0.1",
          readiness: Readiness | None = None, *, timeout_s: float = HTTP_TIMEOUT_S,
          max_connections: int = HTTP_MAX_CONNECTIONS) -> ThreadingHTTPServer:
    """Serve ``/metrics``, ``/healthz`` and ``/readyz`` on a daemon thread; ``shutdown()`` stops.

    A connection that sends nothing for ``timeout_s`` is closed; at most ``max_connections``
    are served at once."""

    class Handler(BaseHTTPRequestHandler):
        timeout = timeout_s  # the socket's, for the request and the reply

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0].rstrip("/")
            if path in ("/metrics", ""):
                if readiness is not None:
                    readiness.refresh()  # keeps postroom_ready current for alerts; never waits
                self._reply(200, generate_latest(metrics.registry), CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                self._reply(200, b"ok\n")
            elif path == "/readyz":
                results = readiness.results() if readiness is not None else []
                text = "".join(f"{'ok' if r.ok else 'FAIL'} {r.name}: {r.detail}\n"
                               for r in results) or "ok\n"
                self._reply(200 if all(r.ok for r in results) else 503, text.encode())
            else:
                self.send_error(404)

        def _reply(self, code: int, body: bytes, content_type: str = "text/plain") -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            log.debug("metrics: " + format, *args)

    server = _BoundedHTTPServer((host, port), Handler, max_connections)
    thread = threading.Thread(target=server.serve_forever, name="metrics", daemon=True)
    thread.start()
    log.info("metrics, /healthz and /readyz on http://%s:%d", host, port)
    return server
