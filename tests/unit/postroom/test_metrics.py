"""The metrics catalogue, the exposition and the health endpoints (a local HTTP server only)."""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from postroom.metrics import CATALOGUE, Kind, Metrics, Readiness, serve

ROOT = Path(__file__).resolve().parents[3]
CALL = re.compile(r"metrics\.(inc|set|observe)\(\s*\"([a-z_]+)\"")
KIND_OF_CALL = {"inc": Kind.COUNTER, "set": Kind.GAUGE, "observe": Kind.HISTOGRAM}


def call_sites() -> list[tuple[str, str, str]]:
    found = []
    for package in ("postroom", "relay", "sender"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for call, name in CALL.findall(path.read_text(encoding="utf-8")):
                found.append((str(path.relative_to(ROOT)), call, name))
    return found


def test_the_scan_finds_the_call_sites() -> None:
    names = {name for _, _, name in call_sites()}
    assert {"outcomes_total", "relay_published_total", "smtp_reply_seconds"} <= names


@pytest.mark.parametrize(("path", "call", "name"), call_sites())
def test_every_metric_a_call_site_uses_is_in_the_catalogue_with_its_kind(
        path: str, call: str, name: str) -> None:
    assert name in CATALOGUE, f"{path}: add {name!r} to postroom.metrics.CATALOGUE"
    assert CATALOGUE[name].kind is KIND_OF_CALL[call], f"{path}: {name} is a {CATALOGUE[name].kind}"


def test_counters_gauges_and_histograms_render_with_help_and_type() -> None:
    metrics = Metrics()
    metrics.inc("outcomes_total", status="sent")
    metrics.inc("outcomes_total", 2, status="failed")
    metrics.set("backlog", 7, priority="high")
    metrics.observe("smtp_reply_seconds", 0.03, stage="data")
    metrics.observe("smtp_reply_seconds", 4.0, stage="data")
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
    assert metrics.counter("outcomes_total", status="failed") == 2
    assert metrics.counter("outcomes_total", status="dead") == 0
    assert metrics.counters("outcomes_total") == {(("status", "sent"),): 1.0,
                                                  (("status", "failed"),): 2.0}
    assert metrics.summary("smtp_reply_seconds") == (2, 4.03, 4.0)
    assert metrics.summary("retry_lateness_seconds") is None


def test_lag_metrics_use_kafka_lag_exporter_names_and_labels() -> None:
    metrics = Metrics()
    labels = {"cluster_name": "c", "group": "g", "topic": "t", "partition": "0"}
    metrics.set("kafka_consumergroup_group_lag", 3, **labels)
    metrics.set("kafka_consumergroup_group_lag_seconds", 1.5, **labels)
    metrics.set("kafka_consumergroup_group_sum_lag", 3, cluster_name="c", group="g")
    metrics.set("kafka_consumergroup_group_max_lag_seconds", 1.5, cluster_name="c", group="g")
    text = metrics.render()
    assert ('kafka_consumergroup_group_lag{cluster_name="c",group="g",partition="0",topic="t"} 3.0'
            in text)
    assert 'kafka_consumergroup_group_sum_lag{cluster_name="c",group="g"} 3.0' in text
    assert "postroom_kafka" not in text
    metrics.remove("kafka_consumergroup_group_lag", **labels)
    assert "kafka_consumergroup_group_lag{" not in metrics.render()


def test_a_name_outside_the_catalogue_is_still_exported() -> None:
    metrics = Metrics()
    metrics.inc("brand_new_total", kind="x")
    assert 'postroom_brand_new_total{kind="x"} 1.0' in metrics.render()


def test_a_metric_used_as_the_wrong_kind_is_a_clear_error() -> None:
    metrics = Metrics()
    with pytest.raises(TypeError, match="outcomes_total is a counter, not a gauge"):
        metrics.set("outcomes_total", 1, status="sent")


def test_a_metric_used_as_the_wrong_kind_is_refused_after_its_first_use_too() -> None:
    metrics = Metrics()
    metrics.inc("outcomes_total", status="sent")
    metrics.inc("outcomes_total", status="sent")
    with pytest.raises(TypeError, match="outcomes_total is a counter, not a gauge"):
        metrics.set("outcomes_total", 1, status="sent")
    assert metrics.counter("outcomes_total", status="sent") == 2


def test_a_removed_series_starts_again_from_zero() -> None:
    metrics = Metrics()
    metrics.set("backlog", 5, priority="high")
    metrics.set("backlog", 7, priority="low")
    metrics.remove("backlog", priority="high")
    assert 'priority="high"' not in metrics.render()
    metrics.inc("outcomes_total", status="sent")
    metrics.remove("outcomes_total", status="sent")
    metrics.inc("outcomes_total", status="sent")
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
