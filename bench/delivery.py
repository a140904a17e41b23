"""Delivery benchmark: the seed's design, django-post-office, postroom end to end, a bare
aiosmtplib client and a bare pipelined client (what the server allows), side by side, to
smtp-sink (no latency) and bench.slowsink at 100 ms per message; postroom runs as `postroom
relay|sender|recorder` subprocesses, timed from enqueue commit to the last row recorded sent; its
senders' duplicate window (the final reply read to the sent mark's commit) comes from their own
histogram, scraped from their metrics port."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import datetime as dt
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from email.message import EmailMessage
from email.utils import make_msgid
from pathlib import Path
from typing import Any

import aiosmtplib
import sqlalchemy as sa
from confluent_kafka import ConsumerGroupState, KafkaException

from bench import seed_baseline
from bench.cpu import CpuUsage, pids_named, rss_mib, sample, usage
from bench.peers import postoffice
from bench.report import BenchError, Options, Section, Target, fmt_rate, per_s, progress, table
from bench.scratch import scratch
from bench.workload import BODY, MAIL_FROM, SUBJECT, enqueue_own_rows, enqueue_rows, recipients
from postroom.devkit.histograms import SENT_MARK_WINDOW, Buckets, scrape_histogram
from postroom.devkit.ports import free_port
from postroom.devkit.processes import PostroomProcesses, stop_process
from postroom.devkit.scratch import scratch_env
from postroom.kafka import make_admin
from postroom.relay.db import make_engine
from postroom.settings import ENV_PREFIX, Settings

HOST = "127.0.0.1"
REPO = Path(__file__).resolve().parents[1]  # where `python -m bench.slowsink` finds the package
SLOW_LATENCY_MS = 100
# Issue 26's targets (issue 14's before them: 2x, 2x, 0.9 at x20, 50x the seed at x64).
TARGET_OVER_SEED_ON_SINK = 3.0        # job start -> last sent, both designs
TARGET_OVER_POSTOFFICE_ON_SINK = 3.0  # commit -> last sent against its send phase
TARGET_OF_CEILING_AT_20 = 0.95
TARGET_OF_CEILING_AT_64 = 0.85
TARGET_CPU_MS_PER_EMAIL = 0.5
TARGET_RSS_GROWTH = 1.2  # end RSS over start RSS across the backlog: "flat"
WIDE_CONCURRENCY = 64
POSTOFFICE_THREADS = 20
SERVER_START_TIMEOUT_S = 15.0
WARMUP_TIMEOUT_S = 120.0
ROUNDS = 3  # runs of each design per server (the backlog: one); the median is reported
# How often the wait for the last row looks at the outbox. Each look counts the run's rows (11 ms of
# PostgreSQL's CPU at 6,000 rows); every 50 ms that took a fifth of a CPU from the pipeline being
# measured. The end of a run is the last row's updated_at, not the look that saw it, so looking
# less often delays only the CPU sample (by less than this: idle processes, a few ms of CPU).
POLL_S = 0.5
PROGRESS_EVERY_S = 5.0
SMTP_TIMEOUT_S = 30.0
# postroom's topics here have the product's default partition count, not the local stack's 3 (a
# test-speed choice): three partitions split 2:1 between two senders, and one sent two-thirds of
# the mail while the machine had CPU to spare.
DELIVERY_PARTITIONS = Settings().topic_partitions

SEED, POSTOFFICE, BARE, WIRE, WIRE_WIDE = "seed", "post-office", "bare", "wire", "wire-64"
POSTROOM, POSTROOM_WIDE, POSTROOM_TWO = "postroom", "postroom-64", "postroom-2"
POSTROOM_OWN = "postroom-own"  # an invoice run: each email a subject and a body of its own
POSTROOM_OWN_HTML = "postroom-own-html"  # the same with an HTML part of its own
BACKLOG = "postroom-backlog"
DESIGN_LABELS = {
    SEED: "seed: SQLite outbox + smtplib, 1 connection",
    POSTOFFICE: f"django-post-office 3.12, SQLite, {POSTOFFICE_THREADS} threads",
    POSTROOM: "postroom: relay -> Kafka -> sender -> recorder",
    POSTROOM_WIDE: "postroom: relay -> Kafka -> sender -> recorder",
    POSTROOM_TWO: "postroom, two sender processes",
    POSTROOM_OWN: "postroom, each email its own subject and body",
    POSTROOM_OWN_HTML: "postroom, each email its own subject, body and HTML",
    BACKLOG: "postroom, one backlog (sender RSS watched)",
    BARE: "bare aiosmtplib client",
    WIRE: "bare asyncio client, pipelined (the server's bound)",
    WIRE_WIDE: "bare asyncio client, pipelined (the server's bound)",
}
POSTROOM_DESIGNS = (POSTROOM, POSTROOM_WIDE, POSTROOM_TWO, POSTROOM_OWN, POSTROOM_OWN_HTML,
                    BACKLOG)
WIDE_DESIGNS = (POSTROOM_WIDE, WIRE_WIDE)
ROLES = ("relay", "recorder", "sender")
# The local stack's processes (PostgreSQL's, the broker's JVM): counted as the machine's, not as
# a design's own CPU; named "<command>:<pid>" in a run's CPU figures.
STACK_COMMANDS = ("postgres", "java")


@dataclasses.dataclass(frozen=True)
class ServerPlan:
    """One SMTP server and how many emails each design sends to it."""

    name: str
    latency_ms: int
    emails: Mapping[str, int]

    @property
    def label(self) -> str:
        if self.latency_ms:
            return f"slowsink ({self.latency_ms} ms/message)"
        return "smtp-sink (no latency)"


FULL = (ServerPlan("smtp-sink", 0, {SEED: 5_000, POSTOFFICE: 5_000, POSTROOM: 5_000,
                                    POSTROOM_TWO: 5_000, POSTROOM_OWN: 5_000,
                                    POSTROOM_OWN_HTML: 5_000, BARE: 5_000, WIRE: 5_000,
                                    BACKLOG: 100_000}),
        ServerPlan("slowsink", SLOW_LATENCY_MS, {SEED: 100, POSTOFFICE: 2_000, POSTROOM: 2_000,
                                                   POSTROOM_WIDE: 2_000, BARE: 2_000, WIRE: 2_000,
                                                   WIRE_WIDE: 2_000}))
QUICK = (ServerPlan("smtp-sink", 0, {SEED: 1_000, POSTOFFICE: 1_000, POSTROOM: 1_000,
                                     POSTROOM_TWO: 1_000, POSTROOM_OWN: 1_000,
                                     POSTROOM_OWN_HTML: 1_000, BARE: 1_000, WIRE: 1_000,
                                     BACKLOG: 5_000}),
         ServerPlan("slowsink", SLOW_LATENCY_MS, {SEED: 30, POSTOFFICE: 400, POSTROOM: 400,
                                                    POSTROOM_WIDE: 400, BARE: 400, WIRE: 400,
                                                    WIRE_WIDE: 400}))


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
    rss_mib: tuple[float, float] | None = None  # the sender's resident memory at start and end
    window: Buckets | None = None  # postroom: its senders' duplicate window over the run
    job_seconds: float | None = None  # seed and postroom: from the job's start (its enqueue)
    # slowsink: the client's turn-around per message over the run (bench.slowsink.Turnaround)
    turnaround: Mapping[str, Mapping[str, float]] | None = None
    # postroom: its first and its last 250 (outbox.sent_at), in seconds after the commit
    sent_span: tuple[float, float] | None = None


@dataclasses.dataclass(frozen=True)
class Run:
    """A design's runs against one server: its figures are the median run's (by duration)."""

    server: ServerPlan
    design: str
    emails: int
    timings: tuple[Timed, ...]

    @property
    def timed(self) -> Timed:
        ordered = sorted(self.timings, key=lambda t: t.seconds)
        return ordered[(len(ordered) - 1) // 2]

    @property
    def seconds(self) -> float:
        return self.timed.seconds

    @property
    def per_s(self) -> float:
        return per_s(self.emails, self.seconds)

    @property
    def job_per_s(self) -> float | None:
        """From the job's start (enqueue included) to the last sent: the median run's."""
        seconds = sorted(t.job_seconds for t in self.timings if t.job_seconds is not None)
        return per_s(self.emails, seconds[(len(seconds) - 1) // 2]) if seconds else None

    @property
    def spread(self) -> str:
        """The slowest and the fastest run, in emails/s; empty for a single run."""
        if len(self.timings) < 2:
            return ""
        rates = sorted(per_s(self.emails, t.seconds) for t in self.timings)
        return f"{fmt_rate(rates[0])}-{fmt_rate(rates[-1])}"


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
        env = dict(os.environ)
        command = [sys.executable, "-m", "bench.slowsink", "--host", HOST, "--port", str(port),
                   "--delay-ms", str(plan.latency_ms)]
    else:
        sink = shutil.which("smtp-sink") or "/usr/sbin/smtp-sink"
        if not Path(sink).exists():
            raise BenchError("smtp-sink not found: it comes with Postfix (apt-get install postfix; "
                             "the daemon itself need not run)")
        env = dict(os.environ)
        # As root smtp-sink wants a user to drop to; the last argument is its listen backlog.
        command = [sink, *(["-u", "nobody"] if os.geteuid() == 0 else []), f"{HOST}:{port}", "1000"]
    progress(f"delivery: starting {plan.label} on {HOST}:{port}")
    process = subprocess.Popen(command, env=env, cwd=REPO, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for_port(port, process, plan.label)
        yield Server(port, process.pid)
    finally:
        stop_process(process)


def take_turnaround(server: Server) -> dict[str, dict[str, float]]:
    """slowsink's turn-around figures since the last call (its XTURN), which starts them again."""
    with socket.create_connection((HOST, server.port), timeout=SMTP_TIMEOUT_S) as sock, \
            sock.makefile("rwb") as wire:
        wire.readline()  # greeting
        wire.write(b"XTURN\r\nQUIT\r\n")
        wire.flush()
        reply = wire.readline()
    if not reply.startswith(b"250 "):
        raise BenchError(f"slowsink answered XTURN with {reply[:80]!r}")
    figures: dict[str, dict[str, float]] = json.loads(reply[4:])
    return figures


