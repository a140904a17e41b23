"""Backlog benchmark (issue 26, target 5): a million emails enqueued while the pipeline is stopped,
drained by `postroom relay` alone, then sent by `postroom sender` to smtp-sink and written back by
`postroom recorder`; what `postroom purge` and autovacuum leave of the outbox after.

The rates per window of 100,000 rows come from the rows' own stamps (the enqueueing process's
commit times, outbox.published_at, outbox.updated_at), read once after each stage. While a stage
runs the benchmark looks only at what costs little (the head of the relay's queue, PostgreSQL's
statistics counters) every few seconds. Each stage's CPU is taken per process, to say what bounds
it. The relay's rate over the backlog is compared with its drain of 10,000-row transactions as the
relay part measures it, measured here first in a scratch of its own.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import math
import os
import re
import resource
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from bench import relay
from bench.cpu import CpuSample, CpuUsage, pids_named, rss_mib, sample, thread_cpu_s, usage
from bench.delivery import (
    DELIVERY_PARTITIONS,
    TARGET_RSS_GROWTH,
    SentProgress,
    ServerPlan,
    component_env,
    first_error,
    smtp_server,
    wait_sent,
)
from bench.report import BenchError, Options, Section, Target, fmt_rate, per_s, progress, table
from bench.scratch import scratch
from postroom.devkit.processes import PostroomProcesses
from postroom.relay.db import make_engine
from postroom.settings import Settings

EMAILS, QUICK_EMAILS = 1_000_000, 20_000
MIN_EMAILS = 10_000  # ten relay rounds at the default batch, ten windows of 1,000 rows
WINDOW_ROWS = 100_000  # the window; a run of fewer than ten windows takes a tenth of its rows
ROWS_PER_TXN = 10_000  # 100 enqueue calls of 10,000 recipients for a million, as the relay part's
TARGET_DRAIN_RATIO = 0.8  # relay drain over the backlog / its 10,000-rows-per-transaction drain
TARGET_SENT_RATIO = 0.8   # sent rows/s, last window / first window
SINK = ServerPlan("smtp-sink", 0, {})
POLL_S = 2.0
PROGRESS_EVERY_S = 5.0
DRAIN_POLL_S = 0.5  # the head of the queue: one index entry
# Counting the outbox's rows reads the whole table (1.6 GB at a million rows, fillfactor 50);
# between counts the recorder's updates in PostgreSQL's statistics stand for them.
EXACT_LOOK_EVERY_S = 60.0
END_LOOK_EVERY_S = 10.0
PURGE_AGE = "1s"  # every row ended more than a second ago; needs --force (younger than retention)
AUTOVACUUM_WAIT_S, QUICK_AUTOVACUUM_WAIT_S = 900.0, 150.0
# Disk a backlog takes at its largest: the outbox (fillfactor 50) with its indexes, the ledger,
# WAL, and the email and results topics (measured: see docs/benchmarks.md); with a margin.
DISK_BYTES_PER_EMAIL = 6_000
TABLES = ("outbox", "outbox_queue", "sender_ledger")
# How the CPU table groups the watched processes: column -> name prefix.
CPU_COLUMNS = (("relay", "relay"), ("sender", "sender"), ("recorder", "recorder"),
               ("PostgreSQL", "postgres:"), ("Kafka (java)", "java:"), ("smtp-sink", "smtp-sink"),
               ("bench", "bench"), ("job", "job"))
CPU_NAMES = (*(column for column, _ in CPU_COLUMNS), "others")
PYTHON_ROLES = ("relay", "sender", "recorder")  # their threads are watched one by one
SINGLE_THREADED = ("postgres:", "smtp-sink", "job")  # processes whose CPU is one thread's
BUSY = 0.9         # a stage with the machine this busy was bound by the CPUs
ONE_THREAD = 0.85  # ... else one thread this busy (of a CPU) was what bound it


# -- windows (pure) --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Window:
    """Rows done over a stretch of time."""

    rows: int
    seconds: float

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else math.inf


Mark = tuple[int, float]  # rows done so far, epoch seconds


def cumulative(stamps: Sequence[tuple[float, int]]) -> list[Mark]:
    """Marks from stamps (epoch seconds, rows with that stamp) in time order: the rows done by each
    stamp, those of the first included. Pure."""
    done, marks = 0, []
    for at, rows in stamps:
        done += rows
        marks.append((done, at))
    return marks


def windows(marks: Sequence[Mark], every: int) -> list[Window]:
    """The stretches between the first mark and the last, cut at the first mark past each multiple
    of ``every`` rows; a last stretch of fewer than half ``every`` rows joins the one before. Pure."""
    if len(marks) < 2:
        return []
    ends = [marks[0]]
    for mark in marks[1:-1]:
        if mark[0] // every > ends[-1][0] // every:
            ends.append(mark)
    if len(ends) > 1 and marks[-1][0] - ends[-1][0] < every / 2:
        ends.pop()
    ends.append(marks[-1])
    return [Window(end[0] - start[0], end[1] - start[1]) for start, end in itertools.pairwise(ends)]


def overall(marks: Sequence[Mark]) -> Window:
    """From the first mark to the last: as bench/relay.py times a drain, the rows of the first
    stamp are not counted (they were done at its time). Pure."""
    if len(marks) < 2:
        raise BenchError(f"{len(marks)} stamp(s): a rate needs two")
    return Window(marks[-1][0] - marks[0][0], marks[-1][1] - marks[0][1])


def trend(rates: Sequence[float]) -> float | None:
    """A least-squares line through the rates in order: its value at the last over its value at
    the first (1.0: flat, below: decay), less swayed by one slow window than last / first. None
    for fewer than three rates or a line that starts at or below zero. Pure."""
    if len(rates) < 3:
        return None
    slope, intercept = statistics.linear_regression(range(len(rates)), rates)
    if intercept <= 0:
        return None
    return (intercept + slope * (len(rates) - 1)) / intercept


def window_rows(emails: int) -> int:
    """WINDOW_ROWS, or a tenth of a run too small for ten of them. Pure."""
    return max(1, min(WINDOW_ROWS, emails // 10))


def bound_by(cpus: Mapping[str, float], busy: float | None,
             thread: tuple[str, float] | None) -> str:
    """What bound a stage, from each process group's CPUs (CPU seconds over wall seconds), the
    machine's busy fraction and the busiest thread (a name and its CPUs): the CPUs when the
    machine was busy, else a thread that kept a CPU busy (a Python role's main thread holds the
    GIL), else none (the stage waited: round trips, batching, a server). Pure."""
    if not cpus or busy is None:
        return "-"
    if busy >= BUSY:
        return f"the CPUs (most: {max(cpus, key=lambda name: cpus[name])})"
    if thread is not None and thread[1] >= ONE_THREAD:
        return f"one thread: {thread[0]}"
    return "no CPU: waiting"


# -- CPU over a stage ------------------------------------------------------------------------------


def _children_cpu_s() -> float:
    """CPU seconds of this process's children that have exited and been waited for."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


