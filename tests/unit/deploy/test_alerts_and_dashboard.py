"""deploy/prometheus/alerts.yml and deploy/grafana/postroom.json use only metrics postroom exports,
and the alerts cover what operations asked for. `make check-alerts` also runs promtool."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from postroom.metrics import NAMESPACE, Kind, Metrics, MetricSpec
from support.metrics import CATALOGUE

ROOT = Path(__file__).resolve().parents[3]
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "postroom.json"
# A metric name in PromQL: ours, kafka-lag-exporter's or the process collector's.
METRIC = re.compile(r"\b((?:postroom|kafka_consumergroup|process)_[a-z0-9_]+)\b")


def full_name(name: str, spec: MetricSpec) -> str:
    return f"{NAMESPACE}_{name}" if spec.namespaced else name


def exported() -> set[str]:
    """Every series name postroom can export, with the suffixes Prometheus sees."""
    names: set[str] = set()
    for name, spec in CATALOGUE.items():
        base = full_name(name, spec)
        if spec.kind is Kind.HISTOGRAM:
            names |= {f"{base}_bucket", f"{base}_count", f"{base}_sum"}
        else:
            names.add(base)
    process = Metrics(process=True).render()
    names |= set(re.findall(r"^# TYPE (process_\w+) ", process, flags=re.MULTILINE))
    return names


def rules() -> list[dict[str, object]]:
    loaded = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    return [rule for group in loaded["groups"] for rule in group["rules"]]


def dashboard_exprs() -> list[str]:
    loaded = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return [target["expr"] for panel in loaded["panels"] for target in panel["targets"]]


def test_the_name_scan_sees_histograms_and_process_metrics() -> None:
    names = exported()
    assert {"postroom_smtp_reply_seconds_bucket", "kafka_consumergroup_group_lag_seconds",
            "process_cpu_seconds_total", "postroom_outcomes_total"} <= names
    assert "postroom_smtp_reply_seconds" not in names  # a histogram has no bare series


@pytest.mark.parametrize("rule", rules(), ids=lambda r: str(r["alert"]))
def test_each_alert_is_complete_and_uses_exported_metrics(rule: dict[str, object]) -> None:
    assert {"alert", "expr", "labels", "annotations"} <= rule.keys()
    assert rule["labels"]["severity"] in {"warning", "critical"}  # type: ignore[index]
    assert rule["annotations"]["summary"]  # type: ignore[index]
    used = METRIC.findall(str(rule["expr"]))
    assert used, rule["expr"]
    assert set(used) <= exported(), set(used) - exported()


def test_the_alerts_cover_what_operations_asked_for() -> None:
    by_metric = {m for rule in rules() for m in METRIC.findall(str(rule["expr"]))}
    assert {
        "postroom_outcomes_total",                    # dead letters arriving
        "postroom_server_faults_total",               # server faults rising
        "kafka_consumergroup_group_max_lag_seconds",  # sender lag in seconds
        "postroom_retry_overdue_seconds",             # overdue retries
        "postroom_outbox_backlog_age_seconds",        # relay backlog age
        "postroom_ready",                             # a role not ready
        "postroom_topic_partitions_offline",          # partitions without a leader
        "postroom_topic_partitions_below_min_insync_replicas",  # writes refused
        "postroom_topic_partitions_under_replicated",  # a broker down or behind
        "postroom_lag_partitions_unavailable",        # lag read only in part
        "postroom_attachments_waiting_total",         # emails waiting on a setting
    } <= by_metric


def test_the_dashboard_uses_only_exported_metrics() -> None:
    exprs = dashboard_exprs()
    assert len(exprs) >= 10
    for expr in exprs:
        used = METRIC.findall(expr)
        assert used, expr
        assert set(used) <= exported(), (expr, set(used) - exported())
    loaded = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert loaded["uid"] == "postroom"
    ids = [panel["id"] for panel in loaded["panels"]]
    assert len(ids) == len(set(ids))


def test_every_histogram_is_on_the_dashboard() -> None:
    text = " ".join(dashboard_exprs())
    for name, spec in CATALOGUE.items():
        if spec.kind is Kind.HISTOGRAM:
            assert f"{full_name(name, spec)}_bucket" in text, name