# -- (a) the seed ----------------------------------------------------------------------------------


def run_seed(server: Server, emails: int) -> Timed:
    """From the SQLite enqueue commit to the last row marked sent."""
    pids = {"client": os.getpid(), "server": server.pid}
    with tempfile.TemporaryDirectory(prefix="bench-seed-") as tmp:
        db = seed_baseline.open_outbox(Path(tmp) / "outbox.db")
        try:
            now = dt.datetime.now(dt.UTC)
            job_started = time.perf_counter()
            seed_baseline.enqueue(db, recipients(emails), SUBJECT, BODY, None, now)
            before, started = sample(pids), time.perf_counter()
            outcome = seed_baseline.deliver_due(db, now, HOST, server.port)
            seconds, after = time.perf_counter() - started, sample(pids)
            job_seconds = time.perf_counter() - job_started
            sent = db.execute("SELECT count(*) FROM outbox WHERE status='sent'").fetchone()[0]
        finally:
            db.close()
    if sent != emails:
        problems = collections.Counter(v for v in outcome.values() if v != "sent")
        raise BenchError(f"seed design sent {sent} of {emails}: {dict(problems)}")
    return Timed(seconds, usage(before, after), job_seconds=job_seconds)


# -- (b) postroom end to end -----------------------------------------------------------------------


