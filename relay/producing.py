"""Produces one claimed batch to the priority topics: each row's record (its event, framing,
headers and ``send`` span), the producer's full local queue, and which rows the broker's delivery
reports leave acknowledged, too large or poison. The rounds around it are relay/publisher.py's.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import sqlalchemy as sa

from postroom.errors import KafkaClientError
from postroom.headers import ATTEMPT_BASE_HEADER, ROW_ID_HEADER
from postroom.kafka import KafkaError, KafkaException, Message, Producer, is_too_large
from postroom.metrics import RELAY_PUBLISH_DELAY_SECONDS, Metrics
from postroom.relay.errors import PoisonRowError
from postroom.relay.rounds import Sent
from postroom.relay.rows import POISON_PREFIX, event_value
from postroom.relay.rows import epoch_s as _epoch_s
from postroom.schemas.codec import EmailRequested, load_schema
from postroom.schemas.errors import SchemaError
from postroom.schemas.framing import Framing
from postroom.settings import PRODUCER_MESSAGE_TIMEOUT_MS, Settings
from postroom.topics import Priority, priority_topic
from postroom.tracing import Attributes, Span, Tracing, kafka_attributes, parse_traceparent

log = logging.getLogger(__name__)

FLUSH_SLICE_S = 1.0
TOO_LARGE_ERROR = ("the event is too large to publish (over POSTROOM_EVENT_MAX_BYTES or the "
                   "broker's message size limit)")


def _send_attributes(topic: str, key: str, outbox_id: int, attempt: int) -> Attributes:
    """A row's ``send`` span's attributes."""
    return {**kafka_attributes("send", topic, key=key), "postroom.outbox_id": outbox_id,
            "postroom.attempt": attempt}


def send_batch(rows: Sequence[sa.Row[Any]], producer: Producer, framing: Framing,
               settings: Settings, tracing: Tracing, metrics: Metrics) -> Sent:
    """Produce every row and wait for the broker. A row that cannot become an event
    (rows.event_value) is not produced: it is poison, marked failed with the reason. With
    tracing, each row's publish span ends with the batch's acknowledgements."""
    with contextlib.ExitStack() as spans:
        row_spans: dict[int, Span] = {}
        sent = _send_rows(rows, spans, row_spans, producer, framing, settings, tracing,
                          metrics)
        # A row whose span began and that was not published (refused, unacknowledged, or
        # left when the producer's queue filled) ends its span as an error.
        for ids, why in ((sent.released, "not acknowledged: published again in a later "
                          "round"), (sent.too_large, TOO_LARGE_ERROR)):
            for row_id in ids:
                if (span := row_spans.get(row_id)) is not None:
                    span.error(why)
        return sent


def _send_rows(rows: Sequence[sa.Row[Any]], spans: contextlib.ExitStack,
               row_spans: dict[int, Span], producer: Producer, framing: Framing,
               settings: Settings, tracing: Tracing, metrics: Metrics) -> Sent:
    failures: dict[bytes, KafkaError] = {}

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        # The relay's producer reports failures only (delivery.report.only.error): once
        # flush() is done, every other record is acknowledged. A producer that reports
        # successes too has them ignored here.
        if err is not None:
            failures[msg.key() or b""] = err

    topics = {p.value: priority_topic(settings.topic_prefix, p) for p in Priority}
    schema = load_schema(EmailRequested.SCHEMA_NAME)
    schema_headers = framing.headers(schema)
    # b"" without a registry: b"" + body is the body itself, no copy.
    prefixes = {priority: framing.prefix(topic) for priority, topic in topics.items()}
    fields = len(schema.field_names)
    if rows and rows[0]._fields[:fields] != schema.field_names:
        raise SchemaError(f"the claim returns {rows[0]._fields}, not the fields of "
                          f"{schema.name} {schema.field_names}")
    # The claim's trace context columns follow the event's fields (a claim of rows without
    # them, as tests build, has none).
    traced = bool(rows) and rows[0]._fields[fields:] == ("traceparent", "tracestate")
    # By position: a row's attribute by name costs ten times its item (~0.5 against 0.05 us).
    key_at, id_at, priority_at, created_at, attempt_at = (
        schema.field_names.index(name)
        for name in ("idempotency_key", "outbox_id", "priority", "created_at", "attempt"))
    produced = len(rows)
    too_large: list[int] = []
    poison: list[tuple[int, str]] = []
    max_bytes = settings.event_max_bytes
    for index, row in enumerate(rows):
        try:
            value = event_value(schema, row[:fields] if traced else row)
        except PoisonRowError as exc:
            poison.append((row[id_at], POISON_PREFIX + str(exc)))
            log.error("row_id=%d key=%.200r: poison, marked failed: %s", row[id_at],  # noqa: TRY400
                      row[key_at], exc)
            continue
        headers: list[tuple[str, str | bytes | None]] = [
            *schema_headers, (ROW_ID_HEADER, str(row[id_at]).encode())]
        if row[attempt_at] > 1:
            # A redriven row: its attempts so far, so the sender gives it a fresh budget.
            headers.append((ATTEMPT_BASE_HEADER, str(row[attempt_at] - 1).encode()))
        priority = row[priority_at]
        context = row[fields] if traced else None
        if context is not None or tracing.enabled:
            # A context written by SQL that does not parse is none: never poison.
            parent = None if context is None else parse_traceparent(context, row[fields + 1])
            if tracing.enabled:
                span = row_spans[row[id_at]] = spans.enter_context(tracing.span(
                    f"send {topics[priority]}", parent, kind="producer",
                    attributes=partial(_send_attributes, topics[priority], row[key_at],
                                       row[id_at], row[attempt_at])))
                headers.extend(span.headers())
            elif parent is not None:
                headers.extend(parent.headers())
        value = prefixes[priority] + value
        if len(value) > max_bytes:
            # Written before the cap or by hand: it can never be published, and retrying it
            # would stall the relay. It ends as a recorded permanent failure.
            too_large.append(row[id_at])
            log.error("row_id=%d: its event is %d bytes, over POSTROOM_EVENT_MAX_BYTES "
                      "(%d); marked failed", row[id_at], len(value), max_bytes)
            continue
        try:
            _produce(producer, topics[priority], row[key_at], value, headers, on_delivery)
        except BufferError:
            produced = index
            break
        except KafkaException as exc:
            if not is_too_large(exc):
                # The records produced before it are delivered or fail first: the failed round's
                # claims end with its connections, and nothing of it may still be on its way
                # when another round claims its rows.
                producer.flush(PRODUCER_MESSAGE_TIMEOUT_MS / 1000)
                raise KafkaClientError(f"producing row_id={row[id_at]} failed: {exc}",
                                       retriable=True) from exc
            too_large.append(row[id_at])
            # An expected refusal: its traceback would say nothing more.
            log.error("row_id=%d: the producer refused its event as too large "  # noqa: TRY400
                      "(%s); marked failed", row[id_at], exc)
    while producer.flush(FLUSH_SLICE_S) > 0:
        log.info("waiting for Kafka to acknowledge %d records", len(producer))
    refused = {*too_large, *(row_id for row_id, _ in poison)}
    # One observation per batch, of its oldest row published (created_at in milliseconds):
    # one per row would cost the relay's hot loop. Rows queued with send_after count from
    # their creation. A claim may hold refused rows only: then there is nothing to observe.
    oldest = min((_epoch_s(row[created_at]) for row in rows[:produced]
                  if not refused or row[id_at] not in refused), default=None)
    if oldest is not None:
        metrics.observe(RELAY_PUBLISH_DELAY_SECONDS, time.time() - oldest)
    unsent = [row[id_at] for row in rows[produced:]]
    if not failures:
        return Sent([row[id_at] for row in rows[:produced] if row[id_at] not in refused],
                    unsent, too_large, poison)
    acked, failed = [], []
    for row in rows[:produced]:
        if row[id_at] in refused:
            continue
        err = failures.get(row[key_at].encode())
        if err is None:
            acked.append(row[id_at])
        elif is_too_large(err):
            too_large.append(row[id_at])
            log.error("row_id=%d: the broker refused its event as too large (%s); marked "
                      "failed", row[id_at], err.str())
        else:
            failed.append(row[id_at])
            log.warning("publish failed row_id=%d code=%s: %s", row[id_at], err.name(),
                        err.str())
    return Sent(acked, [*failed, *unsent], too_large, poison)


def _produce(producer: Producer, topic: str, key: str, value: bytes,
             headers: list[tuple[str, str | bytes | None]], callback: Callable[..., None]) -> None:
    """Produce one record, serving delivery callbacks while the local queue is full; BufferError
    once it stays full for as long as a record may wait (PRODUCER_MESSAGE_TIMEOUT_MS)."""
    deadline: float | None = None  # set by the first full queue, not on every record
    while True:
        try:
            producer.produce(topic, key=key.encode(), value=value, headers=headers,
                             on_delivery=callback)
        except BufferError:
            # The local queue is full: serve callbacks until there is room.
            if deadline is None:
                deadline = time.monotonic() + PRODUCER_MESSAGE_TIMEOUT_MS / 1000
            elif time.monotonic() > deadline:
                raise
            producer.poll(0.05)
        else:
            return
