"""Runs the real pipeline as processes (relay, two senders, recorder) over one scenario's own schema,
topics and groups, and injects faults into it and into this checkout's own stack.

The broker and PostgreSQL are the ones `scripts/services.sh` runs for this checkout (its ports):
every fault on them goes through that script, which touches only its own state dir's servers.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from chaos.mailserver import ChaosMailServer
from postroom import enqueue
from postroom.devkit.histograms import SENT_MARK_WINDOW, Buckets, scrape_histogram
from postroom.devkit.ports import free_port
from postroom.kafka import create_topics, make_admin
from postroom.relay.db import make_engine, upgrade
from postroom.schemas.registry import register_contract
from postroom.settings import Settings
from postroom.topics import all_topics, priority_topic, results_topic, retry_topic
from support.registry import delete_subjects
from support.stack import REPO

SERVICES = REPO / "scripts" / "services.sh"
# Short tiers so a scenario drains in seconds; 5 attempts in all.
RETRY_DELAYS = "500ms,1s,2s,4s"
# The bounce intake's, in a scenario that runs one (the bounce storm).
BOUNCE_ADDRESS = "bounces@bounce.example.com"
BOUNCE_SECRET = "chaos-bounce-secret-0123456789"  # noqa: S105 - the suite's own
TIERS = 4
FEED_CHUNK = 50
# Sends SIGKILL to argv[1] at the time.time() argv[2], and prints when it did. The suite's mail
# server is a thread of this process: a signal sent from here waits for the GIL, which that thread
# holds while it writes a burst of replies, so kills landed right after bursts of 250s, before a
# sender could have read any of them (8 of one run's 11 window duplicates had their 250 written
# in the last millisecond before the kill). A process of its own kills at its own moment.
# A topic of the cluster's own that the failover suite writes one record to, to see whether
# writes are refused (Run.write_refused); no role reads it.
PROBE_TOPIC = "postroom-chaos.write-probe"
PROBE_REPLICAS = 3
KILLER = """
import os, sys, time
pid, at = int(sys.argv[1]), float(sys.argv[2])
time.sleep(max(0.0, at - time.time()))
now = time.time()
os.kill(pid, 9)
print(repr(now))
"""


@dataclasses.dataclass
class Kill:
    """A sender killed with SIGKILL: when, the keys its ledger rows held as `sending`, and how
    many the other senders' processes held as `sending` at that moment."""

    at: float          # time.time() just before the SIGKILL
    owner_pid: int
    in_doubt: frozenset[str]
    others_sending: int = 0
    # From the SIGKILL to the process reaped. The kernel frees a process's memory before it
    # closes its sockets, so for this long a server may still answer the dead process.
    reaped_s: float = 0.0
    repeated: bool = False  # found nothing in doubt, so the scenario killed again


@dataclasses.dataclass
class Role:
    name: str          # relay, sender1, sender2, recorder
    command: str       # the postroom subcommand
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    metrics_port: int | None = None
    supervised: int = 0  # starts again after it exited at its start on a refused connection


# What a role prints when PostgreSQL refuses its connection at start (a fast restart under way):
# it stops, as on a wrong address, and leaves trying again to its supervisor (docs/operations.md,
# "Running in production"). The harness is that supervisor; it starts such a role again, a
# second later, at most SUPERVISED_STARTS times.
REFUSED_AT_START = "error: cannot use the database (POSTROOM_DATABASE_URL): connection failed"
SUPERVISED_STARTS = 3


def recipients_for(count: int, tag: str, start: int = 0) -> list[str]:
    """The known input set: 75% accepted, 15% deferred once or twice, 5% rejected, 5% never;
    ``start`` continues a set where an earlier call ended."""
    kinds = ["reject", "never", "defer1", "defer1", "defer2"] + ["accept"] * 15
    return [f"{kinds[i % len(kinds)]}-{tag}-{i}@example.com" for i in range(start, start + count)]


def expected_status(recipient: str) -> str:
    kind = recipient.split("-", 1)[0]
    return {"reject": "failed", "never": "dead"}.get(kind, "sent")


