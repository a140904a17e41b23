"""`make demo`: the seed's story (postroom.devkit.story) on the local stack, run with the real
`postroom` commands.

Starts the dev SMTP server, relay, sender and recorder as processes, queues the September report
for four recipients (one rejected, one deferred twice), shows who received what, then takes the
mail server down, queues October, brings the server back and shows October delivered. Last,
November goes through a throwaway Postfix smarthost that accepts every recipient; old.manager@'s
refusal comes back as a DSN to `postroom bounces`, and the row ends bounced.
"""

from __future__ import annotations

import dataclasses
import email
import email.policy
import json
import os
import secrets
import shlex
import shutil
import socket
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from postroom.devkit.devsmtp_maildir import read_maildir
from postroom.devkit.ports import free_port, free_ports
from postroom.devkit.processes import PostroomProcesses, run_postroom
from postroom.devkit.scratch import scratch, scratch_env
from postroom.devkit.smarthost import Smarthost, SmarthostError
from postroom.devkit.story import (
    BOUNCE_ADDRESS,
    DEFERRED,
    FINAL_STATUSES,
    NOVEMBER,
    NOVEMBER_ENDS,
    OCTOBER,
    REFUSED,
    SEPTEMBER,
    TEAM,
    Report,
    make_html_summary,
    make_workbook,
)
from postroom.devkit.wait import wait_until
from postroom.settings import Settings

RETRY_DELAYS = "2s,4s,8s,16s"


def say(text: str) -> None:
    print(f"\n== {text}", flush=True)



