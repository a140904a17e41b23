"""Relay benchmark: committed outbox rows to broker-acked records (drain, end to end) and latency.

Rows come from a separate enqueueing process; `postroom relay`, in a process of its own as in
production, drains them or publishes while they arrive; latency is `published_at` less the commit
time at 1,000 rows/s.
"""

from __future__ import annotations

import contextlib
import cProfile
import dataclasses
import math
import multiprocessing
import os
import pstats
import queue
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from bench.cpu import pids_named, sample, usage
from bench.report import (
    BenchError,
    Options,
    Section,
    Target,
    fmt_rate,
    per_s,
    percentile,
    progress,
    table,
)
from bench.scratch import scratch
from bench.workload import enqueue_rows, recipients
from postroom import kafka
from postroom.devkit.processes import PostroomProcesses
from postroom.devkit.scratch import scratch_env
from postroom.errors import first_line
from postroom.relay.db import make_engine
from postroom.relay.publisher import Relay
from postroom.settings import ENV_PREFIX, Settings

TARGET_ROWS_PER_S = 20_000.0
TARGET_P99_MS = 50.0
ENQUEUE_TIMEOUT_S = 240.0
PUBLISH_TIMEOUT_S = 120.0
POLL_S = 0.05
RELAY_START_TIMEOUT_S = 30.0
# A drain round normally takes tens of milliseconds; when no row is published for this long, the
# benchmark prints what the relay may wait on (claims, PostgreSQL's sessions, the relay's log).
STALLED_ROUND_S = 5.0


@dataclasses.dataclass(frozen=True)
class RelayPlan:
    """How much to enqueue: rows per transaction -> rows in all; the paced load and its length."""

    rows_by_txn_size: tuple[tuple[int, int], ...]
    latency_run_s: float
    drains: int = 3  # drains per size: the figure is their median, the spread is shown
    offered_rows_per_s: int = 1_000
    rows_per_paced_txn: int = 10


# One-row transactions enqueue at ~700/s per process: SINGLE_ROW_ENQUEUERS processes fill their
# drain, which is smaller (30,000 rows drain in about a second; 10,000 had made a figure of nine
# rounds, which one hiccup of the machine could halve).
FULL = RelayPlan(((1, 30_000), (100, 100_000), (10_000, 100_000)), latency_run_s=10.0)
SINGLE_ROW_ENQUEUERS = 4
QUICK = RelayPlan(((1, 3_000), (100, 5_000), (10_000, 10_000)), latency_run_s=3.0, drains=1)


# -- the enqueueing process ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class EnqueueJob:
    """What the enqueueing process does: ``total_rows`` in transactions of ``rows_per_txn``."""

    settings: Settings
    total_rows: int
    rows_per_txn: int
    key_prefix: str
    interval_s: float | None = None  # paced: one transaction every interval_s; None: flat out


@dataclasses.dataclass(frozen=True)
class EnqueueReport:
    started_at: float   # epoch seconds, just before the first transaction
    finished_at: float  # epoch seconds, after the last commit
    commits: tuple[tuple[str, float], ...]  # each transaction: (message key, epoch right after commit)
    worst_lateness_s: float  # paced runs: how late the most delayed transaction began


def run_enqueue(job: EnqueueJob) -> EnqueueReport:
    """Enqueue as ``job`` says; paced jobs keep to an absolute schedule. Every commit's time is
    recorded."""
    engine = make_engine(job.settings)
    try:
        with engine.connect() as conn:  # connect before the clock starts
            conn.execute(sa.text("SELECT 1"))
        commits: list[tuple[str, float]] = []
        worst_lateness = 0.0
        done = 0
        started_at, started = time.time(), time.monotonic()
        for index in range(math.ceil(job.total_rows / job.rows_per_txn)):
            if job.interval_s is not None:
                delay = started + index * job.interval_s - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                else:
                    worst_lateness = max(worst_lateness, -delay)
            key = f"{job.key_prefix}-{index}"
            batch = recipients(min(job.rows_per_txn, job.total_rows - done), first=done)
            with engine.begin() as conn:
                enqueue_rows(conn, key, batch)
            commits.append((key, time.time()))
            done += len(batch)
        return EnqueueReport(started_at, time.time(), tuple(commits), worst_lateness)
    finally:
        engine.dispose()