def component_env(settings: Settings, port: int, concurrency: int) -> dict[str, str]:
    """The environment of the postroom processes: the scratch names, the server, the default SMTP
    settings but ``concurrency`` (connections, and sends at once to the one destination)."""
    inherited = {k: v for k, v in os.environ.items()
                 if not k.startswith((ENV_PREFIX + "SMTP_", ENV_PREFIX + "DEVSMTP_",
                                      ENV_PREFIX + "METRICS_"))}
    return {
        **inherited,
        **scratch_env(settings),
        ENV_PREFIX + "SMTP_HOST": HOST,
        ENV_PREFIX + "SMTP_PORT": str(port),
        ENV_PREFIX + "SMTP_CONCURRENCY": str(concurrency),
        # Every recipient here is at example.com, one destination: its limit (20 sends at once by
        # default, as Postfix's) would hold a wider run to 20, as it would a user's.
        ENV_PREFIX + "DESTINATION_CONCURRENCY": str(concurrency),
        ENV_PREFIX + "MAIL_FROM": MAIL_FROM,
        ENV_PREFIX + "LOG_LEVEL": "INFO",
    }


# What a wait for sent rows reads at each look: rows sent, rows not delivered (retrying, failed,
# dead), rows in all, and the last updated_at of them (None: not read at this look).
SentProgress = tuple[int, int, int, dt.datetime | None]


def _progress_of(engine: sa.Engine, key: str) -> SentProgress:
    with engine.connect() as conn:
        sent, unsent, total, last = conn.execute(sa.text("""
            SELECT count(*) FILTER (WHERE status = 'sent'),
                   count(*) FILTER (WHERE status IN ('retrying', 'failed', 'dead')),
                   count(*),
                   max(updated_at)
            FROM outbox WHERE message_key = :key"""), {"key": key}).one()
    return sent, unsent, total, last


def sent_span(engine: sa.Engine, key: str) -> tuple[dt.datetime, dt.datetime]:
    """The sender's times of the first and the last 250 to the rows of ``key``."""
    with engine.connect() as conn:
        first, last = conn.execute(sa.text(
            "SELECT min(sent_at), max(sent_at) FROM outbox WHERE message_key = :key"),
            {"key": key}).one()
    return first, last


def first_error(engine: sa.Engine, key: str | None = None) -> str:
    """The status and last error of one undelivered row (of message key ``key``), or ''."""
    of_key = "" if key is None else "message_key = :key AND "
    with engine.connect() as conn:
        row = conn.execute(sa.text(
            f"SELECT status, last_error FROM outbox WHERE {of_key}"
            "status IN ('retrying', 'failed', 'dead') LIMIT 1"), {"key": key}).one_or_none()
    return "" if row is None else f"{row[0]}: {row[1]}"


def wait_sent(components: PostroomProcesses, emails: int, timeout_s: float,
              look: Callable[[], SentProgress], error: Callable[[], str], *,
              on_progress: Callable[[int], None] | None = None, poll_s: float = POLL_S,
              tag: str = "delivery") -> dt.datetime:
    """Look every ``poll_s`` until ``emails`` rows are sent; return when the recorder wrote the
    last one. ``error()`` says why when a look finds a row not delivered; ``on_progress(sent)`` is
    called at every look."""
    deadline = time.monotonic() + timeout_s
    next_report = time.monotonic() + PROGRESS_EVERY_S
    while time.monotonic() < deadline:
        sent, unsent, total, last = look()
        if on_progress is not None:
            on_progress(sent)
        if unsent:
            # The default retry tiers start at 5 minutes: a run with a retry cannot finish in time.
            raise BenchError(f"{unsent} of {total} rows were not delivered ({error()})")
        if sent == emails and last is not None:
            return last
        components.check_alive()
        if time.monotonic() >= next_report:
            progress(f"{tag}: postroom has {sent:,} of {emails:,} rows recorded sent")
            next_report += PROGRESS_EVERY_S
        time.sleep(poll_s)
    raise BenchError(f"timed out after {timeout_s:.0f}s with {sent} of {emails} rows sent")


def wait_all_sent(engine: sa.Engine, components: PostroomProcesses, key: str, emails: int,
                   timeout_s: float,
                   on_progress: Callable[[int], None] | None = None) -> dt.datetime:
    """Wait until every row of ``key`` is sent; return when the recorder wrote the last one.
    ``on_progress(sent)`` is called at every look."""
    return wait_sent(components, emails, timeout_s, lambda: _progress_of(engine, key),
                     lambda: first_error(engine, key), on_progress=on_progress)


GROUP_FORMED_TIMEOUT_S = 60.0


