"""The bounce intake under a flood (issue 46, item 1): fifty senders at once, from one address,
each sending 4 MiB junk messages and 4 MiB messages of many empty parts to the bare bounce address
without pause, while a genuine DSN arrives once a second from another address (the platform's
relay) at a signed return path. Figures: the intake's peak RSS, each genuine report's time from its
connection to its row recorded `bounced` (the recorder running), and the junk's lot (taken,
refused 421, time per message)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import multiprocessing
import os
import smtplib
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from bench.latency import quantile
from bench.report import BenchError, Options, Section, Target, progress, table
from bench.scratch import scratch
from postroom import enqueue
from postroom.devkit.bouncemail import junk_parts, junk_text, postfix_dsn
from postroom.devkit.ports import free_port
from postroom.devkit.processes import PostroomProcesses
from postroom.devkit.scratch import scratch_env
from postroom.relay.db import make_engine
from postroom.settings import ENV_PREFIX, Settings
from postroom.verp import make_token, return_path

TARGET_PEAK_RSS_MIB = 256.0
TARGET_P99_S = 2.0
JUNK_SENDERS = 50
JUNK_BYTES = 4 * 1024 * 1024
GENUINE, QUICK_GENUINE = 30, 8  # DSNs, one a second
GENUINE_CLIENT, JUNK_CLIENT = "127.0.0.1", "127.0.0.2"  # two client addresses on loopback
BOUNCE = "bounces@bounce.example.com"
SECRET = "bench-bounce-secret-0123456789"  # noqa: S105 - the benchmark's own
START_TIMEOUT_S = 120.0
RECORDED_TIMEOUT_S = 120.0
SMTP_TIMEOUT_S = 600.0  # what a relay waits for the reply to a message (Postfix: 600 s)
FLOOD_FIRST_S = 10.0  # the flood's start before the first genuine report
RETRY_S = 1.0  # a genuine DSN refused 421 is sent again after this (an MTA waits longer)


@dataclasses.dataclass
class JunkTally:
    """What the junk senders met (updated by their threads under ``lock``)."""

    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    taken: int = 0
    refused_421: int = 0
    failed: int = 0
    seconds: list[float] = dataclasses.field(default_factory=list)


def _junk_sender(port: int, messages: tuple[bytes, ...], tally: JunkTally,
                 stop: threading.Event) -> None:
    turn = 0
    while not stop.is_set():
        message = messages[turn % len(messages)]
        turn += 1
        started = time.monotonic()
        try:
            with smtplib.SMTP(GENUINE_CLIENT, port, timeout=SMTP_TIMEOUT_S,
                              source_address=(JUNK_CLIENT, 0)) as client:
                client.sendmail("", [BOUNCE], message)
        except smtplib.SMTPConnectError as exc:
            with tally.lock:
                tally.refused_421 += exc.smtp_code == 421
                tally.failed += exc.smtp_code != 421
            stop.wait(0.1)
            continue
        except (smtplib.SMTPException, OSError):
            with tally.lock:
                tally.failed += 1
            continue
        with tally.lock:
            tally.taken += 1
            tally.seconds.append(time.monotonic() - started)


@dataclasses.dataclass
class Genuine:
    """One genuine DSN: when its connection began, how often it met 421, when its row changed."""

    outbox_id: int
    arrived: float = 0.0
    answered: float | None = None  # its 250
    refused_421: int = 0
    recorded: float | None = None
    error: str | None = None


def _send_genuine(port: int, report: Genuine, raw: bytes, rcpt: str) -> None:
    report.arrived = time.monotonic()
    while True:
        try:
            with smtplib.SMTP(GENUINE_CLIENT, port, timeout=SMTP_TIMEOUT_S,
                              source_address=(GENUINE_CLIENT, 0)) as client:
                client.sendmail("", [rcpt], raw)
                report.answered = time.monotonic()
        except smtplib.SMTPConnectError as exc:
            if exc.smtp_code != 421:
                report.error = f"{exc.smtp_code} {exc.smtp_error!r}"
                return
            report.refused_421 += 1
            time.sleep(RETRY_S)
        except (smtplib.SMTPException, OSError) as exc:
            report.error = f"{type(exc).__name__}: {exc}"
            return
        else:
            return


def _rss_mib(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise BenchError(f"no {field} in /proc/{pid}/status")


def _rows(engine: sa.Engine, count: int) -> list[tuple[int, str]]:
    recipients = [f"gone-{i}@example.com" for i in range(count)]
    with engine.begin() as conn:
        enqueue(conn, key="bounce-bench", recipients=recipients, subject="S", body="b")
        # As the sender leaves them: sent once, so a DSN makes them bounced.
        conn.execute(sa.text("UPDATE outbox SET status = 'sent', attempts = 1"))
        found = conn.execute(sa.text("SELECT id, recipient FROM outbox ORDER BY id")).all()
    return [(int(r.id), str(r.recipient)) for r in found]


def _watch(engine: sa.Engine, reports: dict[int, Genuine], done: threading.Event) -> None:
    """Note when each genuine report's row turns bounced (a look every 20 ms)."""
    while not done.is_set():
        with engine.connect() as conn:
            bounced = conn.execute(sa.text("SELECT id FROM outbox WHERE status = 'bounced'"))
            now = time.monotonic()
            for (outbox_id,) in bounced:
                report = reports.get(int(outbox_id))
                if report is not None and report.recorded is None:
                    report.recorded = now
        if all(r.recorded is not None or r.error is not None for r in reports.values()):
            return
        done.wait(0.02)


