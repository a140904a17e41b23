"""Reads the lag of postroom's consumer groups from the broker: offsets, the timestamp of each
partition's first unconsumed record, the not_before of waiting retries, group state and members.

The arithmetic and the verdicts are in postroom/lagrules.py; this module talks to Kafka, renders
the report for `postroom lag` and sets the lag metrics under kafka-lag-exporter's names.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from postroom.errors import ConfigError, KafkaClientError
from postroom.kafka import check_reachable, client_config, make_admin, message_headers, translate
from postroom.lagrules import (
    CommitWindows,
    Verdict,
    first_not_due,
    group_verdict,
    lag_seconds,
    partition_verdict,
)
from postroom.metrics import Metrics
from postroom.settings import Settings
from postroom.topics import results_topic, sender_topics, tier_of_retry_topic
from schemas.codec import EmailRequested, SchemaError, decode

log = logging.getLogger(__name__)

READ_TIMEOUT_S = 10.0
# Errors of a request no broker answered: the message names the bootstrap servers.
_NO_ANSWER = (KafkaError._TIMED_OUT, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN)
# One-shot `postroom lag`: a short window of samples, so a verdict can be given at all.
ONE_SHOT_SAMPLES = 3
ONE_SHOT_INTERVAL_S = 1.0
WATERMARK_TRIES = 10
WATERMARK_RETRY_S = 0.5


@dataclasses.dataclass(frozen=True)
class Member:
    client_id: str
    host: str
    partitions: int


@dataclasses.dataclass(frozen=True)
class PartitionReport:
    group: str
    topic: str
    partition: int
    committed: int | None  # None: the group has committed nothing here
    end: int
    lag: int
    lag_seconds: float
    verdict: Verdict
    tier: int | None = None         # retry tier number; None for other topics
    overdue: int | None = None      # retry tiers: records past their not_before, unconsumed
    overdue_seconds: float | None = None  # retry tiers: how late the first of them is

    def as_json(self) -> dict[str, Any]:
        row: dict[str, Any] = {
            "group": self.group, "topic": self.topic, "partition": self.partition,
            "committed": self.committed, "end": self.end, "lag": self.lag,
            "lag_seconds": round(self.lag_seconds, 3), "verdict": self.verdict.name}
        if self.tier is not None:
            row.update(waiting=self.lag, overdue=self.overdue,
                       overdue_seconds=round(self.overdue_seconds or 0.0, 3))
        return row


@dataclasses.dataclass(frozen=True)
class GroupReport:
    group: str
    state: str
    members: tuple[Member, ...]
    partitions: tuple[PartitionReport, ...]
    verdict: Verdict

    @property
    def sum_lag(self) -> int:
        return sum(p.lag for p in self.partitions)

    @property
    def max_lag(self) -> int:
        return max((p.lag for p in self.partitions), default=0)

    @property
    def max_lag_seconds(self) -> float:
        return max((p.lag_seconds for p in self.partitions), default=0.0)


@dataclasses.dataclass(frozen=True)
class OutboxBacklog:
    """Rows committed and due, not yet published, and the age of the oldest (None: no rows)."""

    rows: int
    oldest_age_s: float | None


@dataclasses.dataclass(frozen=True)
class LagReport:
    at: dt.datetime
    groups: tuple[GroupReport, ...]
    outbox: OutboxBacklog | None


def postroom_groups(settings: Settings, only: str | None = None) -> dict[str, list[str]]:
    """postroom's consumer groups and the topics each reads; ``only`` picks one of them."""
    prefix = settings.topic_prefix
    groups = {settings.sender_group: sender_topics(prefix, len(settings.retry_delays_s)),
              settings.recorder_group: [results_topic(prefix)]}
    if only is None:
        return groups
    if only not in groups:
        raise ConfigError("--group", f"{only!r} is not one of postroom's groups "
                                     f"({', '.join(groups)}; set by POSTROOM_SENDER_GROUP and "
                                     "POSTROOM_RECORDER_GROUP)")
    return {only: groups[only]}