def wait_group_formed(settings: Settings, components: PostroomProcesses, senders: Sequence[str],
                      timeout_s: float = GROUP_FORMED_TIMEOUT_S) -> None:
    """Until the sender group is stable with one member per sender, each holding partitions, as
    the broker describes it, and every sender has logged an assignment. The warm-up email alone
    showed only that one sender ran: a second that joined after it took its share mid-run, and
    in one run of two senders the first sent 86% of the emails."""
    admin = make_admin(settings)
    group = settings.sender_group
    deadline = time.monotonic() + timeout_s
    seen = "not described yet"
    while time.monotonic() < deadline:
        components.check_alive()
        try:
            described = admin.describe_consumer_groups([group], request_timeout=5)[group].result()
        except KafkaException as exc:
            seen = f"cannot describe it: {exc}"
        else:
            holding = [m for m in described.members if m.assignment.topic_partitions]
            seen = (f"{described.state.name.lower()}, {len(described.members)} member(s), "
                    f"{len(holding)} holding partitions")
            if (described.state is ConsumerGroupState.STABLE and len(holding) == len(senders)
                    == len(described.members)
                    and all(_holds_partitions(components.log(name)) for name in senders)):
                return
        time.sleep(0.2)
    raise BenchError(f"the sender group {group} did not form with {len(senders)} member(s) "
                     f"within {timeout_s:.0f}s ({seen})")


def _holds_partitions(log: str) -> bool:
    """Whether a sender's last assignment line (sender/consumer.py) gave it partitions."""
    changes = [line for line in log.splitlines() if " assigned " in line or " revoked " in line]
    return bool(changes) and " assigned " in changes[-1] and not changes[-1].endswith(
        " assigned nothing")


def run_postroom(base: Settings, server: Server, emails: int, *, concurrency: int,
                 senders: int = 1, own: bool = False, html: bool = False) -> Timed:
    """From the enqueue commit to the last row recorded sent; notes what the logs complained of,
    the first sender's resident memory once a tenth of the rows are sent (its caches and
    buffers warm) and once the last one is, and the senders' duplicate window over the run.
    ``own``: each email with a subject and a body of its own, not one report to all; ``html``:
    and an HTML part of its own."""
    sender_ports = {("sender" if n == 0 else f"sender-{n + 1}"): free_port()
                    for n in range(senders)}
    roles = ", ".join(["relay", "recorder", *sender_ports])
    base = dataclasses.replace(base, topic_partitions=DELIVERY_PARTITIONS)
    with scratch(base, "delivery") as settings, \
            tempfile.TemporaryDirectory(prefix="bench-postroom-") as tmp:
        engine = make_engine(settings)
        try:
            progress(f"delivery: starting postroom {roles} (SMTP concurrency {concurrency})")
            with PostroomProcesses(component_env(settings, server.port, concurrency), Path(tmp),
                                   {"relay": "relay", "recorder": "recorder"}) as components:
                for name, port in sender_ports.items():
                    components.start(name, "sender",
                                     env={ENV_PREFIX + "METRICS_PORT": str(port)})
                pids = {**components.pids, "server": server.pid}
                with engine.begin() as conn:
                    enqueue_rows(conn, "warmup", ["warmup@example.com"])
                wait_all_sent(engine, components, "warmup", 1, WARMUP_TIMEOUT_S)
                wait_group_formed(settings, components, list(sender_ports))
                window_before = scrape_histogram(sender_ports.values(), SENT_MARK_WINDOW)
                progress(f"delivery: postroom is up (one warm-up email went through); "
                         f"enqueueing {emails:,} rows in one transaction")
                warm_rss: list[float | None] = []

                def watch_rss(sent: int) -> None:
                    if not warm_rss and sent >= emails / 10:
                        warm_rss.append(rss_mib(pids["sender"]))

                job_started = time.time()
                with engine.begin() as conn:
                    if own:
                        enqueue_own_rows(conn, "bench", recipients(emails), html=html)
                    else:
                        enqueue_rows(conn, "bench", recipients(emails))
                # The broker's and the database's processes (the roles' backends included), for
                # the machine's share: looked up at both ends, one that starts meanwhile counted
                # from its start, one that ends meanwhile not at all.
                stack = pids_named(*STACK_COMMANDS)
                committed_at, before = time.time(), sample({**pids, **stack})
                last = wait_all_sent(engine, components, "bench", emails, 60 + emails / 20,
                                      watch_rss)
                seconds = last.timestamp() - committed_at
                after = sample({**pids, **stack, **pids_named(*STACK_COMMANDS)})
                rss_after = rss_mib(pids["sender"])
                first_250, last_250 = sent_span(engine, "bench")  # read after the CPU samples
                window = (scrape_histogram(sender_ports.values(), SENT_MARK_WINDOW)
                          - window_before)
            complaints = components.complaints()
        finally:
            engine.dispose()
    for name, lines in complaints.items():
        progress(f"delivery: postroom {name} logged {len(lines)} warnings/errors, e.g. {lines[0]}")
    note = "; ".join(f"{name}: {len(lines)} warnings/errors" for name, lines in complaints.items())
    rss_before = warm_rss[0] if warm_rss else None
    rss = (rss_before, rss_after) if rss_before is not None and rss_after is not None else None
    return Timed(seconds, usage(before, after), note, rss, window,
                 job_seconds=last.timestamp() - job_started,
                 sent_span=(first_250.timestamp() - committed_at,
                            last_250.timestamp() - committed_at))