def run(base: Settings, options: Options) -> Section:
    genuine_count = QUICK_GENUINE if options.quick else GENUINE
    section = Section("bounce intake under a flood")
    with scratch(base, "bounces") as settings, tempfile.TemporaryDirectory() as logs:
        engine = make_engine(settings)
        try:
            rows = _rows(engine, genuine_count)
            port = free_port()
            env = {**os.environ, **scratch_env(settings),
                   ENV_PREFIX + "BOUNCE_ADDRESS": BOUNCE, ENV_PREFIX + "BOUNCE_SECRET": SECRET,
                   ENV_PREFIX + "BOUNCE_LISTEN": f"127.0.0.1:{port}",
                   ENV_PREFIX + "LOG_LEVEL": "INFO"}
            with PostroomProcesses(env, Path(logs), {"recorder": "recorder",
                                                     "bounces": "bounces"}) as processes:
                deadline = time.monotonic() + START_TIMEOUT_S
                while "bounce intake listening" not in processes.log("bounces"):
                    processes.check_alive()
                    if time.monotonic() > deadline:
                        raise BenchError("postroom bounces did not listen: "
                                         + " | ".join(processes.log_tail("bounces")))
                    time.sleep(0.1)
                pid = processes.pids["bounces"]
                rss_before = _rss_mib(pid, "VmRSS")
                progress(f"intake listening, RSS {rss_before:.0f} MiB; {JUNK_SENDERS} junk "
                         f"senders start, then {genuine_count} genuine DSNs, one a second")
                figures = _flood(port, engine, rows)
                processes.check_alive()
                peak = _rss_mib(pid, "VmHWM")
                complaints = processes.complaints()
        finally:
            engine.dispose()
    reports, tally, flood_s = figures
    latencies = [r.recorded - r.arrived for r in reports if r.recorded is not None]
    lost = [r for r in reports if r.recorded is None]
    if not latencies:
        raise BenchError(f"no genuine report was recorded: {[r.error for r in reports]}")
    p50, p99 = quantile(latencies, 0.5), quantile(latencies, 0.99)
    to_250 = [r.answered - r.arrived for r in reports if r.answered is not None]
    mean_junk_s = sum(tally.seconds) / len(tally.seconds) if tally.seconds else float("nan")
    section.lines += table(("", "figure"), [
        ("intake RSS before the flood / peak", f"{rss_before:.0f} / {peak:.0f} MiB"),
        ("genuine DSNs recorded / sent", f"{len(latencies)} / {len(reports)}"),
        ("arrival to row bounced p50 / p99 / max",
         f"{p50:.2f} / {p99:.2f} / {max(latencies):.2f} s"),
        ("of which arrival to the intake's 250 p50 / p99",
         f"{quantile(to_250, 0.5):.2f} / {quantile(to_250, 0.99):.2f} s" if to_250 else "-"),
        ("genuine DSNs answered 421 (sent again)", str(sum(r.refused_421 for r in reports))),
        (f"junk messages taken in {flood_s:.0f} s (the junk senders' run)", f"{tally.taken} "
         f"({tally.taken * JUNK_BYTES / flood_s / 1024 / 1024:.1f} MiB/s)"),
        ("junk: time per message taken (mean)", f"{mean_junk_s:.1f} s"),
        ("junk sessions answered 421 / failed otherwise",
         f"{tally.refused_421} / {tally.failed}"),
    ])
    if lost:
        section.lines.append(f"not recorded: {[(r.outbox_id, r.error) for r in lost]}")
    warned = sum(len(lines) for lines in complaints.values())
    section.lines.append(f"warnings and errors logged by the roles: {warned}")
    section.targets += [
        Target("bounce intake peak RSS under the flood", peak, TARGET_PEAK_RSS_MIB, "MiB",
               higher_is_better=False),
        Target("genuine DSN arrival to row bounced, p99, under the flood", p99, TARGET_P99_S,
               "s", higher_is_better=False),
    ]
    return section