class LagReader:
    """Samples the groups' lag; keeps each partition's window of commits between samples."""

    def __init__(self, settings: Settings, groups: dict[str, list[str]],
                 clock: Callable[[], float] = time.time) -> None:
        self._settings = settings
        self._groups = groups
        self._clock = clock
        self._windows = CommitWindows()
        self._admin = make_admin(settings)
        self._reader: Consumer | None = None
        self._reached = False

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def _records(self) -> Consumer:
        if self._reader is None:
            # Reads records by assignment only: it joins no group and commits nothing.
            self._reader = Consumer({
                **client_config(self._settings), **self._settings.kafka_consumer_config,
                "group.id": f"postroom-lag-reader-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False, "enable.partition.eof": False,
                "fetch.wait.max.ms": 10})
        return self._reader

    def _failed(self, exc: KafkaException, what: str) -> KafkaClientError:
        """Our error for a failed request; one that got no answer says which broker it asked."""
        err = exc.args[0] if exc.args else None
        if isinstance(err, KafkaError) and err.code() in _NO_ANSWER:
            what += (f" on {self._settings.kafka_bootstrap_servers} "
                     "(POSTROOM_KAFKA_BOOTSTRAP_SERVERS)")
        return translate(exc, what)

    def sample(self) -> list[GroupReport]:
        if not self._reached:
            # A broker that never answers is one line, not each request's timeout in turn.
            check_reachable(self._settings)
            self._reached = True
        return [self._sample_group(group, topics) for group, topics in self._groups.items()]

    def _sample_group(self, group: str, topics: list[str]) -> GroupReport:
        state, members = self._describe(group)
        alive = bool(members)
        offsets = self._offsets(group, topics)
        now_s = self._clock()
        heads = self._first_records([(tp, start) for tp, start, _c, end in offsets if end > start])
        prefix = self._settings.topic_prefix
        reports = []
        for tp, start, committed, end in offsets:
            lag = max(0, end - start)
            tier = tier_of_retry_topic(prefix, tp.topic)
            head = heads.get((tp.topic, tp.partition))
            overdue = overdue_s = None
            if tier is not None:
                overdue, overdue_s = self._overdue(tp, start, end, head, now_s)
                seconds = overdue_s
                judged = overdue
            else:
                seconds = lag_seconds(lag, head[0] if head else None, now_s)
                judged = lag
            window = self._windows.add((group, tp.topic, tp.partition), start, judged, now_s,
                                       alive)
            reports.append(PartitionReport(
                group, tp.topic, tp.partition, committed, end, lag, seconds,
                partition_verdict(window, judged, now_s), tier, overdue, overdue_s))
        return GroupReport(group, state, members, tuple(reports),
                           group_verdict(r.verdict for r in reports))

    def _describe(self, group: str) -> tuple[str, tuple[Member, ...]]:
        try:
            description = self._admin.describe_consumer_groups(
                [group], request_timeout=READ_TIMEOUT_S)[group].result()
        except KafkaException as exc:
            raise self._failed(exc, f"cannot describe group {group}") from exc
        state = getattr(description.state, "name", str(description.state)).lower()
        members = tuple(Member(m.client_id, m.host, len(m.assignment.topic_partitions))
                        for m in description.members)
        return state, members

    def _offsets(self, group: str, topics: list[str],
                 ) -> list[tuple[TopicPartition, int, int | None, int]]:
        """(partition, where the group resumes, committed or None, log end) per partition."""
        consumer = self._records()
        try:
            metadata = consumer.list_topics(timeout=READ_TIMEOUT_S)
            # A broker leaves out of the metadata what this principal may not describe: a lag
            # of 0 over no partitions would look like a group that keeps up.
            unseen = [topic for topic in topics if topic not in metadata.topics]
            if unseen:
                raise KafkaClientError(
                    f"cannot read the lag of group {group}: topics missing or not visible to "
                    f"this principal: {', '.join(unseen)} (run `postroom topics create`; on a "
                    f"cluster with ACLs, run lag as the admin, see `postroom acls`)")
            partitions = [TopicPartition(topic, p) for topic in topics
                          for p in sorted(metadata.topics[topic].partitions)]
            committed = self._committed(group, partitions)
            rows = []
            for tp in partitions:
                low, high = _watermarks(consumer, tp)
                done = committed.get((tp.topic, tp.partition))
                # A group with nothing committed starts at the beginning (auto.offset.reset).
                start = min(max(done if done is not None else low, low), high)
                rows.append((tp, start, done, high))
        except KafkaException as exc:
            raise self._failed(exc, f"cannot read the offsets of group {group}") from exc
        return rows

    def _committed(self, group: str, partitions: list[TopicPartition],
                   ) -> dict[tuple[str, int], int | None]:
        if not partitions:
            return {}
        from confluent_kafka import ConsumerGroupTopicPartitions

        request = [ConsumerGroupTopicPartitions(group, partitions)]
        try:
            result = self._admin.list_consumer_group_offsets(
                request, request_timeout=READ_TIMEOUT_S)[group].result()
        except KafkaException as exc:
            raise self._failed(exc, f"cannot read the committed offsets of group {group}") from exc
        return {(tp.topic, tp.partition): (tp.offset if tp.offset >= 0 else None)
                for tp in result.topic_partitions}

    def _first_records(self, wanted: Sequence[tuple[TopicPartition, int]],
                       ) -> dict[tuple[str, int], tuple[int, bytes | None, list[Any]]]:
        """(timestamp ms, value, headers) of the record at each given offset."""
        if not wanted:
            return {}
        consumer = self._records()
        assignment = [TopicPartition(tp.topic, tp.partition, offset) for tp, offset in wanted]
        consumer.assign(assignment)
        found: dict[tuple[str, int], tuple[int, bytes | None, list[Any]]] = {}
        deadline = time.monotonic() + READ_TIMEOUT_S
        try:
            while len(found) < len(assignment) and time.monotonic() < deadline:
                for msg in consumer.consume(num_messages=len(assignment), timeout=0.2):
                    if msg.error() is not None:
                        continue
                    key = (msg.topic() or "", msg.partition() or 0)
                    if key not in found:
                        found[key] = (msg.timestamp()[1], msg.value(), message_headers(msg))
                        consumer.pause([TopicPartition(key[0], key[1])])
        finally:
            # A pause outlives the assignment in librdkafka; the next read would find none.
            consumer.resume(assignment)
            consumer.unassign()
        missing = len(assignment) - len(found)
        if missing:
            log.warning("could not read the first unconsumed record of %d partition(s) within "
                        "%.0fs; their lag in seconds is shown as 0", missing, READ_TIMEOUT_S)
        return found

    def _overdue(self, tp: TopicPartition, start: int, end: int,
                 head: tuple[int, bytes | None, list[Any]] | None,
                 now_s: float) -> tuple[int, float]:
        """(records past their not_before, seconds the first of them is late) on a retry tier."""
        if end <= start or head is None:
            return 0, 0.0
        head_due = _not_before_s(head[1], head[2])
        if head_due is not None and head_due > now_s:
            return 0, 0.0  # the head waits: so does everything behind it
        late = max(0.0, now_s - head_due) if head_due is not None else 0.0

        def is_due(offset: int) -> bool:
            if offset == start:
                return True
            record = self._first_records([(tp, offset)]).get((tp.topic, tp.partition))
            due = _not_before_s(record[1], record[2]) if record else None
            return due is None or due <= now_s

        return first_not_due(start, end, is_due) - start, late