@dataclasses.dataclass(frozen=True)
class Stage:
    name: str
    seconds: float
    cpu: CpuUsage | None
    threads: Mapping[str, float]  # "<role> <thread name>" -> CPU seconds, the busiest of each

    def cpus(self) -> dict[str, float]:
        """Each CPU_COLUMNS group's CPU seconds over the stage's wall seconds, and "others": the
        machine's busy CPUs less the watched processes' (whatever else ran, the kernel's work)."""
        if self.cpu is None or self.seconds <= 0:
            return {}
        watched = sum(self.cpu.processes.values()) / self.seconds
        return {**{column: self.cpu.of(prefix) / self.seconds for column, prefix in CPU_COLUMNS},
                "others": max(0.0, self.cpu.busy_fraction * self.cpu.cpus - watched)}

    def busiest_thread(self) -> tuple[str, float] | None:
        """The thread that used the most CPU, in CPUs: of the Python roles' threads and of the
        processes that have one (each PostgreSQL backend, smtp-sink, the job)."""
        if self.cpu is None or self.seconds <= 0:
            return None
        single = {name.replace(":", " "): seconds for name, seconds in self.cpu.processes.items()
                  if name.startswith(SINGLE_THREADED)}
        candidates = {**self.threads, **single}
        if not candidates:
            return None
        name = max(candidates, key=lambda n: candidates[n])
        return name, candidates[name] / self.seconds


