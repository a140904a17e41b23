"""Latency at a steady load (issue 26, target 7): postroom fed at half of what it delivers to
smtp-sink in a burst (measured first, in the same run), in transactions of 10 emails and, in the
rounds between, of one email each; each email's time from its commit to the server's 250 and to
its row recorded sent; CPU per email of each role while fed steadily, the figures
docs/benchmarks.md's capacity model is built from."""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import statistics
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import sqlalchemy as sa

from bench.cpu import CpuUsage, sample, usage
from bench.delivery import DELIVERY_PARTITIONS, FULL, QUICK, ROLES, component_env, smtp_server, wait_all_sent
from bench.report import BenchError, Options, Section, Target, fmt_rate, per_s, progress, table
from bench.scratch import scratch
from bench.workload import BODY, MAIL_FROM, SUBJECT, enqueue_rows, recipients
from postroom import enqueue
from postroom.devkit.processes import PostroomProcesses
from postroom.relay.db import make_engine
from postroom.settings import Settings

TARGET_P99_MS = 250.0
LOAD_SHARE = 0.5  # of the burst's rate: "a steady load of half the fast-server capacity"
BURST_EMAILS, QUICK_BURST_EMAILS = 5_000, 1_000
STEADY_S, QUICK_STEADY_S = 30.0, 8.0
ROUNDS, QUICK_ROUNDS = 3, 1  # of each feed
# Emails per transaction of the two feeds, their rounds interleaved: the target's is the first. A
# job commits many emails at once (the burst the capacity comes from is one transaction); one
# email per transaction at the same rate adds a commit, a wake-up and a relay round per email.
FEEDS = (10, 1)
WARMUP_TIMEOUT_S = 120.0
DRAIN_TIMEOUT_S = 120.0
KEY = "steady"


