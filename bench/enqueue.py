"""Enqueue in a job's own transaction: personalised calls, one call with many recipients, and
enqueue_many, against the local PostgreSQL (issue 26, targets 1 and 2).

Each measurement runs with the fast path and, interleaved with it, with the reference
(relay.outbox.FAST_PATH off: every statement through SQLAlchemy, as INSERT_ROWS or
INSERT_EMAILS); personalised calls a third time with the full build
(check_composable_by_building) as the header check, and twice more as Batch.enqueue calls (fast
path and reference), so all figures come from one run. enqueue_many runs a third time with no
statement sent (Inserts.add does nothing): the job's own share of its time, beside the whole.
Two floors of a call that waits for its answer run beside the personalised calls, interleaved
with them, each in a transaction of its own as they are, through psycopg alone with no postroom
code: the calls' own statement (INSERT_ROW, prepared, nothing checked) and a ``SELECT 1`` round
trip.
"""

from __future__ import annotations

import contextlib
import statistics
import time
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import sqlalchemy as sa

from bench.report import Options, Section, Target, fmt_rate, per_s, progress, table
from bench.scratch import scratch
from bench.workload import BODY, MAIL_FROM, SUBJECT
from postroom import Batch, Email, enqueue, enqueue_many
from postroom.mime import check_composable_by_building
from postroom.relay import inserts, outbox, pgdriver, sql, validation
from postroom.relay.db import make_engine
from postroom.settings import Settings

RUNS = 3  # of each measurement; the figure is the median, the spread min..max
PERSONALISED_CALLS, QUICK_PERSONALISED_CALLS = 3_000, 500
BULK_ROWS, QUICK_BULK_ROWS = 100_000, 20_000
MANY_EMAILS, QUICK_MANY_EMAILS = 20_000, 5_000
# The iterator's peak memory is measured under tracemalloc, which slows Python several times:
# two sizes, the second twice the first, show whether it grows with the recipients.
MEMORY_ROWS, QUICK_MEMORY_ROWS = 200_000, 20_000


@contextlib.contextmanager
def _reference_check() -> Iterator[None]:
    """enqueue with the full build as its header check (what it ran before issue 26)."""
    fast = validation.check_composable
    validation.check_composable = check_composable_by_building
    try:
        yield
    finally:
        validation.check_composable = fast


@contextlib.contextmanager
def _reference_path() -> Iterator[None]:
    """enqueue with its fast path off: every statement through SQLAlchemy (the reference)."""
    outbox.FAST_PATH = False
    try:
        yield
    finally:
        outbox.FAST_PATH = True


@contextlib.contextmanager
def _nothing_sent() -> Iterator[None]:
    """enqueue_many's own share: every email checked and its row built, no statement sent."""
    real = inserts.Inserts.add
    inserts.Inserts.add = lambda self, statement, params: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        inserts.Inserts.add = real  # type: ignore[method-assign]


def _timed(engine: sa.Engine, work: Callable[[sa.Connection], int]) -> tuple[float, int]:
    with engine.begin() as conn:
        started = time.perf_counter()
        rows = work(conn)
        return time.perf_counter() - started, rows


def _personalised(tag: str, calls: int) -> Callable[[sa.Connection], int]:
    def work(conn: sa.Connection) -> int:
        return sum(enqueue(conn, key=f"{tag}-{n}", recipients=[f"c{n}@example.com"],
                           subject=f"Invoice {n} for September 2026", body=BODY,
                           sender=MAIL_FROM) for n in range(calls))
    return work


def _statement_alone(tag: str, calls: int) -> Callable[[sa.Connection], int]:
    """The personalised calls' statement (INSERT_ROW, the values of :func:`_personalised`'s
    calls) through psycopg alone on one cursor, nothing checked: what a call that waits for its
    row takes with no postroom code around it."""
    def work(conn: sa.Connection) -> int:
        driver = inserts.psycopg_connection(conn)
        assert driver is not None, "the benchmark's engine runs psycopg 3"
        query = pgdriver.driver_sql(sql.insert_row(None), frozenset())
        shared = {"sender": MAIL_FROM, "body": BODY, "attachments": [], "html": None,
                  "inline": [], "priority": "normal", "available_at": None}
        new = 0
        with driver.cursor() as cursor:
            for n in range(calls):
                key = f"{tag}-{n}"
                cursor.execute(query, {**shared, "message_key": key,
                                       "idempotency_key": validation.idempotency_key_prefix(key)
                                       + f"c{n}@example.com",
                                       "recipient": f"c{n}@example.com",
                                       "subject": f"Invoice {n} for September 2026"})
                new += cursor.fetchone() is not None
        return new
    return work


