"""What a chaos run left behind, read from three independent sources and compared with its input:
the outbox table, the mail server's log of replies, and the results topic (replayed into a copy
of the outbox, which must equal the recorder's table)."""

from __future__ import annotations

import dataclasses
import itertools
import statistics
from collections import Counter, defaultdict
from typing import Any

import sqlalchemy as sa
from confluent_kafka import Consumer, TopicPartition

from chaos.harness import TIERS, Run
from chaos.mailserver import Reply, planned_deferrals
from postroom.devkit.histograms import Buckets
from postroom.relay.db import make_engine, upgrade
from postroom.relay.results import apply_each, apply_results, result_problem, storable_result
from postroom.schemas.codec import EmailResult
from postroom.schemas.decoding import decode
from postroom.schemas.errors import SchemaError
from postroom.schemas.registry import reader_for
from postroom.topics import dead_letter_topic, results_topic

# A server may still read a killed client's last message from its socket buffer.
KILL_SLACK_S = 0.5
COMPARED = ("status", "attempts", "message_id", "smtp_code", "enhanced_code", "last_error")


@dataclasses.dataclass(frozen=True)
class KillOutcome:
    """What one sender kill left: keys in doubt, duplicates, how long the in-doubt keys waited."""

    in_doubt: int        # keys the killed sender's ledger rows held as `sending`
    others_sending: int  # keys the other senders' processes held as `sending` at the kill
    duplicates_before: int  # duplicates whose first 250 the server wrote before the SIGKILL
    duplicates_after: int   # ... after it, to a transaction the dead process had sent in full
    first_resent_s: float | None  # the first in-doubt key's wait for the server's next reply
    resent_s: float | None  # the longest such wait
    not_resent: int      # in-doubt keys the server never heard of again (a mark in flight)
    reaped_s: float
    repeated: bool = False  # nothing was in doubt: the scenario killed again

    def line(self) -> str:
        resent = ("-" if self.first_resent_s is None or self.resent_s is None
                  else f"{self.first_resent_s:.1f}-{self.resent_s:.1f}")
        more = f", {self.not_resent} not resent" if self.not_resent else ""
        idle = "idle, killed again: " if self.repeated else ""
        return (f"{idle}{self.in_doubt} in doubt (other {self.others_sending}), duplicates "
                f"{self.duplicates_before}+{self.duplicates_after}, resent within {resent} s"
                f"{more}, reaped in {self.reaped_s * 1000:.0f} ms")


@dataclasses.dataclass
class Outcome:
    scenario: str
    emails: int
    faults: int
    drain_s: float
    lost: list[str] = dataclasses.field(default_factory=list)
    wrong_state: list[str] = dataclasses.field(default_factory=list)
    duplicates: int = 0
    in_window: int = 0
    answered_after_kill: int = 0  # of in_window: the first 250 came after the SIGKILL
    late_reply: int = 0
    unexplained: list[str] = dataclasses.field(default_factory=list)
    bad_attempts: list[str] = dataclasses.field(default_factory=list)
    recorder_mismatch: list[str] = dataclasses.field(default_factory=list)
    poison_dead_lettered: int = 0
    unreadable_results: int = 0
    crashed: list[str] = dataclasses.field(default_factory=list)
    hostile: list[str] = dataclasses.field(default_factory=list)  # the poison storm's checks
    storm: bool = False  # the poison storm: its own checks count its poison (storm.py)
    idle_kills: list[str] = dataclasses.field(default_factory=list)  # at full load: none in doubt
    slow_takeovers: list[str] = dataclasses.field(default_factory=list)  # past the limit
    kills: int = 0
    # transactions the server decided beyond the attempts the outbox counts: duplicates, keys in
    # doubt tried again, attempts made again from a copy of their record (which the ledger stops)
    extra_transactions: int = 0
    in_doubt: int = 0  # keys the killed senders' ledger rows held as sending
    poisoned: int = 0  # poison() calls: one record each on a priority, a retry, the results topic
    window_s: list[float] = dataclasses.field(default_factory=list)
    accepted_before_kill_s: list[float] = dataclasses.field(default_factory=list)
    # the last senders' own histogram of it, from the reply read to the mark's commit
    mark_window: Buckets = dataclasses.field(default_factory=lambda: Buckets(()))
    takeover_s: float | None = None  # the longest a killed sender's in-doubt key waited
    per_kill: list[KillOutcome] = dataclasses.field(default_factory=list)
    # the failover suite: the longest time without a delivery (a 250) from the first fault on
    # the cluster to the first 250 after the last one (longest_pause)
    pause_s: float | None = None
    notes: list[str] = dataclasses.field(default_factory=list)  # what the scenario saw (Run.notes)

    def problems(self) -> list[str]:
        found = []
        for what in ("lost", "wrong_state", "unexplained", "bad_attempts", "recorder_mismatch",
                     "crashed", "idle_kills", "slow_takeovers", "hostile"):
            items = getattr(self, what)
            if items:
                shown = sorted(items)[:20 if what == "hostile" else 5]
                found.append(f"{self.scenario}: {what} ({len(items)}): {shown}")
        if not self.storm and (self.poison_dead_lettered, self.unreadable_results) != (
                2 * self.poisoned, self.poisoned):
            found.append(f"{self.scenario}: {self.poisoned} poison rounds, but "
                         f"{self.poison_dead_lettered} dead-lettered as poison and "
                         f"{self.unreadable_results} unreadable results")
        return found

    def window_ms(self, q: float) -> float | None:
        if len(self.window_s) < 2:
            return None
        return statistics.quantiles(self.window_s, n=100)[int(q) - 1] * 1000