class StageMeter:
    """The CPU of a stage's processes: the named ones, every postgres and java process (looked up
    again at each tick, so backends that come and go are counted up to their last tick), and the
    children of the benchmark that exited during the stage (the enqueueing process, `postroom
    purge`) as "job"; and each thread of the Python roles. Call tick() every second or two."""

    def __init__(self, name: str, named: Mapping[str, int]) -> None:
        self.name = name
        self._named = {"bench": os.getpid(), **named}
        self._started = time.monotonic()
        self._children_s = _children_cpu_s()
        self._first = sample(self._pids())
        self._seen: dict[str, float] = dict(self._first.processes) if self._first else {}
        self._last = self._first
        # Threads there at the start count from their CPU then; those that start later from 0.
        self._thread_base = self._threads()
        self._thread_last = dict(self._thread_base)

    def _pids(self) -> dict[str, int]:
        return {**self._named, **pids_named("postgres", "java")}

    def _threads(self) -> dict[tuple[str, str], float]:
        return {(role, thread): seconds for role in PYTHON_ROLES if role in self._named
                for thread, seconds in thread_cpu_s(self._named[role]).items()}

    def watch(self, name: str, pid: int) -> None:
        self._named[name] = pid

    def tick(self) -> None:
        now = sample(self._pids())
        if now is not None:
            self._seen.update(now.processes)
            self._last = now
        self._thread_last.update(self._threads())

    def stop(self) -> Stage:
        self.tick()
        seconds = time.monotonic() - self._started
        threads: dict[str, float] = {}
        for (role, thread), cpu_s in self._thread_last.items():
            used = cpu_s - self._thread_base.get((role, thread), 0.0)
            label = f"{role} {thread.split(' ', 1)[1]}"  # without its id: one line per name
            threads[label] = max(threads.get(label, 0.0), used)
        if self._first is None or self._last is None:
            return Stage(self.name, seconds, None, threads)
        self._seen["job"] = _children_cpu_s() - self._children_s
        after = CpuSample(self._seen, busy_s=self._last.busy_s, total_s=self._last.total_s)
        return Stage(self.name, seconds, usage(self._first, after), threads)


# -- looks at the database -------------------------------------------------------------------------


def _scalar(engine: sa.Engine, statement: str, **params: object) -> Any:
    with engine.connect() as conn:
        return conn.execute(sa.text(statement), params).scalar()


def _stamps(engine: sa.Engine, column: str, where: str = "TRUE") -> list[tuple[float, int]]:
    """(stamp, rows) of the outbox by ``column`` in time order, NULLs left out; one read of the
    table, after a stage."""
    with engine.connect() as conn:
        rows = conn.execute(sa.text(
            f"SELECT {column}, count(*) FROM outbox WHERE {column} IS NOT NULL AND {where} "
            "GROUP BY 1 ORDER BY 1")).all()
    return [(at.timestamp(), int(count)) for at, count in rows]


def _recorded_updates(engine: sa.Engine) -> int:
    """Rows the outbox has had updated, from PostgreSQL's statistics (flushed about once a
    second by each session): one entry to read, where counting the sent rows reads every row."""
    return int(_scalar(engine, "SELECT n_tup_upd FROM pg_stat_user_tables "
                               "WHERE relid = to_regclass('outbox')") or 0)


class SentLook:
    """wait_sent's look at the whole outbox: between counts, the updates since the sender started
    stand for the rows recorded (below ``emails``: only a count ends the wait); a count every
    EXACT_LOOK_EVERY_S (a row not delivered stops the run) and at each look once that estimate
    reaches ``emails``."""

    def __init__(self, engine: sa.Engine, emails: int) -> None:
        self._engine, self._emails = engine, emails
        self._base = _recorded_updates(engine)
        self._counted = time.monotonic()

    def __call__(self) -> SentProgress:
        estimate = _recorded_updates(self._engine) - self._base
        # The statistics may run ahead of the rows (a backend's counts arrive up to seconds late,
        # the relay's last marks among them): near the end, a count at most every END_LOOK_EVERY_S,
        # so the whole table is not read every look of the last window. The end's time comes from
        # the rows' stamps, not from the look that saw it.
        every = EXACT_LOOK_EVERY_S if estimate < self._emails else END_LOOK_EVERY_S
        if time.monotonic() < self._counted + every:
            return max(min(estimate, self._emails - 1), 0), 0, self._emails, None
        self._counted = time.monotonic()
        with self._engine.connect() as conn:
            sent, unsent, total, last = conn.execute(sa.text("""
                SELECT count(*) FILTER (WHERE status = 'sent'),
                       count(*) FILTER (WHERE status IN ('retrying', 'failed', 'dead')),
                       count(*), max(updated_at) FILTER (WHERE status = 'sent')
                FROM outbox""")).one()
        return int(sent), int(unsent), int(total), last if sent == self._emails else None


@dataclasses.dataclass(frozen=True)
class Sizes:
    """One table's bytes (heap, its indexes, its TOAST table) and PostgreSQL's count of its live
    and dead rows."""

    heap: int
    indexes: int
    toast: int
    live: int
    dead: int

    @property
    def total(self) -> int:
        return self.heap + self.indexes + self.toast


def _sizes(engine: sa.Engine) -> dict[str, Sizes]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text("""
            SELECT c.relname, pg_relation_size(c.oid), pg_indexes_size(c.oid),
                   COALESCE(pg_total_relation_size(NULLIF(c.reltoastrelid, 0)), 0),
                   s.n_live_tup, s.n_dead_tup
            FROM pg_class AS c JOIN pg_stat_user_tables AS s ON s.relid = c.oid
            WHERE c.oid = ANY(ARRAY[to_regclass('outbox'), to_regclass('outbox_queue'),
                                    to_regclass('sender_ledger')])""")).all()
    return {str(name): Sizes(*(int(v) for v in values)) for name, *values in rows}


