"""What tracing costs (issue 28): the relay's drain and enqueue's personalised calls, with tracing
off and on, measured interleaved in one run against the local stack (the order of the
configurations turns from run to run).

The relay drains in this process (its rounds stepped until nothing is due), so the figure is the
relay's own work per row: the claim, the event's encoding, the produce and its acknowledgement,
and with tracing one span per row, batched by the SDK's BatchSpanProcessor (its queue large
enough to drop none) and exported by the real OTLP/HTTP exporter, in this process, to a local
endpoint that reads and discards each request: making, encoding and sending spans is measured,
not a collector's speed. "Off" is today's code with tracing off, not the code before tracing.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa

from bench.report import BenchError, Options, Section, fmt_rate, per_s, progress, table
from bench.scratch import scratch
from bench.workload import BODY, MAIL_FROM, enqueue_rows, recipients
from postroom import enqueue, tracing
from postroom.devkit.otlp import OtlpReceiver
from postroom.relay.db import make_engine
from postroom.relay.publisher import Relay
from postroom.settings import Settings
from postroom.tracing import OFF, Tracing

RUNS = 3
ROWS, QUICK_ROWS = 20_000, 3_000
CALLS, QUICK_CALLS = 2_000, 300
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
CONFIGS = ("off, rows without a context", "off, rows with a context (passed on)",
           "on, one span per row")


@contextlib.contextmanager
def _exporting_tracing() -> Iterator[tuple[Tracing, Any, OtlpReceiver]]:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    with OtlpReceiver(keep=False) as sink:
        provider = TracerProvider(shutdown_on_exit=False)
        provider.add_span_processor(BatchSpanProcessor(
            OTLPSpanExporter(endpoint=f"{sink.endpoint}/v1/traces"),
            max_queue_size=1 << 20, max_export_batch_size=512))
        try:
            yield Tracing.from_provider(provider), provider, sink
        finally:
            provider.shutdown()


@contextlib.contextmanager
def _no_capture() -> Iterator[None]:
    """enqueue as if it kept no trace: the job's own span alone is then measured."""
    @contextlib.contextmanager
    def none(_key: object) -> Iterator[None]:
        yield None

    kept = tracing.enqueue_span
    tracing.enqueue_span = none  # type: ignore[assignment]
    try:
        yield
    finally:
        tracing.enqueue_span = kept


def _drain(settings: Settings, engine: sa.Engine, tag: str, rows: int, *, context: bool,
           tracing: Tracing) -> float:
    with Relay(settings, engine).rounds() as leftover:  # the enqueue calls' rows, untimed
        while leftover.step() > 0:
            pass
    with engine.begin() as conn:
        enqueue_rows(conn, tag, recipients(rows, tag=tag))
        if context:
            conn.execute(sa.text("UPDATE outbox SET traceparent = :t WHERE message_key = :k"),
                         {"t": TRACEPARENT, "k": tag})
    relay = Relay(settings, engine, tracing=tracing)
    started = time.perf_counter()
    published = 0
    with relay.rounds() as rounds:
        while (done := rounds.step()) > 0:
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


ENQUEUES = ("untraced job", "each call in the job's span, enqueue keeping no trace",
            "each call in the job's span, enqueue's span and context kept")


def run(base: Settings, options: Options) -> Section:
    from opentelemetry import trace

    rows = QUICK_ROWS if options.quick else ROWS
    calls = QUICK_CALLS if options.quick else CALLS
    drains: dict[str, list[float]] = {name: [] for name in CONFIGS}
    enqueues: dict[str, list[float]] = {name: [] for name in ENQUEUES}
    with _exporting_tracing() as (traced, provider, sink), scratch(base, "tracing") as settings:
        trace.set_tracer_provider(provider)  # the job's provider: enqueue's span comes from it
        job = provider.get_tracer("bench-job")
        engine = make_engine(settings)
        try:
            for run_no in range(RUNS):
                progress(f"tracing: run {run_no + 1} of {RUNS}: {rows:,} rows drained three "
                         f"ways, {calls:,} enqueue calls three ways")
                for n in _turned(len(CONFIGS), run_no):
                    drains[CONFIGS[n]].append(_drain(
                        settings, engine, f"d{run_no}x{n}", rows, context=n >= 1,
                        tracing=traced if n == 2 else OFF))
                for n in _turned(len(ENQUEUES), run_no):
                    tag = f"e{run_no}x{n}"
                    if n == 0:
                        rate = _calls(engine, tag, calls, None)
                    elif n == 1:
                        with _no_capture():
                            rate = _calls(engine, tag, calls, job)
                    else:
                        rate = _calls(engine, tag, calls, job)
                    enqueues[ENQUEUES[n]].append(rate)
        finally:
            engine.dispose()
            provider.force_flush()
        requests = sink.requests
    body: list[list[str]] = []
    for label, unit, figures_by in (("relay drain", "rows/s", drains),
                                    ("enqueue", "calls/s", enqueues)):
        base_rate = statistics.median(next(iter(figures_by.values())))
        for name, figures in figures_by.items():
            median = statistics.median(figures)
            body.append([f"{label}, {name} ({unit})", fmt_rate(median),
                         f"{fmt_rate(min(figures))}..{fmt_rate(max(figures))}",
                         f"{median / base_rate:.2f}"])
    section = Section("Tracing: its cost on the relay and on enqueue")
    section.lines += [
        f"median of {RUNS} interleaved runs (the order turned each run) with their spread; ratio "
        f"to the first row of each part; spans exported over OTLP/HTTP to a local endpoint in "
        f"{requests:,} requests",
        "",
        *table(["what", "median", "min..max", "ratio"], body),
    ]
    return section


def _turned(count: int, run_no: int) -> list[int]:
    """0..count-1 starting at run_no: each configuration goes first in some run."""
    return [(run_no + n) % count for n in range(count)]
