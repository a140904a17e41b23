"""Delivery benchmark: the seed's design, postroom end to end and a bare aiosmtplib client, side by side.

Same messages to smtp-sink (no latency) and postroom's devsmtp at 100 ms per message; postroom runs
as `postroom relay|sender|recorder` subprocesses, timed from enqueue commit to the last row sent.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import datetime as dt
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from email.message import EmailMessage
from email.utils import make_msgid
from pathlib import Path

import aiosmtplib
import sqlalchemy as sa

from bench import seed_baseline
from bench.cpu import CpuUsage, sample, usage
from bench.report import BenchError, Options, Section, Target, fmt_rate, per_s, progress, table
from bench.scratch import scratch
from bench.workload import BODY, MAIL_FROM, SUBJECT, enqueue_rows, recipients
from postroom.devkit.ports import free_port
from postroom.devkit.processes import PostroomProcesses, postroom_command, stop_process
from postroom.devkit.scratch import scratch_env
from postroom.settings import ENV_PREFIX, Settings
from relay.db import make_engine

HOST = "127.0.0.1"
DEVSMTP_LATENCY_MS = 100
TARGET_POSTROOM_OVER_SEED = 50.0
TARGET_POSTROOM_OVER_BARE = 0.7
SERVER_START_TIMEOUT_S = 15.0
WARMUP_TIMEOUT_S = 120.0
POLL_S = 0.05
PROGRESS_EVERY_S = 5.0
SMTP_TIMEOUT_S = 30.0

SEED, POSTROOM, BARE = "seed", "postroom", "bare"
DESIGN_LABELS = {
    SEED: "seed: SQLite outbox + smtplib, 1 connection",
    POSTROOM: "postroom: relay -> Kafka -> sender -> recorder",
    BARE: "bare aiosmtplib client",
}
COMPONENTS = ("relay", "recorder", "sender")


@dataclasses.dataclass(frozen=True)
class ServerPlan:
    """One SMTP server and how many emails each design sends to it."""

    name: str
    latency_ms: int
    emails: Mapping[str, int]

    @property
    def label(self) -> str:
        if self.latency_ms:
            return f"devsmtp ({self.latency_ms} ms/message)"
        return "smtp-sink (no latency)"


FULL = (ServerPlan("smtp-sink", 0, {SEED: 5_000, POSTROOM: 5_000, BARE: 5_000}),
        ServerPlan("devsmtp", DEVSMTP_LATENCY_MS, {SEED: 100, POSTROOM: 2_000, BARE: 2_000}))
QUICK = (ServerPlan("smtp-sink", 0, {SEED: 1_000, POSTROOM: 1_000, BARE: 1_000}),
         ServerPlan("devsmtp", DEVSMTP_LATENCY_MS, {SEED: 30, POSTROOM: 400, BARE: 400}))


@dataclasses.dataclass(frozen=True)
class Server:
    port: int
    pid: int


@dataclasses.dataclass(frozen=True)
class Timed:
    """What one design's run measured: its duration and the CPU each process used meanwhile."""

    seconds: float
    cpu: CpuUsage | None
    note: str = ""


@dataclasses.dataclass(frozen=True)
class Run:
    server: ServerPlan
    design: str
    emails: int
    timed: Timed

    @property
    def seconds(self) -> float:
        return self.timed.seconds

    @property
    def per_s(self) -> float:
        return per_s(self.emails, self.seconds)


# -- servers ---------------------------------------------------------------------------------------



