"""`make demo`: the seed's story on the local stack, run with the real `postroom` commands.

Starts the dev SMTP server, relay, sender and recorder as processes, queues the September report
for four recipients (one rejected, one deferred twice), shows who received what, then takes the
mail server down, queues October, brings the server back and shows October delivered.
"""

from __future__ import annotations

import dataclasses
import email
import email.policy
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

import sqlalchemy as sa

from postroom.kafka import make_admin
from postroom.settings import Settings
from postroom.topics import all_topics
from sender.devsmtp import read_maildir

TEAM = ["finance@example.com", "ops@example.com", "old.manager@example.com", "ceo@example.com"]
RETRY_DELAYS = "2s,4s,8s,16s"
DEMO_SCHEMA = "postroom_demo"
TERMINAL = {"sent", "failed", "dead"}


def say(text: str) -> None:
    print(f"\n== {text}", flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclasses.dataclass
class Demo:
    settings: Settings
    workdir: Path
    env: dict[str, str]
    smtp_port: int
    processes: dict[str, subprocess.Popen[bytes]] = dataclasses.field(default_factory=dict)
    logs: dict[str, IO[bytes]] = dataclasses.field(default_factory=dict)

    def postroom(self, *args: str, check: bool = True) -> str:
        """Run one `postroom` command as a user would, echoing it and its output."""
        print(f"$ postroom {shlex.join(args)}", flush=True)
        done = subprocess.run([sys.executable, "-m", "postroom.cli", *args], env=self.env,
                              capture_output=True, text=True, check=False)
        if done.stdout.strip():
            print(done.stdout.rstrip())
        if check and done.returncode != 0:
            raise SystemExit(f"postroom {args[0]} failed ({done.returncode}):\n{done.stderr}")
        return done.stdout

    def start(self, name: str, *args: str) -> None:
        log = self.logs[name] = (self.workdir / f"{name}.log").open("ab")
        print(f"$ postroom {shlex.join(args)} &   (log: {log.name})", flush=True)
        self.processes[name] = subprocess.Popen(
            [sys.executable, "-m", "postroom.cli", *args], env=self.env, stdout=log,
            stderr=subprocess.STDOUT)

    def stop(self, name: str) -> None:
        proc = self.processes.pop(name, None)
        log = self.logs.pop(name, None)
        if log is not None:
            log.close()
        if proc is None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def start_smtp(self) -> None:
        self.start("devsmtp", "devsmtp", "--port", str(self.smtp_port),
                   "--reject", "old.manager@example.com", "--defer", "ops@example.com:2",
                   "--maildir", str(self.workdir / "maildir"))
        wait_until(lambda: _port_open(self.smtp_port), 15, "the dev SMTP server")

    def status(self, key: str) -> list[dict[str, Any]]:
        done = subprocess.run([sys.executable, "-m", "postroom.cli", "status", "--key", key,
                               "--json"], env=self.env, capture_output=True, text=True,
                              check=True)
        return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def wait_until(condition: Callable[[], Any], timeout_s: float, what: str) -> Any:
    print(f"   waiting for {what} ...", flush=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.25)
    raise SystemExit(f"demo: timed out after {timeout_s:.0f}s waiting for {what}")


def print_table(rows: Sequence[dict[str, Any]]) -> None:
    print(f"   {'recipient':<26} {'status':<9} {'attempts':<9} last error")
    for row in rows:
        print(f"   {row['recipient']:<26} {row['status']:<9} {row['attempts']:<9} "
              f"{row['last_error'] or ''}")


SEPTEMBER = (("north", 412, 51_230.50), ("south", 388, 47_915.00), ("west", 290, 36_004.25))


def make_workbook(path: Path) -> Path:
    from openpyxl import Workbook

    book = Workbook()
    sheet = book.active
    sheet.title = "September 2026"
    sheet.append(["region", "orders", "revenue"])
    for row in SEPTEMBER:
        sheet.append(list(row))
    book.save(path)
    return path


def make_html_summary(path: Path) -> Path:
    """The report owners' HTML summary: a small table of the month's figures."""
    rows = "".join(f"<tr><td>{region}</td><td>{orders}</td><td>{revenue:,.2f}</td></tr>"
                   for region, orders, revenue in SEPTEMBER)
    total = sum(revenue for _, _, revenue in SEPTEMBER)
    path.write_text(
        "<html><body><h2>Sales — September 2026</h2>"
        "<table border=\"1\"><tr><th>region</th><th>orders</th><th>revenue</th></tr>"
        f"{rows}<tr><th>total</th><th>{sum(o for _, o, _ in SEPTEMBER)}</th>"
        f"<th>{total:,.2f}</th></tr></table><p>The workbook is attached.</p></body></html>",
        encoding="utf-8")
    return path


def mime_outline(raw: bytes) -> str:
    """A received message's MIME structure on one line, e.g. mixed(alternative(plain, html), ...)."""
    def outline(part: Any) -> str:
        if part.is_multipart():
            return f"{part.get_content_subtype()}({', '.join(map(outline, part.iter_parts()))})"
        return str(part.get_content_subtype())
    return outline(email.message_from_bytes(raw, policy=email.policy.default))


def reset_schema(settings: Settings) -> None:
    engine = sa.create_engine(settings.require("database_url"))
    with engine.begin() as conn:
        conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{DEMO_SCHEMA}" CASCADE'))
    engine.dispose()


def run() -> int:
    settings = Settings.from_env()
    settings.require("database_url")
    settings.require("kafka_bootstrap_servers")
    run_id = uuid.uuid4().hex[:6]
    prefix = f"postroom-demo-{run_id}."
    workdir = Path(tempfile.mkdtemp(prefix="postroom-demo-"))
    env = {**os.environ, "POSTROOM_DATABASE_SCHEMA": DEMO_SCHEMA, "POSTROOM_TOPIC_PREFIX": prefix,
           "POSTROOM_RETRY_DELAYS": RETRY_DELAYS, "POSTROOM_SMTP_HOST": "127.0.0.1",
           "POSTROOM_SMTP_TLS": "auto", "POSTROOM_SMTP_CONNECT_TIMEOUT": "2s",
           "POSTROOM_SMTP_TIMEOUT": "10s", "POSTROOM_MAIL_FROM": "reports@example.com",
           "POSTROOM_ATTACHMENTS_ROOT": str(workdir), "POSTROOM_SENDER_GROUP": f"demo-{run_id}",
           "POSTROOM_RECORDER_GROUP": f"demo-recorder-{run_id}"}
    demo = Demo(settings, workdir, env, free_port())
    env["POSTROOM_SMTP_PORT"] = str(demo.smtp_port)
    try:
        say("Setting up: a fresh outbox schema and this run's topics (retry tiers "
            f"{RETRY_DELAYS} instead of the default 5m,10m,20m,40m)")
        reset_schema(settings)
        demo.postroom("db", "upgrade")
        demo.postroom("topics", "create")

        say("Starting the dev SMTP server (rejects old.manager@, defers ops@ twice), "
            "relay, sender and recorder")
        demo.start_smtp()
        demo.start("relay", "relay")
        demo.start("sender", "sender")
        demo.start("recorder", "recorder")

        say("The report job: build the September workbook and an HTML summary, and queue them "
            "for four recipients")
        report = make_workbook(workdir / "sales_2026-09.xlsx")
        summary = make_html_summary(workdir / "summary_2026-09.html")
        enqueue = ["enqueue", "--key", "sales-report-2026-09",
                   "--subject", "Sales report — September 2026",
                   "--body", "The September sales report is attached.", "--attach", str(report),
                   "--html-file", str(summary),
                   *[arg for address in TEAM for arg in ("--to", address)]]
        demo.postroom(*enqueue)
        say("The job runs again by mistake: nothing is queued twice")
        demo.postroom(*enqueue)

        say("Delivery: finance@ and ceo@ at once, old.manager@ refused, ops@ after two deferrals")
        rows = wait_until(lambda: (r := demo.status("sales-report-2026-09"))
                          and all(x["status"] in TERMINAL for x in r) and r, 90,
                          "every September recipient to reach a final state")
        say("Who received the September report, after how many attempts, and why not")
        print_table(rows)
        demo.postroom("status", "--key", "sales-report-2026-09")

        say("The mail server goes down; the October report is queued meanwhile")
        demo.stop("devsmtp")
        october = ["enqueue", "--key", "sales-report-2026-10", "--to", "finance@example.com",
                   "--subject", "Sales report — October 2026",
                   "--body", "The October sales report is attached.", "--attach", str(report)]
        demo.postroom(*october)
        rows = wait_until(lambda: [r for r in demo.status("sales-report-2026-10")
                                   if r["status"] == "retrying"], 60,
                          "the October email to fail and be scheduled for a retry")
        print_table(rows)

        say("The mail server is back; the retry delivers October")
        demo.start_smtp()
        rows = wait_until(lambda: [r for r in demo.status("sales-report-2026-10")
                                   if r["status"] == "sent"], 90, "October to be delivered")
        print_table(rows)

        say("What the mail server received (Maildir), and the consumer groups' lag")
        messages = read_maildir(workdir / "maildir")
        received = Counter(m.rcpt for m in messages)
        for address in TEAM:
            print(f"   {address:<26} {received.get(address, 0)} message(s)")
        print(f"   {sum(received.values())} in all: September to three recipients, "
              "October to finance@, nothing twice")
        september = next(m for m in messages if m.rcpt == "ceo@example.com")
        print(f"   ceo@'s September email: {mime_outline(september.raw)} "
              "(text and HTML summary, the workbook attached)")
        demo.postroom("lag")
        say("Done. The whole run is on the local stack; logs are in " + str(workdir))
    finally:
        for name in list(demo.processes):
            demo.stop(name)
        admin = make_admin(dataclasses.replace(settings, topic_prefix=prefix))
        names = all_topics(prefix, len(RETRY_DELAYS.split(",")))
        for future in admin.delete_topics(names, operation_timeout=10).values():
            try:
                future.result()
            except Exception as exc:  # noqa: BLE001 - cleanup is best effort; say what was left
                print(f"   could not delete a demo topic: {exc}", file=sys.stderr)
    shutil.rmtree(workdir / "maildir", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(run())