def _watermarks(consumer: Consumer, tp: TopicPartition) -> tuple[int, int]:
    """(low, high) watermarks, asking again while a partition's leadership moves."""
    tries = 0
    while True:
        try:
            low, high = consumer.get_watermark_offsets(tp, timeout=READ_TIMEOUT_S)
            return int(low), int(high)
        except KafkaException:
            # NOT_LEADER_FOR_PARTITION comes as not retriable, yet passes once metadata
            # catches up (a new topic, a broker restart): ask a few times before giving up.
            tries += 1
            if tries >= WATERMARK_TRIES:
                raise
            time.sleep(WATERMARK_RETRY_S)


def _not_before_s(value: bytes | None, headers: list[Any]) -> float | None:
    """A retry record's not_before (epoch s); None when it has none or cannot be read (an
    unreadable record is dead-lettered at once: it is due)."""
    try:
        event = decode(EmailRequested, value, headers)
    except SchemaError:
        return None
    return event.not_before.timestamp() if event.not_before else None


def read_report(reader: LagReader, outbox: Callable[[], OutboxBacklog] | None,
                samples: int = 1, interval_s: float = ONE_SHOT_INTERVAL_S,
                stop: threading.Event | None = None) -> LagReport:
    """Sample ``samples`` times ``interval_s`` apart and report the last sample."""
    groups = reader.sample()
    for _ in range(samples - 1):
        if stop is not None and stop.wait(interval_s):
            break
        if stop is None:
            time.sleep(interval_s)
        groups = reader.sample()
    return LagReport(dt.datetime.now(dt.UTC), tuple(groups), outbox() if outbox else None)


