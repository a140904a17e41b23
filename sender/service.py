"""The sender: a consumer-group member that delivers email events over SMTP and routes each outcome.

Wiring only. The decisions are pure modules (outcome: what a reply means; retry: what comes next;
routing: what to publish where; claims: leases and waits; offsets: what may be committed;
priority: which topics to read; admission: what is poison; throttle: when a destination may take
a send); the adapters talk to Kafka (consumer, producer, publishing), SMTP (smtp, delivery,
destinations) and PostgreSQL (ledger). A record's offset is stored only when everything it caused
(result, retry or dead letter) is acknowledged by Kafka; librdkafka commits stored offsets in the
background.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from functools import partial
from typing import Any, TypeVar

from postroom.errors import ConfigError
from postroom.kafka import Record, readable_records
from postroom.metrics import Metrics
from postroom.settings import Settings
from postroom.topics import tier_of_retry_topic
from schemas.codec import DeliveryStatus, EmailRequested, SchemaById, SchemaUnavailableError
from schemas.registry import framing_for, reader_for
from sender.admission import Admission, Admitted, admit
from sender.claims import busy_wait_s, needs_renewal, send_deadline_s
from sender.consumer import SenderConsumer
from sender.delivery import Delivery, waits_for_configuration
from sender.destinations import DestinationGate
from sender.errors import LedgerUnavailableError, PoisonRecordError
from sender.ledger import Claim, ClaimResult, Ledger
from sender.outcome import SmtpReply, Verdict, classify_reply
from sender.producer import AcknowledgedProducer
from sender.publishing import OutcomePublisher, origin_of
from sender.retry import Action, RetryPolicy, due_in_s, lateness_s
from sender.routing import (
    Routing,
    already_sent,
    outcome_line,
    route,
)
from sender.smtp import SmtpConfig, SmtpPool, SmtpSlot
from sender.throttle import DestinationBy, ThrottleLimits, destination_of, is_throttling
from sender.writers import WriterSchemas

log = logging.getLogger(__name__)

FETCH_MAX = 500
IDLE_WAIT_S = 0.02
PRIORITY_EVERY_S = 0.1
LEDGER_RETRY_S = 2.0
SHUTDOWN_GRACE_S = 30.0
# A record whose writer schema the registry cannot give now waits, its partition paused, this
# long at first, twice as long each time it fails again, up to the most.
REGISTRY_RETRY_FIRST_S = 1.0
REGISTRY_RETRY_MOST_S = 30.0
IN_FLIGHT_PER_CONNECTION = 4  # records read ahead per SMTP connection
WAITING_PER_IN_FLIGHT = 4     # records waiting for their destination, per in-flight record
# Sends claimed and waiting for their destination's turn, per send the destination may run at
# once: enough that the next send's claim is ready when a send ends, few enough that a sender
# stopped or cut off holds few claims that another sender must wait out.
QUEUED_PER_SEND = 1

T = TypeVar("T")


@dataclasses.dataclass(frozen=True, slots=True)
class _Attempt:
    """One send: the reply, the Message-ID, when the reply was read, and for a 250 its ledger
    mark, started as the reply was read."""

    reply: SmtpReply
    message_id: str
    read_at: float
    mark: asyncio.Future[float] | None


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def event_loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """The loop the sender runs on (POSTROOM_EVENT_LOOP): uvloop's, asyncio's, or for ``auto``
    uvloop's when it is installed. ConfigError for ``uvloop`` when it is not."""
    if choice != "asyncio":
        try:
            import uvloop
        except ImportError:
            if choice == "uvloop":
                raise ConfigError("POSTROOM_EVENT_LOOP", "uvloop is not installed") from None
        else:
            log.info("sender runs on uvloop")
            return uvloop.new_event_loop
    log.info("sender runs on asyncio's event loop")
    return asyncio.new_event_loop