def _junk_process(port: int, stop: Any, out: Any) -> None:
    """The junk senders, in a process of their own (spawned): in the benchmark's, their threads
    would hold the GIL the genuine sender and the watcher need, and time them, not the intake."""
    messages = (junk_text(JUNK_BYTES), junk_parts(JUNK_BYTES))
    tally, stopping = JunkTally(), threading.Event()
    senders = [threading.Thread(target=_junk_sender, args=(port, messages, tally, stopping),
                                daemon=True) for _ in range(JUNK_SENDERS)]
    started = time.monotonic()
    for sender in senders:
        sender.start()
    stop.wait()
    stopping.set()
    for sender in senders:
        sender.join(SMTP_TIMEOUT_S)
    out.put((tally.taken, tally.refused_421, tally.failed, tally.seconds,
             time.monotonic() - started))


def _flood(port: int, engine: sa.Engine,
           rows: list[tuple[int, str]]) -> tuple[list[Genuine], JunkTally, float]:
    context = multiprocessing.get_context("spawn")
    stop, out = context.Event(), context.Queue()
    junk = context.Process(target=_junk_process, args=(port, stop, out), daemon=True)
    reports = {outbox_id: Genuine(outbox_id) for outbox_id, _ in rows}
    done = threading.Event()
    watcher = threading.Thread(target=_watch, args=(engine, reports, done), daemon=True)
    started = time.monotonic()
    junk.start()
    watcher.start()
    try:
        time.sleep(FLOOD_FIRST_S)  # the flood under way before the first genuine report
        for i, (outbox_id, recipient) in enumerate(rows):
            time.sleep(max(0.0, started + FLOOD_FIRST_S + i - time.monotonic()))
            token = make_token(outbox_id, SECRET.encode(), dt.datetime.now(dt.UTC))
            threading.Thread(target=_send_genuine, daemon=True, args=(
                port, reports[outbox_id], postfix_dsn(BOUNCE, token, recipient),
                return_path(BOUNCE, token))).start()
        watcher.join(RECORDED_TIMEOUT_S)
    finally:
        done.set()
        stop.set()
    progress(f"genuine reports done after {time.monotonic() - started:.0f} s; waiting for the "
             "junk senders to finish")
    tally = JunkTally()
    tally.taken, tally.refused_421, tally.failed, tally.seconds, junk_s = out.get(
        timeout=SMTP_TIMEOUT_S)
    junk.join(SMTP_TIMEOUT_S)
    return list(reports.values()), tally, junk_s