def render_text(report: LagReport, roles: Mapping[str, str] | None = None) -> list[str]:
    """The report for a person; ``roles`` names the role of each group (its members)."""
    lines = []
    for group in report.groups:
        role = (roles or {}).get(group.group, "consumer of this group")
        members = ", ".join(f"{m.client_id}@{m.host} ({m.partitions} partitions)"
                            for m in group.members) or f"none (no {role} is running)"
        lines.append(f"{group.group}: {group.verdict.name}, state {group.state}, "
                     f"members {members}; total lag {group.sum_lag}, "
                     f"max {group.max_lag_seconds:.1f}s behind")
        for p in group.partitions:
            committed = "-" if p.committed is None else str(p.committed)
            line = f"  {p.topic}[{p.partition}] committed={committed} end={p.end} lag={p.lag}"
            if p.tier is not None:
                line += f" waiting={p.lag} overdue={p.overdue}"
                if p.overdue:
                    line += f" ({p.overdue_seconds:.1f}s late)"
            else:
                line += f" behind={p.lag_seconds:.1f}s"
            lines.append(line + f" {p.verdict.name}")
    if report.outbox is not None:
        age = report.outbox.oldest_age_s
        lines.append(f"outbox: {report.outbox.rows} row(s) waiting for the relay"
                     + (f", oldest {age:.1f}s" if age is not None else ""))
    return lines


def render_json(report: LagReport) -> list[str]:
    lines = [json.dumps({**p.as_json(), "group_state": g.state, "group_members": len(g.members),
                         "group_verdict": g.verdict.name})
             for g in report.groups for p in g.partitions]
    if report.outbox is not None:
        lines.append(json.dumps({"outbox_backlog": report.outbox.rows,
                                 "outbox_oldest_age_seconds": report.outbox.oldest_age_s}))
    return lines


def export(metrics: Metrics, report: LagReport, cluster: str) -> None:
    """Set the lag metrics: kafka-lag-exporter's names and labels, plus postroom's own."""
    for group in report.groups:
        for p in group.partitions:
            labels = {"cluster_name": cluster, "group": group.group, "topic": p.topic,
                      "partition": str(p.partition)}
            metrics.set("kafka_consumergroup_group_lag", p.lag, **labels)
            metrics.set("kafka_consumergroup_group_lag_seconds", p.lag_seconds, **labels)
            if p.tier is not None:
                where = {"topic": p.topic, "partition": str(p.partition)}
                metrics.set("retry_waiting", p.lag, **where)
                metrics.set("retry_overdue", p.overdue or 0, **where)
                metrics.set("retry_overdue_seconds", p.overdue_seconds or 0.0, **where)
        of_group = {"cluster_name": cluster, "group": group.group}
        metrics.set("kafka_consumergroup_group_sum_lag", group.sum_lag, **of_group)
        metrics.set("kafka_consumergroup_group_max_lag", group.max_lag, **of_group)
        metrics.set("kafka_consumergroup_group_max_lag_seconds", group.max_lag_seconds, **of_group)
        metrics.set("consumergroup_status", group.verdict.value, group=group.group)
        metrics.set("consumergroup_members", len(group.members), group=group.group)
    if report.outbox is not None:
        metrics.set("outbox_backlog", report.outbox.rows)
        metrics.set("outbox_backlog_age_seconds", report.outbox.oldest_age_s or 0.0)


def watch(reader: LagReader, outbox: Callable[[], OutboxBacklog] | None, every_s: float,
          stop: threading.Event, on_report: Callable[[LagReport], None]) -> None:
    """Sample every ``every_s`` seconds until ``stop``; a failed sample is said and retried."""
    while not stop.is_set():
        started = time.monotonic()
        try:
            on_report(read_report(reader, outbox))
        except Exception as exc:  # noqa: BLE001 - the watcher outlives a broker or database outage
            log.warning("lag sample failed (%s); trying again in %.0fs",
                        str(exc).splitlines()[0] if str(exc) else type(exc).__name__, every_s)
        stop.wait(max(0.0, every_s - (time.monotonic() - started)))


def partitions_of(report: LagReport) -> Iterable[PartitionReport]:
    return (p for g in report.groups for p in g.partitions)