def _enqueue_worker(job: EnqueueJob, results: Any) -> None:
    try:
        results.put(run_enqueue(job))
    except Exception as exc:  # noqa: BLE001 - handed to the parent, which raises it
        results.put(f"{type(exc).__name__}: {first_line(exc)[:300]}")


def enqueue_elsewhere(job: EnqueueJob, timeout_s: float = ENQUEUE_TIMEOUT_S,
                      waiting: Callable[[], None] | None = None) -> EnqueueReport:
    """Run ``job`` in a fresh process (its own interpreter and GIL) and return its report;
    ``waiting()`` is called every half second meanwhile."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    process = context.Process(target=_enqueue_worker, args=(job, results), name="bench-enqueue",
                              daemon=True)
    process.start()
    deadline = time.monotonic() + timeout_s
    outcome: object = None
    try:
        while outcome is None:
            alive = process.is_alive()  # read before get(): a finished child has flushed its result
            try:
                outcome = results.get(timeout=0.5)
            except queue.Empty:
                if waiting is not None:
                    waiting()
                if not alive:
                    raise BenchError("the enqueueing process exited with status "
                                     f"{process.exitcode} and no result") from None
                if time.monotonic() > deadline:
                    raise BenchError(f"the enqueueing process took over {timeout_s:.0f}s") from None
    finally:
        process.join(10)
        if process.is_alive():
            process.terminate()
            process.join(5)
    if isinstance(outcome, str):
        raise BenchError(f"the enqueueing process failed: {outcome}")
    if not isinstance(outcome, EnqueueReport):
        raise BenchError(f"the enqueueing process returned {outcome!r}")
    return outcome


def _enqueuer_count(job: EnqueueJob) -> int:
    """How many processes share ``job``: flat-out one-row transactions are split."""
    return SINGLE_ROW_ENQUEUERS if job.rows_per_txn == 1 and job.interval_s is None else 1


def enqueue_filled(job: EnqueueJob) -> EnqueueReport:
    """Run ``job`` in _enqueuer_count(job) processes at once, each its share of the rows under its
    own message keys. The report spans them all."""
    count = _enqueuer_count(job)
    if count == 1:
        return enqueue_elsewhere(job)
    share = math.ceil(job.total_rows / count)
    jobs = [dataclasses.replace(job, total_rows=min(share, job.total_rows - first),
                                key_prefix=f"{job.key_prefix}-p{n}")
            for n, first in enumerate(range(0, job.total_rows, share))]
    with ThreadPoolExecutor(len(jobs), thread_name_prefix="bench-enqueue") as pool:
        reports = list(pool.map(enqueue_elsewhere, jobs))
    return EnqueueReport(min(r.started_at for r in reports), max(r.finished_at for r in reports),
                         (), 0.0)


# -- measuring -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Drain:
    """One drain of pre-enqueued rows."""

    enqueue_rows_per_s: float
    rows_per_s: float
    rounds: int
    mean_round_s: float
    relay_cpus: float | None     # CPUs the relay's process kept busy while draining
    postgres_cpus: float | None  # ... every PostgreSQL process (its backends)
    kafka_cpus: float | None     # ... every java process (the broker of the local stack)
    machine_busy: float | None   # fraction of all CPUs busy meanwhile


@dataclasses.dataclass(frozen=True)
class ThroughputRow:
    rows_per_txn: int
    rows: int
    drains: tuple[Drain, ...]
    concurrent_enqueue_rows_per_s: float
    end_to_end_rows_per_s: float

    @property
    def median(self) -> Drain:
        """The drain of median rate (the lower middle one of an even count)."""
        return sorted(self.drains, key=lambda d: d.rows_per_s)[(len(self.drains) - 1) // 2]


@dataclasses.dataclass(frozen=True)
class LatencyResult:
    rows: int
    offered_rows_per_s: float
    worst_lateness_s: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    min_ms: float
    relay_rounds: int


def _truncate(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text("TRUNCATE outbox, outbox_queue RESTART IDENTITY"))


def _unpublished(engine: sa.Engine) -> int:
    """Rows not yet published: the relay's queue, not a scan of the outbox."""
    with engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM outbox_queue")).scalar_one())


