"""Encoding one email-requested event: fastavro against our compiled writer, side by side.

No stack needed: it times the three writers on the relay's own kind of row (the claim's field
values in the contract's order, a 500-byte body) in this process, interleaved, best of several
repeats, so a machine that slows down for a while slows all three alike.
"""

from __future__ import annotations

import datetime as dt
import io
import timeit
from collections.abc import Callable, Sequence
from typing import Any

import fastavro

from bench.report import Section, fmt_rate, progress, table
from bench.workload import BODY, MAIL_FROM, SUBJECT
from postroom.schemas.codec import EmailRequested, load_schema
from postroom.schemas.compiled_writer import RecordWriter
from postroom.schemas.errors import SchemaError
from postroom.settings import Settings

ROUNDS = 9  # repeats of each writer, interleaved; the figure is the best one
QUICK_ROUNDS = 3
EVENTS_PER_ROUND = 20_000


def claimed_row() -> tuple[Any, ...]:
    """A row as the relay's claim returns it for one recipient of a report."""
    return ("report-2026-09/r12345@example.com", "report-2026-09", 123_456, "r12345@example.com",
            MAIL_FROM, SUBJECT, BODY, ["/srv/reports/2026-09.xlsx"], "normal",
            dt.datetime(2026, 9, 30, 22, 0, 1, 123_000, tzinfo=dt.UTC), 1, None,
            None, [])  # version 2 of the contract: no HTML body, no inline images


def writers() -> dict[str, Callable[[Sequence[Any]], bytes]]:
    """The writers compared, each taking the row's values in field order."""
    schema = load_schema(EmailRequested.SCHEMA_NAME)
    compiled = schema.writer
    if compiled is None:
        raise SchemaError(f"{schema.name} has no compiled writer")
    per_field = RecordWriter(compiled.names, compiled.writers, compiled.defaults)  # no kinds: calls
    names = schema.field_names

    def with_fastavro(values: Sequence[Any]) -> bytes:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, schema.parsed, dict(zip(names, values, strict=True)))
        return buf.getvalue()

    return {"fastavro schemaless_writer (dict built per event)": with_fastavro,
            "ours, one call per field": per_field.write,
            "ours, generated (strings and small ints in line)": compiled.write}


def run(settings: Settings, options: Any) -> Section:
    del settings  # no stack needed
    row = claimed_row()
    candidates = writers()
    outputs = {name: write(row) for name, write in candidates.items()}
    if len(set(outputs.values())) != 1:
        raise SchemaError("the writers disagree on the bytes of the same event")
    rounds = QUICK_ROUNDS if options.quick else ROUNDS
    best = {name: float("inf") for name in candidates}
    for n in range(rounds):
        progress(f"codec: round {n + 1} of {rounds}, {EVENTS_PER_ROUND:,} events per writer")
        for name, write in candidates.items():
            seconds = timeit.timeit(lambda write=write: write(row), number=EVENTS_PER_ROUND)
            best[name] = min(best[name], seconds / EVENTS_PER_ROUND)
    baseline = next(iter(best.values()))
    section = Section("Codec: one email-requested event to schemaless Avro bytes")
    section.lines += [
        f"{len(outputs[next(iter(outputs))])}-byte event (500-byte body), the values of a claimed "
        f"row; best of {rounds} rounds of {EVENTS_PER_ROUND:,} events per writer, interleaved; "
        "all three write the same bytes (checked)",
        "",
        *table(["writer", "us/event", "vs fastavro"],
               [[name, fmt_rate(seconds * 1e6), f"{baseline / seconds:.2f}x"]
                for name, seconds in best.items()]),
    ]
    return section
