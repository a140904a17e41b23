"""The sender: a consumer-group member that delivers email events over SMTP and routes each outcome.

Wiring only. What becomes of a record read is sender/intake.py's; what happens to one event (claim,
send, classify, record, route, release) is sender/attempt.py's, over sender/ports.py's protocols.
The decisions are pure modules (outcome, retry, routing, claims, offsets, priority, admission,
throttle); the adapters talk to Kafka (consumer, producer, publishing), SMTP (transport, smtp,
delivery, destinations) and PostgreSQL (ledger). A record's offset is stored only when everything
it caused (result, retry or dead letter) is acknowledged by Kafka; librdkafka commits stored
offsets in the background.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TypeVar

from postroom.errors import ConfigError, KafkaFatalError
from postroom.kafka import Record, raise_if_fatal, readable_records
from postroom.metrics import Metrics
from postroom.schemas.registry import framing_for, reader_for
from postroom.sender.admission import Admission
from postroom.sender.attempt import AttemptRules, Attempts
from postroom.sender.claims import dead_letter_key
from postroom.sender.consumer import SenderConsumer
from postroom.sender.delivery import Delivery
from postroom.sender.destinations import DestinationGate
from postroom.sender.errors import PoisonRecordError
from postroom.sender.intake import Intake, Task
from postroom.sender.ledger import Ledger
from postroom.sender.ports import Clock, SystemClock
from postroom.sender.producer import AcknowledgedProducer
from postroom.sender.publishing import OutcomePublisher
from postroom.sender.retry import RetryPolicy
from postroom.sender.smtp import SmtpPool
from postroom.sender.smtp_config import SmtpConfig
from postroom.sender.throttle import DestinationBy, ThrottleLimits, destination_of
from postroom.sender.transport import SmtpTransport
from postroom.sender.writers import WriterSchemas
from postroom.settings import Settings
from postroom.tracing import OFF, Tracing

log = logging.getLogger(__name__)

FETCH_MAX = 500
IDLE_WAIT_S = 0.02
PRIORITY_EVERY_S = 0.1
SHUTDOWN_GRACE_S = 30.0
IN_FLIGHT_PER_CONNECTION = 4  # records read ahead per SMTP connection
WAITING_PER_IN_FLIGHT = 4     # records waiting for their destination, per in-flight record
# Sends claimed and waiting for their destination's turn, per send the destination may run at
# once: enough that the next send's claim is ready when a send ends, few enough that a sender
# stopped or cut off holds few claims that another sender must wait out.
QUEUED_PER_SEND = 1


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


T = TypeVar("T")


async def serving(work: Awaitable[T], serve: Callable[[], None], every_s: float) -> T:
    """``await work``, calling ``serve`` (the producer's poll, which runs its acknowledgements)
    every ``every_s`` seconds meanwhile."""
    task = asyncio.ensure_future(work)
    while not task.done():
        serve()
        await asyncio.wait({task}, timeout=every_s)
    return task.result()


async def poison_once(attempts: Attempts, publisher: OutcomePublisher, record: Record,
                      poison: PoisonRecordError, now: dt.datetime) -> None:
    """Dead-letter a poison record and end its row, once per record (Attempts.dead_letter_once,
    keyed by the record's origin in the ledger): a copy read again after a rebalance or a
    restart before its commit is not dead-lettered again."""
    await attempts.dead_letter_once(
        dead_letter_key(record.topic, record.partition, record.offset, record.timestamp_ms),
        partial(publisher.poison, record, poison, now))


class Sender:
    """One member of the sender group. ``await run()`` until ``stop()``; build it with
    :meth:`from_settings`."""

    def __init__(self, settings: Settings, *, ledger: Ledger, metrics: Metrics,
                 consumer: SenderConsumer, producer: AcknowledgedProducer,
                 publisher: OutcomePublisher, transport: SmtpTransport, gate: DestinationGate,
                 clock: Clock, tracing: Tracing = OFF) -> None:
        self._settings = settings
        self._ledger = ledger
        self.metrics = metrics
        self._consumer = consumer
        self._producer = producer
        self._publisher = publisher
        self._transport = transport
        self._gate = gate
        self._clock = clock
        self._max_in_flight = settings.smtp_concurrency * IN_FLIGHT_PER_CONNECTION
        destination = partial(destination_of, by=DestinationBy(settings.destination_by),
                              smarthost=f"{settings.smtp_host}:{settings.smtp_port}")
        rules = AttemptRules(settings.topic_prefix, RetryPolicy(settings.retry_delays_s),
                             destination, settings.throttle_max_wait_s, settings.sender_group)
        attempts = Attempts(rules, ledger=ledger, transport=transport, line=gate,
                            outcomes=publisher, metrics=metrics, clock=clock, tracing=tracing)
        self._intake = Intake(
            settings.topic_prefix,
            Admission.for_tiers(settings.size_limits(), settings.retry_delays_s), consumer,
            metrics, start=self._spawn, deliver=attempts.deliver,
            poison=partial(poison_once, attempts, publisher))
        self._tasks: set[asyncio.Task[None]] = set()
        self._a_task_finished = asyncio.Event()  # set by every finish; the loop waits on it
        self._stopping = asyncio.Event()

    @classmethod
    def from_settings(cls, settings: Settings, *, ledger: Ledger,
                      metrics: Metrics | None = None, tracing: Tracing = OFF) -> Sender:
        """The sender the settings describe, its adapters built (none connects before run())."""
        metrics = metrics or Metrics()
        producer = AcknowledgedProducer(settings, metrics)
        delivery = Delivery.from_settings(settings)
        gate = DestinationGate(ThrottleLimits(
            settings.destination_concurrency, settings.destination_rate_per_s,
            settings.throttle_pause_s), queued_per_send=QUEUED_PER_SEND)
        return cls(settings, ledger=ledger, metrics=metrics,
                   consumer=SenderConsumer(settings, metrics), producer=producer,
                   publisher=OutcomePublisher(settings.topic_prefix, producer, metrics),
                   transport=SmtpTransport(SmtpPool(SmtpConfig.from_settings(settings)), delivery),
                   gate=gate, clock=SystemClock(), tracing=tracing)

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        """Consume and deliver until stop(); then finish in-flight work, commit and leave."""
        lookup = reader_for(self._settings, self._consumer.topics)
        writers = WriterSchemas(lookup) if lookup is not None else None
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
                # A client in librdkafka's fatal state never works again: the sender exits
                # (its in-flight sends finish first) and its supervisor starts it afresh.
                raise_if_fatal()
                now = self._clock.utcnow()
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
                # A registry slow to answer for a new id (its timeout and retries: tens of
                # seconds while it is down) must not hold up the acknowledgements the sends in
                # flight wait on: they are served while the lookup runs.
                schema_by_id = (await serving(writers.for_batch(records), self._producer.poll,
                                              IDLE_WAIT_S)
                                if writers is not None else None)
                self._intake.dispatch(records, now, schema_by_id)
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
        await self._transport.close()
        await self._ledger.close()
        log.info("sender stopped: %s", self.summary())

    def summary(self) -> str:
        parts = [f"{labels[0][1]}={value:g}" for labels, value in
                 sorted(self.metrics.counters("outcomes_total").items())]
        return " ".join(parts) or "no deliveries"

    def _spawn(self, coro: Task, record: Record) -> None:
        self._consumer.take(record)
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(lambda t: self._finished(t, record))

    def _finished(self, task: asyncio.Task[None], record: Record) -> None:
        self._tasks.discard(task)
        self._a_task_finished.set()
        if task.cancelled():
            return  # abandoned at shutdown: not stored, so it is redelivered
        error = task.exception()
        if isinstance(error, KafkaFatalError) or isinstance(
                getattr(error, "__cause__", None), KafkaFatalError):
            return  # the sender exits on it, saying so once; the record is read again
        if error is not None:
            log.error("delivery task failed; the record will be redelivered", exc_info=error)
            return
        self._consumer.finished(record.tp, record.offset)
