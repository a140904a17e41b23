"""The metrics catalogue, the exposition and the health endpoints (a local HTTP server only)."""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from postroom.health import Readiness, serve
from postroom.metrics import (
    BACKLOG,
    KAFKA_CONSUMERGROUP_GROUP_LAG,
    KAFKA_CONSUMERGROUP_GROUP_LAG_SECONDS,
    KAFKA_CONSUMERGROUP_GROUP_MAX_LAG_SECONDS,
    KAFKA_CONSUMERGROUP_GROUP_SUM_LAG,
    OUTCOMES_TOTAL,
    SMTP_REPLY_SECONDS,
    Metrics,
)
from support.metrics import CATALOGUE, DECLARED, counter

ROOT = Path(__file__).resolve().parents[3]
# A write naming its metric by a string literal: refused at run time, and none may be left.
BY_STRING = re.compile(r"\.(inc|set|observe|remove)\(\s*[\"']([a-z_]+)[\"']")


def test_no_call_site_names_a_metric_by_string() -> None:
    found = [f"{path.relative_to(ROOT)}: {m.group(0)}"
             for package in ("postroom", "relay", "sender", "bounces")
             for path in sorted((ROOT / package).rglob("*.py"))
             for m in BY_STRING.finditer(path.read_text(encoding="utf-8"))
             if m.group(2) in CATALOGUE]
    assert found == []


def test_the_scan_finds_a_call_by_string() -> None:
    assert BY_STRING.search("self.metrics.inc('outcomes_total', status='sent')")


def test_a_metric_named_by_string_is_refused() -> None:
    with pytest.raises(TypeError, match="declared object"):
        Metrics().inc("outcomes_total", status="sent")  # type: ignore[arg-type]


def test_every_declared_metric_has_a_name_of_its_own() -> None:
    assert len(DECLARED) == len(CATALOGUE) > 40
    assert all(CATALOGUE[m.name] is m for m in DECLARED)


def test_counters_gauges_and_histograms_render_with_help_and_type() -> None:
    metrics = Metrics()
    metrics.inc(OUTCOMES_TOTAL, status="sent")
    metrics.inc(OUTCOMES_TOTAL, 2, status="failed")
    metrics.set(BACKLOG, 7, priority="high")
    metrics.observe(SMTP_REPLY_SECONDS, 0.03, stage="data")
    metrics.observe(SMTP_REPLY_SECONDS, 4.0, stage="data")
    text = metrics.render()
    assert "# HELP postroom_outcomes_total Results written" in text
    assert "# TYPE postroom_outcomes_total counter" in text
    assert 'postroom_outcomes_total{status="failed"} 2.0' in text
    assert "# TYPE postroom_backlog gauge" in text
    assert 'postroom_backlog{priority="high"} 7.0' in text
    assert "# TYPE postroom_smtp_reply_seconds histogram" in text
    assert 'postroom_smtp_reply_seconds_bucket{le="0.05",stage="data"} 1.0' in text
    assert 'postroom_smtp_reply_seconds_bucket{le="+Inf",stage="data"} 2.0' in text
    assert 'postroom_smtp_reply_seconds_count{stage="data"} 2.0' in text
    assert "_created" not in text
    assert counter(metrics, "outcomes_total", status="failed") == 2
    assert counter(metrics, "outcomes_total", status="dead") == 0
    assert metrics.counters("outcomes_total") == {(("status", "sent"),): 1.0,
                                                  (("status", "failed"),): 2.0}
    assert metrics.summary("smtp_reply_seconds") == (2, 4.03, 4.0)
    assert metrics.summary("retry_lateness_seconds") is None


