"""Reads the lag of postroom's consumer groups from the broker: offsets, the timestamp of each
partition's first unconsumed record, the not_before of waiting retries, group state and members.
The arithmetic and the verdicts are in postroom/lagrules.py."""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from postroom.errors import ConfigError, KafkaClientError
from postroom.kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    OffsetSpec,
    TopicPartition,
    check_reachable,
    is_moving,
    make_admin,
    make_reader,
    message_headers,
    min_insync_replicas,
    topic_replicas,
    translate,
)
from postroom.lag.due import QuietLookup, not_before_s
from postroom.lag.report import GroupReport, LagReport, Member, OutboxBacklog, PartitionReport
from postroom.lagrules import (
    CommitWindows,
    Verdict,
    first_not_due,
    group_verdict,
    lag_seconds,
    partition_verdict,
)
from postroom.replication import TopicHealth, topic_health
from postroom.schemas.framing import SchemaById
from postroom.schemas.registry import schema_lookup
from postroom.settings import Settings
from postroom.topics import all_topics, results_topic, sender_topics, tier_of_retry_topic

log = logging.getLogger(__name__)

# What one group's part of a sample may take, all its requests together (the replication read
# has as long of its own): a broker that does not answer (killed, its leaderships not moved yet)
# makes a partial sample, not a wait of minutes, and one group's wait does not eat the next's.
READ_TIMEOUT_S = 10.0
MIN_REQUEST_S = 0.5  # a request still made once the sample's time is up gets this long
# Errors of a request no broker answered: the message names the bootstrap servers.
_NO_ANSWER = (KafkaError._TIMED_OUT, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN)
# A broker loss's passing errors (postroom.kafka.is_moving): the part of the report they hold up
# is labelled unavailable, the rest is answered. Others (a refusal) end the report.
# One-shot `postroom lag`: a short window of samples, so a verdict can be given at all.
ONE_SHOT_SAMPLES = 3
ONE_SHOT_INTERVAL_S = 1.0
# A partition whose offsets its leader did not give (leadership moving after a broker loss)
# is asked again this often until the sample's time is up, then reported unavailable.
OFFSETS_RETRY_S = 0.5


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
        self.replication: dict[str, TopicHealth] | None = None
        self._deadline = 0.0  # of the group's part of the sample under way (time.monotonic())
        # Partitions per topic as the last metadata said: what is labelled unavailable when
        # the metadata itself does not come.
        self._partitions_seen: dict[str, list[int]] = {}
        # A retry record's writer schema, when it is in the Confluent wire format.
        registry = schema_lookup(settings)
        self._schema_by_id: SchemaById | None = (
            None if registry is None else QuietLookup(registry))

    def _left_s(self) -> float:
        """How long the next request of this sample may wait."""
        return max(MIN_REQUEST_S, self._deadline - time.monotonic())

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def _records(self) -> Consumer:
        if self._reader is None:
            # Reads records by assignment only: it joins no group and commits nothing.
            self._reader = make_reader(self._settings,
                                       f"postroom-lag-reader-{uuid.uuid4().hex[:8]}",
                                       **{"fetch.wait.max.ms": 10})
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
        self._deadline = time.monotonic() + READ_TIMEOUT_S
        self.replication = self._replication()
        groups = []
        for group, topics in self._groups.items():
            self._deadline = time.monotonic() + READ_TIMEOUT_S
            groups.append(self._sample_group(group, topics))
        return groups

    def _replication(self) -> dict[str, TopicHealth] | None:
        """Every postroom topic's partitions by replication state; None when unreadable."""
        topics = all_topics(self._settings.topic_prefix, len(self._settings.retry_delays_s))
        try:
            partitions, _brokers = topic_replicas(self._settings, topics, self._left_s(),
                                                  self._admin)
            min_insync = min_insync_replicas(self._settings, topics, self._left_s(),
                                             self._admin)
        except KafkaClientError as exc:
            log.warning("cannot read the replication of postroom's topics: %s", exc)
            return None
        return topic_health(partitions, min_insync)

    def _sample_group(self, group: str, topics: list[str]) -> GroupReport:
        try:
            state, members = self._describe(group)
            alive, members_known = bool(members), True
        except KafkaClientError as exc:
            if not is_moving(exc):
                raise
            # Its coordinator moving after a broker loss: the offsets may still be read. Taken
            # as alive, so the verdict's window does not call it stopped for the gap.
            state, members, alive, members_known = f"unknown ({exc})", (), True, False
        offsets, unreadable = self._offsets(group, topics)
        now_s = self._clock()
        heads = self._first_records([(tp, start) for tp, start, _c, end in offsets if end > start])
        prefix = self._settings.topic_prefix
        reports = [PartitionReport(group, tp.topic, tp.partition, None, -1, 0, 0.0, Verdict.OK,
                                   tier_of_retry_topic(prefix, tp.topic), unavailable=why)
                   for tp, why in unreadable]
        for tp, start, committed, end in offsets:
            lag = max(0, end - start)
            tier = tier_of_retry_topic(prefix, tp.topic)
            head = heads.get((tp.topic, tp.partition))
            overdue = overdue_s = None
            key = (group, tp.topic, tp.partition)
            judged: int | None
            if tier is not None:
                overdue, overdue_s = self._overdue(tp, start, end, head, now_s)
                seconds, judged = overdue_s, overdue
            else:
                seconds = lag_seconds(lag, head[0] if head else None, now_s)
                judged = lag
            if judged is None:
                # A tier whose head was not read: what is overdue is unknown, so this sample
                # adds nothing to the window and the verdict stays what the window said.
                seen = self._windows.seen(key)
                verdict = partition_verdict(seen, seen[-1].lag if seen else 0, now_s)
            else:
                window = self._windows.add(key, start, judged, now_s, alive)
                verdict = partition_verdict(window, judged, now_s)
            reports.append(PartitionReport(
                group, tp.topic, tp.partition, committed, end, lag, seconds, verdict, tier,
                overdue, overdue_s))
        reports.sort(key=lambda r: (topics.index(r.topic), r.partition))
        return GroupReport(group, state, members, tuple(reports),
                           group_verdict(r.verdict for r in reports if r.unavailable is None),
                           members_known)

    def _describe(self, group: str) -> tuple[str, tuple[Member, ...]]:
        try:
            description = self._admin.describe_consumer_groups(
                [group], request_timeout=self._left_s())[group].result()
        except KafkaException as exc:
            raise self._failed(exc, f"cannot describe group {group}") from exc
        state = getattr(description.state, "name", str(description.state)).lower()
        members = tuple(Member(m.client_id, m.host, len(m.assignment.topic_partitions),
                               m.member_id or "")
                        for m in description.members)
        return state, members

    def _offsets(self, group: str, topics: list[str],
                 ) -> tuple[list[tuple[TopicPartition, int, int | None, int]],
                            list[tuple[TopicPartition, str]]]:
        """(partition, where the group resumes, committed or None, log end) per partition whose
        offsets were read, and (partition, why not) for the others: a broker down leaves its
        partitions unread until their leadership moves, not the whole report."""
        consumer = self._records()
        try:
            metadata = consumer.list_topics(timeout=self._left_s())
        except KafkaException as exc:
            failed = self._failed(exc, f"cannot read the offsets of group {group}")
            if not is_moving(failed):
                raise failed from exc
            # No broker gave the metadata in time (a broker loss): the group's partitions, as
            # last seen, are unavailable, as when its committed offsets do not come.
            seen = [TopicPartition(topic, p) for topic in topics for p in self._partitions_seen.get(
                topic, range(self._settings.topic_partitions))]
            return [], [(tp, f"metadata unreadable: {failed}") for tp in seen]
        # A broker leaves out of the metadata what this principal may not describe: a lag
        # of 0 over no partitions would look like a group that keeps up.
        unseen = [topic for topic in topics if topic not in metadata.topics]
        if unseen:
            raise KafkaClientError(
                f"cannot read the lag of group {group}: topics missing or not visible to "
                f"this principal: {', '.join(unseen)} (run `postroom topics create`; on a "
                f"cluster with ACLs, run lag as the admin, see `postroom acls`)")
        for topic in topics:
            self._partitions_seen[topic] = sorted(metadata.topics[topic].partitions)
        partitions = [TopicPartition(topic, p) for topic in topics
                      for p in self._partitions_seen[topic]]
        try:
            committed = self._committed(group, partitions)
        except KafkaClientError as exc:
            if not is_moving(exc):
                raise
            return [], [(tp, f"committed offsets unreadable: {exc}") for tp in partitions]
        leaders = {(tp.topic, tp.partition): metadata.topics[tp.topic].partitions[tp.partition]
                   .leader for tp in partitions}
        marks = self._watermarks(partitions, leaders)
        rows, unreadable = [], []
        for tp in partitions:
            mark = marks[(tp.topic, tp.partition)]
            if isinstance(mark, str):
                unreadable.append((tp, mark))
                continue
            low, high = mark
            done = committed.get((tp.topic, tp.partition))
            # A group with nothing committed starts at the beginning (auto.offset.reset).
            start = min(max(done if done is not None else low, low), high)
            rows.append((tp, start, done, high))
        return rows, unreadable

    def _watermarks(self, partitions: Sequence[TopicPartition], leaders: Mapping[
            tuple[str, int], int]) -> dict[tuple[str, int], tuple[int, int] | str]:
        """(low, high) watermarks of each partition, or why they could not be read within
        the sample's time. One request per leader, all at once, so a leader that does not answer
        holds up only its own partitions; those that fail are asked again until the deadline
        (a new topic, leadership moving after a broker restart)."""
        found: dict[tuple[str, int], tuple[int, int] | str] = {}
        pending = []
        for tp in partitions:
            if leaders[(tp.topic, tp.partition)] < 0:
                found[(tp.topic, tp.partition)] = "offline: the partition has no leader"
            else:
                pending.append(tp)
        deadline = time.monotonic() + self._left_s()
        while pending:
            left = deadline - time.monotonic()
            by_leader: dict[int, list[TopicPartition]] = {}
            for tp in pending:
                by_leader.setdefault(leaders[(tp.topic, tp.partition)], []).append(tp)
            asked = []
            for group in by_leader.values():
                for spec in (OffsetSpec.earliest(), OffsetSpec.latest()):  # type: ignore[no-untyped-call]
                    asked.append((spec, self._admin.list_offsets(
                        {TopicPartition(tp.topic, tp.partition): spec for tp in group},
                        request_timeout=max(1.0, left))))
            marks: dict[tuple[str, int], list[int]] = {}
            failed: dict[tuple[str, int], str] = {}
            for _spec, futures in asked:
                for tp, future in futures.items():
                    key = (tp.topic, tp.partition)
                    try:
                        marks.setdefault(key, []).append(int(future.result().offset))
                    except KafkaException as exc:
                        failed[key] = f"offsets unreadable: {translate(exc, 'list offsets')}"
            retry = []
            for tp in pending:
                key = (tp.topic, tp.partition)
                if key in failed or len(marks.get(key, ())) < 2:
                    found[key] = failed.get(key, "offsets unreadable")
                    retry.append(tp)
                else:
                    low, high = sorted(marks[key])
                    found[key] = (low, high)
            if not retry or time.monotonic() + OFFSETS_RETRY_S >= deadline:
                break
            time.sleep(OFFSETS_RETRY_S)
            pending = retry
        return found

    def _committed(self, group: str, partitions: list[TopicPartition],
                   ) -> dict[tuple[str, int], int | None]:
        if not partitions:
            return {}
        request = [ConsumerGroupTopicPartitions(group, partitions)]
        try:
            result = self._admin.list_consumer_group_offsets(
                request, request_timeout=self._left_s())[group].result()
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
        deadline = time.monotonic() + self._left_s()
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
                        "the sample's %.0fs; their lag in seconds is unknown", missing,
                        READ_TIMEOUT_S)
        return found

    def _overdue(self, tp: TopicPartition, start: int, end: int,
                 head: tuple[int, bytes | None, list[Any]] | None,
                 now_s: float) -> tuple[int | None, float | None]:
        """(records past their not_before, seconds the first of them is late) on a retry tier;
        (None, None) when its first record was not read in time."""
        if end <= start:
            return 0, 0.0
        if head is None:
            return None, None
        head_due = not_before_s(head[1], head[2], self._schema_by_id)
        if head_due is not None and head_due > now_s:
            return 0, 0.0  # the head waits: so does everything behind it
        late = max(0.0, now_s - head_due) if head_due is not None else 0.0

        def is_due(offset: int) -> bool:
            if offset == start:
                return True
            record = self._first_records([(tp, offset)]).get((tp.topic, tp.partition))
            due = not_before_s(record[1], record[2], self._schema_by_id) if record else None
            return due is None or due <= now_s

        return first_not_due(start, end, is_due) - start, late


def read_report(reader: LagReader, outbox: Callable[[], OutboxBacklog] | None,
                samples: int = 1, interval_s: float = ONE_SHOT_INTERVAL_S,
                stop: threading.Event | None = None) -> LagReport:
    """Sample ``samples`` times ``interval_s`` apart and report the last sample; a partial
    sample (a broker down) is reported at once."""
    groups = reader.sample()
    for _ in range(samples - 1):
        if any(g.unavailable for g in groups):
            break
        if stop is not None and stop.wait(interval_s):
            break
        if stop is None:
            time.sleep(interval_s)
        groups = reader.sample()
    return LagReport(dt.datetime.now(dt.UTC), tuple(groups), outbox() if outbox else None,
                     reader.replication)