@dataclasses.dataclass(frozen=True)
class Steady:
    """One steady round: the rate fed, and each email's latencies in ms."""

    fed_per_s: float
    per_transaction: int
    to_250_ms: tuple[float, ...]
    to_recorded_ms: tuple[float, ...]
    cpu: CpuUsage | None

    @property
    def emails(self) -> int:
        return len(self.to_250_ms)


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank), 0 < q <= 1."""
    ordered = sorted(values)
    if not ordered:
        raise BenchError("no latency measured")
    return ordered[min(len(ordered), max(1, math.ceil(q * len(ordered)))) - 1]


def feed(engine: sa.Engine, rate: float, seconds: float, round_no: int,
         per_transaction: int) -> dict[str, float]:
    """``rate`` emails a second for ``seconds``, one enqueue call each, ``per_transaction`` of them
    in each transaction, paced from the start (a late transaction is not made up for by a burst:
    the next waits its own time). Returns each recipient's commit time (time.time() once the
    commit returned)."""
    committed: dict[str, float] = {}
    began = time.monotonic()
    n = 0
    while (due := began + n / rate) < began + seconds:
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        addresses = [f"s{round_no}-{n + k}@example.com" for k in range(per_transaction)]
        with engine.begin() as conn:
            for k, address in enumerate(addresses):
                enqueue(conn, key=f"{KEY}-{round_no}-{n + k}", recipients=[address],
                        subject=SUBJECT, body=BODY, sender=MAIL_FROM)
        at = time.time()
        committed.update((address, at) for address in addresses)
        n += per_transaction
    return committed


def _wait_drained(engine: sa.Engine, components: PostroomProcesses, round_no: int,
                  emails: int) -> list[tuple[str, dt.datetime, dt.datetime]]:
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    pattern = f"{KEY}-{round_no}-%"
    while True:
        with engine.connect() as conn:
            rows = conn.execute(sa.text(
                "SELECT recipient, sent_at, updated_at FROM outbox "
                "WHERE message_key LIKE :pattern AND status = 'sent'"),
                {"pattern": pattern}).all()
        if len(rows) == emails:
            return [(r[0], r[1], r[2]) for r in rows]
        components.check_alive()
        if time.monotonic() > deadline:
            raise BenchError(f"latency: {len(rows)} of {emails} steady emails sent after "
                             f"{DRAIN_TIMEOUT_S:.0f}s")
        time.sleep(0.5)


def steady_round(engine: sa.Engine, components: PostroomProcesses, pids: dict[str, int],
                 rate: float, seconds: float, round_no: int, per_transaction: int) -> Steady:
    progress(f"latency: round {round_no + 1}: feeding {fmt_rate(rate)} emails/s for {seconds:.0f}s,"
             f" {per_transaction} a transaction")
    committed: dict[str, float] = {}
    # The feed runs in a thread of its own so that this one's CPU sample brackets it exactly.
    feeder = threading.Thread(target=lambda: committed.update(
        feed(engine, rate, seconds, round_no, per_transaction)), name="bench-feed")
    before = sample(pids)
    started = time.monotonic()
    feeder.start()
    feeder.join()
    fed_s = time.monotonic() - started
    rows = _wait_drained(engine, components, round_no, len(committed))
    after = sample(pids)
    to_250, to_recorded = [], []
    for recipient, sent_at, updated_at in rows:
        at = committed[recipient]
        to_250.append((sent_at.timestamp() - at) * 1000)
        to_recorded.append((updated_at.timestamp() - at) * 1000)
    return Steady(per_s(len(committed), fed_s), per_transaction, tuple(to_250), tuple(to_recorded),
                  usage(before, after))


def run(base: Settings, options: Options) -> Section:
    plan = (QUICK if options.quick else FULL)[0]  # smtp-sink: the fast server
    burst = QUICK_BURST_EMAILS if options.quick else BURST_EMAILS
    seconds = QUICK_STEADY_S if options.quick else STEADY_S
    rounds = QUICK_ROUNDS if options.quick else ROUNDS
    concurrency = Settings().smtp_concurrency
    base = dataclasses.replace(base, topic_partitions=DELIVERY_PARTITIONS)
    with smtp_server(plan) as server, scratch(base, "latency") as settings, \
            tempfile.TemporaryDirectory(prefix="bench-latency-") as tmp:
        engine = make_engine(settings)
        try:
            progress("latency: starting postroom relay, recorder, sender")
            with PostroomProcesses(component_env(settings, server.port, concurrency), Path(tmp),
                                   {"relay": "relay", "recorder": "recorder",
                                    "sender": "sender"}) as components:
                pids = dict(components.pids)
                with engine.begin() as conn:
                    enqueue_rows(conn, "warmup", ["warmup@example.com"])
                wait_all_sent(engine, components, "warmup", 1, WARMUP_TIMEOUT_S)
                progress(f"latency: a burst of {burst:,} emails in one transaction, for the "
                         "capacity the steady load is half of")
                with engine.begin() as conn:
                    enqueue_rows(conn, "burst", recipients(burst, tag="b"))
                committed_at = time.time()
                last = wait_all_sent(engine, components, "burst", burst, 60 + burst / 20)
                capacity = per_s(burst, last.timestamp() - committed_at)
                steady = [steady_round(engine, components, pids, capacity * LOAD_SHARE, seconds,
                                       n, FEEDS[n % len(FEEDS)])
                          for n in range(rounds * len(FEEDS))]
            complaints = components.complaints()
        finally:
            engine.dispose()
    for name, lines in complaints.items():
        progress(f"latency: postroom {name} logged {len(lines)} warnings/errors, e.g. {lines[0]}")
    return _section(capacity, burst, seconds, steady)


def _ms(value: float) -> str:
    return f"{value:,.1f}"


def _section(capacity: float, burst: int, seconds: float, steady: list[Steady]) -> Section:
    rows = []
    for n, s in enumerate(steady, 1):
        cpu = s.cpu
        rows.append([f"round {n}", f"{s.per_transaction}", fmt_rate(s.fed_per_s), f"{s.emails:,}",
                     *(_ms(quantile(s.to_250_ms, q)) for q in (0.5, 0.99)),
                     _ms(max(s.to_250_ms)),
                     *(_ms(quantile(s.to_recorded_ms, q)) for q in (0.5, 0.99)),
                     *("-" if cpu is None else f"{cpu.of(role) * 1000 / s.emails:.2f}"
                       for role in ROLES),
                     "-" if cpu is None else f"{cpu.busy_fraction:.0%}"])
    p99s = {size: sorted(quantile(s.to_250_ms, 0.99) for s in steady if s.per_transaction == size)
            for size in FEEDS}
    section = Section("Latency at a steady load: enqueue commit -> 250 and -> recorded")
    section.lines += [
        f"smtp-sink; a burst of {burst:,} emails in one transaction went through at "
        f"{fmt_rate(capacity)} emails/s (commit -> last recorded); then {len(steady)} round(s) of "
        f"{seconds:.0f}s fed at {LOAD_SHARE:.0%} of that, one enqueue call per email, "
        f"{' or '.join(str(size) for size in FEEDS)} emails a transaction (rounds interleaved), "
        "500-byte body",
        "",
        *table(["", "emails/txn", "fed/s", "emails", "->250 p50 ms", "p99", "max",
                "->recorded p50 ms", "p99", *(f"{role} CPU ms/email" for role in ROLES),
                "machine busy"], rows),
        "",
        "->250: from the commit returning in the feeding thread to the sender's time of the "
        "server's 250 (outbox.sent_at, milliseconds); ->recorded: to the recorder's transaction "
        "(outbox.updated_at). One clock: every process on this machine.",
    ]
    for size, figures in p99s.items():
        section.lines.append(
            f"p99 over the rounds of {size} email(s) a transaction: median "
            f"{_ms(statistics.median(figures))} ms"
            + (f", {_ms(figures[0])}-{_ms(figures[-1])}" if len(figures) > 1 else " (one round)"))
    target_feed = FEEDS[0]
    section.targets.append(Target(
        f"steady load, {target_feed} emails a transaction: commit -> 250 p99 (median of rounds)",
        statistics.median(p99s[target_feed]), TARGET_P99_MS, "ms", higher_is_better=False))
    return section