def _queue_head(engine: sa.Engine) -> int | None:
    """The lowest id still queued, None when every row is published. This runs every POLL_S
    while the relay works and must not take the machine's time from it: it reads one entry of
    the queue's primary key, where count(*) read the whole queue (8-10 ms of a CPU each time on
    100,000 rows, 15-20% of one CPU at this rate)."""
    with engine.connect() as conn:
        return conn.execute(sa.text("SELECT id FROM outbox_queue ORDER BY id LIMIT 1")).scalar()


def wait_all_published(engine: sa.Engine, relays: PostroomProcesses,
                       timeout_s: float = PUBLISH_TIMEOUT_S, poll_s: float = POLL_S,
                       on_poll: Callable[[int], None] | None = None) -> None:
    """Wait until no row is unpublished; when the relay stops making progress, say what it waits on.
    ``on_poll(head)`` is called at every look that finds rows queued, with the lowest id queued."""
    deadline = time.monotonic() + timeout_s
    last_head, last_progress, diagnosed = -1, time.monotonic(), False
    while time.monotonic() < deadline:
        relays.check_alive()
        head = _queue_head(engine)
        if head is None:
            return
        if on_poll is not None:
            on_poll(head)
        if head != last_head:
            last_head, last_progress = head, time.monotonic()
        elif not diagnosed and time.monotonic() - last_progress > STALLED_ROUND_S:
            diagnosed = True
            progress(f"relay: no progress for {STALLED_ROUND_S:.0f} s (row {head} still queued)")
            for line in [*_stall_report(engine), *relays.log_tail()]:
                progress(f"  {line}")
        time.sleep(poll_s)
    raise BenchError(f"timed out after {timeout_s:.0f}s waiting for every row to be published")


def _stall_report(engine: sa.Engine) -> list[str]:
    """What a stalled relay may be waiting on: the queue's claims, PostgreSQL's sessions."""
    with engine.connect() as conn:
        claims = conn.execute(sa.text("""
            SELECT count(*) FILTER (WHERE claimed_until > now()) AS claimed,
                   min(claimed_until - now()) FILTER (WHERE claimed_until > now()) AS expires_in,
                   count(*) AS unpublished
            FROM outbox_queue""")).one()
        sessions = conn.execute(sa.text(r"""
            SELECT pid, state, wait_event_type, wait_event, now() - xact_start AS xact_age,
                   left(regexp_replace(query, '\s+', ' ', 'g'), 70) AS query
            FROM pg_stat_activity
            WHERE datname = current_database() AND pid <> pg_backend_pid() AND state <> 'idle'
            """)).all()
        waiting_locks = conn.execute(sa.text("SELECT count(*) FROM pg_locks WHERE NOT granted")
                                     ).scalar_one()
    lines = [f"outbox_queue: {claims.unpublished:,} unpublished, {claims.claimed:,} of them claimed "
             f"(first claim expires in {claims.expires_in}); ungranted PostgreSQL locks: "
             f"{waiting_locks}"]
    lines += [f"pg pid {r.pid} {r.state} wait={r.wait_event_type}:{r.wait_event} "
              f"xact_age={r.xact_age} {r.query}" for r in sessions]
    return lines


@contextlib.contextmanager
def relay_processes(settings: Settings, count: int = 1) -> Iterator[PostroomProcesses]:
    """``count`` `postroom relay` processes on the scratch schema and prefix, as production runs
    them, once each has logged that its loop runs (schema and broker checked)."""
    env = {**os.environ, **scratch_env(settings), ENV_PREFIX + "LOG_LEVEL": "INFO"}
    with tempfile.TemporaryDirectory(prefix="postroom-bench-relay-") as logs, \
            PostroomProcesses(env, Path(logs), {f"relay{n}": "relay" for n in range(count)}
                              ) as relays:
        relays.wait_logged("relay started", RELAY_START_TIMEOUT_S)
        yield relays


