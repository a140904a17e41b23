"""The sender: a consumer-group member that delivers email events over SMTP and routes each outcome.

Wires the pure decisions (classify_reply, RetryPolicy, the priority rule) to the adapters (Kafka
consumer and producer, the SMTP pool, the delivery ledger). A record's offset is stored only when
everything it caused (result, retry or dead letter) is acknowledged by Kafka; librdkafka commits
stored offsets in the background and on close.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
import os
import socket
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from email.message import EmailMessage
from functools import partial
from typing import Any, TypeVar

from confluent_kafka import (
    OFFSET_INVALID,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from postroom import kafka
from postroom.kafka import Headers, Record, readable_records
from postroom.metrics import Metrics
from postroom.settings import Settings
from postroom.topics import (
    Priority,
    dead_letter_topic,
    priority_of_topic,
    priority_topic,
    results_topic,
    retry_topic,
    tier_of_retry_topic,
)
from schemas.codec import (
    DeliveryStatus,
    EmailRequested,
    EmailResult,
    SchemaError,
    decode,
    encode,
    headers_for,
)
from sender.errors import AttachmentError
from sender.ledger import Claim, Ledger
from sender.message import build_message
from sender.outcome import Failure, Outcome, SmtpReply, Stage, Verdict, classify_reply
from sender.priority import PriorityState, plan_round
from sender.retry import Action, RetryDecision, RetryPolicy, due_in_s, lateness_s
from sender.smtp import SmtpConfig, SmtpPool

log = logging.getLogger(__name__)

ERROR_HEADER = "postroom.error"
DLQ_TOPIC_HEADER = "postroom.dlq.topic"
DLQ_PARTITION_HEADER = "postroom.dlq.partition"
DLQ_OFFSET_HEADER = "postroom.dlq.offset"
DLQ_CLASS_HEADER = "postroom.dlq.classification"
DLQ_REASON_HEADER = "postroom.dlq.reason"

FETCH_MAX = 500
IDLE_WAIT_S = 0.02
PRIORITY_EVERY_S = 0.1
STARVATION_LIMIT_ROUNDS = 50   # at PRIORITY_EVERY_S: a backlogged low priority waits at most ~5 s
PRODUCE_RETRY_S = 2.0
SHUTDOWN_GRACE_S = 30.0
COMMITTED_TIMEOUT_S = 1.0
LEASE_MARGIN_S = 15.0  # time after a send's deadline to record its outcome in the ledger
# A busy key's owner may die at any moment, freeing it at once: ask again this often.
BUSY_RECHECK_S = 1.0
STATUS_OF = {Action.DONE_SENT: DeliveryStatus.SENT, Action.RETRY: DeliveryStatus.RETRYING,
             Action.FAIL: DeliveryStatus.FAILED, Action.DEAD: DeliveryStatus.DEAD}

TP = tuple[str, int]
T = TypeVar("T")


def send_deadline_s(settings: Settings) -> float:
    """The longest one SMTP send may take before it is abandoned as timed out."""
    return settings.smtp_connect_timeout_s + 4 * settings.smtp_timeout_s


def lease_s(settings: Settings) -> float:
    """How long a ledger claim lasts: past the send's deadline, so a live sender keeps it."""
    return send_deadline_s(settings) + LEASE_MARGIN_S


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def sender_identity() -> str:
    """Names this process in the ledger and in logs: host, pid and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


@dataclasses.dataclass
class _PartitionProgress:
    """Offsets of one partition handed to tasks and not yet finished, for storing commit points."""

    in_flight: set[int] = dataclasses.field(default_factory=set)
    next_offset: int | None = None  # one past the highest offset taken from this partition

    def commit_point(self) -> int | None:
        return min(self.in_flight) if self.in_flight else self.next_offset


class Sender:
    """One member of the sender group. ``await run()`` until ``stop()``."""

    def __init__(
        self,
        settings: Settings,
        *,
        ledger: Ledger,
        pool: SmtpPool | None = None,
        metrics: Metrics | None = None,
        consumer_factory: Callable[[], Consumer] | None = None,
        producer_factory: Callable[[], Producer] | None = None,
        clock: Callable[[], dt.datetime] = utcnow,
        max_in_flight: int | None = None,
    ) -> None:
        self._settings = settings
        self._prefix = settings.topic_prefix
        self._ledger = ledger
        self._pool = pool or SmtpPool(SmtpConfig.from_settings(settings))
        self.metrics = metrics or Metrics()
        self._policy = RetryPolicy(settings.retry_delays_s)
        self._clock = clock
        self._max_in_flight = max_in_flight or settings.smtp_concurrency * 4
        self._slots = asyncio.Semaphore(settings.smtp_concurrency)
        self._send_deadline_s = send_deadline_s(settings)
        self._consumer_factory = consumer_factory or (lambda: kafka.make_consumer(
            settings, settings.sender_group))
        self._producer_factory = producer_factory or (lambda: kafka.make_producer(
            settings, **{"message.timeout.ms": 120_000}))
        self._consumer: Consumer | None = None
        self._producer: Producer | None = None
        self._progress: dict[TP, _PartitionProgress] = defaultdict(_PartitionProgress)
        self._assigned: set[TP] = set()
        self._waiting: dict[TP, dt.datetime] = {}      # retry partitions paused until due
        self._priority_paused: set[TP] = set()
        self._start_offsets: dict[TP, int] = {}       # where reading began, until position is known
        self._priority_state = PriorityState()
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopping = asyncio.Event()
        self.topics = [
            *(priority_topic(self._prefix, p) for p in Priority),
            *(retry_topic(self._prefix, n) for n in range(1, self._policy.tiers + 1)),
        ]

    # -- lifecycle -----------------------------------------------------------------------------

    def stop(self) -> None:
        self._stopping.set()

    @property
    def consumer(self) -> Consumer:
        if self._consumer is None:
            raise RuntimeError("the sender is not running")
        return self._consumer

    @property
    def producer(self) -> Producer:
        if self._producer is None:
            raise RuntimeError("the sender is not running")
        return self._producer

    async def run(self) -> None:
        """Consume and deliver until stop(); then finish in-flight work, commit and leave."""
        self._consumer = self._consumer_factory()
        self._producer = self._producer_factory()
        self._consumer.subscribe(self.topics, on_assign=self._on_assign,
                                 on_revoke=self._on_revoke, on_lost=self._on_revoke)
        log.info("sender %s consuming %s as group %s (concurrency %d, tiers %s)",
                 self._ledger.owner, ", ".join(self.topics), self._settings.sender_group,
                 self._settings.smtp_concurrency, list(self._settings.retry_delays_s))
        last_priority = 0.0
        loop = asyncio.get_running_loop()
        try:
            while not self._stopping.is_set():
                self._producer.poll(0)
                now = self._clock()
                self._resume_due(now)
                if loop.time() - last_priority >= PRIORITY_EVERY_S:
                    last_priority = loop.time()
                    self._apply_priority()
                room = self._max_in_flight - len(self._tasks)
                if room <= 0:
                    await asyncio.wait(self._tasks, timeout=IDLE_WAIT_S,
                                       return_when=asyncio.FIRST_COMPLETED)
                    continue
                messages = self._consumer.consume(num_messages=min(room, FETCH_MAX), timeout=0)
                if not messages:
                    await asyncio.sleep(IDLE_WAIT_S)
                    continue
                self._dispatch(messages, now)
        finally:
            await self._shutdown()

    async def _shutdown(self) -> None:
        log.info("sender stopping: finishing %d in-flight deliveries", len(self._tasks))
        deadline = asyncio.get_running_loop().time() + SHUTDOWN_GRACE_S
        while self._tasks and asyncio.get_running_loop().time() < deadline:
            # Delivery reports arrive only through poll(): the tasks wait on them.
            if self._producer is not None:
                self._producer.poll(0)
            await asyncio.wait(self._tasks, timeout=IDLE_WAIT_S)
        pending = set(self._tasks)
        if pending:
            for task in pending:
                task.cancel()
            log.warning("abandoned %d deliveries after %.0fs; they will be redelivered",
                        len(pending), SHUTDOWN_GRACE_S)
            await asyncio.gather(*pending, return_exceptions=True)
        if self._producer is not None:
            self._producer.flush(30)
        if self._consumer is not None:
            self._consumer.close()  # commits stored offsets and leaves the group
        await self._pool.close()
        await self._ledger.close()
        log.info("sender stopped: %s", self.summary())

    def summary(self) -> str:
        parts = [f"{labels[0][1]}={value:g}" for labels, value in
                 sorted(self.metrics.counters("outcomes_total").items())]
        return " ".join(parts) or "no deliveries"

    # -- assignment ----------------------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self._assigned.add((tp.topic, tp.partition))
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
            progress = self._progress.pop(key, None)
            point = progress.commit_point() if progress else None
            if point is not None:
                commits.append(TopicPartition(tp.topic, tp.partition, point))
        if commits:
            try:
                consumer.commit(offsets=commits, asynchronous=False)
            except KafkaException as exc:
                log.warning("commit on revoke failed: %s", exc)
        log.info("revoked %s", _names(partitions))

    # -- fetching ------------------------------------------------------------------------------

    def _dispatch(self, messages: Sequence[Message], now: dt.datetime) -> None:
        held_back: set[TP] = set()
        for record in readable_records(messages):
            if record.tp in held_back:
                continue  # we rewound this partition; its later records come again
            try:
                event = decode(EmailRequested, record.value, record.headers)
            except SchemaError as exc:
                self._take(record)
                self._spawn(self._dead_letter_poison(record, str(exc)), record)
                continue
            if tier_of_retry_topic(self._prefix, record.topic) is not None:
                if due_in_s(event.not_before, now) > 0:
                    self._hold_until_due(record, event.not_before or now)
                    held_back.add(record.tp)
                    continue
                if event.not_before is not None:
                    self.metrics.observe("retry_lateness_seconds", lateness_s(event.not_before, now))
            self._take(record)
            self._spawn(self._handle(record, event), record)

    def _take(self, record: Record) -> None:
        progress = self._progress[record.tp]
        progress.in_flight.add(record.offset)
        progress.next_offset = max(progress.next_offset or 0, record.offset + 1)

    def _hold_until_due(self, record: Record, due: dt.datetime) -> None:
        """Pause a retry partition at this record and rewind to it; resume when it is due.
        Polling goes on meanwhile, so heartbeats and fresh mail are not held up."""
        tp = TopicPartition(record.topic, record.partition, record.offset)
        self.consumer.pause([tp])
        self.consumer.seek(tp)
        self._waiting[record.tp] = due

    def _resume_due(self, now: dt.datetime) -> None:
        due = [tp for tp, when in self._waiting.items() if when <= now]
        if due:
            for tp in due:
                del self._waiting[tp]
            self.consumer.resume([TopicPartition(t, p) for t, p in due])

    def _apply_priority(self) -> None:
        """Pause or resume whole priorities by the rule in sender/priority.py."""
        by_priority: dict[Priority, list[TP]] = defaultdict(list)
        for tp in self._assigned:
            priority = priority_of_topic(self._prefix, tp[0])
            if priority is not None:
                by_priority[priority].append(tp)
        if not by_priority:
            return
        backlog = {p: self._backlog(by_priority.get(p, [])) for p in Priority}
        active, self._priority_state = plan_round(self._priority_state, backlog,
                                                  STARVATION_LIMIT_ROUNDS)
        to_pause = [tp for p, tps in by_priority.items() if p not in active for tp in tps
                    if tp not in self._priority_paused]
        to_resume = [tp for p, tps in by_priority.items() if p in active for tp in tps
                     if tp in self._priority_paused]
        if to_pause:
            self.consumer.pause([TopicPartition(t, p) for t, p in to_pause])
            self._priority_paused.update(to_pause)
        if to_resume:
            self.consumer.resume([TopicPartition(t, p) for t, p in to_resume])
            self._priority_paused.difference_update(to_resume)
        for priority in Priority:
            self.metrics.set("backlog", backlog[priority], priority=priority.value)

    def _backlog(self, tps: list[TP]) -> int:
        """Records known to wait on these partitions: cached high watermark less our position.

        Before a partition has yielded a record its position is unknown; the group's committed
        offset (looked up once per assignment) or the low watermark stands in for it.
        """
        if not tps:
            return 0
        total = 0
        positions = self.consumer.position([TopicPartition(t, p) for t, p in tps])
        unknown = [tp for tp in positions if tp.offset < 0
                   and (tp.topic, tp.partition) not in self._start_offsets]
        if unknown:
            # Asked once per assignment, briefly: this blocks the event loop while it waits.
            for tp in unknown:
                self._start_offsets[(tp.topic, tp.partition)] = OFFSET_INVALID
            try:
                for tp in self.consumer.committed(unknown, timeout=COMMITTED_TIMEOUT_S):
                    self._start_offsets[(tp.topic, tp.partition)] = tp.offset
            except KafkaException as exc:
                log.debug("committed offsets unavailable: %s", exc)
        for tp in positions:
            try:
                low, high = self.consumer.get_watermark_offsets(tp, cached=True)
            except KafkaException:
                continue
            if high < 0:
                continue  # nothing fetched from this partition yet
            position = tp.offset
            if position < 0:
                start = self._start_offsets.get((tp.topic, tp.partition), OFFSET_INVALID)
                position = start if start >= 0 else max(low, 0)
            total += max(0, high - position)
        return total

    # -- per record ----------------------------------------------------------------------------

    def _spawn(self, coro: Any, record: Record) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(lambda t: self._finished(t, record.tp, record.offset))

    def _finished(self, task: asyncio.Task[None], tp: TP, offset: int) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return  # abandoned at shutdown: not stored, so it is redelivered
        if task.exception() is not None:
            log.error("delivery task failed; the record will be redelivered",
                      exc_info=task.exception())
            return
        progress = self._progress.get(tp)
        if progress is None or tp not in self._assigned:
            return  # revoked meanwhile; the next owner takes it from the last commit
        progress.in_flight.discard(offset)
        point = progress.commit_point()
        if point is not None and self._consumer is not None:
            try:
                self._consumer.store_offsets(offsets=[TopicPartition(tp[0], tp[1], point)])
            except KafkaException as exc:
                log.debug("store_offsets %s failed: %s", tp, exc)

    async def _handle(self, msg: Record, event: EmailRequested) -> None:
        """Claim, send and record one event; then route its outcome."""
        key = event.idempotency_key
        waits = 0
        while True:
            # The claim is taken inside a sending slot, so its lease starts when the send does
            # and outlasts the send's deadline.
            async with self._slots:
                claim = await self._retrying("claim", partial(self._ledger.claim, key, event.attempt))
                if claim.claim is Claim.MINE:
                    outcome, message_id = await self._deliver(event)
                    replied = time.monotonic()
                    now = self._clock()
                    decision = self._policy.decide(outcome, event.attempt, now)
                    if decision.action is Action.DONE_SENT:
                        await self._retrying("mark sent",
                                             partial(self._ledger.mark_sent, key, message_id))
                        # The duplicate window: a crash before this point sends the key again.
                        self.metrics.observe("sent_mark_seconds", time.monotonic() - replied)
                    else:
                        await self._retrying("release", partial(self._ledger.release, key))
                    break
            if claim.claim is Claim.SENT:
                self.metrics.inc("duplicates_suppressed_total")
                log.info("key=%s already accepted by the server; not sending again", key)
                await self._produce_result(event, Action.DONE_SENT, None, claim.message_id)
                return
            # Another sender (or an earlier copy here) is on it: wait for its answer, its end or
            # its lease.
            wait_s = BUSY_RECHECK_S if claim.lease_until is None else max(
                0.2, min(due_in_s(claim.lease_until, self._clock()) + 0.2, BUSY_RECHECK_S))
            log.log(logging.INFO if waits == 0 else logging.DEBUG,
                    "key=%s is being sent elsewhere (lease until %s); asking again every %.1fs",
                    key, claim.lease_until, wait_s)
            waits += 1
            await asyncio.sleep(wait_s)
        await self._route(msg, event, outcome, decision, message_id, now)

    async def _retrying(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """``call()`` until the ledger answers (a shutdown cancels the wait)."""
        while True:
            try:
                return await call()
            except Exception as exc:  # noqa: BLE001 - the ledger must come back; retried
                log.warning("ledger %s failed (%s); retrying in %.0fs", what, exc, PRODUCE_RETRY_S)
                await asyncio.sleep(PRODUCE_RETRY_S)

    def _build(self, event: EmailRequested) -> EmailMessage | SmtpReply:
        """The message to send, or the local failure that stands in for the server's reply."""
        root = self._settings.attachments_root
        if event.attachments and root is None:
            # Reading whatever path the process can read is not on: a root must be chosen.
            return SmtpReply(Stage.LOCAL, None, "attachments are off: POSTROOM_ATTACHMENTS_ROOT "
                             "is not set", Failure.CONFIG)
        try:
            return build_message(event, attachments_root=root, now=self._clock())
        except (AttachmentError, ValueError) as exc:
            return SmtpReply(Stage.LOCAL, None, str(exc), Failure.BAD_MESSAGE)

    async def _deliver(self, event: EmailRequested) -> tuple[Outcome, str]:
        sender = event.sender or self._settings.mail_from
        event = dataclasses.replace(event, sender=sender)
        built = self._build(event)
        if isinstance(built, SmtpReply):
            reply, message_id = built, ""
        else:
            message_id = str(built["Message-ID"])
            try:
                async with asyncio.timeout(self._send_deadline_s):
                    reply = await self._pool.send(built, sender, event.recipient)
            except TimeoutError:
                reply = SmtpReply(Stage.LOCAL, None, f"the send took longer than its deadline "
                                  f"of {self._send_deadline_s:.0f}s", Failure.TIMEOUT)
        outcome = classify_reply(reply)
        self.metrics.inc("attempts_total", verdict=outcome.verdict.value)
        if outcome.server_fault and outcome.verdict is not Verdict.SENT:
            self.metrics.inc("server_faults_total", stage=reply.stage.value)
        return outcome, message_id

    async def _route(self, msg: Record, event: EmailRequested, outcome: Outcome,
                     decision: RetryDecision, message_id: str, now: dt.datetime) -> None:
        key = event.idempotency_key
        history = [*_errors_of(msg), *(
            [(ERROR_HEADER, f"attempt={event.attempt} at={now.isoformat()} {outcome.reason}")]
            if outcome.verdict is not Verdict.SENT else [])]
        pending = [self._produce_result(event, decision.action, outcome,
                                        message_id if decision.action is Action.DONE_SENT else None,
                                        decision.not_before)]
        if decision.action is Action.RETRY:
            retry = dataclasses.replace(event, attempt=event.attempt + 1,
                                        not_before=decision.not_before)
            pending.append(self._produce(retry_topic(self._prefix, decision.tier or 1), key,
                                         encode(retry), [*headers_for(retry), *history]))
            log.info("key=%s attempt=%d transient (%s): retry tier %d at %s", key, event.attempt,
                     outcome.reason, decision.tier, decision.not_before)
        elif decision.action in (Action.FAIL, Action.DEAD):
            classification = ("permanent" if decision.action is Action.FAIL
                              else "transient-exhausted")
            pending.append(self._produce(dead_letter_topic(self._prefix), key, encode(event), [
                *headers_for(event), *history, *_dlq_headers(msg, classification, outcome.reason)]))
            log.error("key=%s domain=%s attempt=%d %s: %s", key,
                      event.recipient.rpartition("@")[2], event.attempt,
                      "failed permanently" if decision.action is Action.FAIL else
                      "dead after the last retry tier", outcome.reason)
        else:
            log.info("key=%s attempt=%d sent: %s", key, event.attempt, outcome.reason)
        await asyncio.gather(*pending)
        self.metrics.inc("outcomes_total", status=STATUS_OF[decision.action].value)

    async def _produce_result(self, event: EmailRequested, action: Action, outcome: Outcome | None,
                              message_id: str | None,
                              next_attempt_at: dt.datetime | None = None) -> None:
        failed = outcome is not None and outcome.verdict is not Verdict.SENT
        result = EmailResult(
            idempotency_key=event.idempotency_key, outbox_id=event.outbox_id,
            recipient=event.recipient, status=STATUS_OF[action], attempt=event.attempt,
            occurred_at=self._clock(), smtp_code=outcome.code if outcome else None,
            enhanced_code=outcome.enhanced_code if outcome else None,
            error=outcome.reason if failed and outcome else None,
            next_attempt_at=next_attempt_at, message_id=message_id)
        await self._produce(results_topic(self._prefix), event.idempotency_key, encode(result),
                            headers_for(result))

    async def _dead_letter_poison(self, msg: Record, reason: str) -> None:
        self.metrics.inc("poison_total")
        log.error("unreadable record %s[%d]@%d dead-lettered: %s", msg.topic, msg.partition,
                  msg.offset, reason)
        await self._produce(dead_letter_topic(self._prefix), msg.key, msg.value, [
            *msg.headers, *_dlq_headers(msg, "poison", reason)])

    async def _produce(self, topic: str, key: str | bytes | None, value: bytes | None,
                       headers: Sequence[tuple[str, str | bytes | None]]) -> None:
        """Produce and wait for the broker's acknowledgement, retrying until it comes."""
        loop = asyncio.get_running_loop()
        while True:
            future: asyncio.Future[None] = loop.create_future()

            def on_delivery(err: KafkaError | None, _msg: Message,
                            future: asyncio.Future[None] = future) -> None:
                if future.done():
                    return
                if err is None:
                    future.set_result(None)
                else:
                    future.set_exception(KafkaException(err))
            try:
                self.producer.produce(topic, key=key, value=value, headers=list(headers),
                                       on_delivery=on_delivery)
                await future
            except (KafkaException, BufferError) as exc:
                err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
                # Not retriable (e.g. a record too large) means this partition is stuck until an
                # operator acts: say so loudly. Giving up would lose the email.
                level = logging.ERROR if err is not None and not err.retriable() else logging.WARNING
                log.log(level, "producing to %s failed (%s); retrying in %.0fs", topic, exc,
                        PRODUCE_RETRY_S)
                self.metrics.inc("produce_failures_total", topic=topic)
                await asyncio.sleep(PRODUCE_RETRY_S)
                continue
            return


def _errors_of(msg: Record) -> Headers:
    return [(k, v) for k, v in msg.headers if k == ERROR_HEADER]


def _dlq_headers(msg: Record, classification: str, reason: str) -> Headers:
    return [(DLQ_TOPIC_HEADER, msg.topic), (DLQ_PARTITION_HEADER, str(msg.partition)),
            (DLQ_OFFSET_HEADER, str(msg.offset)), (DLQ_CLASS_HEADER, classification),
            (DLQ_REASON_HEADER, reason)]


def _names(partitions: list[TopicPartition]) -> str:
    return ", ".join(f"{tp.topic}[{tp.partition}]" for tp in partitions) or "nothing"