# -- (c) django-post-office ------------------------------------------------------------------------


def run_postoffice(server: Server, emails: int) -> Timed:
    """Its send phase only (``send_queued_mail`` until nothing is queued), as issue 14 times it;
    its queueing with ``mail.send`` is slower still and not counted."""
    before = sample({"server": server.pid})
    figures = postoffice.run(HOST, server.port, recipients(emails), threads=POSTOFFICE_THREADS,
                             sender=MAIL_FROM, subject=SUBJECT, body=BODY)
    after = sample({"server": server.pid})
    cpu = usage(before, after)
    if cpu is not None:
        cpu = dataclasses.replace(cpu, processes={"post-office": figures.cpu_s, **cpu.processes})
    return Timed(figures.send_s, cpu, f"queueing with mail.send took {figures.queue_s:.1f} s")


# -- (d) the bare client ---------------------------------------------------------------------------


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


def run_client(send: Callable[[int, list[str], int], Coroutine[Any, Any, None]], server: Server,
               emails: int, connections: int) -> Timed:
    """A client of this process, ``send(port, addresses, connections)``, timed from its first
    connect to its last reply, with its CPU and the server's."""
    pids = {"client": os.getpid(), "server": server.pid}
    addresses = recipients(emails)
    before, started = sample(pids), time.perf_counter()
    asyncio.run(send(server.port, addresses, connections))
    seconds, after = time.perf_counter() - started, sample(pids)
    return Timed(seconds, usage(before, after))


def run_bare(server: Server, emails: int, connections: int) -> Timed:
    """``connections`` persistent aiosmtplib connections sending one email per recipient."""
    return run_client(_bare_send, server, emails, connections)


# -- (e) the pipelined client: what the server allows ----------------------------------------------


async def _reply(reader: asyncio.StreamReader, expected: bytes) -> None:
    """Read one reply (its continuation lines too); raise unless its code is ``expected``."""
    while True:
        line = await reader.readline()
        if not line:
            raise BenchError("the server closed the connection")
        if line[3:4] != b"-":
            break
    if not line.startswith(expected):
        raise BenchError(f"the server answered {line.decode(errors='replace').strip()!r}")


async def _wire_send(port: int, addresses: list[str], connections: int) -> None:
    queue = collections.deque(addresses)
    body = BODY.encode().replace(b"\n", b"\r\n").replace(b"\r\n.", b"\r\n..")  # dot-stuffed

    async def worker(n: int) -> None:
        reader, writer = await asyncio.open_connection(HOST, port)
        try:
            await _reply(reader, b"220")
            writer.write(b"EHLO bench.localhost\r\n")
            await _reply(reader, b"250")
            sent = 0
            while queue:
                recipient = queue.popleft()
                # MAIL, RCPT and DATA in one write (RFC 2920), then the message: two writes and
                # two waits per email, nothing built but the bytes.
                writer.write(f"MAIL FROM:<{MAIL_FROM}>\r\nRCPT TO:<{recipient}>\r\nDATA\r\n"
                             .encode())
                for code in (b"250", b"250", b"354"):
                    await _reply(reader, code)
                writer.write(f"From: {MAIL_FROM}\r\nTo: {recipient}\r\nSubject: {SUBJECT}\r\n"
                             f"Message-ID: <{n}.{sent}@bench.localhost>\r\n\r\n".encode()
                             + body + b".\r\n")
                await _reply(reader, b"250")
                sent += 1
            writer.write(b"QUIT\r\n")
            await _reply(reader, b"221")
        finally:
            writer.close()

    await asyncio.gather(*(worker(n) for n in range(connections)))


def run_wire(server: Server, emails: int, connections: int) -> Timed:
    """``connections`` raw connections writing each email's commands together: the least a
    client can do, so the most this server gives any client here."""
    return run_client(_wire_send, server, emails, connections)


# -- the benchmark ---------------------------------------------------------------------------------


def _run_design(base: Settings, server: Server, design: str, emails: int,
                concurrency: int) -> Timed:
    if design == SEED:
        return run_seed(server, emails)
    if design == POSTOFFICE:
        return run_postoffice(server, emails)
    if design == BARE:
        return run_bare(server, emails, concurrency)
    if design in (WIRE, WIRE_WIDE):
        return run_wire(server, emails, _width(design, concurrency))
    return run_postroom(base, server, emails,
                        concurrency=_width(design, concurrency),
                        senders=_senders(design),
                        own=design in (POSTROOM_OWN, POSTROOM_OWN_HTML),
                        html=design == POSTROOM_OWN_HTML)


def run(base: Settings, options: Options) -> Section:
    concurrency = Settings().smtp_concurrency
    runs: list[Run] = []
    rounds = 1 if options.quick else ROUNDS
    for plan in QUICK if options.quick else FULL:
        timings: dict[str, list[Timed]] = collections.defaultdict(list)
        with smtp_server(plan) as server:
            # Round by round, every design once per round, so a slow patch of a shared machine
            # falls on all of them; the backlog run once.
            for round_no in range(rounds):
                for design, emails in plan.emails.items():
                    if design == BACKLOG and round_no > 0:
                        continue
                    progress(f"delivery: round {round_no + 1}/{rounds}: "
                             f"{_label(design, concurrency)}, {emails:,} emails to {plan.label}")
                    if plan.latency_ms:
                        take_turnaround(server)  # what came before this design is not its
                    timed = _run_design(base, server, design, emails, concurrency)
                    if plan.latency_ms:
                        timed = dataclasses.replace(timed, turnaround=take_turnaround(server))
                    timings[design].append(timed)
        runs += [Run(plan, design, emails, tuple(timings[design]))
                 for design, emails in plan.emails.items()]
    return _section(runs, concurrency)