def measure_drain(settings: Settings, engine: sa.Engine, rows_per_txn: int, rows: int,
                  tag: str, relays: int = 1) -> Drain:
    """Pre-enqueue ``rows`` (another process) and drain them with ``relays`` `postroom relay`s."""
    _truncate(engine)
    job = EnqueueJob(settings, rows, rows_per_txn, tag)
    enqueuers = _enqueuer_count(job)
    progress(f"relay: enqueueing {rows:,} rows, {rows_per_txn:,} per transaction ("
             + ("separate process)" if enqueuers == 1 else f"{enqueuers} separate processes)"))
    filled = enqueue_filled(job)
    if _unpublished(engine) != rows:
        raise BenchError(f"expected {rows} unpublished rows after enqueueing")
    progress(f"relay: draining {rows:,} rows with {relays} `postroom relay` "
             f"(batch {settings.relay_batch_size:,})")
    with relay_processes(settings, relays) as running:  # started: not timing its start-up
        watched = {**{f"relay:{name}": pid for name, pid in running.pids.items()},
                   **pids_named("postgres", "java")}
        before, window_started = sample(watched), time.monotonic()
        wait_all_published(engine, running)
        cpu, window_s = usage(before, sample(watched)), time.monotonic() - window_started
    with engine.connect() as conn:
        # Every mark stamps its rows with its own transaction time: rounds are distinct stamps.
        first, last, rounds = conn.execute(sa.text(
            "SELECT min(published_at), max(published_at), count(DISTINCT published_at) "
            "FROM outbox")).one()
        first_round = conn.execute(sa.text("SELECT count(*) FROM outbox WHERE published_at = :t"),
                                   {"t": first}).scalar_one()
    if rounds < 2:
        raise BenchError(f"a drain of {rows:,} rows took {rounds} round: it needs more rows than "
                         f"one batch ({settings.relay_batch_size:,}) to be timed")
    # From the first round's mark to the last one's: the rows of every round after the first.
    drain_s = last.timestamp() - first.timestamp()
    drain = Drain(enqueue_rows_per_s=per_s(rows, filled.finished_at - filled.started_at),
                  rows_per_s=per_s(rows - first_round, drain_s), rounds=rounds,
                  mean_round_s=drain_s / max(rounds - 1, 1),
                  relay_cpus=cpu.of("relay:") / window_s if cpu else None,
                  postgres_cpus=cpu.of("postgres:") / window_s if cpu else None,
                  kafka_cpus=cpu.of("java:") / window_s if cpu else None,
                  machine_busy=cpu.busy_fraction if cpu else None)
    progress(f"relay: drained at {fmt_rate(drain.rows_per_s)} rows/s")
    return drain


def measure_throughput(settings: Settings, engine: sa.Engine, rows_per_txn: int, rows: int,
                       drains: int) -> ThroughputRow:
    """Drain pre-enqueued rows ``drains`` times; then enqueue and relay at the same time."""
    done = tuple(measure_drain(settings, engine, rows_per_txn, rows, f"drain{rows_per_txn}-{n}")
                 for n in range(drains))
    _truncate(engine)
    progress(f"relay: enqueueing {rows:,} rows, {rows_per_txn:,} per transaction, while "
             "`postroom relay` publishes")
    with relay_processes(settings) as running:
        concurrent = enqueue_filled(EnqueueJob(settings, rows, rows_per_txn, f"e2e{rows_per_txn}"))
        wait_all_published(engine, running)
    with engine.connect() as conn:
        last = conn.execute(sa.text("SELECT max(published_at), count(*) FROM outbox")).one()
    if last[1] != rows:
        raise BenchError(f"expected {rows} rows, found {last[1]}")
    return ThroughputRow(
        rows_per_txn=rows_per_txn, rows=rows, drains=done,
        concurrent_enqueue_rows_per_s=per_s(rows, concurrent.finished_at - concurrent.started_at),
        end_to_end_rows_per_s=per_s(rows, last[0].timestamp() - concurrent.started_at))


def measure_latency(settings: Settings, engine: sa.Engine, plan: RelayPlan) -> LatencyResult:
    """A paced load from another process while Relay.run() publishes; latency per row."""
    _truncate(engine)
    transactions = round(plan.latency_run_s * plan.offered_rows_per_s / plan.rows_per_paced_txn)
    rows = transactions * plan.rows_per_paced_txn
    interval_s = plan.rows_per_paced_txn / plan.offered_rows_per_s
    progress(f"relay: latency at {plan.offered_rows_per_s:,} rows/s offered "
             f"({plan.rows_per_paced_txn} rows every {interval_s * 1000:.0f} ms for "
             f"{plan.latency_run_s:.0f} s) while `postroom relay` publishes")
    with relay_processes(settings) as running:
        paced = enqueue_elsewhere(EnqueueJob(settings, rows, plan.rows_per_paced_txn, "lat",
                                             interval_s=interval_s))
        wait_all_published(engine, running)
    committed_at = dict(paced.commits)
    with engine.connect() as conn:
        published = conn.execute(sa.text("SELECT message_key, published_at FROM outbox")).all()
        rounds = conn.execute(sa.text("SELECT count(DISTINCT published_at) FROM outbox")
                              ).scalar_one()
    if len(published) != rows:
        raise BenchError(f"expected {rows} rows, found {len(published)}")
    latencies_ms = [(at.timestamp() - committed_at[key]) * 1000 for key, at in published]
    return LatencyResult(
        rows=rows, offered_rows_per_s=per_s(rows, paced.finished_at - paced.started_at),
        worst_lateness_s=paced.worst_lateness_s,
        p50_ms=percentile(latencies_ms, 50), p99_ms=percentile(latencies_ms, 99),
        max_ms=max(latencies_ms), min_ms=min(latencies_ms), relay_rounds=rounds)