def _round_trips(calls: int) -> Callable[[sa.Connection], int]:
    """``calls`` round trips of ``SELECT 1`` through psycopg alone: the least any call that waits
    for the database's answer takes."""
    def work(conn: sa.Connection) -> int:
        driver = inserts.psycopg_connection(conn)
        assert driver is not None, "the benchmark's engine runs psycopg 3"
        with driver.cursor() as cursor:
            for _ in range(calls):
                cursor.execute("SELECT 1")
                cursor.fetchone()
        return calls
    return work


def _batched(tag: str, calls: int) -> Callable[[sa.Connection], int]:
    """The personalised calls, each a Batch.enqueue: rows written together, counted at the end."""
    def work(conn: sa.Connection) -> int:
        with Batch(conn) as batch:
            for n in range(calls):
                batch.enqueue(key=f"{tag}-{n}", recipients=[f"c{n}@example.com"],
                              subject=f"Invoice {n} for September 2026", body=BODY,
                              sender=MAIL_FROM)
        return batch.new
    return work


def _bulk(tag: str, rows: int) -> Callable[[sa.Connection], int]:
    def work(conn: sa.Connection) -> int:
        return enqueue(conn, key=tag, recipients=(f"r{n}@example.com" for n in range(rows)),
                       subject=SUBJECT, body=BODY, sender=MAIL_FROM)
    return work


def _many(tag: str, emails: int) -> Callable[[sa.Connection], int]:
    def work(conn: sa.Connection) -> int:
        return enqueue_many(conn, (Email(key=f"{tag}-{n}", recipients=[f"c{n}@example.com"],
                                         subject=f"Invoice {n}", body=BODY, sender=MAIL_FROM)
                                   for n in range(emails)))
    return work


def _many_unsent(tag: str, emails: int) -> Callable[[sa.Connection], int]:
    """:func:`_many`, counting the emails (with nothing sent, no row is new)."""
    many = _many(tag, emails)

    def work(conn: sa.Connection) -> int:
        many(conn)
        return emails
    return work


def _rates(figures: list[float]) -> tuple[float, str]:
    return statistics.median(figures), f"{fmt_rate(min(figures))}..{fmt_rate(max(figures))}"


def _call_lines(medians: dict[str, float]) -> list[str]:
    """What a personalised call's time is made of, from the medians: its statement's round trip
    (psycopg alone) and what postroom adds to it."""
    names = ("personalised", "statement alone", "round trip")
    if not all(medians[name] > 0 for name in names):
        return []
    call, alone, trip = (1e6 / medians[name] for name in names)
    return [f"a personalised call took {call:.0f} µs: its statement alone {alone:.0f} µs (of "
            f"which a bare round trip {trip:.0f} µs), postroom's checks and keys "
            f"{call - alone:.0f} µs.",
            f"No call that waits for its statement's answer goes faster than the statement "
            f"alone: {fmt_rate(medians['statement alone'])} calls/s in this run. Batch.enqueue "
            "does not wait."]