def _mib(count: int) -> str:
    return f"{count / 2**20:,.1f}"


def _check_disk(engine: sa.Engine, emails: int) -> str:
    """Refuse a run the disk of PostgreSQL's data directory cannot hold; what it has free."""
    try:
        directory = str(_scalar(engine, "SHOW data_directory"))
    except sa.exc.DBAPIError:
        return "free disk unknown (data_directory not readable)"
    if not Path(directory).exists():
        return "free disk unknown (PostgreSQL's data directory is not on this machine)"
    free = shutil.disk_usage(directory).free
    needed = emails * DISK_BYTES_PER_EMAIL
    if free < needed:
        raise BenchError(f"{emails:,} emails need about {needed / 1e9:.1f} GB of disk, "
                         f"{directory} has {free / 1e9:.1f} GB free")
    return f"{free / 1e9:.0f} GB free for about {needed / 1e9:.1f} GB needed"


# -- stages ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Figures:
    """What one stage's stamps give: its rate over the stage and per window."""

    overall: Window
    windows: tuple[Window, ...]
    stamps: int  # distinct stamps: commits, relay rounds, recorder batches

    @property
    def last_over_first(self) -> float:
        return self.windows[-1].rows_per_s / self.windows[0].rows_per_s

    def spread(self) -> str:
        rates = [w.rows_per_s for w in self.windows]
        return f"{fmt_rate(min(rates))}..{fmt_rate(max(rates))}"

    def trend(self) -> str:
        fitted = trend([w.rows_per_s for w in self.windows])
        return "-" if fitted is None else f"{fitted:.2f}"


def _figures(marks: Sequence[Mark], every: int, what: str) -> Figures:
    found = windows(marks, every)
    if not found:
        raise BenchError(f"{what}: {len(marks)} stamp(s), too few for a window")
    return Figures(overall(marks), tuple(found), len(marks))


class Ticker:
    """Ticks ``meter`` at each call (every half second to two seconds: the CPU of a process that
    ends between two ticks is lost since the last); prints ``report()`` every PROGRESS_EVERY_S."""

    def __init__(self, meter: StageMeter, report: Callable[[], str]) -> None:
        self._meter, self._report = meter, report
        self._next = time.monotonic() + PROGRESS_EVERY_S

    def __call__(self) -> None:
        self._meter.tick()
        if time.monotonic() >= self._next:
            self._next = time.monotonic() + PROGRESS_EVERY_S
            progress(self._report())


def _enqueue(settings: Settings, engine: sa.Engine, emails: int) -> tuple[Figures, Stage]:
    """``emails`` rows in transactions of ROWS_PER_TXN, one enqueue call each, from a process of
    their own, as the relay part enqueues (bench.relay.enqueue_elsewhere)."""
    progress(f"backlog: enqueueing {emails:,} rows, {ROWS_PER_TXN:,} per transaction (separate "
             "process), no postroom process running")
    meter = StageMeter("enqueue", {})
    ticker = Ticker(meter, lambda: f"backlog: {_scalar(engine, 'SELECT max(id) FROM outbox') or 0:,} "
                                   f"of {emails:,} rows committed")
    report = relay.enqueue_elsewhere(relay.EnqueueJob(settings, emails, ROWS_PER_TXN, "backlog"),
                                     timeout_s=120 + emails / 500, waiting=ticker)
    stage = meter.stop()
    marks: list[Mark] = [(0, report.started_at)]
    for _, at in report.commits:
        marks.append((min(emails, marks[-1][0] + ROWS_PER_TXN), at))
    queued = _scalar(engine, "SELECT count(*) FROM outbox_queue")
    if queued != emails:
        raise BenchError(f"{queued} rows queued after enqueueing {emails}")
    return _figures(marks, window_rows(emails), "enqueue"), stage


