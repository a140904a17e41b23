"""The bounce storm (issue 46, item 12): while mail flows, `postroom bounces` meets junk at the bare
address (4 MiB of text, 4 MiB of empty parts, several senders at once), forged tokens (at RCPT and
inside reports), reports sent again, and a genuine DSN for each of the storm's own rows once it is
sent, all from a relay that keeps one connection and starts its next report there with MAIL after
whatever DATA was answered (451 included: RFC 5321 needs no RSET). Every genuine report must turn
its row `bounced`, no role exit, the intake's peak RSS stay under 256 MiB; the known input is
checked as in every scenario (nothing else lost or delayed past the drain).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import random
import smtplib
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from chaos.harness import BOUNCE_ADDRESS, BOUNCE_SECRET
from postroom import enqueue
from postroom.devkit.bouncemail import junk_parts, junk_text, postfix_dsn
from postroom.devkit.histograms import scrape
from postroom.verp import make_token, return_path

GENUINE = 40
JUNK_SENDERS = 6
JUNK_BYTES = 4 * 1024 * 1024
FORGED = 30
PEAK_RSS_MIB = 256.0
RECORDED_TIMEOUT_S = 120.0
SMTP_TIMEOUT_S = 120.0
HELD_PAUSE_S = 0.5  # before a report answered 451 is sent again, on the same connection


@dataclasses.dataclass
class BounceStorm:
    """What the storm sent and what it met."""

    rows: dict[int, str] = dataclasses.field(default_factory=dict)  # outbox id -> recipient
    arrived: dict[int, float] = dataclasses.field(default_factory=dict)  # its DSN's first send
    recorded: dict[int, float] = dataclasses.field(default_factory=dict)  # its row bounced
    replies: dict[int, int] = dataclasses.field(default_factory=dict)  # DATA reply code -> count
    forged_refused: int = 0  # forged tokens answered 550 at RCPT
    replayed: int = 0
    junk_taken: int = 0
    junk_refused: int = 0
    errors: list[str] = dataclasses.field(default_factory=list)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def count(self, code: int) -> None:
        with self.lock:
            self.replies[code] = self.replies.get(code, 0) + 1


class Relay:
    """One connection to the intake, kept: each report starts with MAIL on it, without RSET,
    whatever the last DATA was answered; a report answered 451 is sent again on it."""

    def __init__(self, port: int, storm: BounceStorm) -> None:
        self._port = port
        self._storm = storm
        self._client: smtplib.SMTP | None = None

    def _connection(self) -> smtplib.SMTP:
        if self._client is None:
            self._client = smtplib.SMTP("127.0.0.1", self._port, timeout=SMTP_TIMEOUT_S)
            self._client.ehlo("relay.example.com")
        return self._client

    def send(self, rcpt: str, raw: bytes) -> int:
        """The code DATA was answered (550 when RCPT refused it); 451s sent again until not."""
        while True:
            try:
                client = self._connection()
                code, _ = client.mail("")
                if code != 250:
                    raise AssertionError(f"MAIL FROM:<> answered {code} on a reused connection")
                code, _ = client.rcpt(rcpt)
                if code != 250:
                    client.rset()  # the transaction is open after a refused RCPT
                    return code
                code, _ = client.data(raw)
            except (smtplib.SMTPServerDisconnected, OSError) as exc:
                self._storm.errors.append(f"relay connection: {type(exc).__name__}: {exc}")
                self._client = None
                time.sleep(HELD_PAUSE_S)
                continue
            self._storm.count(code)
            if code != 451:
                return code
            time.sleep(HELD_PAUSE_S)

    def close(self) -> None:
        if self._client is not None:
            try:
                self._client.quit()
            except (smtplib.SMTPException, OSError):
                pass


def _junk(port: int, storm: BounceStorm, stop: threading.Event, messages: tuple[bytes, ...],
          turn: int) -> None:
    while not stop.is_set():
        turn += 1
        try:
            with smtplib.SMTP("127.0.0.1", port, timeout=SMTP_TIMEOUT_S) as client:
                client.sendmail("", [BOUNCE_ADDRESS], messages[turn % len(messages)])
            with storm.lock:
                storm.junk_taken += 1
        except smtplib.SMTPConnectError as exc:
            with storm.lock:
                storm.junk_refused += exc.smtp_code == 421
            stop.wait(0.2)
        except (smtplib.SMTPException, OSError) as exc:
            storm.errors.append(f"junk: {type(exc).__name__}: {exc}")
            stop.wait(0.2)


def _own_rows(run: Any) -> dict[int, str]:
    recipients = [f"bounced-{run.tag}-{i}@example.com" for i in range(GENUINE)]
    with run.engine.begin() as conn:
        enqueue(conn, key=f"{run.tag}-bounced", recipients=recipients, subject="Report",
                body="bounced later")
    rows = run.query("SELECT id, recipient FROM outbox WHERE recipient = ANY(:r)", r=recipients)
    for row in rows:
        run.hostile_rows[row.id] = "bounce storm: bounced by its DSN"
    return {int(r.id): str(r.recipient) for r in rows}


def _statuses(run: Any, ids: list[int]) -> dict[int, str]:
    return {int(r.id): str(r.status) for r in run.query(
        "SELECT id, status FROM outbox WHERE id = ANY(:ids)", ids=ids)}


def _watch(run: Any, storm: BounceStorm, stop: threading.Event, deadline: float) -> None:
    """Note when each own row turns bounced (a look every 50 ms)."""
    while not stop.is_set() and time.monotonic() < deadline:
        statuses = _statuses(run, list(storm.rows))
        now = time.monotonic()
        for outbox_id, status in statuses.items():
            if status == "bounced" and outbox_id not in storm.recorded:
                storm.recorded[outbox_id] = now
        if len(storm.recorded) == len(storm.rows):
            return
        stop.wait(0.05)


def inject(run: Any, rng: random.Random) -> None:
    """Junk and forged reports from the start; each own row's DSN once it is sent, and some sent
    again; until every own row is bounced (or RECORDED_TIMEOUT_S)."""
    port = run.bounce_port
    storm = BounceStorm()
    run.bounce_storm = storm
    storm.rows = _own_rows(run)
    stop = threading.Event()
    messages = (junk_text(JUNK_BYTES), junk_parts(JUNK_BYTES))
    junk = [threading.Thread(target=_junk, args=(port, storm, stop, messages, n), daemon=True)
            for n in range(JUNK_SENDERS)]
    for thread in junk:
        thread.start()
    run._fault()
    relay = Relay(port, storm)
    secret = BOUNCE_SECRET.encode()
    deadline = time.monotonic() + RECORDED_TIMEOUT_S
    forged = 0
    watching = threading.Thread(target=_watch, args=(run, storm, stop, deadline), daemon=True)
    watching.start()
    try:
        while len(storm.recorded) < len(storm.rows) and time.monotonic() < deadline:
            statuses = _statuses(run, list(storm.rows))
            ready = [i for i, s in statuses.items() if s == "sent" and i not in storm.arrived]
            for outbox_id in ready:
                token = make_token(outbox_id, secret, dt.datetime.now(dt.UTC))
                raw = postfix_dsn(BOUNCE_ADDRESS, token, storm.rows[outbox_id])
                storm.arrived[outbox_id] = time.monotonic()
                relay.send(return_path(BOUNCE_ADDRESS, token), raw)
                if rng.random() < 0.3:  # the relay sends it again (a lost 250, say)
                    relay.send(return_path(BOUNCE_ADDRESS, token), raw)
                    storm.replayed += 1
            if forged < FORGED:
                forged += 1
                fake = make_token(rng.randrange(1, 1 << 30), os.urandom(24),
                                  dt.datetime.now(dt.UTC))
                forged_dsn = postfix_dsn(BOUNCE_ADDRESS, fake, "x@example.com")
                if relay.send(return_path(BOUNCE_ADDRESS, fake), forged_dsn) == 550:
                    storm.forged_refused += 1
                # the forged token inside a report to the bare address: taken, changes nothing
                relay.send(BOUNCE_ADDRESS, forged_dsn)
            time.sleep(0.05)
    finally:
        stop.set()
        watching.join(SMTP_TIMEOUT_S)
        relay.close()
        for thread in junk:
            thread.join(SMTP_TIMEOUT_S)
        run._fault()


def _counters(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(scrape(port)):
        for sample in family.samples:
            if sample.name.endswith("_total"):
                found[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return found


def before_stop(run: Any) -> list[str]:
    """While the roles run: every own row bounced, the intake's peak RSS, its counters."""
    storm: BounceStorm = run.bounce_storm
    problems = [f"{len(storm.errors)} relay errors, the first: {storm.errors[0]}"
                for _ in storm.errors[:1]]
    statuses = _statuses(run, list(storm.rows))
    not_bounced = {i: s for i, s in statuses.items() if s != "bounced"}
    if not_bounced or len(statuses) != GENUINE:
        problems.append(f"genuine reports not recorded: {sorted(not_bounced.items())[:8]} "
                        f"({len(statuses)} rows of {GENUINE})")
    role = run.roles["bounces"]
    status = Path(f"/proc/{role.proc.pid}/status").read_text()
    peak = int(next(line.split()[1] for line in status.splitlines()
                    if line.startswith("VmHWM:"))) / 1024
    if peak >= PEAK_RSS_MIB:
        problems.append(f"the intake's peak RSS {peak:.0f} MiB (at most {PEAK_RSS_MIB:.0f})")
    counters = _counters(role.metrics_port)
    refused = {dict(labels).get("reason"): value for (name, labels), value in counters.items()
               if name == "postroom_bounce_refused_total"}
    if refused.get("forged_token", 0) < storm.forged_refused:
        problems.append(f"forged tokens: {storm.forged_refused} refused at RCPT, "
                        f"{refused.get('forged_token', 0)} counted")
    latencies = sorted(storm.recorded[i] - storm.arrived[i] for i in storm.recorded
                       if i in storm.arrived)
    p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] if latencies else None
    run.notes.append(
        f"bounce storm: {len(storm.recorded)}/{GENUINE} genuine reports recorded, DSN to row "
        f"bounced p50 {statistics.median(latencies) if latencies else float('nan'):.2f} s, p99 "
        f"{p99 if p99 is not None else float('nan'):.2f} s (checked at 50 ms); DATA replies "
        f"{dict(sorted(storm.replies.items()))}; {storm.replayed} sent again; "
        f"{storm.forged_refused} forged tokens refused at RCPT; junk {storm.junk_taken} taken, "
        f"{storm.junk_refused} answered 421; intake peak RSS {peak:.0f} MiB; refused by reason "
        f"{dict(sorted((k or '', v) for k, v in refused.items()))}")
    return problems


def after_stop(run: Any) -> list[str]:
    """After SIGTERM: the intake logged no traceback."""
    logs = sorted(run.log_dir.glob("bounces.*.log"))
    text = "".join(p.read_text(errors="replace") for p in logs)
    return ["the bounce intake logged a traceback"] if "Traceback" in text else []