def _peak_mib(engine: sa.Engine, tag: str, rows: int) -> float:
    tracemalloc.start()
    try:
        _timed(engine, _bulk(tag, rows))
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def run(base: Settings, options: Options) -> Section:
    quick = options.quick
    calls = QUICK_PERSONALISED_CALLS if quick else PERSONALISED_CALLS
    bulk_rows = QUICK_BULK_ROWS if quick else BULK_ROWS
    many = QUICK_MANY_EMAILS if quick else MANY_EMAILS
    memory_rows = QUICK_MEMORY_ROWS if quick else MEMORY_ROWS
    results: dict[str, list[float]] = {
        "personalised": [], "personalised, reference": [], "personalised, full build": [],
        "statement alone": [], "round trip": [],
        "batch": [], "batch, reference": [],
        "bulk": [], "bulk, reference": [], "many": [], "many, reference": [],
        "many, nothing sent": []}
    with scratch(base, "enqueue") as settings:
        engine = make_engine(settings)
        try:
            for run_no in range(RUNS):
                progress(f"enqueue: run {run_no + 1} of {RUNS}: {calls:,} personalised calls "
                         f"(three ways, their statement alone, a bare round trip, and two in a "
                         f"Batch), {bulk_rows:,} recipients and "
                         f"{many:,} emails at once (two ways each)")
                for name, work, mode in (
                        ("personalised", _personalised(f"p{run_no}", calls), None),
                        ("personalised, reference", _personalised(f"pr{run_no}", calls),
                         _reference_path),
                        ("personalised, full build", _personalised(f"ref{run_no}", calls),
                         _reference_check),
                        ("statement alone", _statement_alone(f"s{run_no}", calls), None),
                        ("round trip", _round_trips(calls), None),
                        ("batch", _batched(f"pb{run_no}", calls), None),
                        ("batch, reference", _batched(f"pbr{run_no}", calls), _reference_path),
                        ("bulk", _bulk(f"bulk{run_no}", bulk_rows), None),
                        ("bulk, reference", _bulk(f"bulkr{run_no}", bulk_rows), _reference_path),
                        ("many", _many(f"many{run_no}", many), None),
                        ("many, reference", _many(f"manyr{run_no}", many), _reference_path),
                        ("many, nothing sent", _many_unsent(f"manyn{run_no}", many),
                         _nothing_sent)):
                    with mode() if mode is not None else contextlib.nullcontext():
                        seconds, rows = _timed(engine, work)
                    results[name].append(per_s(rows, seconds))
            progress(f"enqueue: peak memory of {memory_rows:,} and {2 * memory_rows:,} "
                     "recipients given as an iterator (tracemalloc)")
            peaks = [_peak_mib(engine, f"mem{n}", n * memory_rows) for n in (1, 2)]
        finally:
            engine.dispose()
    rows_out: list[list[Any]] = []
    labels = {"personalised": f"{calls:,} enqueue calls, one recipient each (calls/s)",
              "personalised, reference": "  the same, fast path off (reference)",
              "personalised, full build": "  the same, full build as header check",
              "statement alone": "  its statement alone, psycopg only, nothing checked",
              "round trip": "  a SELECT 1 round trip, psycopg only",
              "batch": f"{calls:,} Batch.enqueue calls, one recipient each (calls/s)",
              "batch, reference": "  the same, fast path off (reference)",
              "bulk": f"one enqueue call, {bulk_rows:,} recipients (rows/s)",
              "bulk, reference": "  the same, fast path off (reference)",
              "many": f"enqueue_many, {many:,} one-recipient emails (rows/s)",
              "many, reference": "  the same, fast path off (reference)",
              "many, nothing sent": "  the same, no statement sent: the job's share (emails/s)"}
    medians: dict[str, float] = {}
    for name, figures in results.items():
        medians[name], spread = _rates(figures)
        rows_out.append([labels[name], fmt_rate(medians[name]), spread])
    section = Section("Enqueue: a job's transaction into the outbox")
    section.lines += [
        f"each in one transaction, committed; median of {RUNS} runs with their spread; each "
        "run interleaves the fast path, the reference and (personalised) the full build",
        "",
        *table(["what", "median", "min..max"], rows_out),
        "",
        f"peak traced memory of one call with recipients from an iterator: {peaks[0]:.1f} MiB "
        f"for {memory_rows:,}, {peaks[1]:.1f} MiB for {2 * memory_rows:,}",
        "",
        *_call_lines(medians),
    ]
    section.targets += [
        Target("personalised enqueue, one call each", medians["personalised"], 5_000, "calls/s"),
        Target("personalised enqueue, one Batch.enqueue call each", medians["batch"], 5_000,
               "calls/s"),
        Target(f"bulk enqueue, {bulk_rows:,} recipients in one call", medians["bulk"], 50_000,
               "rows/s"),
        Target("enqueue_many, one-recipient emails", medians["many"], 50_000, "rows/s"),
    ]
    return section
