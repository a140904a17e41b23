"""The recorder: applies delivery results from the results topic to the outbox rows, and the
reports ``postroom bounces`` publishes there (bounced, delayed, complained) to the rows and the
suppression list; it is the one writer of outbox rows after the relay.

Each batch is applied in one transaction and its offsets are committed after it; a crash in
between replays the batch, which changes nothing because RECORD_RESULT only moves a row forward
and a report changes a row, or suppresses an address, only the first time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable

import sqlalchemy as sa

from postroom import kafka
from postroom.errors import first_line
from postroom.kafka import Consumer, KafkaException, Message, Record, TopicPartition, readable_records
from postroom.metrics import (
    RECORDED_TOTAL,
    RECORDER_REFUSED_TOTAL,
    RECORDER_UNREADABLE_TOTAL,
    RECORDER_UNRECORDABLE_TOTAL,
    SUPPRESSED_ADDRESSES_TOTAL,
    UNDELIVERABLE_TOTAL,
    Metrics,
)
from postroom.relay.results import (
    REPORT_STATUSES,
    ReportPolicy,
    ReportsApplied,
    apply_each,
    apply_reports,
    apply_results,
    apply_soft_bounces,
    refuses_the_data,
    result_problem,
    storable_result,
)
from postroom.schemas.codec import DeliveryStatus, EmailResult
from postroom.schemas.decoding import decode
from postroom.schemas.errors import SchemaError, SchemaUnavailableError
from postroom.schemas.framing import SchemaById
from postroom.schemas.registry import reader_for
from postroom.settings import Settings
from postroom.topics import results_topic
from postroom.tracing import OFF, Span, Tracing, from_headers, kafka_attributes

log = logging.getLogger(__name__)

BATCH_MAX = 1000
# A batch starts with a read of up to QUIET_S (the wait when nothing comes), gathers what arrives
# for up to BATCH_WAIT_S in reads of up to GAP_S each, and is applied as soon as one read finds
# nothing new: a busy topic still gets batches of hundreds, and the last results of a burst are
# recorded within GAP_S, not at the end of a fixed wait (a consume() returns only when its batch
# is full or its timeout is over). With reads of QUIET_S after the first, a trickle of 190
# results a second (20 connections to a server that takes 100 ms) brought a few records to every
# read, so each batch ran its whole BATCH_WAIT_S and the burst's last result waited 75-90 ms.
BATCH_WAIT_S = 0.5
QUIET_S = 0.05
GAP_S = 0.01
RETRY_BACKOFF_S = 2.0


def gather(consume: Callable[[int, float], list[Message]],
           clock: Callable[[], float] = time.monotonic) -> list[Message]:
    """One batch: up to BATCH_MAX records, read until a read of GAP_S brings none or
    BATCH_WAIT_S has passed since the first; [] when nothing came within QUIET_S."""
    messages = consume(BATCH_MAX, QUIET_S)
    if not messages:
        return []
    deadline = clock() + BATCH_WAIT_S
    while len(messages) < BATCH_MAX and clock() < deadline:
        more = consume(BATCH_MAX - len(messages), GAP_S)
        if not more:
            break
        messages += more
    return messages


@dataclasses.dataclass
class RecorderStats:
    applied: int = 0
    ignored: int = 0
    unreadable: int = 0
    refused: int = 0
    unrecordable: int = 0


class Recorder:
    """Consumes ``<prefix>email.results`` as group POSTROOM_RECORDER_GROUP until stop()."""

    def __init__(self, settings: Settings, engine: sa.Engine, *, metrics: Metrics | None = None,
                 consumer_factory: Callable[[], Consumer] | None = None,
                 schema_by_id: SchemaById | None = None, tracing: Tracing = OFF) -> None:
        self._settings = settings
        self._tracing = tracing
        # None: the registry's lookup when one is set (see run()), else none.
        self._schema_by_id = schema_by_id
        self._engine = engine
        self.metrics = metrics or Metrics()
        self._consumer_factory = consumer_factory or (lambda: kafka.make_consumer(
            settings, settings.recorder_group, **{"enable.auto.commit": False}))
        self._stop = threading.Event()
        self.stats = RecorderStats()
        self._max_attempt = len(settings.retry_delays_s) + 1
        self._policy = ReportPolicy.from_settings(settings)

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        topic = results_topic(self._settings.topic_prefix)
        if self._schema_by_id is None:
            self._schema_by_id = reader_for(self._settings, [topic])
        consumer = self._consumer_factory()
        consumer.subscribe([topic])
        log.info("recorder consuming %s as group %s", topic, self._settings.recorder_group)
        try:
            while not self._stop.is_set():
                # A consumer in librdkafka's fatal state (fenced as a static member) never
                # works again: the recorder exits and its supervisor starts it afresh. The
                # consumer raises it as it reads; a result read with it is read again.
                kafka.raise_if_fatal()
                messages = gather(lambda n, timeout_s: consumer.consume(num_messages=n,
                                                                        timeout=timeout_s))
                if messages:
                    self._apply_until_done(consumer, messages)
        finally:
            consumer.close()
            log.info("recorder stopped: applied=%d ignored=%d unreadable=%d refused=%d "
                     "unrecordable=%d", self.stats.applied, self.stats.ignored,
                     self.stats.unreadable, self.stats.refused, self.stats.unrecordable)

    def _decode(self, record: Record) -> EmailResult | None:
        """The result ``record`` holds; None when it is unreadable or refused (counted and
        logged). While the registry cannot give its writer schema it asks again; _STOPPED when
        stop() came meanwhile."""
        while True:
            try:
                result = decode(EmailResult, record.value, record.headers,
                                schema_by_id=self._schema_by_id)
                break
            except SchemaUnavailableError as exc:
                if self._stop.is_set():
                    raise _StoppedError from None
                log.warning("result %s[%d]@%d waits for the schema registry (%s); asking again "
                            "in %.0fs", record.topic, record.partition, record.offset,
                            first_line(exc), RETRY_BACKOFF_S)
                self._stop.wait(RETRY_BACKOFF_S)
            except SchemaError as exc:
                # A result we cannot read cannot be applied; skip it loudly rather than stall.
                self.stats.unreadable += 1
                self.metrics.inc(RECORDER_UNREADABLE_TOTAL)
                log.error("unreadable result %s[%d]@%d skipped: %s", record.topic,  # noqa: TRY400
                          record.partition, record.offset, _short(str(exc)))
                return None
        problem = result_problem(result)
        if problem is not None:
            self.stats.refused += 1
            self.metrics.inc(RECORDER_REFUSED_TOTAL)
            log.error("result %s[%d]@%d refused: %s", record.topic, record.partition,
                      record.offset, problem)
            return None
        return storable_result(result)

    def _apply_until_done(self, consumer: Consumer, messages: list[Message]) -> None:
        with contextlib.ExitStack() as spans:
            opened: list[Span] = []
            if not self._apply_batch(consumer, messages, spans, opened):
                for span in opened:
                    span.error("not recorded: the recorder stopped; the batch is read again")

    def _span(self, spans: contextlib.ExitStack, record: Record, result: EmailResult) -> Span:
        """The recording of one result, a span under the record's context, ended with its
        batch's transaction."""
        return spans.enter_context(self._tracing.span(
            f"process {record.topic}", from_headers(record.headers), kind="consumer",
            attributes=lambda: {
                **kafka_attributes("process", record.topic, partition=record.partition,
                                   key=result.idempotency_key, offset=record.offset,
                                   group=self._settings.recorder_group),
                "postroom.outbox_id": result.outbox_id,
                "postroom.attempt": result.attempt,
                "postroom.status": result.status.value}))

    def _apply_batch(self, consumer: Consumer, messages: list[Message],
                     spans: contextlib.ExitStack, opened: list[Span]) -> bool:
        """Record a batch; False when the recorder stopped first (it stays uncommitted)."""
        results: list[EmailResult] = []
        try:
            for record in readable_records(messages):
                result = self._decode(record)
                if result is not None:
                    results.append(result)
                    if self._tracing.enabled:
                        opened.append(self._span(spans, record, result))
        except _StoppedError:
            return False  # uncommitted: the batch comes again after restart
        outcomes = [r for r in results if r.status not in REPORT_STATUSES]
        reports = [r for r in results if r.status in REPORT_STATUSES]
        while True:
            refused: list[tuple[EmailResult, str]] = []
            applied = ReportsApplied()
            try:
                try:
                    with self._engine.begin() as conn:
                        changed = apply_results(conn, outcomes, self._max_attempt)
                        apply_reports(conn, reports, self._policy, applied)
                        apply_soft_bounces(conn, outcomes, self._policy, applied)
                except sa.exc.DBAPIError as exc:
                    if not refuses_the_data(exc):
                        raise
                    # What one result held, that no check above foresaw: the others are
                    # recorded, that one counted and logged.
                    log.warning("recording %d results failed (%s); recording them one by one",
                                len(results), first_line(exc))
                    applied = ReportsApplied()
                    with self._engine.begin() as conn:
                        changed, refused = apply_each(conn, outcomes, self._max_attempt)
                        refused += apply_reports(conn, reports, self._policy, applied, each=True)
                        apply_soft_bounces(conn, outcomes, self._policy, applied)
                break
            except sa.exc.DBAPIError as exc:
                # The database's fault, not a result's: the batch waits, uncommitted.
                if self._stop.is_set():
                    return False  # uncommitted: the batch comes again after restart
                log.warning("recording %d results failed (%s); retrying in %.0fs", len(results),
                            first_line(exc), RETRY_BACKOFF_S)
                self._stop.wait(RETRY_BACKOFF_S)
        for result, why in refused:
            self.stats.unrecordable += 1
            self.metrics.inc(RECORDER_UNRECORDABLE_TOTAL)
            log.error("result key=%.200r attempt=%d status=%s not recorded: the database "
                      "refused it (%s)", result.idempotency_key, result.attempt,
                      result.status.value, why)
        if refused:
            unrecorded = {id(result) for result, _ in refused}
            results = [result for result in results if id(result) not in unrecorded]
        self.stats.applied += changed + applied.changed
        self.stats.ignored += (sum(r.status not in REPORT_STATUSES for r in results) - changed
                               + applied.ignored)
        for result in results:
            self.metrics.inc(RECORDED_TOTAL, status=result.status.value)
            if result.status in (DeliveryStatus.FAILED, DeliveryStatus.DEAD,
                                 DeliveryStatus.BOUNCED):
                self.metrics.inc(UNDELIVERABLE_TOTAL, status=result.status.value)
        for source, count in applied.suppressed.items():
            self.metrics.inc(SUPPRESSED_ADDRESSES_TOTAL, count, source=source)
            log.info("suppressed %d address(es) (%s)", count, source)
        positions: dict[tuple[str, int], int] = {}
        for msg in messages:
            topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
            if topic is not None and partition is not None and offset is not None:
                positions[(topic, partition)] = max(positions.get((topic, partition), 0), offset + 1)
        try:
            consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in positions.items()],
                            asynchronous=False)
        except KafkaException as exc:
            # Harmless: the batch is replayed and changes nothing the second time.
            log.warning("offset commit failed (%s); the batch will be replayed", exc)
        return True


class _StoppedError(Exception):
    """stop() came while a result waited for the schema registry."""


def _short(text: str, max_chars: int = 500) -> str:
    """A refusal's text for a log line: what a result held may be long."""
    return text if len(text) <= max_chars else text[:max_chars - 3] + "..."