def _drain(engine: sa.Engine, components: PostroomProcesses, emails: int,
           rss: dict[str, list[float | None]]) -> tuple[Figures, Stage]:
    """`postroom relay` alone over the whole backlog; its RSS once a tenth is published and at
    the end."""
    components.start("relay", "relay")
    components.wait_logged("relay started", relay.RELAY_START_TIMEOUT_S)
    pid = components.pids["relay"]
    meter = StageMeter("relay drain", {"relay": pid})
    first_id = int(_scalar(engine, "SELECT min(id) FROM outbox"))
    progress(f"backlog: `postroom relay` drains {emails:,} rows")
    published = [0]
    ticker = Ticker(meter, lambda: f"backlog: relay has published about {published[0]:,} of "
                                   f"{emails:,} rows")

    def on_poll(head: int) -> None:
        published[0] = head - first_id
        if not rss["relay"] and published[0] >= emails / 10:
            rss["relay"].append(rss_mib(pid))
        ticker()

    relay.wait_all_published(engine, components, timeout_s=60 + emails / 2_000,
                             poll_s=DRAIN_POLL_S, on_poll=on_poll)
    stage = meter.stop()
    if not rss["relay"]:
        rss["relay"].append(None)  # drained before a look saw a tenth of it
    rss["relay"].append(rss_mib(pid))
    marks = cumulative(_stamps(engine, "published_at"))
    if not marks or marks[-1][0] != emails:
        raise BenchError(f"{marks[-1][0] if marks else 0} of {emails} rows published")
    return _figures(marks, window_rows(emails), "relay drain"), stage


def _send(engine: sa.Engine, components: PostroomProcesses, server_pid: int, emails: int,
          rss: dict[str, list[float | None]]) -> tuple[Figures, Stage]:
    """`postroom recorder` and `postroom sender` start on the published backlog; until the last
    row is recorded sent. The sender's and the recorder's RSS once a tenth is recorded sent and at
    the end, the relay's at the end."""
    look = SentLook(engine, emails)
    meter = StageMeter("send + record", {"relay": components.pids["relay"],
                                         "smtp-sink": server_pid})
    for name in ("recorder", "sender"):
        meter.watch(name, components.start(name, name).pid)
    progress(f"backlog: `postroom sender` and `postroom recorder` started on {emails:,} published "
             "rows")
    pids = components.pids

    def on_progress(sent: int) -> None:
        if not rss["sender"] and sent >= emails / 10:
            for name in ("sender", "recorder"):
                rss[name].append(rss_mib(pids[name]))
        meter.tick()

    wait_sent(components, emails, 120 + emails / 200, look, lambda: first_error(engine),
              on_progress=on_progress, poll_s=POLL_S, tag="backlog")
    stage = meter.stop()
    for name in ("sender", "recorder", "relay"):
        if len(rss[name]) < (2 if name == "relay" else 1):
            rss[name].append(None)
        rss[name].append(rss_mib(pids[name]))
    marks = cumulative(_stamps(engine, "updated_at", "status = 'sent'"))
    return _figures(marks, window_rows(emails), "send + record"), stage


@dataclasses.dataclass(frozen=True)
class Purge:
    seconds: float
    outbox_rows: int
    ledger_rows: int
    plan: tuple[str, ...]  # what it printed before deleting


def _purge(engine: sa.Engine, components: PostroomProcesses, emails: int) -> tuple[Purge, Stage]:
    """`postroom purge --older-than 1s --force`, as a user runs it, with the pipeline running."""
    ended = _scalar(engine, "SELECT max(COALESCE(sent_at, updated_at)) FROM outbox")
    if isinstance(ended, dt.datetime):  # every row must have ended before the cutoff
        time.sleep(max(0.0, ended.timestamp() + 1.5 - time.time()))
    meter = StageMeter("purge", {})
    started = time.monotonic()
    process = components.start("purge", "purge", "--older-than", PURGE_AGE, "--force")
    progress(f"backlog: `postroom purge --older-than {PURGE_AGE} --force` started")
    deadline = started + 120 + emails / 1_000
    ticker = Ticker(meter, lambda: "backlog: purge: " + " ".join(components.log_tail("purge", lines=1)))
    while process.poll() is None:
        if time.monotonic() > deadline:
            process.kill()
            raise BenchError(f"postroom purge took over {deadline - started:.0f}s")
        ticker()
        time.sleep(DRAIN_POLL_S)
    seconds = time.monotonic() - started
    stage = meter.stop()
    log = components.log("purge")
    done = re.search(r"^deleted (\d+) outbox row\(s\) and (\d+) ledger row\(s\)$", log, re.MULTILINE)
    if process.returncode != 0 or done is None:
        raise BenchError(f"postroom purge exited with status {process.returncode}:\n  "
                         + "\n  ".join(components.log_tail("purge")))
    plan = tuple(line for line in log.splitlines()
                 if line.startswith(("cutoff ", "outbox: ", "ledger: ")))
    purge = Purge(seconds, int(done.group(1)), int(done.group(2)), plan)
    if purge.outbox_rows != emails:
        raise BenchError(f"postroom purge deleted {purge.outbox_rows} of {emails} outbox rows")
    return purge, stage


