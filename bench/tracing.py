"""What tracing costs (issue 28): the relay's drain and enqueue's personalised calls, with tracing
off and on, measured interleaved in one run against the local stack.

The relay drains in this process (publish_once until nothing is due), so the figure is the
relay's own work per row: the claim, the event's encoding, the produce and its acknowledgement,
and with tracing one span per row. Spans go to an exporter that discards them, through the SDK's
BatchSpanProcessor (its queue large enough to drop none), so what is measured is making and
batching spans, not a collector's speed.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from bench.report import BenchError, Options, Section, fmt_rate, per_s, progress, table
from bench.scratch import scratch
from bench.workload import BODY, MAIL_FROM, enqueue_rows, recipients
from postroom import enqueue
from postroom.settings import Settings
from postroom.tracing import OFF, Tracing
from relay.db import make_engine
from relay.publisher import Relay

RUNS = 3
ROWS, QUICK_ROWS = 20_000, 3_000
CALLS, QUICK_CALLS = 2_000, 300
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
CONFIGS = ("off, rows without a context", "off, rows with a context (passed on)",
           "on, one span per row")


def _discarding_tracing() -> tuple[Tracing, Any, list[int]]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    exported = [0]

    class Discard(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            exported[0] += len(spans)
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Discard(), max_queue_size=1 << 20,
                                                   max_export_batch_size=512))
    return Tracing.from_provider(provider), provider, exported


def _drain(settings: Settings, engine: sa.Engine, tag: str, rows: int, *, context: bool,
           tracing: Tracing) -> float:
    leftover = Relay(settings, engine)  # the enqueue calls' rows, untimed
    while leftover.publish_once() > 0:
        pass
    with engine.begin() as conn:
        enqueue_rows(conn, tag, recipients(rows, tag=tag))
        if context:
            conn.execute(sa.text("UPDATE outbox SET traceparent = :t WHERE message_key = :k"),
                         {"t": TRACEPARENT, "k": tag})
    relay = Relay(settings, engine, tracing=tracing)
    started = time.perf_counter()
    published = 0
    while (done := relay.publish_once()) > 0:
        published += done
    seconds = time.perf_counter() - started
    if published != rows:
        raise BenchError(f"the relay published {published} of {rows} rows")
    return per_s(rows, seconds)


def _calls(engine: sa.Engine, tag: str, calls: int, tracer: Any | None) -> float:
    with engine.begin() as conn:
        started = time.perf_counter()
        for n in range(calls):
            if tracer is None:
                enqueue(conn, key=f"{tag}-{n}", recipients=[f"c{n}@example.com"],
                        subject=f"Invoice {n}", body=BODY, sender=MAIL_FROM)
            else:
                with tracer.start_as_current_span("invoice"):
                    enqueue(conn, key=f"{tag}-{n}", recipients=[f"c{n}@example.com"],
                            subject=f"Invoice {n}", body=BODY, sender=MAIL_FROM)
        return per_s(calls, time.perf_counter() - started)


def run(base: Settings, options: Options) -> Section:
    from opentelemetry import trace

    rows = QUICK_ROWS if options.quick else ROWS
    calls = QUICK_CALLS if options.quick else CALLS
    tracing, provider, exported = _discarding_tracing()
    trace.set_tracer_provider(provider)  # the job's provider: enqueue's span comes from it
    job = provider.get_tracer("bench-job")
    drains: dict[str, list[float]] = {name: [] for name in CONFIGS}
    enqueues: dict[str, list[float]] = {"untraced job": [], "each call in a span": []}
    with scratch(base, "tracing") as settings:
        engine = make_engine(settings)
        try:
            for run_no in range(RUNS):
                progress(f"tracing: run {run_no + 1} of {RUNS}: {rows:,} rows drained three "
                         f"ways, {calls:,} enqueue calls twice")
                for n, name in enumerate(CONFIGS):
                    drains[name].append(_drain(
                        settings, engine, f"d{run_no}x{n}", rows, context=n >= 1,
                        tracing=tracing if n == 2 else OFF))
                enqueues["untraced job"].append(_calls(engine, f"u{run_no}", calls, None))
                enqueues["each call in a span"].append(_calls(engine, f"s{run_no}", calls, job))
        finally:
            engine.dispose()
            provider.force_flush()
    base_rate = statistics.median(drains[CONFIGS[0]])
    body: list[list[str]] = []
    for name, figures in drains.items():
        median = statistics.median(figures)
        body.append([f"relay drain, {name} (rows/s)", fmt_rate(median),
                     f"{fmt_rate(min(figures))}..{fmt_rate(max(figures))}",
                     f"{median / base_rate:.2f}"])
    calls_base = statistics.median(enqueues["untraced job"])
    for name, figures in enqueues.items():
        median = statistics.median(figures)
        body.append([f"enqueue, {name} (calls/s)", fmt_rate(median),
                     f"{fmt_rate(min(figures))}..{fmt_rate(max(figures))}",
                     f"{median / calls_base:.2f}"])
    section = Section("Tracing: its cost on the relay and on enqueue")
    section.lines += [
        f"median of {RUNS} interleaved runs with their spread; ratio to tracing off; "
        f"{exported[0]:,} spans made and exported (discarded)",
        "",
        *table(["what", "median", "min..max", "ratio"], body),
    ]
    return section