# Where a drain's time goes on the thread that steps the rounds: a round's phases, found by the
# functions that carry them out. The marks and the claims ahead run on the database threads; this
# thread sees them only as the waits for them.
_PHASES = (
    ("encode a claimed row as Avro", "codec.py", "encode_values"),
    ("produce() into librdkafka", "producing.py", "_produce"),
    ("flush(): waiting for the broker's acks", "~", "<method 'flush' of 'cimpl.Producer' objects>"),
    ("waiting for the database threads (the claim ahead, the last batch's marks)", "_base.py",
     "result"),
)
PROFILE_TOP = 12


def profile_drain(settings: Settings, engine: sa.Engine, rows_per_txn: int, rows: int) -> list[str]:
    """Drain ``rows`` pre-enqueued rows under cProfile; the phases of a round and top costs."""
    _truncate(engine)
    progress(f"relay: profiling a drain of {rows:,} rows ({rows_per_txn:,} per transaction)")
    enqueue_elsewhere(EnqueueJob(settings, rows, rows_per_txn, f"prof{rows_per_txn}"))
    relay = Relay(settings, engine)
    relay.producer.list_topics(timeout=10)  # connected before the clock starts
    profiler = cProfile.Profile()
    started = time.perf_counter()
    profiler.enable()
    with relay.rounds() as rounds:
        for _ in range(rows + 1):  # bounded, as in measure_throughput
            if rounds.step() == 0:
                break
    profiler.disable()
    wall_s = time.perf_counter() - started
    raw = pstats.Stats(profiler).stats  # type: ignore[attr-defined]  # (file, line, name) -> timings

    def cumulative(file_suffix: str, name: str) -> float:
        return sum(v[3] for (file, _, func), v in raw.items()
                   if func == name and file.endswith(file_suffix))

    total = cumulative("publisher.py", "step")
    phases = [(label, cumulative(file, name)) for label, file, name in _PHASES]
    phases.append(("CLAIM_DUE transaction (not ahead) and the rest of the round",
                   total - sum(seconds for _, seconds in phases)))
    top = sorted(raw.items(), key=lambda item: item[1][2], reverse=True)[:PROFILE_TOP]
    return [
        f"Profile: one drain of {rows:,} rows under cProfile, {wall_s:.2f} s wall "
        f"({per_s(rows, wall_s):,.0f} rows/s; the profiler slows Python code, not waiting)",
        *table(["round phase", "seconds", "share", "us/row"],
               [[label, f"{seconds:.2f}", f"{seconds / total:.0%}", f"{seconds / rows * 1e6:.0f}"]
                for label, seconds in phases]),
        "",
        *table(["function (own time)", "calls", "seconds", "share"],
               [[_function_name(file, line, func), f"{timings[1]:,}", f"{timings[2]:.2f}",
                 f"{timings[2] / total:.0%}"] for (file, line, func), timings in top]),
    ]


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


_SHORTEN = ("site-packages/", f"{Path(__file__).resolve().parents[1]}/",
            f"{sysconfig.get_paths()['stdlib']}/")


def _function_name(file: str, line: int, func: str) -> str:
    if file == "~":
        return func  # a builtin or C method: its name says where it lives
    for prefix in _SHORTEN:
        if prefix in file:
            file = file.split(prefix, 1)[1]
    return f"{file}:{line} {func}"