@dataclasses.dataclass
class Demo:
    workdir: Path
    env: dict[str, str]
    smtp_port: int
    processes: PostroomProcesses = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.processes = PostroomProcesses(self.env, self.workdir)

    def postroom(self, *args: str) -> str:
        """Run one `postroom` command as a user would, echoing it and its output."""
        print(f"$ postroom {shlex.join(args)}", flush=True)
        done = run_postroom(*args, env=self.env)
        if done.stdout.strip():
            print(done.stdout.rstrip())
        if done.returncode != 0:
            raise SystemExit(f"postroom {args[0]} failed ({done.returncode}):\n{done.stderr}")
        return done.stdout

    def start(self, name: str, *args: str, env: dict[str, str] | None = None) -> None:
        shown = "".join(f"{k}={shlex.quote(v)} " for k, v in (env or {}).items()
                        if "SECRET" not in k)
        print(f"$ {shown}postroom {shlex.join(args)} &   (log: {self.processes.log_path(name)})",
              flush=True)
        self.processes.start(name, *args, env=env)

    def start_smtp(self) -> None:
        defer = [arg for address, times in DEFERRED.items()
                 for arg in ("--defer", f"{address}:{times}")]
        self.start("devsmtp", "devsmtp", "--port", str(self.smtp_port), "--reject", REFUSED,
                   *defer, "--maildir", str(self.workdir / "maildir"))
        wait(lambda: _port_open(self.smtp_port), 15, "the dev SMTP server")

    def status(self, key: str) -> list[dict[str, Any]]:
        done = run_postroom("status", "--key", key, "--json", env=self.env)
        if done.returncode != 0:
            raise SystemExit(f"postroom status failed ({done.returncode}):\n{done.stderr}")
        return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def wait(condition: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """wait_until, saying what the demo waits for; a timeout ends the demo with that message."""
    print(f"   waiting for {what} ...", flush=True)
    try:
        return wait_until(condition, timeout_s, what, poll_interval_s=0.25)
    except TimeoutError as exc:
        raise SystemExit(f"demo: {exc}") from None


def enqueue_args(report: Report, attachment: Path, html: Path | None = None) -> list[str]:
    """`postroom enqueue` as the report job calls it for ``report`` (with an HTML summary)."""
    return ["enqueue", "--key", report.key, "--subject", report.subject, "--body", report.body,
            "--attach", str(attachment), *(["--html-file", str(html)] if html else []),
            *[arg for address in report.recipients for arg in ("--to", address)]]


def mime_outline(raw: bytes) -> str:
    """A received message's MIME structure on one line, e.g. mixed(alternative(plain, html), ...)."""
    def outline(part: Any) -> str:
        if part.is_multipart():
            return f"{part.get_content_subtype()}({', '.join(map(outline, part.iter_parts()))})"
        return str(part.get_content_subtype())
    return outline(email.message_from_bytes(raw, policy=email.policy.default))


@dataclasses.dataclass
class CompanyRelay:
    """November's path: a throwaway Postfix smarthost relaying example.com to the dev SMTP
    server and the bounce domain to `postroom bounces`; the sender, started again with
    POSTROOM_BOUNCE_ADDRESS, sends through it with signed VERP return paths."""

    demo: Demo
    smarthost: Smarthost | None = None
    directory: Path | None = None
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    relay_port: int = 0

    def start(self) -> None:
        """The smarthost and `postroom bounces`, started early so they are up by November."""
        relay_port, bounce_port = free_ports(2)
        self.env = {"POSTROOM_BOUNCE_ADDRESS": BOUNCE_ADDRESS,
                    "POSTROOM_BOUNCE_SECRET": secrets.token_hex(16),
                    "POSTROOM_BOUNCE_LISTEN": f"127.0.0.1:{bounce_port}"}
        self.relay_port = relay_port
        # Postfix's own user must reach its directories: a directory of /tmp open to it.
        self.directory = Path(tempfile.mkdtemp(prefix="postroom-smarthost-"))
        self.directory.chmod(0o755)
        smarthost = Smarthost(self.directory, relay_port,
                              {"example.com": ("127.0.0.1", self.demo.smtp_port),
                               "bounce.example.com": ("127.0.0.1", bounce_port)},
                              delay_warning_s=None,
                              say=lambda text: print(f"   {text}", flush=True))
        try:
            smarthost.start()
        except SmarthostError as exc:
            print(f"   no smarthost, November is left out: {exc}")
            return
        self.smarthost = smarthost
        self.demo.start("bounces", "bounces", env=self.env)

    def november(self, workbook: Path) -> None:
        if self.smarthost is None:
            return
        self.demo.processes.stop("sender")
        self.demo.start("sender", "sender",
                        env={**self.env, "POSTROOM_SMTP_PORT": str(self.relay_port)})
        wait(lambda: "bounce intake listening" in self.demo.processes.log("bounces"), 30,
             "postroom bounces to listen")
        self.demo.postroom(*enqueue_args(NOVEMBER, workbook))
        wait(lambda: (r := self.demo.status(NOVEMBER.key))
                    and {x["recipient"]: x["status"] for x in r} == NOVEMBER_ENDS and r, 60,
                    "old.manager@'s bounce to come back through the smarthost")
        say("November: the relay accepted all four (sent); old.manager@'s DSN came back to its "
            "return path bounces+<token>@bounce.example.com, and the row is bounced")
        # The table as `postroom status` prints it: its columns, "(earlier attempt)" marks.
        self.demo.postroom("status", "--key", NOVEMBER.key)
        for line in self.demo.processes.log("bounces").splitlines():
            if "bounce report" in line:
                print(f"   postroom bounces: {line.split(' ', 3)[-1]}")

    def stop(self) -> None:
        if self.smarthost is not None:
            self.smarthost.stop()
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)


def show_console(demo: Demo, workdir: Path) -> None:
    """`postroom web` on this run's data, its address printed last; from a terminal it serves
    until Enter (the schema and topics go with the demo's end)."""
    import importlib.util

    if importlib.util.find_spec("starlette") is None:
        print("   the console needs the web extra: pip install 'postroom[web]'")
        return
    token_file = workdir / "console-token"
    token_file.write_text(secrets.token_hex(16) + "\n")
    port = free_port()
    demo.start("web", "web", env={"POSTROOM_WEB_LISTEN": f"127.0.0.1:{port}",
                                  "POSTROOM_WEB_OPERATOR_TOKEN_FILE": str(token_file)})
    wait(lambda: _port_open(port), 60, "the console")
    say(f"The console, on this run's data: http://127.0.0.1:{port}/ (operator token: "
        f"{token_file.read_text().strip()}, in {token_file})")
    if sys.stdin.isatty():
        input("   press Enter to end the demo (its schema and topics are removed) ")