def _vacuum_state(engine: sa.Engine) -> tuple[int, int, bool, str]:
    """The outbox's autovacuum count and dead rows, whether a vacuum of it runs now, its phase."""
    with engine.connect() as conn:
        count, dead = conn.execute(sa.text(
            "SELECT autovacuum_count, n_dead_tup FROM pg_stat_user_tables "
            "WHERE relid = to_regclass('outbox')")).one()
        running = conn.execute(sa.text(
            "SELECT phase, heap_blks_scanned, heap_blks_total FROM pg_stat_progress_vacuum "
            "WHERE relid = to_regclass('outbox')")).one_or_none()
    phase = "" if running is None else (f"{running.phase}, {running.heap_blks_scanned:,} of "
                                        f"{running.heap_blks_total:,} heap blocks scanned")
    return int(count), int(dead), running is not None, phase


def _vacuum(engine: sa.Engine, emails: int, wait_s: float) -> tuple[str, Stage]:
    """Wait for an autovacuum of the outbox that starts after the purge; if none has run within
    ``wait_s``, VACUUM the three tables. Says which, and when."""
    meter = StageMeter("vacuum", {})
    started = time.monotonic()
    count, _, running, _ = _vacuum_state(engine)
    # A vacuum already running began before the purge ended: the one after it is the one.
    wanted = count + (2 if running else 1)
    progress(f"backlog: waiting up to {wait_s:.0f} s for autovacuum of the outbox")
    phase = ["not started"]
    ticker = Ticker(meter, lambda: f"backlog: autovacuum of the outbox: {phase[0]} "
                                   f"({time.monotonic() - started:.0f} s)")
    while time.monotonic() - started < wait_s:
        count, dead, running, now = _vacuum_state(engine)
        if count >= wanted and not running and dead < max(1_000, emails // 100):
            return (f"autovacuum, {time.monotonic() - started:.0f} s after the purge ended "
                    "(waited for, not started by the benchmark)"), meter.stop()
        phase[0] = now or "not running"
        ticker()
        time.sleep(POLL_S)
    progress(f"backlog: no autovacuum of the outbox within {wait_s:.0f} s: VACUUM by hand")
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for name in TABLES:
            conn.execute(sa.text(f"VACUUM {name}"))
    return (f"VACUUM by the benchmark, autovacuum not having run within {wait_s:.0f} s of the "
            "purge"), meter.stop()


# -- the benchmark ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Result:
    emails: int
    reference: tuple[relay.Drain, ...]
    reference_rows: int
    enqueue: Figures
    drain: Figures
    sent: Figures
    rss: Mapping[str, Sequence[float | None]]
    sizes: Mapping[str, Mapping[str, Sizes]]  # moment -> table -> sizes
    purge: Purge
    vacuum: str
    stages: tuple[Stage, ...]
    disk: str
    complaints: Mapping[str, Sequence[str]]

    @property
    def reference_drain(self) -> relay.Drain:
        """The median drain (the lower middle one of an even count), as the relay part reports."""
        return sorted(self.reference, key=lambda d: d.rows_per_s)[(len(self.reference) - 1) // 2]


def _reference(base: Settings, plan: relay.RelayPlan) -> tuple[tuple[relay.Drain, ...], int]:
    """The relay part's drain of its largest plan (10,000 rows per transaction), in a scratch of
    its own: its records must not reach the backlog's sender."""
    rows_per_txn, rows = plan.rows_by_txn_size[-1]
    with scratch(base, "backlog_ref") as settings:
        engine = make_engine(settings)
        try:
            return tuple(relay.measure_drain(settings, engine, rows_per_txn, rows, f"ref{n}")
                         for n in range(plan.drains)), rows
        finally:
            engine.dispose()


def run(base: Settings, options: Options) -> Section:
    emails = options.emails or (QUICK_EMAILS if options.quick else EMAILS)
    if emails < MIN_EMAILS:
        raise BenchError(f"a backlog of {emails:,} emails is too small to be timed (at least "
                         f"{MIN_EMAILS:,})")
    base = dataclasses.replace(base, topic_partitions=DELIVERY_PARTITIONS)
    progress(f"backlog: the relay's reference drain of {ROWS_PER_TXN:,}-row transactions")
    reference, reference_rows = _reference(base, relay.QUICK if options.quick else relay.FULL)
    concurrency = Settings().smtp_concurrency
    rss: dict[str, list[float | None]] = {"relay": [], "sender": [], "recorder": []}
    sizes: dict[str, dict[str, Sizes]] = {}
    with smtp_server(SINK) as server, scratch(base, "backlog") as settings, \
            tempfile.TemporaryDirectory(prefix="bench-backlog-") as logs:
        engine = make_engine(settings)
        try:
            disk = _check_disk(engine, emails)
            progress(f"backlog: {disk}")
            enqueued, enqueue_stage = _enqueue(settings, engine, emails)
            with PostroomProcesses(component_env(settings, server.port, concurrency),
                                   Path(logs)) as components:
                drained, drain_stage = _drain(engine, components, emails, rss)
                sent, send_stage = _send(engine, components, server.pid, emails, rss)
                sizes["before purge"] = _sizes(engine)
                purged, purge_stage = _purge(engine, components, emails)
                sizes["after purge"] = _sizes(engine)
                vacuum, vacuum_stage = _vacuum(
                    engine, emails, QUICK_AUTOVACUUM_WAIT_S if options.quick else AUTOVACUUM_WAIT_S)
                sizes["after vacuum"] = _sizes(engine)
                complaints = components.complaints()
        finally:
            engine.dispose()
    for name, lines in complaints.items():
        progress(f"backlog: postroom {name} logged {len(lines)} warnings/errors, e.g. {lines[0]}")
    return _section(Result(emails, reference, reference_rows, enqueued, drained, sent, rss, sizes,
                           purged, vacuum, (enqueue_stage, drain_stage, send_stage, purge_stage,
                                            vacuum_stage), disk, complaints), settings, concurrency)


def _rss(values: Sequence[float | None]) -> str:
    return " -> ".join("-" if v is None else f"{v:.0f}" for v in values)


def _growth(values: Sequence[float | None]) -> float | None:
    """The largest later RSS over the first one (the one at a tenth), None when one is missing."""
    if not values or values[0] is None or any(v is None for v in values[1:]):
        return None
    return max(v for v in values[1:] if v is not None) / values[0]


def _per_email(r: Result) -> str:
    """Bytes per email of each table before the purge."""
    before = r.sizes.get("before purge", {})
    return ", ".join(f"{name} {before[name].total / r.emails:,.0f} bytes" for name in TABLES
                     if name in before) + (" an email" if before else "")


def _section(r: Result, settings: Settings, concurrency: int) -> Section:
    every = window_rows(r.emails)
    ref = r.reference_drain
    drain_ratio = r.drain.overall.rows_per_s / ref.rows_per_s
    stages = (("enqueue", r.enqueue), ("relay drain", r.drain), ("sent (recorded)", r.sent))
    count = max(len(f.windows) for _, f in stages)
    window_table = [[str(k + 1), *(fmt_rate(f.windows[k].rows_per_s) if k < len(f.windows) else ""
                                   for _, f in stages)] for k in range(count)]
    cpu_rows = []
    for stage in r.stages:
        cpus, thread = stage.cpus(), stage.busiest_thread()
        cpu_rows.append([stage.name, f"{stage.seconds:,.1f}",
                         *(f"{cpus[column]:.2f}" if cpus else "-" for column in CPU_NAMES),
                         "-" if stage.cpu is None else f"{stage.cpu.busy_fraction:.0%}",
                         "-" if thread is None else f"{thread[0]} {thread[1]:.2f}",
                         bound_by(cpus, stage.cpu.busy_fraction if stage.cpu else None, thread)])
    size_rows = [[name if n == 0 else "", moment, _mib(s.heap), _mib(s.indexes), _mib(s.toast),
                  _mib(s.total), f"{s.live:,}", f"{s.dead:,}"]
                 for name in TABLES
                 for n, (moment, by_table) in enumerate(r.sizes.items())
                 if (s := by_table.get(name)) is not None]
    section = Section(f"Backlog: {r.emails:,} emails enqueued, drained, sent and recorded, "
                      "then purged")
    section.lines += [
        f"{r.emails:,} rows of a 500-byte body, one recipient each, enqueued {ROWS_PER_TXN:,} per "
        f"transaction (one enqueue call each, a process of its own) with no postroom process "
        f"running; then `postroom relay` alone (batch {settings.relay_batch_size:,}); then "
        f"`postroom sender` (SMTP concurrency {concurrency}, to smtp-sink) and `postroom recorder` "
        f"with the relay still running; {DELIVERY_PARTITIONS} partitions a topic; {r.disk}",
        "",
        *table(["stage", "rows", "seconds", "rows/s", "windows (rows)", "first window",
                "last window", "last / first", "line's last / first", "min..max"],
               [[name, f"{f.overall.rows:,}", f"{f.overall.seconds:,.1f}",
                 fmt_rate(f.overall.rows_per_s), f"{len(f.windows)} x ~{every:,}",
                 fmt_rate(f.windows[0].rows_per_s), fmt_rate(f.windows[-1].rows_per_s),
                 f"{f.last_over_first:.2f}", f.trend(), f.spread()] for name, f in stages]),
        "",
        f"rows/s per window of ~{every:,} rows (each stage's own windows):",
        *table(["window", *(name for name, _ in stages)], window_table),
        "",
        "enqueue: from the enqueueing process's first transaction to its last commit, windows cut "
        "at its commits. relay drain: as bench/relay.py times one, the rows published after the "
        "relay's first round over the time from that round's mark (published_at) to the last "
        f"one's, {r.drain.stamps:,} rounds. sent: from the first recorder batch's updated_at to "
        f"the last one's, rows recorded 'sent' ({r.sent.stamps:,} batches). A window ends at the "
        f"first stamp past each multiple of {every:,} rows; a last one of fewer than half that "
        "joins the one before. line's last / first: a least-squares line through the windows' "
        "rates, its value at the last window over its value at the first (below 1: decay).",
        "",
        f"Relay drain over the backlog against its drain of {r.reference_rows:,} rows in "
        f"{ROWS_PER_TXN:,}-row transactions (the relay part's, run here first in a scratch of its "
        f"own, {len(r.reference)} drain(s), the median): {fmt_rate(r.drain.overall.rows_per_s)} / "
        f"{fmt_rate(ref.rows_per_s)} rows/s = {drain_ratio:.2f} (reference drains "
        f"{' '.join(fmt_rate(d.rows_per_s) for d in sorted(r.reference, key=lambda d: d.rows_per_s))}"
        f"; its enqueue {fmt_rate(ref.enqueue_rows_per_s)} rows/s against "
        f"{fmt_rate(r.enqueue.overall.rows_per_s)} here; relay CPUs {ref.relay_cpus or 0:.2f}, "
        f"machine busy {ref.machine_busy or 0:.0%})",
        "",
        "RSS MiB once a tenth of its stage was done -> at its end (relay: of the drain -> end of "
        "the drain -> after the sending):",
        *(f"  {name}: {_rss(values)}" for name, values in r.rss.items()),
        "",
        "CPU per stage, in CPUs (CPU seconds over the stage's wall seconds): PostgreSQL is every "
        "postgres process, Kafka every java process (the broker and the schema registry), bench "
        "this process, job the children that ended in the stage (the enqueueing process, "
        "`postroom purge`), others the machine's busy CPUs less all those; machine busy: all "
        "CPUs, every process:",
        *table(["stage", "seconds", *CPU_NAMES, "machine busy", "busiest thread", "bound by"],
               cpu_rows),
        "busiest thread: of the relay's, the sender's and the recorder's threads (main: the one "
        "that runs Python; rdk:*: librdkafka's) and of the one-thread processes (each PostgreSQL "
        f"backend, smtp-sink, the job). bound by: the CPUs when the machine was at least {BUSY:.0%} "
        f"busy (the group with the largest share named), else a thread at {ONE_THREAD:.2f} CPUs "
        "or more, else nothing on the CPU (the stage waited: round trips, batching).",
        "",
        f"`postroom purge --older-than {PURGE_AGE} --force` with the pipeline running: "
        f"{r.purge.seconds:,.1f} s, {r.purge.outbox_rows:,} outbox rows and "
        f"{r.purge.ledger_rows:,} ledger rows deleted "
        f"({per_s(r.purge.outbox_rows + r.purge.ledger_rows, r.purge.seconds):,.0f} rows/s). "
        "It printed:",
        *(f"  {line}" for line in r.purge.plan),
        f"Vacuum: {r.vacuum}.",
        "",
        "Sizes MiB (pg_relation_size, pg_indexes_size, TOAST; rows live / dead as PostgreSQL's "
        "statistics count them):",
        *table(["table", "when", "heap", "indexes", "TOAST", "total", "live", "dead"], size_rows),
        *([f"before the purge: {per_email}"] if (per_email := _per_email(r)) else []),
        *(f"postroom {name} logged {len(lines)} warnings/errors, e.g. {lines[0]}"
          for name, lines in r.complaints.items()),
    ]
    section.targets += [
        Target(f"relay drain over a {r.emails:,}-row backlog / its {ROWS_PER_TXN:,}-rows-per-"
               "transaction drain", drain_ratio, TARGET_DRAIN_RATIO, "x"),
        Target(f"sent rows/s, last window / first window of ~{every:,} rows",
               r.sent.last_over_first, TARGET_SENT_RATIO, "x"),
    ]
    for name in ("sender", "relay"):
        growth = _growth(r.rss[name])
        if growth is not None:
            section.targets.append(Target(
                f"{name} RSS growth over the backlog (largest later / at a tenth)", growth,
                TARGET_RSS_GROWTH, "x", higher_is_better=False))
    return section