def run(base: Settings, options: Options) -> Section:
    """The whole relay benchmark in a scratch schema and topic prefix."""
    plan = QUICK if options.quick else FULL
    section = Section("Relay: committed outbox rows -> broker-acknowledged records")
    profile: list[str] = []
    with scratch(base, "relay") as settings:
        engine = make_engine(settings)
        try:
            results = [measure_throughput(settings, engine, size, rows, plan.drains)
                       for size, rows in plan.rows_by_txn_size]
            size, rows = plan.rows_by_txn_size[-1]
            two_relays = measure_drain(settings, engine, size, rows, "two-relays", relays=2)
            latency = measure_latency(settings, engine, plan)
            if options.profile:
                profile = profile_drain(settings, engine, size, rows)
        finally:
            engine.dispose()
    producer = kafka.producer_config(settings)
    section.lines += [
        f"relay batch {settings.relay_batch_size:,} rows, {settings.topic_partitions} partitions, "
        f"producer acks={producer['acks']} linger.ms={producer['linger.ms']} "
        f"compression={producer['compression.type']}; 500-byte bodies; rows enqueued by a "
        f"separate process ({SINGLE_ROW_ENQUEUERS} at once for one-row transactions: their "
        "enqueue rates are those processes' together)",
        "",
        *table(["rows/txn", "rows", "enqueue rows/s", "drain rows/s", "drains (slow..fast)",
                "rounds", "mean round ms", "relay CPUs", "PostgreSQL", "Kafka", "machine busy",
                "e2e rows/s", "(enqueue rows/s meanwhile)"],
               [[f"{r.rows_per_txn:,}", f"{r.rows:,}", fmt_rate(r.median.enqueue_rows_per_s),
                 fmt_rate(r.median.rows_per_s),
                 " ".join(fmt_rate(d.rows_per_s) for d in sorted(r.drains, key=lambda d: d.rows_per_s)),
                 str(r.median.rounds), f"{r.median.mean_round_s * 1000:,.0f}",
                 _share(r.median.relay_cpus), _share(r.median.postgres_cpus),
                 _share(r.median.kafka_cpus), _share(r.median.machine_busy),
                 fmt_rate(r.end_to_end_rows_per_s), fmt_rate(r.concurrent_enqueue_rows_per_s)]
                for r in results]),
        "",
        f"drain: pre-enqueued rows, then `postroom relay` starts; the rows published after its "
        f"first round over the time from that round's mark to the last one's. {plan.drains} "
        "drains per size, each of freshly enqueued rows: the figure (and the columns after it) is "
        "the median drain. relay CPUs: CPU time of the relay's process over the drain's wall "
        "time; PostgreSQL, Kafka: the same for every postgres and every java process; machine "
        "busy: all CPUs.",
        "e2e: first transaction begun -> last row published, enqueueing while `postroom relay` "
        "publishes.",
        "",
        f"Two `postroom relay` processes sharing one drain ({rows:,} rows, {size:,} per "
        f"transaction): {fmt_rate(two_relays.rows_per_s)} rows/s, relay CPUs "
        f"{_share(two_relays.relay_cpus)}, PostgreSQL {_share(two_relays.postgres_cpus)}, Kafka "
        f"{_share(two_relays.kafka_cpus)}, machine busy {_share(two_relays.machine_busy)}.",
        "",
        f"Commit-to-publish latency, {latency.rows:,} rows offered at "
        f"{fmt_rate(latency.offered_rows_per_s)} rows/s "
        f"(worst transaction start {latency.worst_lateness_s * 1000:.1f} ms behind schedule):",
        f"  p50 {latency.p50_ms:.1f} ms   p99 {latency.p99_ms:.1f} ms   max {latency.max_ms:.1f} ms   "
        f"min {latency.min_ms:.1f} ms   ({latency.relay_rounds:,} relay rounds)",
        "  latency = outbox.published_at (set after the broker's ack) - client clock right after "
        "COMMIT",
        *(["", *profile] if profile else []),
    ]
    section.targets += [
        *(Target(f"relay drain, {r.rows_per_txn:,} rows/txn (median of {len(r.drains)})",
                 r.median.rows_per_s, TARGET_ROWS_PER_S, "rows/s") for r in results),
        Target(f"p99 commit-to-publish at {plan.offered_rows_per_s:,} rows/s", latency.p99_ms,
               TARGET_P99_MS, "ms", higher_is_better=False),
    ]
    return section