class Sender:
    """One member of the sender group. ``await run()`` until ``stop()``."""

    def __init__(self, settings: Settings, *, ledger: Ledger, metrics: Metrics | None = None) -> None:
        self._settings = settings
        self._writers: WriterSchemas | None = None  # from the registry, when run() starts
        self._ledger = ledger
        self.metrics = metrics or Metrics()
        self._pool = SmtpPool(SmtpConfig.from_settings(settings))
        self._policy = RetryPolicy(settings.retry_delays_s)
        self._delivery = Delivery(settings.mail_from, settings.attachments_root,
                                  send_deadline_s(settings), settings.size_limits())
        self._admission = Admission.for_tiers(settings.size_limits(), settings.retry_delays_s)
        self._max_in_flight = settings.smtp_concurrency * IN_FLIGHT_PER_CONNECTION
        self._consumer = SenderConsumer(settings, self.metrics)
        self._producer = AcknowledgedProducer(settings, self.metrics)
        self._publisher = OutcomePublisher(settings.topic_prefix, self._producer, self.metrics)
        self._gate = DestinationGate(ThrottleLimits(
            settings.destination_concurrency, settings.destination_rate_per_s,
            settings.throttle_pause_s), queued_per_send=QUEUED_PER_SEND)
        self._destination_by = DestinationBy(settings.destination_by)
        self._smarthost = f"{settings.smtp_host}:{settings.smtp_port}"
        self._tasks: set[asyncio.Task[None]] = set()
        self._a_task_finished = asyncio.Event()  # set by every finish; the loop waits on it
        self._stopping = asyncio.Event()
        self._registry_wait_s = REGISTRY_RETRY_FIRST_S
        self._registry_down_since: float | None = None
        self._registry_held: set[tuple[str, int]] = set()  # partitions waiting for it

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        """Consume and deliver until stop(); then finish in-flight work, commit and leave."""
        lookup = reader_for(self._settings, self._consumer.topics)
        self._writers = WriterSchemas(lookup) if lookup is not None else None
        self._publisher.framing = framing = framing_for(self._settings)
        log.info("sender writes %s", "the Confluent wire format" if framing.uses_registry
                 else "schemaless Avro")
        self._consumer.start()
        self._producer.start()
        log.info("sender %s consuming %s as group %s (concurrency %d, tiers %s)",
                 self._ledger.owner, ", ".join(self._consumer.topics), self._settings.sender_group,
                 self._settings.smtp_concurrency, list(self._settings.retry_delays_s))
        loop = asyncio.get_running_loop()
        last_priority = 0.0
        try:
            while not self._stopping.is_set():
                self._producer.poll()
                now = utcnow()
                self._consumer.resume_due(now)
                if self._consumer.unplanned or loop.time() - last_priority >= PRIORITY_EVERY_S:
                    last_priority = loop.time()
                    await self._consumer.apply_priority()
                # Sends waiting for a throttled or busy destination do not hold up the others,
                # up to WAITING_PER_IN_FLIGHT times the in-flight limit.
                room = self._max_in_flight - len(self._tasks) + min(
                    self._gate.waiting, self._max_in_flight * WAITING_PER_IN_FLIGHT)
                if room <= 0:
                    # Not asyncio.wait(self._tasks): that adds and removes a callback on every
                    # in-flight task per call, a tenth of the sender's CPU at full load.
                    self._a_task_finished.clear()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(IDLE_WAIT_S):
                            await self._a_task_finished.wait()
                    continue
                messages = self._consumer.fetch(min(room, FETCH_MAX))
                if self._consumer.unplanned:
                    # Assigned during this fetch: no record goes out before its priority is
                    # planned; those of paused priorities are read again when let in.
                    last_priority = loop.time()
                    await self._consumer.apply_priority(messages)
                    messages = self._consumer.put_back_paused(messages)
                if not messages:
                    if not self._tasks:
                        self._consumer.commit_stored()
                    await asyncio.sleep(IDLE_WAIT_S)
                    continue
                records = list(readable_records(messages))
                schema_by_id = (await self._writers.for_batch(records)
                                if self._writers is not None else None)
                self._dispatch(records, now, schema_by_id)
        finally:
            await self._shutdown()

    async def _shutdown(self) -> None:
        log.info("sender stopping: finishing %d in-flight deliveries", len(self._tasks))
        deadline = asyncio.get_running_loop().time() + SHUTDOWN_GRACE_S
        while self._tasks and asyncio.get_running_loop().time() < deadline:
            self._producer.poll()  # the tasks wait on delivery reports
            await asyncio.wait(self._tasks, timeout=IDLE_WAIT_S)
        pending = set(self._tasks)
        if pending:
            for task in pending:
                task.cancel()
            log.warning("abandoned %d deliveries after %.0fs; they will be redelivered",
                        len(pending), SHUTDOWN_GRACE_S)
            await asyncio.gather(*pending, return_exceptions=True)
        self._producer.flush(30)
        self._consumer.close()
        await self._pool.close()
        await self._ledger.close()
        log.info("sender stopped: %s", self.summary())

    def summary(self) -> str:
        parts = [f"{labels[0][1]}={value:g}" for labels, value in
                 sorted(self.metrics.counters("outcomes_total").items())]
        return " ".join(parts) or "no deliveries"

    # -- per record ----------------------------------------------------------------------------

    def _dispatch(self, records: Sequence[Record], now: dt.datetime,
                  schema_by_id: SchemaById | None) -> None:
        held_back: set[tuple[str, int]] = set()
        waited = False
        for record in records:
            if record.tp in held_back:
                continue  # we rewound this partition; its later records come again
            tier = tier_of_retry_topic(self._settings.topic_prefix, record.topic)
            try:
                admitted = admit(record.value, record.headers, key=record.key, tier=tier,
                                 now=now, admission=self._admission, schema_by_id=schema_by_id)
            except SchemaUnavailableError as exc:
                self._wait_for_registry(record, exc, now)
                held_back.add(record.tp)
                waited = True
                continue
            except PoisonRecordError as exc:
                if record.tp in self._registry_held:
                    self._registry_answers(record.tp)  # it said what the record is
                self._spawn(self._publisher.poison(record, exc, now), record)
                continue
            except Exception as exc:  # no record may stop the sender
                # admit() raises nothing else (tests/unit/sender/test_record_boundary_properties);
                # were it to, the record is poison with the error's name, not a crash loop.
                log.exception("admitting %s[%d]@%d failed", record.topic, record.partition,
                              record.offset)
                poison = PoisonRecordError(f"unexpected {type(exc).__name__} while reading the "
                                           "record")
                self._spawn(self._publisher.poison(record, poison, now), record)
                continue
            if record.tp in self._registry_held:
                self._registry_answers(record.tp)
            event = admitted.event
            if tier is not None:
                if due_in_s(event.not_before, now) > 0:
                    self._consumer.hold_until_due(record, event.not_before or now)
                    held_back.add(record.tp)
                    continue
                if event.not_before is not None:
                    self.metrics.observe("retry_lateness_seconds", lateness_s(event.not_before, now))
            self._spawn(self._handle(record, admitted), record)
        if waited:
            self._registry_wait_s = min(self._registry_wait_s * 2, REGISTRY_RETRY_MOST_S)

    def _wait_for_registry(self, record: Record, exc: SchemaUnavailableError,
                           now: dt.datetime) -> None:
        """Hold ``record``'s partition at it until the registry may answer: an infrastructure
        fault, not poison. Logged once per outage; each hold is counted."""
        self.metrics.inc("registry_unavailable_total")
        if self._registry_down_since is None:
            self._registry_down_since = time.monotonic()
            log.warning("the schema registry cannot give a writer schema (%s); records that need "
                        "it wait, their partitions paused, and are read again every %.0f-%.0fs",
                        exc, REGISTRY_RETRY_FIRST_S, REGISTRY_RETRY_MOST_S)
        self._registry_held.add(record.tp)
        self._consumer.hold_until_due(record, now + dt.timedelta(seconds=self._registry_wait_s))

    def _registry_answers(self, tp: tuple[str, int]) -> None:
        self._registry_held.discard(tp)
        # A held partition revoked meanwhile waits elsewhere now.
        self._registry_held.intersection_update(self._consumer.assigned)
        if self._registry_held or self._registry_down_since is None:
            return
        log.info("the schema registry answers again after %.0fs; delivering what waited",
                 time.monotonic() - self._registry_down_since)
        self._registry_down_since = None
        self._registry_wait_s = REGISTRY_RETRY_FIRST_S

    def _spawn(self, coro: Coroutine[Any, Any, None], record: Record) -> None:
        self._consumer.take(record)
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(lambda t: self._finished(t, record))

    def _finished(self, task: asyncio.Task[None], record: Record) -> None:
        self._tasks.discard(task)
        self._a_task_finished.set()
        if task.cancelled():
            return  # abandoned at shutdown: not stored, so it is redelivered
        if task.exception() is not None:
            log.error("delivery task failed; the record will be redelivered",
                      exc_info=task.exception())
            return
        self._consumer.finished(record.tp, record.offset)

    async def _handle(self, record: Record, admitted: Admitted) -> None:
        """Claim, send and record one event; then publish where its outcome routes it."""
        event = admitted.event
        routing = await self._claim_and_send(record, admitted)
        if routing is None:
            return
        key = event.idempotency_key
        if routing.forward is None:
            await self._publisher.result(key, routing.result)  # no gather: it is a task per call
        else:
            await asyncio.gather(self._publisher.result(key, routing.result),
                                 self._publisher.forward(record, event, routing.forward, utcnow()))
        if routing.status is not DeliveryStatus.SENT:
            # Given up only now that its outcome is out: a copy of this record read again (we die
            # before its offset is committed, or its partition moves) finds the attempt done.
            started = time.monotonic()
            # An attempt that waited (forwarded with its number kept) was not made: its copies
            # must find it not done, or the next read of the wait would be taken for a repeat.
            waited = (routing.status is DeliveryStatus.RETRYING and routing.forward is not None
                      and routing.forward.event.attempt == event.attempt)
            await self._ledger_call("release", partial(self._ledger.release, key,
                                                       None if waited else event.attempt))
            self.metrics.observe("ledger_mark_seconds", time.monotonic() - started,
                                 operation="release")
        self.metrics.inc("outcomes_total", status=routing.status.value)

    async def _claim_and_send(self, record: Record, admitted: Admitted) -> Routing | None:
        """Send ``event`` once its destination lets it and its ledger claim is ours, and route
        the outcome; None when a server accepted its key before (its result is published here,
        and nothing is sent again). A throttling reply defers the send without counting it as
        an attempt, until POSTROOM_THROTTLE_MAX_WAIT has passed."""
        event = admitted.event
        key = event.idempotency_key
        destination = destination_of(event.recipient, self._destination_by, self._smarthost)
        deferred_since: float | None = None
        waits = 0
        while True:
            may_defer = (deferred_since is None
                         or time.monotonic() - deferred_since < self._settings.throttle_max_wait_s)
            claim, claimed_at = await self._claim_in_line(destination, key, event.attempt)
            sent: _Attempt | None = None
            throttled = lost = False
            if claim.claim is Claim.MINE:
                try:
                    async with self._pool.slot() as slot:
                        lost = not await self._still_ours(key, claim, claimed_at)
                        if not lost:
                            sent = await self._send(event, slot)
                            throttled = may_defer and is_throttling(sent.reply)
                finally:
                    await self._gate.release(destination, throttled=throttled)
            if lost:
                log.warning("key=%s is no longer ours after it waited for its turn (another "
                            "sender took it, or a server accepted it); asking the ledger again",
                            key)
                continue
            if sent is not None:
                # The slot and the destination are free again: the next send need not wait
                # for this one's ledger write.
                routing = await self._record(record, admitted, sent, throttled=throttled)
                if routing is not None:
                    return routing
                deferred_since = deferred_since or time.monotonic()
                self.metrics.inc("throttled_total")
                self.metrics.set("destinations_paused", self._gate.paused())
                log.info("key=%s domain=%s attempt=%d throttled by the server: deferred, not "
                         "counted as an attempt", key, event.recipient.rpartition("@")[2],
                         event.attempt)
                continue
            if claim.claim is Claim.SENT:
                self.metrics.inc("duplicates_suppressed_total")
                log.info("key=%s already accepted by the server; not sending again", key)
                await self._publisher.result(key, already_sent(event, claim.message_id, utcnow()))
                return None
            if claim.claim is Claim.DONE:
                # Its result and its retry or dead letter went out with the attempt.
                self.metrics.inc("repeated_attempts_suppressed_total")
                log.info("key=%s attempt=%d already made and its outcome published; not "
                         "making it again", key, event.attempt)
                return None
            wait_s = busy_wait_s(claim.lease_until, utcnow())
            log.log(logging.INFO if waits == 0 else logging.DEBUG,
                    "key=%s is being sent elsewhere (lease until %s); asking again in %.1fs",
                    key, claim.lease_until, wait_s)
            waits += 1
            await asyncio.sleep(wait_s)

    async def _claim_in_line(self, destination: str, key: str,
                             attempt: int) -> tuple[ClaimResult, float]:
        """Claim ``key`` while it waits in its destination's line, so the claim's round trip
        overlaps the sends before it; the claim and when it was taken. When it is ours, the
        destination has let its send start (release it after the send)."""
        await self._gate.queue(destination)
        try:
            claim = await self._ledger_call("claim", partial(self._ledger.claim, key, attempt))
            claimed_at = time.monotonic()
            if claim.claim is Claim.MINE:
                await self._gate.acquire(destination)
        finally:
            self._gate.unqueue(destination)
        return claim, claimed_at

    async def _still_ours(self, key: str, claim: ClaimResult, claimed_at: float) -> bool:
        """Renew a claim that waited too long for its turn, or that an ended ledger session took;
        False when another sender has it now. Called as the send starts."""
        if not needs_renewal(time.monotonic() - claimed_at, claim.session == self._ledger.session):
            return True
        kept = await self._ledger_call("renew", partial(self._ledger.renew, key))
        self.metrics.inc("claims_renewed_total", result="kept" if kept else "lost")
        return kept

    async def _send(self, event: EmailRequested, slot: SmtpSlot) -> _Attempt:
        key = event.idempotency_key
        started = time.monotonic()
        marks: list[tuple[asyncio.Future[float], float]] = []

        def accepted(message_id: str) -> None:
            # The duplicate window opens as the 250 is read: its mark leaves from here, before
            # the send's coroutine resumes, the slot and the destination are given back, or the
            # loop turns.
            marks.append((self._ledger.start_mark(key, message_id), time.monotonic()))

        reply, message_id = await self._delivery.send(event, slot, utcnow(), accepted)
        mark, read_at = marks[0] if marks else (None, time.monotonic())
        self.metrics.observe("smtp_reply_seconds", read_at - started, stage=reply.stage.value)
        return _Attempt(reply, message_id, read_at, mark)

    async def _record(self, record: Record, admitted: Admitted, attempt: _Attempt, *,
                      throttled: bool) -> Routing | None:
        """Route the send's outcome, a 250 marked sent in the ledger first; None for a throttling
        reply whose send is deferred (the ledger claim is released, nothing is published). A
        failed attempt keeps its claim until its outcome is published (see _handle)."""
        reply, message_id = attempt.reply, attempt.message_id
        event = admitted.event
        key = event.idempotency_key
        if throttled:
            await self._ledger_call("release", partial(self._ledger.release, key))
            return None
        outcome = classify_reply(reply)
        self.metrics.inc("attempts_total", verdict=outcome.verdict.value)
        if outcome.server_fault and outcome.verdict is not Verdict.SENT:
            self.metrics.inc("server_faults_total", stage=reply.stage.value)
        now = utcnow()
        # A redriven email has a fresh budget: its retry tiers count from the redrive.
        in_round = event.attempt - admitted.attempt_base
        if waits_for_configuration(reply):
            self.metrics.inc("attachments_waiting_total")
            decision = self._policy.wait(in_round, now)
        else:
            decision = self._policy.decide(outcome, in_round, now)
        if decision.action is Action.DONE_SENT:
            # The duplicate window, from the reply read to the mark's commit: a crash before the
            # mark commits sends the key again.
            committed_at = await self._ledger_call(
                "mark sent", partial(self._ledger.mark_sent, key, message_id), attempt.mark)
            window_s = committed_at - attempt.read_at  # the mark started with the read
            self.metrics.observe("sent_mark_window_seconds", window_s)
            self.metrics.observe("ledger_mark_seconds", window_s, operation="sent")
        log.log(*outcome_line(event, decision, outcome.reason))
        return route(self._settings.topic_prefix, origin_of(record), event, outcome, decision,
                     message_id, now)

    async def _ledger_call(self, what: str, call: Callable[[], Awaitable[T]],
                           started: Awaitable[T] | None = None) -> T:
        """``call()`` until the ledger answers (a shutdown cancels the wait); ``started``: the
        first such call, already under way."""
        while True:
            try:
                if started is not None:
                    first, started = started, None
                    return await first
                return await call()
            except LedgerUnavailableError as exc:
                log.warning("ledger %s failed (%s); retrying in %.0fs", what, exc, LEDGER_RETRY_S)
                await asyncio.sleep(LEDGER_RETRY_S)