def _width(design: str, concurrency: int) -> int:
    """The connections a design runs with: the wide ones 64, the others ``concurrency``."""
    return WIDE_CONCURRENCY if design in WIDE_DESIGNS else concurrency


def _senders(design: str) -> int:
    """The sender processes a postroom design runs."""
    return 2 if design == POSTROOM_TWO else 1


def _label(design: str, concurrency: int) -> str:
    label = DESIGN_LABELS[design]
    width = _width(design, concurrency)
    if design in (BARE, WIRE, WIRE_WIDE):
        return f"{label} (x{width} connections)"
    if design in POSTROOM_DESIGNS:
        return f"{label} (x{width})"
    return label


def _window_ms(window: Buckets | None) -> str:
    """p50 / p99 of a duplicate window as the bounds of the buckets that hold them."""
    p50, p99 = (None, None) if window is None else (window.quantile_bound(0.5),
                                                    window.quantile_bound(0.99))
    if p50 is None or p99 is None:
        return "-"
    return f"<= {p50 * 1000:g} / <= {p99 * 1000:g}"


def _ms_per_email(cpu: CpuUsage | None, emails: int, *names: str) -> str:
    if cpu is None:
        return "-"
    return f"{sum(cpu.of(name) for name in names) * 1000 / emails:.2f}"


_STACK_PREFIXES = tuple(f"{command}:" for command in STACK_COMMANDS)


def client_cpu_s(cpu: CpuUsage) -> float:
    """A design's own CPU seconds: every process of the run but the SMTP server and the local
    stack's (PostgreSQL, the JVMs)."""
    return sum(seconds for name, seconds in cpu.processes.items()
               if name != "server" and not name.startswith(_STACK_PREFIXES))


def _cpu_bound_lines(by_design: Mapping[tuple[str, str], Run], concurrency: int) -> list[str]:
    """What the machine's CPUs allow postroom on smtp-sink, from the median runs: every process's
    CPU per email (the machine's busy time, so the broker's, the database's, the server's and
    whatever else ran), the rate the CPUs would give at that cost fully busy, and how busy the
    sender's own process was, against the 3x targets' rates."""
    sink = "smtp-sink"
    lines = []
    for design in (POSTROOM, POSTROOM_TWO):
        r = by_design.get((sink, design))
        cpu = None if r is None else r.timed.cpu
        if r is None or cpu is None or cpu.busy_s <= 0 or r.seconds <= 0:
            continue
        # CPU over the samples' interval, from the commit to the poll that saw the last row sent
        # (up to POLL_S after it; the tail is idle but for the stack's own housekeeping).
        machine_ms = cpu.busy_s * 1000 / r.emails
        senders = " and ".join(f"{cpu.processes[name] / r.seconds:.0%}"
                               for name in sorted(cpu.processes) if name.startswith("sender"))
        parts = {"postroom's roles": sum(cpu.of(role) for role in ROLES),
                 "PostgreSQL": cpu.of("postgres:"), "the JVMs (Kafka, registry)": cpu.of("java:"),
                 "smtp-sink": cpu.of("server")}
        parts["the rest"] = max(0.0, cpu.busy_s - sum(parts.values()))
        split = ", ".join(f"{name} {seconds * 1000 / r.emails:.2f}"
                          for name, seconds in parts.items())
        lines.append(
            f"  {_label(design, concurrency)}: {machine_ms:.2f} ms of CPU per email over the "
            f"machine ({split}), so its {cpu.cpus} CPUs give at most "
            f"{fmt_rate(cpu.cpus * 1000 / machine_ms)} emails/s at that cost, fully busy; the "
            f"sender's CPU over the run's seconds: {senders} of one CPU")
    if not lines:
        return []
    office, seed = by_design.get((sink, POSTOFFICE)), by_design.get((sink, SEED))
    wanted = []
    if office is not None:
        wanted.append(f"3x django-post-office's send phase is {fmt_rate(3 * office.per_s)}/s")
    if seed is not None and seed.job_per_s:
        wanted.append(f"3x the seed's job rate {fmt_rate(3 * seed.job_per_s)}/s")
    return ["What the CPUs allow on smtp-sink (the machine's busy time: every process on it):",
            *lines, *([f"  ({'; '.join(wanted)})"] if wanted else []), ""]


def _turnaround_lines(runs: list[Run], concurrency: int) -> list[str]:
    """slowsink's view of each design's turn-around per message, the median run's: the part of a
    message's time that is the client's and the wire's, on top of the server's delay."""
    rows = []
    for r in runs:
        figures = r.timed.turnaround
        if not figures:
            continue
        cells = []
        for stage in ("after_250", "after_354"):
            got = figures.get(stage, {})
            cells.append(f"{got['p50_ms']:.2f} / {got['p90_ms']:.2f} / {got['mean_ms']:.2f}"
                         if got.get("count") else "-")
        rows.append([_label(r.design, concurrency), *cells])
    if not rows:
        return []
    return [f"turn-around per message on slowsink, as the server saw it (ms, p50 / p90 / mean; "
            f"the median run's): a message takes the server's {SLOW_LATENCY_MS} ms and these",
            *table(["design", "250 to the message -> next MAIL", "354 -> message's end"], rows)]