def test_lag_metrics_use_kafka_lag_exporter_names_and_labels() -> None:
    metrics = Metrics()
    labels = {"cluster_name": "c", "group": "g", "topic": "t", "partition": "0"}
    metrics.set(KAFKA_CONSUMERGROUP_GROUP_LAG, 3, **labels)
    metrics.set(KAFKA_CONSUMERGROUP_GROUP_LAG_SECONDS, 1.5, **labels)
    metrics.set(KAFKA_CONSUMERGROUP_GROUP_SUM_LAG, 3, cluster_name="c", group="g")
    metrics.set(KAFKA_CONSUMERGROUP_GROUP_MAX_LAG_SECONDS, 1.5, cluster_name="c", group="g")
    text = metrics.render()
    assert ('kafka_consumergroup_group_lag{cluster_name="c",group="g",partition="0",topic="t"} 3.0'
            in text)
    assert 'kafka_consumergroup_group_sum_lag{cluster_name="c",group="g"} 3.0' in text
    assert "postroom_kafka" not in text
    metrics.remove(KAFKA_CONSUMERGROUP_GROUP_LAG, **labels)
    assert "kafka_consumergroup_group_lag{" not in metrics.render()


def test_a_metric_used_as_the_wrong_kind_is_a_clear_error() -> None:
    metrics = Metrics()
    with pytest.raises(TypeError, match="outcomes_total is a counter, not a gauge"):
        metrics.set(OUTCOMES_TOTAL, 1, status="sent")


def test_a_metric_used_as_the_wrong_kind_is_refused_after_its_first_use_too() -> None:
    metrics = Metrics()
    metrics.inc(OUTCOMES_TOTAL, status="sent")
    metrics.inc(OUTCOMES_TOTAL, status="sent")
    with pytest.raises(TypeError, match="outcomes_total is a counter, not a gauge"):
        metrics.set(OUTCOMES_TOTAL, 1, status="sent")
    assert counter(metrics, "outcomes_total", status="sent") == 2


def test_a_removed_series_starts_again_from_zero() -> None:
    metrics = Metrics()
    metrics.set(BACKLOG, 5, priority="high")
    metrics.set(BACKLOG, 7, priority="low")
    metrics.remove(BACKLOG, priority="high")
    assert 'priority="high"' not in metrics.render()
    metrics.inc(OUTCOMES_TOTAL, status="sent")
    metrics.remove(OUTCOMES_TOTAL, status="sent")
    metrics.inc(OUTCOMES_TOTAL, status="sent")
    rendered = metrics.render()
    assert 'postroom_outcomes_total{status="sent"} 1.0' in rendered
    assert 'postroom_backlog{priority="low"} 7.0' in rendered


def test_process_metrics_are_there_when_asked_for() -> None:
    assert "process_cpu_seconds_total" in Metrics(process=True).render()
    assert "process_cpu_seconds_total" not in Metrics().render()


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - our own localhost
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_healthz_readyz_and_metrics_are_served() -> None:
    state = {"smtp": "down"}

    def smtp() -> str:
        if state["smtp"] == "down":
            raise OSError("connect: refused")
        return "220 ready"

    now = [0.0]
    metrics = Metrics()
    readiness = Readiness([("database", lambda: "schema at head"), ("smtp", smtp)], metrics,
                          clock=lambda: now[0])
    server = serve(metrics, 0, readiness=readiness)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert get(f"{base}/healthz") == (200, "ok\n")
        assert get(f"{base}/readyz") == (
            503, "ok database: schema at head\nFAIL smtp: connect: refused\n")
        assert 'postroom_ready{check="smtp"} 0.0' in get(f"{base}/metrics")[1]
        state["smtp"] = "up"
        assert get(f"{base}/readyz")[0] == 503  # cached for READY_CACHE_S
        now[0] += 10
        assert get(f"{base}/readyz") == (200, "ok database: schema at head\nok smtp: 220 ready\n")
        status, text = get(f"{base}/metrics")
        assert status == 200
        assert 'postroom_ready{check="smtp"} 1.0' in text
        assert get(f"{base}/nothing")[0] == 404
    finally:
        server.shutdown()
        server.server_close()
