"""Talks to Kafka for the sender's reads: the group subscription and its rebalances, pausing (a retry
tier until its head record is due, lower priorities by the rule in sender/priority.py), and the
offsets stored as tasks finish (sender/offsets.py decides which)."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import cast

from postroom import kafka
from postroom.kafka import OFFSET_INVALID, Consumer, KafkaException, Message, Record, TopicPartition
from postroom.metrics import BACKLOG, Metrics
from postroom.sender.offsets import TP, OffsetBook
from postroom.sender.priority import PRIORITY_ORDER, PriorityState, partition_backlog, plan_round
from postroom.settings import Settings
from postroom.topics import (
    Priority,
    priority_of_topic,
    retry_topic,
    sender_topics,
    tier_of_retry_topic,
)

log = logging.getLogger(__name__)

STARVATION_LIMIT_ROUNDS = 50   # at the sender's priority interval (0.1 s): a low priority waits ~5 s
COMMITTED_TIMEOUT_S = 1.0
LIST_TOPICS_TIMEOUT_S = 10.0
# Each topic's partitions divided among the senders. Not cooperative-sticky: it balances the
# count of partitions over all the group's topics (three priorities and the retry tiers), and gave
# one of two senders every partition of the one topic with mail and the other only idle ones (in
# the two-sender run of bench/delivery.py, the second used 2% of the CPU of the first). Range is
# eager: a rebalance stops every member for a moment, and a member's records in flight are read
# again, where the ledger finds them busy or sent (sender/claims.py), so nothing goes twice.
ASSIGNMENT = "range"


class SenderConsumer:
    """The sender's group membership. ``start()``, then ``fetch`` and ``take`` records and report
    each one ``finished``; ``close()`` commits what is finished and leaves the group."""

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self._settings = settings
        self._metrics = metrics
        self.topics = sender_topics(settings.topic_prefix, len(settings.retry_delays_s))
        self._consumer: Consumer | None = None
        self._book = OffsetBook()
        self._assigned: set[TP] = set()
        self._waiting: dict[TP, dt.datetime] = {}   # retry partitions paused until due
        self._priority_paused: set[TP] = set()
        self._start_offsets: dict[TP, int] = {}     # where reading began, until position is known
        self._start_highs: dict[TP, int] = {}       # high watermarks asked at the assignment
        # An assignment whose priorities are not planned yet: the sender plans them before it
        # hands out any record (a fast fetch would otherwise fill its lines with whatever came).
        self.unplanned = False
        self._priority_state = PriorityState()
        self._stored: dict[TP, int] = {}            # stored since the last commit_stored()

    @property
    def consumer(self) -> Consumer:
        if self._consumer is None:
            raise RuntimeError("the sender's consumer is not started")
        return self._consumer

    def start(self) -> None:
        self._consumer = kafka.make_consumer(self._settings, self._settings.sender_group,
                                             **{"partition.assignment.strategy": ASSIGNMENT})
        self.topics = [*self.topics, *self.removed_tiers()]
        self._consumer.subscribe(self.topics, on_assign=self._on_assign,
                                 on_revoke=self._on_revoke, on_lost=self._on_revoke)

    def removed_tiers(self) -> list[str]:
        """Retry tier topics beyond today's POSTROOM_RETRY_DELAYS that the broker still has:
        shortened while retries waited there, they are read until empty (each record is
        attempted when due, and a transient failure of it is dead, as after the last tier)."""
        prefix, tiers = self._settings.topic_prefix, len(self._settings.retry_delays_s)
        try:
            names = self.consumer.list_topics(timeout=LIST_TOPICS_TIMEOUT_S).topics
        except KafkaException as exc:
            log.warning("cannot list the topics to find retry tiers beyond POSTROOM_RETRY_DELAYS "
                        "(%s); reading today's tiers only", exc)
            return []
        found = sorted(tier for name in names
                       if (tier := tier_of_retry_topic(prefix, name)) is not None and tier > tiers)
        if found:
            log.info("also reading retry tiers %s, beyond the %d of POSTROOM_RETRY_DELAYS, for "
                     "the retries that waited there", found, tiers)
        return [retry_topic(prefix, tier) for tier in found]

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()  # commits stored offsets and leaves the group

    @property
    def assigned(self) -> frozenset[TP]:
        """The partitions this member holds now."""
        return frozenset(self._assigned)

    def fetch(self, max_records: int) -> list[Message]:
        """What the broker has already sent us, without waiting."""
        return self.consumer.consume(num_messages=max_records, timeout=0)

    # -- offsets -------------------------------------------------------------------------------

    def take(self, record: Record) -> None:
        self._book.take(record.tp, record.offset)

    def finished(self, tp: TP, offset: int) -> None:
        """A task is done with the record at ``offset``: store the partition's commit point."""
        point = self._book.finish(tp, offset)
        if point is None or self._consumer is None:
            return
        try:
            self._consumer.store_offsets(offsets=[TopicPartition(tp[0], tp[1], point)])
            self._stored[tp] = point
        except KafkaException as exc:
            log.debug("store_offsets %s failed: %s", tp, exc)

    def commit_stored(self) -> None:
        """Commit the offsets stored since the last call, now. The sender calls it when it falls
        idle: librdkafka's auto-commit runs only every auto.commit.interval.ms (5 s), and until
        then `postroom lag` counts mail already delivered as lag."""
        stored, self._stored = self._stored, {}
        offsets = [TopicPartition(t, p, point) for (t, p), point in stored.items()
                   if (t, p) in self._assigned]
        if offsets and self._consumer is not None:
            try:
                self._consumer.commit(offsets=offsets, asynchronous=True)
            except KafkaException as exc:
                log.debug("commit of stored offsets failed: %s", exc)

    # -- rebalances ----------------------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._assigned.update((tp.topic, tp.partition) for tp in partitions)
        self.unplanned = True
        log.info("assigned %s", _names(partitions))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Commit what is finished on the partitions we lose; their unfinished records go to the
        next owner, whose ledger claim waits for our answer instead of sending twice."""
        try:
            # librdkafka keeps a partition's pause across a revoke; were it assigned to us again
            # it would stay paused with nothing here to resume it.
            consumer.resume(partitions)
        except KafkaException as exc:
            log.debug("resume on revoke: %s", exc)
        commits = []
        for tp in partitions:
            key = (tp.topic, tp.partition)
            self._assigned.discard(key)
            self._waiting.pop(key, None)
            self._priority_paused.discard(key)
            self._start_offsets.pop(key, None)
            self._start_highs.pop(key, None)
            point = self._book.revoke(key)
            if point is not None:
                commits.append(TopicPartition(tp.topic, tp.partition, point))
        if commits:
            try:
                consumer.commit(offsets=commits, asynchronous=False)
            except KafkaException as exc:
                log.warning("commit on revoke failed: %s", exc)
        log.info("revoked %s", _names(partitions))

    # -- retry tiers ---------------------------------------------------------------------------

    def hold_until_due(self, record: Record, due: dt.datetime) -> None:
        """Pause a partition at this record and rewind to it; resume when it is due (a retry
        tier's head record, or one waiting for the schema registry). Polling goes on meanwhile,
        so heartbeats and fresh mail are not held up."""
        tp = TopicPartition(record.topic, record.partition, record.offset)
        self.consumer.pause([tp])
        self.consumer.seek(tp)
        self._waiting[record.tp] = due

    def resume_due(self, now: dt.datetime) -> None:
        due = [tp for tp, when in self._waiting.items() if when <= now]
        if due:
            for tp in due:
                del self._waiting[tp]
            # One its priority paused meanwhile stays paused: the priority resumes it.
            resume = [TopicPartition(t, p) for t, p in due if (t, p) not in self._priority_paused]
            if resume:
                self.consumer.resume(resume)

    # -- priorities ----------------------------------------------------------------------------

    async def apply_priority(self, fetched: Sequence[Message] = ()) -> None:
        """Pause or resume whole priorities by the rule in sender/priority.py. ``fetched``: records
        read and not handed out yet (our position is past them), counted in their backlog."""
        self.unplanned = False
        prefix = self._settings.topic_prefix
        by_priority: dict[Priority, list[TP]] = defaultdict(list)
        for tp in self._assigned:
            priority = priority_of_topic(prefix, tp[0])
            if priority is not None:
                by_priority[priority].append(tp)
        if not by_priority:
            return
        # Most urgent first: should the broker be slow, the high partitions' backlog is known.
        await self._look_up_start_offsets(
            [tp for p in PRIORITY_ORDER for tp in by_priority.get(p, [])])
        unread = Counter(_tp_of(m) for m in fetched if m.error() is None)
        backlog = {p: self._backlog(by_priority.get(p, []), unread) for p in Priority}
        active, self._priority_state = plan_round(self._priority_state, backlog,
                                                  STARVATION_LIMIT_ROUNDS)
        to_pause = [tp for p, tps in by_priority.items() if p not in active for tp in tps
                    if tp not in self._priority_paused]
        to_resume = [tp for p, tps in by_priority.items() if p in active for tp in tps
                     if tp in self._priority_paused]
        # A partition held at a record (waiting for the registry) stays paused until it is due.
        self._priority_paused.difference_update(tp for tp in to_resume if tp in self._waiting)
        to_resume = [tp for tp in to_resume if tp not in self._waiting]
        if to_pause:
            self.consumer.pause([TopicPartition(t, p) for t, p in to_pause])
            self._priority_paused.update(to_pause)
        if to_resume:
            self.consumer.resume([TopicPartition(t, p) for t, p in to_resume])
            self._priority_paused.difference_update(to_resume)
        for priority in Priority:
            self._metrics.set(BACKLOG, backlog[priority], priority=priority.value)

    def put_back_paused(self, messages: list[Message]) -> list[Message]:
        """``messages`` less those of partitions paused by priority, which are rewound to their
        first such record, to be read again when their priority is let in."""
        rewind: dict[TP, int] = {}
        kept = []
        for message in messages:
            tp, offset = _tp_of(message), message.offset()
            if message.error() is None and offset is not None and tp in self._priority_paused:
                rewind.setdefault(tp, offset)
            else:
                kept.append(message)
        for (topic, partition), offset in rewind.items():
            self.consumer.seek(TopicPartition(topic, partition, offset))
        return kept

    async def _look_up_start_offsets(self, tps: list[TP]) -> None:
        """The group's committed offsets and the high watermarks of partitions whose position is
        still unknown, asked once per assignment in a worker thread (the broker's answer must
        not hold the loop): the backlog of a partition nothing was fetched from yet."""
        unknown = [tp for tp in self.consumer.position([TopicPartition(t, p) for t, p in tps])
                   if tp.offset < 0 and (tp.topic, tp.partition) not in self._start_offsets]
        if not unknown:
            return
        for tp in unknown:
            self._start_offsets[(tp.topic, tp.partition)] = OFFSET_INVALID
        try:
            committed, highs = await asyncio.to_thread(self._committed_and_highs, unknown)
        except KafkaException as exc:
            log.debug("committed offsets unavailable: %s", exc)
            return
        for tp in committed:
            key = (tp.topic, tp.partition)
            if key in self._start_offsets:  # not revoked while we asked
                self._start_offsets[key] = tp.offset
                if key in highs:
                    self._start_highs[key] = highs[key]

    def _committed_and_highs(self, tps: list[TopicPartition],
                             ) -> tuple[list[TopicPartition], dict[TP, int]]:
        committed = self.consumer.committed(tps, timeout=COMMITTED_TIMEOUT_S)
        highs: dict[TP, int] = {}
        # One broker request per partition, all within one more COMMITTED_TIMEOUT_S: a slow
        # broker holds a new assignment's first records about two seconds at most.
        deadline = time.monotonic() + COMMITTED_TIMEOUT_S
        for tp in tps:
            left_s = deadline - time.monotonic()
            if left_s <= 0:
                break  # the rest are known from their first fetch
            try:
                _, high = self.consumer.get_watermark_offsets(
                    TopicPartition(tp.topic, tp.partition), timeout=left_s, cached=False)
            except KafkaException as exc:
                log.debug("high watermark of %s[%d] unavailable: %s", tp.topic, tp.partition, exc)
                continue
            highs[(tp.topic, tp.partition)] = high
        return committed, highs

    def _backlog(self, tps: list[TP], unread: Mapping[TP, int]) -> int:
        if not tps:
            return 0
        total = 0
        for tp in self.consumer.position([TopicPartition(t, p) for t, p in tps]):
            try:
                low, high = self.consumer.get_watermark_offsets(tp, cached=True)
            except KafkaException:
                continue
            key = (tp.topic, tp.partition)
            high = max(high, self._start_highs.get(key, -1))
            total += unread.get(key, 0) + partition_backlog(tp.offset, low, high,
                                                            self._start_offsets.get(key))
        return total


def _tp_of(message: Message) -> TP:
    """A record's topic and partition (a record, unlike an error event, has both)."""
    return cast(TP, (message.topic(), message.partition()))


def _names(partitions: list[TopicPartition]) -> str:
    return ", ".join(f"{tp.topic}[{tp.partition}]" for tp in partitions) or "nothing"