def _span_lines(runs: list[Run], concurrency: int) -> list[str]:
    """Each postroom run (the median one) in three parts, from the commit: to the first 250 (the
    pipeline filling: relay, broker, sender, connections), from it to the last 250 (the sends),
    and on to the last row recorded. On slowsink the seconds above the ceiling's (N emails over
    the connections at the server's delay each) are split the same way: the first part less one
    message's delay, the second less the delays of the messages after each connection's first
    (the turn-around), and the third, so that the three add up to the whole gap."""
    rows = []
    for r in runs:
        span = r.timed.sent_span
        if r.design not in POSTROOM_DESIGNS or span is None:
            continue
        first, last = span
        # Each sender process has its own connections.
        connections = _width(r.design, concurrency) * _senders(r.design)
        per_connection = r.emails / connections
        message_ms = ((last - first) * 1000 / (per_connection - 1) if per_connection > 1
                      else None)
        above = "-"
        if r.server.latency_ms:
            delay_s = r.server.latency_ms / 1000
            parts = (first - delay_s, (last - first) - (per_connection - 1) * delay_s,
                     r.seconds - last)
            above = (f"{r.seconds - per_connection * delay_s:.2f} = "
                     + " + ".join(f"{part:.2f}" for part in parts))
        rows.append([r.server.label, _label(r.design, concurrency), f"{first:.3f}",
                     f"{last - first:.3f}", f"{r.seconds - last:.3f}",
                     "-" if message_ms is None else f"{message_ms:.2f}", above])
    if not rows:
        return []
    return ["postroom's runs in three parts (the median run's; seconds from the commit, by "
            "outbox.sent_at, the sender's time of each 250, and outbox.updated_at):",
            *table(["server", "design", "commit -> first 250", "first -> last 250",
                    "last 250 -> recorded", "ms a message on a connection",
                    "s above the ceiling = filling + turn-around + recording"], rows),
            "ms a message on a connection: first -> last 250 over the messages after each "
            "connection's first (N / connections - 1), as if the sends were spread evenly.",
            ""]