def run() -> int:
    settings = Settings.from_env()
    settings.require("database_url")
    settings.require("kafka_bootstrap_servers")
    workdir = Path(tempfile.mkdtemp(prefix="postroom-demo-"))
    # Its own schema, topics and groups, removed at the end; `db upgrade` and `topics create`
    # are part of the show.
    with scratch(settings, "postroom_demo", create=False,
                 say=lambda text: print(f"   {text}", flush=True)) as names:
        smtp_port = free_port()
        env = {**os.environ, **scratch_env(names), "POSTROOM_RETRY_DELAYS": RETRY_DELAYS,
               "POSTROOM_SMTP_HOST": "127.0.0.1", "POSTROOM_SMTP_PORT": str(smtp_port),
               "POSTROOM_SMTP_TLS": "auto", "POSTROOM_SMTP_CONNECT_TIMEOUT": "2s",
               "POSTROOM_SMTP_TIMEOUT": "10s", "POSTROOM_MAIL_FROM": "reports@example.com",
               "POSTROOM_ATTACHMENTS_ROOT": str(workdir)}
        demo = Demo(workdir, env, smtp_port)
        company_relay = CompanyRelay(demo)
        try:
            say("Setting up: a fresh outbox schema and this run's topics (retry tiers "
                f"{RETRY_DELAYS} instead of the default 5m,10m,20m,40m)")
            demo.postroom("db", "upgrade")
            demo.postroom("topics", "create")

            say("Starting the dev SMTP server (rejects old.manager@, defers ops@ twice), "
                "relay, sender and recorder")
            demo.start_smtp()
            demo.start("relay", "relay")
            demo.start("sender", "sender")
            demo.start("recorder", "recorder")
            say("And for November, the company's relay: a Postfix smarthost that answers 250 to "
                "every recipient and reports failures later by mail, and postroom bounces, "
                "which takes those reports")
            company_relay.start()

            say("The report job: build the September workbook and an HTML summary, and queue "
                "them for four recipients")
            workbook = make_workbook(workdir)
            enqueue = enqueue_args(SEPTEMBER, workbook, make_html_summary(workdir))
            demo.postroom(*enqueue)
            say("The job runs again by mistake: nothing is queued twice")
            demo.postroom(*enqueue)

            say("Delivery: finance@ and ceo@ at once, old.manager@ refused, ops@ after two deferrals")
            wait(lambda: (r := demo.status(SEPTEMBER.key))
                        and all(x["status"] in FINAL_STATUSES for x in r) and r, 90,
                        "every September recipient to reach a final state")
            say("Who received the September report, after how many attempts, and why not")
            demo.postroom("status", "--key", SEPTEMBER.key)

            say("The mail server goes down; the October report is queued meanwhile")
            demo.processes.stop("devsmtp")
            demo.postroom(*enqueue_args(OCTOBER, workbook))
            wait(lambda: [r for r in demo.status(OCTOBER.key)
                                 if r["status"] == "retrying"], 60,
                        "the October email to fail and be scheduled for a retry")
            demo.postroom("status", "--key", OCTOBER.key)

            say("The mail server is back; the retry delivers October")
            demo.start_smtp()
            wait(lambda: [r for r in demo.status(OCTOBER.key)
                                 if r["status"] == "sent"], 90, "October to be delivered")
            demo.postroom("status", "--key", OCTOBER.key)

            say("What the mail server received (Maildir), and the consumer groups' lag")
            messages = read_maildir(workdir / "maildir")
            received = Counter(m.rcpt for m in messages)
            for address in TEAM:
                print(f"   {address:<26} {received.get(address, 0)} message(s)")
            print(f"   {sum(received.values())} in all: September to three recipients, "
                  "October to finance@, nothing twice")
            september = next(m for m in messages
                             if m.rcpt == "ceo@example.com" and b"September" in m.raw)
            print(f"   ceo@'s September email: {mime_outline(september.raw)} "
                  "(text and HTML summary, the workbook attached)")
            demo.postroom("lag")

            say("November goes through the company's relay; the sender starts again with "
                "POSTROOM_BOUNCE_ADDRESS, so each email's return path names its row, signed")
            company_relay.november(workbook)
            say("Done. The whole run is on the local stack; logs are in " + str(workdir))
            show_console(demo, workdir)
        finally:
            demo.processes.stop_all()
            company_relay.stop()
    shutil.rmtree(workdir / "maildir", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(run())
