"""Writes what the sender's deliveries produce to Kafka: results, retries and dead letters, in the
platform's framing (schemaless, or the Confluent wire format with a registry); each write waits
for the broker's acknowledgement."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence

from postroom.kafka import Record
from postroom.metrics import POISON_TOTAL, POISON_UNKEYED_TOTAL, Metrics
from postroom.schemas.codec import EmailRequested, EmailResult
from postroom.schemas.framing import Framing
from postroom.sender.errors import PoisonRecordError, RecordTooLargeError
from postroom.sender.ports import TraceHeaders
from postroom.sender.producer import AcknowledgedProducer
from postroom.sender.routing import (
    Forward,
    Origin,
    dead_letter_headers,
    poison_result,
    too_large_to_forward,
)
from postroom.topics import dead_letter_topic, results_topic
from postroom.tracing import from_headers

log = logging.getLogger(__name__)


def origin_of(record: Record) -> Origin:
    return Origin(record.topic, record.partition, record.offset, tuple(record.headers))


class OutcomePublisher:
    """The sender's writes. ``framing`` is set before the first (it may need the registry)."""

    def __init__(self, prefix: str, producer: AcknowledgedProducer, metrics: Metrics) -> None:
        self._prefix = prefix
        self._producer = producer
        self._metrics = metrics
        self.framing: Framing | None = None

    async def publish(self, topic: str, key: str, event: EmailRequested | EmailResult,
                      extra_headers: Sequence[tuple[str, str | bytes | None]] = ()) -> None:
        if self.framing is None:
            raise RuntimeError("the publisher has no framing yet")
        value, schema_headers = self.framing.frame(topic, event)
        await self._producer.produce(topic, key, value, [*schema_headers, *extra_headers])

    async def result(self, key: str, result: EmailResult, trace: TraceHeaders = ()) -> None:
        await self.publish(results_topic(self._prefix), key, result, trace)

    async def forward(self, origin: Origin, event: EmailRequested, forward: Forward,
                      now: dt.datetime, trace: TraceHeaders = ()) -> None:
        """Publish the retry or dead letter; one Kafka refuses as too large ends the email as a
        recorded permanent failure (a value-less dead letter saying why), never a stuck
        partition."""
        key = event.idempotency_key
        try:
            await self.publish(forward.topic, key, forward.event, (*forward.headers, *trace))
        except RecordTooLargeError as exc:
            result = too_large_to_forward(event, forward.topic, now)
            log.error("key=%s: %s; failed permanently", key, exc)  # noqa: TRY400 - expected
            await self._producer.produce(dead_letter_topic(self._prefix), key, None,
                                         [*dead_letter_headers(origin, "permanent",
                                                               result.error or ""), *trace])
            await self.result(key, result, trace)

    async def poison(self, record: Record, poison: PoisonRecordError, now: dt.datetime) -> None:
        """Dead-letter a record no enqueue or sender of ours could have written, as it was read
        (or without its value when it is too large to copy), and end its outbox row with a
        ``failed`` result; a record with no readable key is only dead-lettered, and counted."""
        self._metrics.inc(POISON_TOTAL)
        result = poison_result(poison, now)
        log.error("poison record %s[%d]@%d dead-lettered%s: %s", record.topic, record.partition,
                  record.offset, "" if result is None else f", key={result.idempotency_key} failed",
                  poison.reason)
        why = dead_letter_headers(origin_of(record), "poison", poison.reason)
        # The record's own context, if it carries a valid one: the email's trace ends here.
        context = from_headers(record.headers)
        trace = () if context is None else context.headers()
        topic = dead_letter_topic(self._prefix)
        copied = poison.copy_record
        if copied:
            try:
                await self._producer.produce(topic, record.key, record.value,
                                             [*record.headers, *why])
            except RecordTooLargeError:
                copied = False
        if not copied:
            # Its value and headers stay in the source topic, where the dead letter points.
            await self._producer.produce(topic, record.key, None, [*why, *trace])
        if result is None:
            self._metrics.inc(POISON_UNKEYED_TOTAL)
            return
        await self.result(result.idempotency_key, result, trace)