class Run:
    """One scenario's pipeline. ``start()``, feed, inject faults, ``wait_drained()``, ``stop()``."""

    def __init__(self, base: Settings, name: str, log_dir: Path, mail: ChaosMailServer,
                 extra_env: dict[str, str] | None = None,
                 role_env: dict[str, dict[str, str]] | None = None,
                 group_config: dict[str, str] | None = None, bounces: bool = False) -> None:
        tag = uuid.uuid4().hex[:8]
        self.name = name
        self.tag = tag
        self.settings = dataclasses.replace(
            base, database_schema=f"chaos_{tag}", topic_prefix=f"chaos{tag}.",
            sender_group=f"chaos-sender-{tag}", recorder_group=f"chaos-recorder-{tag}",
            retry_delays_s=(0.5, 1.0, 2.0, 4.0))
        self.mail = mail
        self.log_dir = log_dir / name
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.extra_env = extra_env or {}
        self.role_env = role_env or {}  # by command: what only that kind of role is given
        self.group_config = group_config or {}  # set on the sender's and recorder's groups
        self.roles = {r.name: r for r in (
            Role("recorder", "recorder", metrics_port=free_port()),
            Role("relay", "relay", metrics_port=free_port()),
            Role("sender1", "sender", metrics_port=free_port()),
            Role("sender2", "sender", metrics_port=free_port()))}
        # `postroom bounces` on this port, when the scenario has one
        self.bounce_port: int | None = free_port() if bounces else None
        if bounces:
            self.roles["bounces"] = Role("bounces", "bounces", metrics_port=free_port())
        self.engine = make_engine(self.settings, application_name=f"chaos-harness-{tag}")
        self.kills: list[Kill] = []
        self.faults = 0
        self.poisoned = 0  # poison() calls
        self.last_fault_at = 0.0
        self.expected: dict[str, str] = {}  # recipient -> expected final status
        self._feeder: threading.Thread | None = None
        self.feed_error: BaseException | None = None
        self.faults_done = threading.Event()  # set when the scenario has injected its faults
        self.faults_done_at = 0.0  # time.time() when it was set
        # time.time() when the first fault on the cluster began (the failover suite): the longest
        # pause in deliveries is measured from it (checks.longest_pause)
        self.node_fault_began_at = 0.0
        self.notes: list[str] = []  # what a scenario saw, printed with its outcome
        self.write_refusal: str | None = None  # what write_refused() saw during the faults
        # Rows the scenario wrote that are not part of the known input (the poison storm's), and
        # what they are: not counted by finished(), checked by the scenario itself.
        self.hostile_rows: dict[int, str] = {}
        self.storm: Any = None  # the poison storm's own record of what it injected
        self.counters: dict[str, dict[str, float]] = {}  # per role, scraped before stop()

    # -- set-up and processes ------------------------------------------------------------------

    def prepare(self) -> None:
        upgrade(self.engine, self.settings.database_schema)
        create_topics(self.settings)
        if len(make_admin(self.settings).list_topics(timeout=30).brokers) >= PROBE_REPLICAS:
            # Before any fault: made during "two brokers down", three replicas cannot be placed.
            self.ensure_probe_topic()
        if self.group_config:
            self.set_group_config()
        if self.settings.schema_registry_url:
            register_contract(self.settings)

    def set_group_config(self) -> None:
        """The groups' own configs on the broker (KIP-848: incrementalAlterConfigs of a GROUP),
        within the broker's group.consumer.min/max bounds."""
        admin = make_admin(self.settings)
        entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
                   for k, v in self.group_config.items()]
        resources = [ConfigResource(ResourceType.GROUP, group, incremental_configs=entries)
                     for group in (self.settings.sender_group, self.settings.recorder_group)]
        for future in admin.incremental_alter_configs(resources).values():
            future.result()
        # The broker describes the new values a moment after the change returns, and a role
        # reads them at its start to choose its group protocol.
        def described() -> bool:
            found = admin.describe_configs([ConfigResource(ResourceType.GROUP, r.name)
                                            for r in resources], request_timeout=10)
            return all(all(f.result()[k].value == v for k, v in self.group_config.items())
                       for f in found.values())
        self.wait_until(described, 30, "the groups' configs to be described")

    def env(self, role: Role) -> dict[str, str]:
        url = sa.make_url(self.settings.require("database_url")).update_query_dict(
            {"application_name": f"chaos-{self.tag}-{role.name}"})
        return {
            **os.environ,
            "POSTROOM_DATABASE_URL": url.render_as_string(hide_password=False),
            "POSTROOM_DATABASE_SCHEMA": self.settings.database_schema or "",
            "POSTROOM_TOPIC_PREFIX": self.settings.topic_prefix,
            "POSTROOM_SENDER_GROUP": self.settings.sender_group,
            "POSTROOM_RECORDER_GROUP": self.settings.recorder_group,
            "POSTROOM_RETRY_DELAYS": RETRY_DELAYS,
            "POSTROOM_SMTP_HOST": "127.0.0.1",
            "POSTROOM_SMTP_PORT": str(self.mail.port),
            "POSTROOM_SMTP_TLS": "none",
            "POSTROOM_MAIL_FROM": "reports@example.com",
            "POSTROOM_RELAY_POLL_INTERVAL": "200ms",
            "POSTROOM_LOG_LEVEL": "INFO",
            **({"POSTROOM_SCHEMA_REGISTRY_URL": self.settings.schema_registry_url}
               if self.settings.schema_registry_url else {}),
            **({"POSTROOM_METRICS_PORT": str(role.metrics_port)} if role.metrics_port else {}),
            **({"POSTROOM_BOUNCE_ADDRESS": BOUNCE_ADDRESS, "POSTROOM_BOUNCE_SECRET": BOUNCE_SECRET,
                "POSTROOM_BOUNCE_LISTEN": f"127.0.0.1:{self.bounce_port}"}
               if role.command == "bounces" else {}),
            **self.extra_env,
            **self.role_env.get(role.command, {}),
        }

    def start_role(self, name: str) -> None:
        role = self.roles[name]
        role.starts += 1
        log = (self.log_dir / f"{name}.{role.starts}.log").open("wb")
        role.proc = subprocess.Popen(
            [sys.executable, "-m", "postroom.cli", role.command], env=self.env(role),
            stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        log.close()

    def start(self) -> None:
        for name in self.roles:
            self.start_role(name)

    def wait_assigned(self, timeout_s: float = 90) -> None:
        """Until every sender's current process has been assigned partitions: a kill during the
        group's first rebalance would test the rebalance, not the takeover."""
        def assigned(name: str) -> bool:
            role = self.roles[name]
            text = (self.log_dir / f"{name}.{role.starts}.log").read_text(errors="replace")
            return f"assigned {self.settings.topic_prefix}" in text
        self.wait_until(lambda: all(assigned(n) for n in ("sender1", "sender2")), timeout_s,
                        "both senders to be assigned partitions")

    def group_protocols(self) -> str:
        """Which protocol the sender's and recorder's groups run on, as the broker says: a note,
        so a run's table shows which one it measured."""
        admin = make_admin(self.settings)
        groups = [self.settings.sender_group, self.settings.recorder_group]
        types = []
        for group, future in admin.describe_consumer_groups(groups, request_timeout=30).items():
            try:
                types.append(f"{group.split('-')[1]} {future.result().type.name}")
            except KafkaException as exc:
                types.append(f"{group.split('-')[1]} unknown ({exc})")
        return "groups: " + ", ".join(sorted(types))

    def sent_mark_window(self) -> Buckets:
        """The running senders' sent_mark_window_seconds histograms (reply read to the mark's
        commit), summed: the processes started last, as a killed one's went with it."""
        return scrape_histogram([role.metrics_port for role in self.roles.values()
                                 if role.command == "sender"
                                 and role.metrics_port is not None and role.proc is not None
                                 and role.proc.poll() is None], SENT_MARK_WINDOW)

    def alive(self) -> list[str]:
        return [n for n, r in self.roles.items() if r.proc is not None and r.proc.poll() is None]

    def stop(self) -> dict[str, int | None]:
        """SIGTERM every role; their exit codes (None: did not stop in time, then killed)."""
        codes: dict[str, int | None] = {}
        for role in self.roles.values():
            if role.proc is not None and role.proc.poll() is None:
                role.proc.send_signal(signal.SIGCONT)
                role.proc.terminate()
        for name, role in self.roles.items():
            if role.proc is None:
                continue
            try:
                codes[name] = role.proc.wait(60)
            except subprocess.TimeoutExpired:
                role.proc.kill()
                role.proc.wait()
                codes[name] = None
        return codes

    def drop(self) -> None:
        with self.engine.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{self.settings.database_schema}" CASCADE'))
        self.engine.dispose()
        admin = make_admin(self.settings)
        names = all_topics(self.settings.topic_prefix, TIERS)
        for future in admin.delete_topics(names, operation_timeout=30).values():
            future.result()
        if self.settings.schema_registry_url:
            delete_subjects(self.settings.schema_registry_url, self.settings)

    # -- input -----------------------------------------------------------------------------------

    def feed(self, recipients: list[str], rate_per_s: float, backlog: int = 0,
             steady: bool = False) -> None:
        """Enqueue ``recipients`` on a thread, FEED_CHUNK per transaction, at about this rate.
        With a ``backlog``, go on with more of the same set until ``faults_done`` is set, keeping
        at least that many rows unfinished: the senders never run dry while faults come.
        ``steady``: go on at the rate until then, whatever is unfinished (rows become final
        through the recorder: a recorder held up would stop a backlog's feed, and the senders'
        deliveries would pause for want of mail, not by a fault of theirs)."""
        for rcpt in recipients:
            self.expected[rcpt] = expected_status(rcpt)

        def run() -> None:
            try:
                chunks = range(0, len(recipients), FEED_CHUNK)
                for n, start in enumerate(chunks):
                    chunk = recipients[start:start + FEED_CHUNK]
                    self._enqueue(f"feed-{n}", chunk)
                    time.sleep(len(chunk) / rate_per_s)
                n = len(chunks)
                while (backlog or steady) and not self.faults_done.is_set():
                    if backlog and len(self.expected) - self.finished() >= backlog:
                        time.sleep(0.2)
                        continue
                    chunk = recipients_for(FEED_CHUNK, self.tag, start=len(self.expected))
                    for rcpt in chunk:
                        self.expected[rcpt] = expected_status(rcpt)
                    self._enqueue(f"feed-{n}", chunk)
                    n += 1
                    time.sleep(len(chunk) / rate_per_s)
            except BaseException as exc:  # noqa: BLE001 - reported by wait_fed()
                self.feed_error = exc

        self._feeder = threading.Thread(target=run, name="feeder", daemon=True)
        self._feeder.start()

    def _enqueue(self, key: str, recipients: list[str]) -> None:
        while True:
            try:
                with self.engine.begin() as conn:
                    enqueue(conn, key=f"{self.tag}-{key}", recipients=recipients,
                            subject="Report", body="The report is attached in spirit.")
            except sa.exc.OperationalError:
                time.sleep(0.5)  # the database is being restarted: the job retries
            else:
                return

    def wait_fed(self) -> None:
        if self._feeder is not None:
            self._feeder.join(300)
        if self.feed_error is not None:
            raise AssertionError("feeding the outbox failed") from self.feed_error

    # -- observing -------------------------------------------------------------------------------

    def query(self, sql: str, **params: Any) -> list[sa.Row[Any]]:
        deadline = time.monotonic() + 60
        while True:
            try:
                with self.engine.connect() as conn:
                    return list(conn.execute(sa.text(sql), params))
            except sa.exc.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def finished(self) -> int:
        """Rows of the known input in a final state (not the hostile rows)."""
        return self.query("SELECT count(*) FROM outbox WHERE status IN ('sent','failed','dead') "
                          "AND NOT id = ANY(:ids)", ids=list(self.hostile_rows))[0][0]

    def accepted(self) -> int:
        return sum(1 for r in self.mail.replies if r.code == 250)

    def sending(self) -> dict[str, int]:
        """How many keys each sender's current process holds as `sending` in the ledger."""
        pids = {str(r.proc.pid): n for n, r in self.roles.items()
                if r.command == "sender" and r.proc is not None}
        counts = dict.fromkeys(pids.values(), 0)
        for pid, n in self.query("SELECT split_part(owner, ':', 2), count(*) FROM sender_ledger "
                                 "WHERE state = 'sending' "
                                 "AND idempotency_key NOT LIKE 'dead-letter %' GROUP BY 1"):
            if pid in pids:
                counts[pids[pid]] = n
        return counts

    def busy_senders(self, share: float, timeout_s: float, samples: int = 5,
                     every_s: float = 0.2) -> list[str]:
        """The senders whose current process held at least ``share`` of its SMTP concurrency as
        `sending` at each of the last ``samples`` looks, ``every_s`` apart (a backlog on its
        partitions, not a burst of retries coming due), once there is one; none after
        ``timeout_s``, so the kill that follows shows it."""
        wanted = share * self.settings.smtp_concurrency
        deadline = time.monotonic() + timeout_s
        seen: list[dict[str, int]] = []
        while True:
            seen = [*seen, self.sending()][-samples:]
            busy = [name for name in seen[-1]
                    if len(seen) == samples and all(s.get(name, 0) >= wanted for s in seen)]
            if busy or time.monotonic() > deadline:
                return busy
            time.sleep(every_s)

    def wait_until(self, condition: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: timed out after {timeout_s:.0f}s waiting for "
                                     f"{what}; logs in {self.log_dir}")
            time.sleep(0.2)

    def wait_drained(self, timeout_s: float) -> float:
        """Seconds from the last fault until every row is final."""
        self.wait_fed()
        total = len(self.expected)

        def drained() -> bool:
            self.supervise()
            # No fault is injected now: a role that exited did so on its own, and the rest of
            # its input would wait for ever; say which and why at once.
            if exited := self.exited():
                raise AssertionError(f"{self.name}: {'; '.join(exited)} while the input drained; "
                                     f"logs in {self.log_dir}")
            return self.finished() >= total
        self.wait_until(drained, timeout_s, f"all {total} rows to reach sent/failed/dead")
        return time.time() - self.last_fault_at if self.last_fault_at else 0.0

    def supervise(self) -> None:
        """Start again, as a supervisor would, each role that exited at its start because the
        database refused its connection (REFUSED_AT_START), and say so."""
        for name, role in self.roles.items():
            if role.proc is None or role.proc.poll() != 1 or role.supervised >= SUPERVISED_STARTS:
                continue
            text = (self.log_dir / f"{name}.{role.starts}.log").read_text(errors="replace")
            if REFUSED_AT_START not in text:
                continue
            role.supervised += 1
            print(f"chaos: {self.name}: {name} exited at its start, PostgreSQL refusing the "
                  f"connection; started again a second later, as its supervisor would "
                  f"({role.supervised} of {SUPERVISED_STARTS})", flush=True)
            time.sleep(1.0)
            self.start_role(name)

    def exited(self) -> list[str]:
        """Each role whose current process has exited: its code and its log's last line."""
        found = []
        for name, role in self.roles.items():
            if role.proc is None or role.proc.poll() is None:
                continue
            lines = (self.log_dir / f"{name}.{role.starts}.log").read_text(
                errors="replace").strip().splitlines()
            errors = [line for line in lines if "Error" in line or "error:" in line] or lines
            why = errors[-1][:300] if errors else "no log"
            found.append(f"{name} exited {role.proc.returncode} ({why})")
        return found

    # -- faults ----------------------------------------------------------------------------------

    def _fault(self) -> None:
        self.faults += 1
        self.last_fault_at = time.time()

    def kill(self, name: str, restart: bool = True, after_s: float = 0.0) -> None:
        """SIGKILL a role ``after_s`` from now (from a process of its own: KILLER) and start it
        again; for a sender, note what it left in doubt."""
        role = self.roles[name]
        assert role.proc is not None
        pid = role.proc.pid
        killer = subprocess.run([sys.executable, "-c", KILLER, str(pid), repr(time.time() + after_s)],
                                capture_output=True, text=True, check=True, timeout=after_s + 30)
        at = float(killer.stdout)
        role.proc.wait()
        reaped_s = time.time() - at
        if role.command == "sender":
            # The dead process changes nothing any more; no one takes its claims before
            # its partitions move, seconds from now.
            # An email's keys only: a poison record's dead letter is claimed by its origin
            # (sender/claims.py's dead_letter_key), never mailed.
            rows = self.query("SELECT idempotency_key FROM sender_ledger WHERE state = 'sending' "
                              "AND split_part(owner, ':', 2) = :pid "
                              "AND idempotency_key NOT LIKE 'dead-letter %'", pid=str(pid))
            others = sum(n for other, n in self.sending().items() if other != name)
            self.kills.append(Kill(at, pid, frozenset(r[0] for r in rows), others, reaped_s))
        if restart:
            self.start_role(name)
        self._fault()

    def pause(self, name: str, seconds: float) -> None:
        role = self.roles[name]
        assert role.proc is not None
        role.proc.send_signal(signal.SIGSTOP)
        time.sleep(seconds)
        role.proc.send_signal(signal.SIGCONT)
        self._fault()

    def terminate_backends(self, name_prefix: str) -> int:
        """pg_terminate_backend of the connections of the roles whose name starts so."""
        rows = self.query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name LIKE :app", app=f"chaos-{self.tag}-{name_prefix}%")
        self._fault()
        return len(rows)

    def kill_broker(self, down_s: float) -> None:
        services("kill-kafka")
        time.sleep(down_s)
        services("up")
        self._fault()

    def kill_relay_with_broker_down(self, down_s: float) -> None:
        """SIGKILL the broker, and ``down_s`` later the relay, which has claimed a batch of what
        was fed meanwhile and waits for the broker's acknowledgements; start the broker, then the
        relay. The rows the dead relay held were never published: only their claims keep them.
        A relay that held no claim when killed would prove nothing: that fails the run."""
        services("kill-kafka")
        time.sleep(down_s)
        held = self.query("SELECT count(*) FROM outbox_queue WHERE claimed_until > now()")[0][0]
        if not held:
            raise AssertionError(f"{self.name}: the relay held no claim when it was to be killed")
        self.kill("relay", restart=False)
        services("up")
        self.start_role("relay")
        self._fault()

    def restart_postgres(self) -> None:
        services("restart-postgres")
        self._fault()

    # -- faults on a cluster's nodes (POSTROOM_DEV_BROKERS=3; the failover suite) ----------------

    def node(self, command: str, n: int) -> None:
        """``scripts/services.sh COMMAND N``: kill-broker, stop-broker, start-broker and the same
        for a controller; a start waits until the node answers."""
        if not self.node_fault_began_at:
            self.node_fault_began_at = time.time()
        services(command, str(n))
        self._fault()

    def busiest_leader(self) -> int:
        """The broker leading the partitions that hold most of this run's records (priority,
        retry and results topics), by their end offsets."""
        admin = make_admin(self.settings)
        metadata = admin.list_topics(timeout=30)
        consumer = Consumer({**self.settings.kafka_client_config(),
                             "group.id": f"leaders-{self.tag}"})
        load: Counter[int] = Counter()
        try:
            for name in all_topics(self.settings.topic_prefix, TIERS):
                for number, partition in metadata.topics[name].partitions.items():
                    high = consumer.get_watermark_offsets(TopicPartition(name, number),
                                                          timeout=10)[1]
                    load[partition.leader] += high
        finally:
            consumer.close()
        load.pop(-1, None)
        assert load, f"{self.name}: no partition of the run has a leader"
        return load.most_common(1)[0][0]

    def ensure_probe_topic(self) -> None:
        """PROBE_TOPIC, one partition of three replicas, made when missing (all brokers up)."""
        admin = make_admin(self.settings)
        if PROBE_TOPIC in admin.list_topics(timeout=30).topics:
            return
        for future in admin.create_topics([NewTopic(PROBE_TOPIC, 1, PROBE_REPLICAS)]).values():
            try:
                future.result()
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise

    def write_refused(self, timeout_s: float = 60) -> str | None:
        """The error the cluster answers a write of one record with, acks=all and no retry, to
        PROBE_TOPIC (made by prepare() or ensure_probe_topic(), before any fault); asked until
        one comes or for ``timeout_s``. None: the write was taken."""
        producer = Producer({**self.settings.kafka_client_config(), "acks": "all",
                             "enable.idempotence": False, "retries": 0,
                             "message.timeout.ms": 5000})
        deadline = time.monotonic() + timeout_s
        refused: list[str] = []
        while not refused and time.monotonic() < deadline:
            producer.produce(PROBE_TOPIC, b"probe", on_delivery=lambda err, _msg: refused.append(
                "" if err is None else err.name()))
            producer.flush(10)
            if refused == [""]:
                return None
            if refused and refused[0] != "NOT_ENOUGH_REPLICAS":
                refused.clear()  # the leader moving (NOT_LEADER...): ask again
                time.sleep(0.5)
        return refused[0] if refused else "no answer"

    def coordinators(self) -> dict[str, int]:
        """The broker coordinating each of the run's groups (sender, recorder)."""
        admin = make_admin(self.settings)
        groups = [self.settings.sender_group, self.settings.recorder_group]
        return {group: future.result().coordinator.id
                for group, future in admin.describe_consumer_groups(groups).items()}

    def active_controller(self) -> int:
        """N of the KRaft controller leading now, once one does."""
        deadline = time.monotonic() + 60
        while True:
            done = subprocess.run([str(SERVICES), "controller"], capture_output=True, text=True,
                                  check=False, timeout=60)
            if done.returncode == 0:
                return int(done.stdout.strip())
            if time.monotonic() > deadline:
                raise AssertionError(f"no active controller: {done.stdout}{done.stderr}")
            time.sleep(0.5)

    def wait_in_sync(self, timeout_s: float = 180) -> None:
        """Until every partition of the cluster (this run's topics and the internal ones) has
        all its replicas in sync: the next fault must meet a healthy cluster."""
        admin = make_admin(self.settings)

        def in_sync() -> bool:
            try:
                topics = admin.list_topics(timeout=10).topics
            except KafkaException:
                return False
            return all(len(p.isrs) == len(p.replicas) and p.leader >= 0
                       for t in topics.values() for p in t.partitions.values())
        self.wait_until(in_sync, timeout_s, "every partition's replicas to be in sync")

    def smtp_down(self, seconds: float) -> None:
        self.mail.down()
        time.sleep(seconds)
        self.mail.up()
        self._fault()

    def smtp_fault(self, seconds: float, *, drop_data: bool = False, slow_s: float = 0.0) -> None:
        self.mail.set_faults(drop_data=drop_data, slow_s=slow_s)
        time.sleep(seconds)
        self.mail.set_faults()
        self._fault()

    def poison(self) -> int:
        """Write unreadable records to a priority topic, a retry topic and the results topic."""
        producer = Producer(self.settings.kafka_client_config())
        prefix = self.settings.topic_prefix
        topics = [priority_topic(prefix, "normal"), retry_topic(prefix, 1), results_topic(prefix)]
        for topic in topics:
            producer.produce(topic, key=b"poison", value=b"\x00not avro at all",
                             headers=[("postroom.schema", b"0000000000000000")])
        assert producer.flush(30) == 0
        self.poisoned += 1
        self._fault()
        return len(topics)

    def hold_open_transaction(self, seconds: float, recipients: list[str]) -> None:
        """Enqueue ``recipients`` in a transaction kept open while other rows commit around it."""
        for rcpt in recipients:
            self.expected[rcpt] = expected_status(rcpt)
        with self.engine.begin() as conn:
            enqueue(conn, key=f"{self.tag}-held", recipients=recipients, subject="Report",
                    body="held open")
            time.sleep(seconds)
        self._fault()


def check_own_stack(settings: Settings) -> None:
    """Fail unless the stack the tests use is the one scripts/services.sh would act on (the
    ports its POSTROOM_DEV_* variables give): a fault must never hit another checkout's servers."""
    db_port = sa.make_url(settings.require("database_url")).port
    # A cluster's first address is its broker 1, at the ports' base (scripts/services.sh).
    first = settings.require("kafka_bootstrap_servers").split(",")[0]
    kafka_port = int(first.rsplit(":", 1)[1])
    wanted = (os.environ.get("POSTROOM_DEV_PG_PORT", "15432"),
              os.environ.get("POSTROOM_DEV_KAFKA_PORT", "19092"))
    if wanted != (str(db_port), str(kafka_port)):
        raise AssertionError(
            f"the tests use PostgreSQL :{db_port} and Kafka :{kafka_port}, but scripts/services.sh "
            f"would act on :{wanted[0]} and :{wanted[1]}: export the POSTROOM_DEV_* ports this "
            "checkout's stack was started with")


def services(*args: str) -> None:
    """scripts/services.sh with this checkout's ports (the caller's environment)."""
    done = subprocess.run([str(SERVICES), *args], capture_output=True, text=True, check=False,
                          timeout=180)
    if done.returncode != 0:
        raise AssertionError(f"scripts/services.sh {' '.join(args)} failed:\n"
                             f"{done.stdout}{done.stderr}")