def read_topic(run: Run, topic: str) -> list[Any]:
    """Every record of ``topic`` from the start to its end as of now, partition by partition."""
    consumer = Consumer({**run.settings.kafka_client_config(), "group.id": f"check-{run.tag}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        metadata = consumer.list_topics(topic, timeout=30).topics[topic]
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
                for p in metadata.partitions}
        consumer.assign([TopicPartition(topic, p, 0) for p in ends])
        records: list[Any] = []
        left = {p for p, end in ends.items() if end > 0}
        while left:
            msg = consumer.poll(5)
            if msg is None:
                raise AssertionError(f"{topic}: no record within 5 s, {left} not read to the end")
            if msg.error():
                continue
            records.append(msg)
            if msg.offset() + 1 >= ends[msg.partition()]:
                left.discard(msg.partition())
        return records
    finally:
        consumer.close()


def replay(run: Run, results: list[EmailResult]) -> dict[str, tuple[Any, ...]]:
    """The outbox rows as a fresh recorder would leave them after the whole results topic: the
    results it refuses left out, what a row cannot hold made storable, as it does."""
    results = [storable_result(r) for r in results if result_problem(r) is None]
    schema = f"{run.settings.database_schema}_replay"
    settings = dataclasses.replace(run.settings, database_schema=schema)
    engine = make_engine(settings)
    try:
        upgrade(engine, schema)
        with engine.begin() as conn:
            conn.execute(sa.text(
                f"INSERT INTO outbox OVERRIDING SYSTEM VALUE "
                f"SELECT * FROM \"{run.settings.database_schema}\".outbox"))
            conn.execute(sa.text(
                "UPDATE outbox SET status = 'published', attempts = 0, last_error = NULL, "
                "smtp_code = NULL, enhanced_code = NULL, message_id = NULL, sent_at = NULL, "
                "next_attempt_at = NULL"))
            try:
                with conn.begin_nested():
                    apply_results(conn, results, len(run.settings.retry_delays_s) + 1)
            except sa.exc.DatabaseError:
                apply_each(conn, results, len(run.settings.retry_delays_s) + 1)
            rows = conn.execute(sa.text(f"SELECT idempotency_key, {', '.join(COMPARED)} "
                                        "FROM outbox")).all()
        with engine.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
    finally:
        engine.dispose()
    return {row[0]: tuple(row[1:]) for row in rows}


def check(run: Run, drain_s: float, exact_attempts: bool, smtp_timeout_s: float,
          kills_at_full_load: bool = False, takeover_limit_s: float | None = None) -> Outcome:
    """Compare the three sources with the input; see Outcome.problems() for what must be empty.
    ``kills_at_full_load``: a sender kill that found no key in doubt is a problem (it proved
    nothing about the window), unless the scenario killed again for it (not counted as a kill).
    ``takeover_limit_s``: a key in doubt at a kill not tried again within it is a problem."""
    kills = sum(not k.repeated for k in run.kills)
    outcome = Outcome(run.name, len(run.expected), run.faults, drain_s, kills=kills,
                      poisoned=run.poisoned, in_doubt=sum(len(k.in_doubt) for k in run.kills))
    rows = {r.recipient: r for r in run.query(
        f"SELECT id, recipient, idempotency_key, {', '.join(COMPARED)} FROM outbox")}
    ledger = {r.idempotency_key: r for r in run.query(
        "SELECT idempotency_key, state, taken_from, updated_at FROM sender_ledger")}
    replies: dict[str, list[Reply]] = defaultdict(list)
    for reply in run.mail.replies:
        replies[reply.rcpt].append(reply)

    # 1. every input row, in its expected final state, delivered where it should be
    for rcpt, expected in run.expected.items():
        row = rows.get(rcpt)
        accepted = [r for r in replies[rcpt] if r.code == 250]
        if row is None or (expected == "sent" and not accepted):
            outcome.lost.append(rcpt)
        elif row.status != expected:
            outcome.wrong_state.append(f"{rcpt}={row.status}")

    # 2. duplicates at the server, each explained by a kill's window or a reply too late: in a
    # kill's window when the key was `sending` under the killed process and its first 250 was
    # written before the SIGKILL (received, or on its way) or just after it (the server finished
    # a transaction the dead process had sent in full)
    ids = Counter(r.message_id for r in run.mail.replies if r.code == 250)
    by_kill: Counter[tuple[int, bool]] = Counter()
    for rcpt, got in replies.items():
        accepted = [r for r in got if r.code == 250]
        if len(accepted) < 2:
            continue
        extra = len(accepted) - 1
        outcome.duplicates += extra
        first = accepted[0]
        key = rows[rcpt].idempotency_key if rcpt in rows else ""
        killed = [n for n, kill in enumerate(run.kills)
                  if key in kill.in_doubt and first.at <= kill.at + KILL_SLACK_S]
        if killed:
            kill = run.kills[killed[0]]
            outcome.in_window += extra
            outcome.accepted_before_kill_s.append(kill.at - first.at)
            after = first.at > kill.at
            outcome.answered_after_kill += extra if after else 0
            by_kill[killed[0], after] += extra
        elif first.late_s > smtp_timeout_s:
            outcome.late_reply += extra
        else:
            outcome.unexplained.append(f"{rcpt} x{len(accepted)}")
    assert sum(ids.values()) - len(ids) == outcome.duplicates  # one Message-ID per recipient

    # 3. attempts against the server's replies
    for rcpt, expected in run.expected.items():
        row = rows.get(rcpt)
        if row is None:
            continue
        deferred = sum(1 for r in replies[rcpt] if r.code == 451)
        outcome.extra_transactions += max(0, len(replies[rcpt]) - row.attempts)
        if not 1 <= row.attempts <= TIERS + 1:
            outcome.bad_attempts.append(f"{rcpt} attempts={row.attempts}")
        elif expected == "dead" and (row.attempts != TIERS + 1 or deferred < 1):
            outcome.bad_attempts.append(f"{rcpt} dead after {row.attempts}, {deferred} x 451")
        elif expected == "failed" and not any(r.code == 550 for r in replies[rcpt]):
            outcome.bad_attempts.append(f"{rcpt} failed without a 550")
        elif exact_attempts and expected == "sent" and row.attempts != deferred + 1:
            outcome.bad_attempts.append(f"{rcpt} attempts={row.attempts} after {deferred} x 451")
        elif expected == "sent" and deferred < planned_deferrals(rcpt):
            outcome.bad_attempts.append(f"{rcpt} sent after only {deferred} x 451")

    # 4. the recorder's table is a replay of the results topic
    results = []
    topic = results_topic(run.settings.topic_prefix)
    schema_by_id = reader_for(run.settings, [topic])
    for msg in read_topic(run, topic):
        try:
            results.append(decode(EmailResult, msg.value(), msg.headers(),
                                  schema_by_id=schema_by_id))
        except SchemaError:
            outcome.unreadable_results += 1
    replayed = replay(run, results)
    for rcpt, row in rows.items():
        if row.id in run.hostile_rows:
            continue  # the storm's own rows: some never had a result (the relay refused them)
        mine = tuple(getattr(row, c) for c in COMPARED)
        if replayed.get(row.idempotency_key) != mine:
            outcome.recorder_mismatch.append(
                f"{rcpt}: table {mine} replay {replayed.get(row.idempotency_key)}")

    # 5. poison records dead-lettered, not lost and not fatal
    if run.poisoned:
        for msg in read_topic(run, dead_letter_topic(run.settings.topic_prefix)):
            if dict(msg.headers() or []).get("postroom.dlq.classification") == b"poison":
                outcome.poison_dead_lettered += 1

    # takeover: from a kill to the server's next reply for each key the killed sender held
    for n, kill in enumerate(run.kills):
        wait_of: dict[str, float] = {}  # each in-doubt key's wait for the server's next reply
        for key in kill.in_doubt:
            rcpt = key.split("|", 1)[1]
            after = [r.at for r in replies[rcpt] if r.at > kill.at + KILL_SLACK_S]
            if after:
                wait_of[key] = min(after) - kill.at
        waits = list(wait_of.values())
        resent_s = max(waits) if waits else None
        outcome.per_kill.append(KillOutcome(
            len(kill.in_doubt), kill.others_sending, by_kill[n, False], by_kill[n, True],
            min(waits) if waits else None, resent_s, len(kill.in_doubt) - len(waits),
            kill.reaped_s, kill.repeated))
        if resent_s is not None:
            outcome.takeover_s = max(outcome.takeover_s or 0.0, resent_s)
        if takeover_limit_s is not None:
            late = [key for key in kill.in_doubt
                    if key not in wait_of or wait_of[key] > takeover_limit_s]
            outcome.slow_takeovers.extend(f"kill {n + 1}: {key}" for key in late)
        if kills_at_full_load and not kill.in_doubt and not kill.repeated:
            outcome.idle_kills.append(f"kill {n + 1} (pid {kill.owner_pid}) at {kill.at:.1f}: "
                                      "no key in doubt")

    outcome.notes = list(run.notes)
    if run.node_fault_began_at:
        outcome.pause_s = longest_pause([r.at for r in run.mail.replies if r.code == 250],
                                        run.node_fault_began_at, run.faults_done_at)

    # the window: the 250 on its way back (after the server's latency) to the sent mark
    for rcpt, row in rows.items():
        accepted = [r for r in replies[rcpt] if r.code == 250]
        mark = ledger.get(row.idempotency_key)
        if len(accepted) == 1 and mark is not None and mark.state == "sent" \
                and accepted[0].replied_at is not None:
            outcome.window_s.append(max(0.0, mark.updated_at.timestamp() - accepted[0].replied_at))
    return outcome


def longest_pause(accepted_at: list[float], began_at: float, done_at: float) -> float | None:
    """The longest gap between deliveries from ``began_at`` (the first fault) to the first
    delivery after ``done_at`` (the faults ended); None when none came after it."""
    times = sorted(t for t in accepted_at if t > began_at)
    after = [t for t in times if t > done_at]
    if not after:
        return None
    points = [began_at, *(t for t in times if t <= done_at), after[0]]
    return max(b - a for a, b in itertools.pairwise(points))


def table(outcomes: list[Outcome]) -> str:
    """One line per scenario, as docs/reliability.md shows it."""
    head = ("| scenario | emails | faults | lost | wrong state | duplicates (in window: 250 "
            "before + after the kill / late reply / unexplained) | window p50 / p99 ms | in doubt "
            "at kills, resent within s | drain after last fault s |")
    lines = [head, "|---|---:|---:|---:|---:|---|---|---|---:|"]
    for o in outcomes:
        p50, p99 = o.window_ms(50), o.window_ms(99)
        window = f"{p50:.1f} / {p99:.1f}" if p50 is not None and p99 is not None else "-"
        takeover = "-" if o.takeover_s is None else f"{o.in_doubt}, {o.takeover_s:.1f}"
        lines.append(
            f"| {o.scenario} | {o.emails} | {o.faults} | {len(o.lost)} | {len(o.wrong_state)} "
            f"| {o.duplicates} ({o.in_window - o.answered_after_kill} + {o.answered_after_kill} "
            f"/ {o.late_reply} / {len(o.unexplained)}) "
            f"| {window} | {takeover} | {o.drain_s:.1f} |")
    return "\n".join(lines)