def _wait_for_port(port: int, process: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise BenchError(f"{what} exited with status {process.returncode} before listening")
        try:
            with socket.create_connection((HOST, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise BenchError(f"{what} did not listen on {HOST}:{port} within {SERVER_START_TIMEOUT_S:.0f}s")


@contextlib.contextmanager
def smtp_server(plan: ServerPlan) -> Iterator[Server]:
    """Start the plan's server on a free loopback port in its own process."""
    port = free_port()
    if plan.latency_ms:
        env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX + "DEVSMTP_")}
        command = [*postroom_command(), "devsmtp", "--host", HOST, "--port", str(port),
                   "--latency", str(plan.latency_ms)]
    else:
        sink = shutil.which("smtp-sink") or "/usr/sbin/smtp-sink"
        if not Path(sink).exists():
            raise BenchError("smtp-sink not found: it comes with Postfix (apt-get install postfix; "
                             "the daemon itself need not run)")
        env = dict(os.environ)
        # As root smtp-sink wants a user to drop to; the last argument is its listen backlog.
        command = [sink, *(["-u", "nobody"] if os.geteuid() == 0 else []), f"{HOST}:{port}", "1000"]
    progress(f"delivery: starting {plan.label} on {HOST}:{port}")
    process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for_port(port, process, plan.label)
        yield Server(port, process.pid)
    finally:
        stop_process(process)


# -- (a) the seed ----------------------------------------------------------------------------------


def run_seed(server: Server, emails: int) -> Timed:
    """From the SQLite enqueue commit to the last row marked sent."""
    pids = {"client": os.getpid(), "server": server.pid}
    with tempfile.TemporaryDirectory(prefix="bench-seed-") as tmp:
        db = seed_baseline.open_outbox(Path(tmp) / "outbox.db")
        try:
            now = dt.datetime.now(dt.UTC)
            seed_baseline.enqueue(db, recipients(emails), SUBJECT, BODY, None, now)
            before, started = sample(pids), time.perf_counter()
            outcome = seed_baseline.deliver_due(db, now, HOST, server.port)
            seconds, after = time.perf_counter() - started, sample(pids)
            sent = db.execute("SELECT count(*) FROM outbox WHERE status='sent'").fetchone()[0]
        finally:
            db.close()
    if sent != emails:
        problems = collections.Counter(v for v in outcome.values() if v != "sent")
        raise BenchError(f"seed design sent {sent} of {emails}: {dict(problems)}")
    return Timed(seconds, usage(before, after))


# -- (b) postroom end to end -----------------------------------------------------------------------


def component_env(settings: Settings, port: int) -> dict[str, str]:
    """The environment of the postroom processes: the scratch names, the server, default SMTP."""
    inherited = {k: v for k, v in os.environ.items()
                 if not k.startswith((ENV_PREFIX + "SMTP_", ENV_PREFIX + "DEVSMTP_",
                                      ENV_PREFIX + "METRICS_"))}
    return {
        **inherited,
        **scratch_env(settings),
        ENV_PREFIX + "SMTP_HOST": HOST,
        ENV_PREFIX + "SMTP_PORT": str(port),
        ENV_PREFIX + "SMTP_CONCURRENCY": str(Settings().smtp_concurrency),
        ENV_PREFIX + "MAIL_FROM": MAIL_FROM,
        ENV_PREFIX + "LOG_LEVEL": "INFO",
    }


def _progress_of(engine: sa.Engine, key: str) -> sa.Row[tuple[int, int, int, dt.datetime | None]]:
    with engine.connect() as conn:
        return conn.execute(sa.text("""
            SELECT count(*) FILTER (WHERE status = 'sent'),
                   count(*) FILTER (WHERE status IN ('retrying', 'failed', 'dead')),
                   count(*),
                   max(updated_at)
            FROM outbox WHERE message_key = :key"""), {"key": key}).one()


def _first_error(engine: sa.Engine, key: str) -> str:
    with engine.connect() as conn:
        row = conn.execute(sa.text(
            "SELECT status, last_error FROM outbox WHERE message_key = :key "
            "AND status IN ('retrying', 'failed', 'dead') LIMIT 1"), {"key": key}).one_or_none()
    return "" if row is None else f"{row[0]}: {row[1]}"


def _wait_all_sent(engine: sa.Engine, components: PostroomProcesses, key: str, emails: int,
                   timeout_s: float) -> dt.datetime:
    """Wait until every row of ``key`` is sent; return when the recorder wrote the last one."""
    deadline = time.monotonic() + timeout_s
    next_report = time.monotonic() + PROGRESS_EVERY_S
    while time.monotonic() < deadline:
        sent, unsent, total, last = _progress_of(engine, key)
        if unsent:
            # The default retry tiers start at 5 minutes: a run with a retry cannot finish in time.
            raise BenchError(f"{unsent} of {total} rows were not delivered "
                             f"({_first_error(engine, key)})")
        if sent == emails and last is not None:
            return last
        components.check_alive()
        if time.monotonic() >= next_report:
            progress(f"delivery: postroom has {sent:,} of {emails:,} rows recorded sent")
            next_report += PROGRESS_EVERY_S
        time.sleep(POLL_S)
    raise BenchError(f"timed out after {timeout_s:.0f}s with {sent} of {emails} rows sent")


def run_postroom(base: Settings, server: Server, emails: int) -> Timed:
    """From the enqueue commit to the last row recorded sent; notes what the logs complained of."""
    with scratch(base, "delivery") as settings, \
            tempfile.TemporaryDirectory(prefix="bench-postroom-") as tmp:
        engine = make_engine(settings)
        try:
            progress(f"delivery: starting postroom {', '.join(COMPONENTS)} "
                     f"(SMTP concurrency {Settings().smtp_concurrency})")
            with PostroomProcesses(component_env(settings, server.port), Path(tmp),
                                   {name: name for name in COMPONENTS}) as components:
                pids = {**components.pids, "server": server.pid}
                with engine.begin() as conn:
                    enqueue_rows(conn, "warmup", ["warmup@example.com"])
                _wait_all_sent(engine, components, "warmup", 1, WARMUP_TIMEOUT_S)
                progress(f"delivery: postroom is up (one warm-up email went through); "
                         f"enqueueing {emails:,} rows in one transaction")
                with engine.begin() as conn:
                    enqueue_rows(conn, "bench", recipients(emails))
                committed_at, before = time.time(), sample(pids)
                last = _wait_all_sent(engine, components, "bench", emails, 60 + emails / 20)
                seconds, after = last.timestamp() - committed_at, sample(pids)
            complaints = components.complaints()
        finally:
            engine.dispose()
    for name, lines in complaints.items():
        progress(f"delivery: postroom {name} logged {len(lines)} warnings/errors, e.g. {lines[0]}")
    note = "; ".join(f"{name}: {len(lines)} warnings/errors" for name, lines in complaints.items())
    return Timed(seconds, usage(before, after), note)


# -- (c) the bare client ---------------------------------------------------------------------------


async def _bare_send(port: int, addresses: list[str], connections: int) -> None:
    queue = collections.deque(addresses)

    async def worker() -> None:
        smtp = aiosmtplib.SMTP(hostname=HOST, port=port, start_tls=False, timeout=SMTP_TIMEOUT_S,
                               local_hostname="bench.localhost")
        await smtp.connect()
        try:
            while queue:
                recipient = queue.popleft()
                message = EmailMessage()
                message["From"], message["To"], message["Subject"] = MAIL_FROM, recipient, SUBJECT
                message["Message-ID"] = make_msgid(domain="example.com")
                message.set_content(BODY)
                await smtp.send_message(message)
        finally:
            await smtp.quit()

    await asyncio.gather(*(worker() for _ in range(connections)))


def run_bare(server: Server, emails: int, connections: int) -> Timed:
    """``connections`` persistent aiosmtplib connections sending one email per recipient."""
    pids = {"client": os.getpid(), "server": server.pid}
    addresses = recipients(emails)
    before, started = sample(pids), time.perf_counter()
    asyncio.run(_bare_send(server.port, addresses, connections))
    seconds, after = time.perf_counter() - started, sample(pids)
    return Timed(seconds, usage(before, after))


# -- the benchmark ---------------------------------------------------------------------------------


def run(base: Settings, options: Options) -> Section:
    concurrency = Settings().smtp_concurrency
    runs: list[Run] = []
    for plan in QUICK if options.quick else FULL:
        with smtp_server(plan) as server:
            emails = plan.emails[SEED]
            progress(f"delivery: seed design, {emails:,} emails to {plan.label}")
            runs.append(Run(plan, SEED, emails, run_seed(server, emails)))
            emails = plan.emails[POSTROOM]
            progress(f"delivery: postroom end to end, {emails:,} emails to {plan.label}")
            runs.append(Run(plan, POSTROOM, emails, run_postroom(base, server, emails)))
            emails = plan.emails[BARE]
            progress(f"delivery: bare aiosmtplib x{concurrency}, {emails:,} emails to {plan.label}")
            runs.append(Run(plan, BARE, emails, run_bare(server, emails, concurrency)))
    return _section(runs, concurrency)


def _section(runs: list[Run], concurrency: int) -> Section:
    rate = {(r.server.name, r.design): r.per_s for r in runs}
    labels = {**DESIGN_LABELS, POSTROOM: f"{DESIGN_LABELS[POSTROOM]} (x{concurrency})",
              BARE: f"{DESIGN_LABELS[BARE]} (x{concurrency} connections)"}
    rows = []
    for index, r in enumerate(runs):
        first = index == 0 or runs[index - 1].server is not r.server
        cpu = r.timed.cpu
        client = sum(s for name, s in cpu.processes.items() if name != "server") if cpu else None
        rows.append([r.server.label if first else "", labels[r.design], f"{r.emails:,}",
                     f"{r.seconds:.2f}", fmt_rate(r.per_s),
                     "-" if cpu is None else f"{client * 1000 / r.emails:.2f}",
                     "-" if cpu is None else f"{cpu.processes['server'] * 1000 / r.emails:.2f}",
                     "-" if cpu is None else f"{cpu.busy_fraction:.0%}"])
    sink, slow = "smtp-sink", "devsmtp"
    ceiling = concurrency * 1000 / DEVSMTP_LATENCY_MS
    section = Section("Delivery: enqueue commit -> last email accepted by the SMTP server")
    section.lines += [
        "500-byte plain-text body, one recipient per email, N distinct recipients; every server "
        "and every postroom component in a process of its own",
        "",
        *table(["server", "design", "emails", "seconds", "emails/s", "client CPU ms/email",
                "server CPU ms/email", "machine busy"], rows),
        "",
        "seed: enqueue commit -> deliver_due() returned with every row 'sent'.",
        "postroom: enqueue commit -> the recorder's update of the last row to 'sent' "
        "(outbox.updated_at), after a warm-up email.",
        "bare: first connect -> last reply, one message per recipient, no outbox.",
        "client CPU: the design's own processes (postroom: relay + sender + recorder; Kafka and "
        "PostgreSQL not counted); machine busy: all CPUs, every process.",
        *(f"postroom on {r.server.label}: {r.timed.cpu.describe()}" for r in runs
          if r.design == POSTROOM and r.timed.cpu is not None),
        *(f"postroom logs on {r.server.label}: {r.timed.note}" for r in runs if r.timed.note),
        "",
        "Ratios:",
        f"  postroom / seed       on {slow}: {rate[slow, POSTROOM] / rate[slow, SEED]:.1f}x   "
        f"on {sink}: {rate[sink, POSTROOM] / rate[sink, SEED]:.2f}x",
        f"  postroom / bare client on {slow}: {rate[slow, POSTROOM] / rate[slow, BARE]:.2f}x   "
        f"on {sink}: {rate[sink, POSTROOM] / rate[sink, BARE]:.2f}x",
        f"  bare client / seed    on {slow}: {rate[slow, BARE] / rate[slow, SEED]:.1f}x   "
        f"on {sink}: {rate[sink, BARE] / rate[sink, SEED]:.2f}x",
        f"  ({concurrency} connections to a server that takes {DEVSMTP_LATENCY_MS} ms per message "
        f"cap any client at {ceiling:,.0f} emails/s; one connection at "
        f"{1000 / DEVSMTP_LATENCY_MS:.0f}/s: at most {concurrency}x apart.)",
    ]
    section.targets += [
        Target(f"postroom / seed on devsmtp {DEVSMTP_LATENCY_MS} ms",
               rate[slow, POSTROOM] / rate[slow, SEED], TARGET_POSTROOM_OVER_SEED, "x"),
        Target("postroom / bare aiosmtplib on smtp-sink", rate[sink, POSTROOM] / rate[sink, BARE],
               TARGET_POSTROOM_OVER_BARE, "x"),
    ]
    return section
