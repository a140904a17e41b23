"""One email's trace, from the job's enqueue to its recorded outcome: the relay, the sender and the
recorder on the local stack, spans through OpenTelemetry's SDK (in memory), and the relay as a
process exporting to an OTLP/HTTP endpoint this test serves."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

from postroom import Email, enqueue, enqueue_many, tracing
from postroom.devkit.devsmtp import DevSmtpServer
from postroom.devkit.otlp import OtlpReceiver
from postroom.devkit.processes import stop_process
from postroom.devkit.scratch import scratch_env
from postroom.devkit.wait import wait_until
from postroom.relay.db import downgrade, upgrade
from postroom.relay.publisher import Relay
from postroom.settings import Settings, TlsMode
from postroom.topics import priority_topic, results_topic, retry_topic
from postroom.tracing import TraceContext
from support.commands import start_postroom
from support.pipeline import Pipeline, outbox_rows
from support.rounds import publish_round
from support.tracing import memory_tracing

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _id(span_id: int) -> str:
    return f"{span_id:016x}"


def test_one_trace_holds_enqueue_publish_both_attempts_the_retry_and_the_recording(
        settings: Settings, engine: sa.Engine) -> None:
    tracing, provider, exporter = memory_tracing()
    exporter.clear()
    server = DevSmtpServer(port=0, defer={"later@example.com": 1})  # 451 once, then accepted
    server.start()
    job = provider.get_tracer("nightly-job")
    with job.start_as_current_span("nightly report") as root, engine.begin() as conn:
        enqueue(conn, key="traced", recipients=["later@example.com"], subject="S", body="b")
    pipeline = Pipeline(dataclasses.replace(
        settings, smtp_host="127.0.0.1", smtp_port=server.port, smtp_tls=TlsMode.NONE,
        smtp_timeout_s=5.0, retry_delays_s=(0.5,)), engine, tracing=tracing).start()
    prefix = settings.topic_prefix
    results = results_topic(prefix)
    try:
        wait_until(lambda: outbox_rows(engine, "traced")[0].status == "sent", 30, "the row sent")
        wait_until(lambda: len([s for s in exporter.get_finished_spans()
                                if s.name == f"process {results}"]) == 2, 30,
                   "both results recorded")
    finally:
        pipeline.stop()
        server.stop()
    spans = exporter.get_finished_spans()
    trace_id = root.get_span_context().trace_id
    assert {s.context.trace_id for s in spans} == {trace_id}, [s.name for s in spans]
    by_id = {s.context.span_id: s for s in spans}

    def children(parent: ReadableSpan, name: str) -> list[ReadableSpan]:
        return [s for s in spans if s.parent is not None
                and s.parent.span_id == parent.context.span_id and s.name == name]

    [job_span] = [s for s in spans if s.parent is None]
    assert job_span.name == "nightly report"
    [enqueued] = children(job_span, "enqueue outbox")
    assert enqueued.attributes["postroom.message_key"] == "traced"
    normal = priority_topic(prefix, "normal")
    [published] = children(enqueued, f"send {normal}")
    assert published.kind is SpanKind.PRODUCER
    assert published.attributes["messaging.system"] == "kafka"
    assert published.attributes["messaging.destination.name"] == normal
    [first] = children(published, f"process {normal}")
    assert first.kind is SpanKind.CONSUMER
    assert (first.attributes["postroom.attempt"], first.attributes["postroom.status"]) == (
        1, "retrying")
    assert first.attributes["messaging.consumer.group.name"] == settings.sender_group
    [deferred] = children(first, "smtp send")
    assert deferred.kind is SpanKind.CLIENT
    assert deferred.attributes["postroom.smtp.reply_code"] == 451
    assert deferred.attributes["postroom.destination"] == "example.com"
    assert deferred.status.status_code is StatusCode.ERROR
    tier = retry_topic(prefix, 1)
    [scheduled] = children(first, f"send {tier}")
    assert scheduled.attributes["postroom.attempt"] == 2
    assert "postroom.retry.not_before" in scheduled.attributes
    [second] = children(scheduled, f"process {tier}")
    assert (second.attributes["postroom.attempt"], second.attributes["postroom.status"]) == (
        2, "sent")
    [accepted] = children(second, "smtp send")
    assert accepted.attributes["postroom.smtp.reply_code"] == 250
    assert accepted.status.status_code is not StatusCode.ERROR
    recorded = [s for s in spans if s.name == f"process {results}"]
    assert sorted((by_id[s.parent.span_id].name, s.attributes["postroom.status"])
                  for s in recorded if s.parent is not None) == [
        (f"process {normal}", "retrying"), (f"process {tier}", "sent")]
    # Each span starts after its parent: the order a trace viewer draws.
    for span in spans:
        if span.parent is not None:
            assert span.start_time >= by_id[span.parent.span_id].start_time, span.name
    assert len(spans) == 10, sorted(s.name for s in spans)


GOOD_PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _rows_with_contexts(engine: sa.Engine, key: str) -> None:
    """Three rows written by SQL: a valid context with its tracestate, a malformed one and one
    of 10,000 characters."""
    with engine.begin() as conn:
        enqueue(conn, key=key, recipients=["a@example.com", "b@example.com", "c@example.com"],
                subject="S", body="b")
        conn.execute(sa.text(
            "UPDATE outbox SET traceparent = CASE recipient WHEN 'a@example.com' THEN :good "
            "WHEN 'b@example.com' THEN '00-xyz-01' ELSE repeat('0', 10000) END, "
            "tracestate = CASE recipient WHEN 'a@example.com' THEN 'k=v' ELSE 'a=\u00e9' END "
            "WHERE message_key = :key"), {"good": GOOD_PARENT, "key": key})


def test_without_tracing_the_relay_passes_a_rows_context_on_and_drops_a_malformed_one(
        settings: Settings, engine: sa.Engine, consume: Callable[..., list[Any]]) -> None:
    _rows_with_contexts(engine, "passed-on")
    assert publish_round(Relay(settings, engine)) == 3  # none refused
    records = consume(settings, [priority_topic(settings.topic_prefix, "normal")], expected=3)
    carried = {r.key.decode().rpartition("|")[2]: tracing.from_headers(r.headers)
               for r in records}
    assert carried == {"a@example.com": TraceContext(
        "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", 1, "k=v"),
        "b@example.com": None, "c@example.com": None}
    assert all(len([h for h in r.headers if h[0] == "traceparent"]) <= 1 for r in records)


def test_with_tracing_a_malformed_context_starts_a_trace_of_its_own(
        settings: Settings, engine: sa.Engine) -> None:
    tracer, _provider, exporter = memory_tracing()
    exporter.clear()
    _rows_with_contexts(engine, "odd-trace")
    assert publish_round(Relay(settings, engine, tracing=tracer)) == 3
    sends = {s.attributes["messaging.kafka.message.key"].rpartition("|")[2]: s
             for s in exporter.get_finished_spans() if s.name.startswith("send ")}
    assert f"{sends['a@example.com'].parent.span_id:016x}" == "00f067aa0ba902b7"
    assert sends["b@example.com"].parent is None and sends["c@example.com"].parent is None


def test_a_traced_job_enqueues_on_0009_and_enqueue_many_keeps_its_context_once_upgraded(
        settings: Settings, engine: sa.Engine, caplog: pytest.LogCaptureFixture) -> None:
    _tracer, provider, _exporter = memory_tracing()
    job = provider.get_tracer("invoice-run")
    # An outbox not yet at 0010: the traced job's rows are queued, without the context.
    downgrade(engine, "0009")
    with job.start_as_current_span("invoices"), engine.begin() as conn:
        assert enqueue(conn, key="early", recipients=["d@example.com"], subject="S",
                       body="b") == 1
        assert enqueue_many(conn, [Email(key="early-2", recipients=["e@example.com"],
                                         subject="S", body="b")]) == 1
    assert "no trace context columns" in caplog.text
    upgrade(engine)  # the same process asks again at its next traced enqueue
    with job.start_as_current_span("invoices") as root, engine.begin() as conn:
        assert enqueue_many(conn, [Email(key=f"inv-{n}", recipients=[f"c{n}@example.com"],
                                         subject=f"Invoice {n}", body="b")
                                   for n in range(3)]) == 3
    with engine.connect() as conn:
        kept = conn.execute(sa.text(
            "SELECT message_key, split_part(traceparent, '-', 2) FROM outbox "
            "ORDER BY id")).all()
    trace_id = f"{root.get_span_context().trace_id:032x}"
    assert kept == [("early", None), ("early-2", None), *((f"inv-{n}", trace_id) for n in range(3))]


@pytest.fixture
def otlp_receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as receiver:
        yield receiver


def test_the_relay_process_exports_its_spans_over_otlp(
        settings: Settings, engine: sa.Engine, otlp_receiver: OtlpReceiver,
        tmp_path: Path) -> None:
    _tracing, provider, _exporter = memory_tracing()
    with provider.get_tracer("job").start_as_current_span("invoice run") as root, \
            engine.begin() as conn:
        enqueue(conn, key="exported", recipients=["c@example.com"], subject="S", body="b")
    env = {**os.environ, **scratch_env(settings),
           "OTEL_EXPORTER_OTLP_ENDPOINT": otlp_receiver.endpoint,
           "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=test"}
    log = tmp_path / "relay.log"
    relay = start_postroom("relay", env=env, log=log)
    try:
        wait_until(lambda: outbox_rows(engine, "exported")[0].status == "published", 30,
                   "the row published")
    finally:
        assert stop_process(relay) == 0, log.read_text()
    spans = [(resource.resource, span)
             for request in map(ExportTraceServiceRequest.FromString, otlp_receiver.bodies)
             for resource in request.resource_spans
             for scope in resource.scope_spans for span in scope.spans]
    [(resource, span)] = [(r, s) for r, s in spans if s.name.startswith("send ")]
    attributes = {a.key: a.value.string_value for a in resource.attributes}
    assert attributes["service.name"] == "postroom-relay"
    assert attributes["deployment.environment"] == "test"
    assert span.trace_id.hex() == f"{root.get_span_context().trace_id:032x}"
    assert span.parent_span_id  # the enqueue span's, in the job's process
    assert "tracing: relay spans exported over OTLP/HTTP" in log.read_text()