def _section(runs: list[Run], concurrency: int) -> Section:
    rate = {(r.server.name, r.design): r.per_s for r in runs}
    job_rate = {r.design: r.job_per_s or 0.0 for r in runs
                if r.server.name == "smtp-sink" and r.design in (SEED, POSTROOM)}
    by_design = {(r.server.name, r.design): r for r in runs}
    rows = []
    for index, r in enumerate(runs):
        first = index == 0 or runs[index - 1].server is not r.server
        cpu = r.timed.cpu
        client = client_cpu_s(cpu) if cpu else None
        rows.append([r.server.label if first else "", _label(r.design, concurrency),
                     f"{r.emails:,}", f"{r.seconds:.2f}", fmt_rate(r.per_s), r.spread or "-",
                     "-" if client is None else f"{client * 1000 / r.emails:.2f}",
                     _ms_per_email(cpu, r.emails, "server"),
                     "-" if cpu is None else f"{cpu.busy_fraction:.0%}"])
    role_rows = [[r.server.label, _label(r.design, concurrency),
                  *(_ms_per_email(r.timed.cpu, r.emails, role) for role in ROLES),
                  _ms_per_email(r.timed.cpu, r.emails, *ROLES),
                  "-" if r.timed.rss_mib is None else
                  f"{r.timed.rss_mib[0]:.0f} -> {r.timed.rss_mib[1]:.0f}",
                  _window_ms(r.timed.window)]
                 for r in runs if r.design in POSTROOM_DESIGNS]
    sink, slow = "smtp-sink", "slowsink"
    ceiling = concurrency * 1000 / SLOW_LATENCY_MS
    wide_ceiling = WIDE_CONCURRENCY * 1000 / SLOW_LATENCY_MS
    section = Section("Delivery: enqueue commit -> last email accepted by the SMTP server")
    section.lines += [
        "500-byte plain-text body, one recipient per email, N distinct recipients; every server "
        "and every design in a process of its own",
        "",
        *table(["server", "design", "emails", "seconds", "emails/s", "slowest-fastest",
                "client CPU ms/email", "server CPU ms/email", "machine busy"], rows),
        "",
        (f"emails/s, seconds and CPU: the median of {rounds} runs per design (the backlog: "
         "one), taken round by round; slowest-fastest: the range of those runs."
         if (rounds := max(len(r.timings) for r in runs)) > 1 else
         "one run per design (--quick): no median, no spread."),
        "",
        "seed: enqueue commit -> deliver_due() returned with every row 'sent'.",
        "post-office: its send phase only, send_queued_mail until nothing is queued (queueing "
        "with mail.send not counted).",
        "postroom: enqueue commit -> the recorder's update of the last row to 'sent' "
        f"(outbox.updated_at), after a warm-up email; {DELIVERY_PARTITIONS} partitions a topic. "
        "Each email its own subject and body: an invoice run, one enqueue_many call (subject "
        "'Invoice NNNNN for September 2026', a line of its own before the 500-byte body; with "
        "HTML, the same lines as paragraphs of an HTML part).",
        "bare: first connect -> last reply, one message per recipient, no outbox; pipelined: "
        "the same over raw connections, MAIL, RCPT and DATA in one write, the message's bytes "
        "written as they are (the most this server gives any client on this machine).",
        "client CPU: the design's own processes (postroom: relay + sender(s) + recorder; Kafka and "
        "PostgreSQL not counted); machine busy: all CPUs, every process.",
        "",
        "postroom per role (CPU ms/email; sender RSS MiB when a tenth of the rows were sent -> "
        "after the last; the duplicate window, from a sender reading the final 250 to its "
        "sent mark's commit, over every email of the run, p50 / p99 as the upper bounds of the "
        "histogram buckets that hold them):",
        *table(["server", "design", *ROLES, "all three", "sender RSS MiB",
                "duplicate window p50 / p99 ms"], role_rows),
        *(f"postroom logs on {r.server.label}, {r.design}: {r.timed.note}" for r in runs
          if r.design in POSTROOM_DESIGNS and r.timed.note),
        "",
        *_turnaround_lines(runs, concurrency),
        "",
        *_span_lines(runs, concurrency),
        *_cpu_bound_lines(by_design, concurrency),
        "Ratios:",
        f"  postroom / seed, job start -> last sent, on {sink}: {job_rate[POSTROOM] / job_rate[SEED]:.2f}x "
        f"({fmt_rate(job_rate[POSTROOM])} / {fmt_rate(job_rate[SEED])} emails/s)",
        f"  postroom / seed         on {sink}: {rate[sink, POSTROOM] / rate[sink, SEED]:.2f}x   "
        f"on {slow}: {rate[slow, POSTROOM] / rate[slow, SEED]:.1f}x "
        f"(x{WIDE_CONCURRENCY}: {rate[slow, POSTROOM_WIDE] / rate[slow, SEED]:.1f}x)",
        f"  postroom / post-office  on {sink}: "
        f"{rate[sink, POSTROOM] / rate[sink, POSTOFFICE]:.2f}x   on {slow}: "
        f"{rate[slow, POSTROOM] / rate[slow, POSTOFFICE]:.2f}x",
        f"  postroom / bare client  on {sink}: {rate[sink, POSTROOM] / rate[sink, BARE]:.2f}x   "
        f"on {slow}: {rate[slow, POSTROOM] / rate[slow, BARE]:.2f}x",
        f"  postroom / pipelined    on {sink}: {rate[sink, POSTROOM] / rate[sink, WIRE]:.2f}x   "
        f"on {slow}: {rate[slow, POSTROOM] / rate[slow, WIRE]:.2f}x "
        f"(x{WIDE_CONCURRENCY}: {rate[slow, POSTROOM_WIDE] / rate[slow, WIRE_WIDE]:.2f}x)",
        f"  pipelined client on {slow}, of the {ceiling:,.0f}/s ceiling: "
        f"{rate[slow, WIRE] / ceiling:.2f}x (x{WIDE_CONCURRENCY}: "
        f"{rate[slow, WIRE_WIDE] / wide_ceiling:.2f}x of {wide_ceiling:,.0f}/s)",
        f"  two senders / one       on {sink}: "
        f"{rate[sink, POSTROOM_TWO] / rate[sink, POSTROOM]:.2f}x",
        f"  emails of their own / one report on {sink}: "
        f"{rate[sink, POSTROOM_OWN] / rate[sink, POSTROOM]:.2f}x, with HTML "
        f"{rate[sink, POSTROOM_OWN_HTML] / rate[sink, POSTROOM]:.2f}x (each a subject and a body "
        "of its own, commit -> last sent)",
        f"  ({concurrency} connections to a server that takes {SLOW_LATENCY_MS} ms per message "
        f"cap any client at {ceiling:,.0f} emails/s; one connection at "
        f"{1000 / SLOW_LATENCY_MS:.0f}/s.)",
    ]
    sink_cpu = by_design[sink, POSTROOM].timed.cpu
    section.targets += [
        Target("postroom / seed on smtp-sink, job start -> last sent",
               job_rate[POSTROOM] / job_rate[SEED], TARGET_OVER_SEED_ON_SINK, "x"),
        Target(f"postroom / django-post-office ({POSTOFFICE_THREADS} threads) on smtp-sink, "
               "commit -> last sent against its send phase",
               rate[sink, POSTROOM] / rate[sink, POSTOFFICE], TARGET_OVER_POSTOFFICE_ON_SINK, "x"),
        Target(f"postroom x{concurrency} on slowsink {SLOW_LATENCY_MS} ms, of the "
               f"{ceiling:.0f}/s ceiling", rate[slow, POSTROOM] / ceiling, TARGET_OF_CEILING_AT_20,
               "x"),
        Target(f"postroom x{WIDE_CONCURRENCY} on slowsink {SLOW_LATENCY_MS} ms, of the "
               f"{wide_ceiling:.0f}/s ceiling", rate[slow, POSTROOM_WIDE] / wide_ceiling,
               TARGET_OF_CEILING_AT_64, "x"),
    ]
    if sink_cpu is not None:
        section.targets.append(Target(
            "postroom CPU per email on smtp-sink (relay + sender + recorder)",
            sum(sink_cpu.of(role) for role in ROLES) * 1000 / by_design[sink, POSTROOM].emails,
            TARGET_CPU_MS_PER_EMAIL, "ms", higher_is_better=False))
    backlog = by_design.get((sink, BACKLOG))
    if backlog is not None and backlog.timed.rss_mib is not None:
        start, end = backlog.timed.rss_mib
        section.targets.append(Target(
            f"sender RSS growth over a {backlog.emails:,}-email backlog (end / start)",
            end / start, TARGET_RSS_GROWTH, "x", higher_is_better=False))
    return section
