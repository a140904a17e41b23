"""Sends dead-lettered or failed emails again: `postroom dlq list`, `dlq replay` and `requeue`.

The outbox row is the record, so a redrive puts the row back on the relay's queue (status
``pending``) instead of copying the dead letter: the relay publishes it as the next attempt with
a fresh retry budget, its history (attempts, last error) stays on the row, and a second redrive
finds the row pending and does nothing.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from confluent_kafka import Consumer, KafkaException, TopicPartition

from postroom.errors import KafkaClientError
from postroom.headers import DLQ_CLASS_HEADER, DLQ_REASON_HEADER, DLQ_TOPIC_HEADER, ERROR_HEADER
from postroom.kafka import translate
from postroom.settings import Settings
from postroom.topics import dead_letter_topic
from relay import sql
from schemas.codec import EmailRequested, SchemaError, decode, header_value

log = logging.getLogger(__name__)

READ_TIMEOUT_S = 30.0


@dataclasses.dataclass(frozen=True)
class DeadLetter:
    """One record of the dead-letter topic, with the state of its outbox row now."""

    partition: int
    offset: int
    key: str | None
    at: dt.datetime
    classification: str
    reason: str
    source: str
    attempts: int
    recipient: str | None = None
    message_key: str | None = None
    subject: str | None = None
    row_status: str | None = None  # None: no outbox row (poison, or purged)

    @property
    def replayable(self) -> bool:
        return self.row_status in sql.FINAL_FAILURES

    def as_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "at": self.at.isoformat(),
                "replayable": self.replayable}


@dataclasses.dataclass(frozen=True)
class RedriveRow:
    id: int
    idempotency_key: str
    recipient: str
    status: str
    attempts: int


@dataclasses.dataclass(frozen=True)
class RedrivePlan:
    """What a redrive would send again, and what it leaves, with why."""

    rows: tuple[RedriveRow, ...]
    skipped: tuple[tuple[str, str], ...] = ()  # (key, why)


def read_dead_letters(settings: Settings, engine: sa.Engine) -> list[DeadLetter]:
    """Every record on the dead-letter topic, oldest first per partition."""
    topic = dead_letter_topic(settings.topic_prefix)
    consumer = Consumer({**settings.kafka_client_config(), **settings.kafka_consumer_config,
                         "group.id": f"postroom-dlq-reader-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, "enable.partition.eof": False})
    letters: list[DeadLetter] = []
    try:
        metadata = consumer.list_topics(topic, timeout=READ_TIMEOUT_S)
        if topic not in metadata.topics or metadata.topics[topic].error is not None:
            raise KafkaClientError(f"cannot read the dead letters: no topic {topic} "
                                   "(run `postroom topics create`)")
        ends: dict[int, int] = {}
        assignment = []
        for partition in sorted(metadata.topics[topic].partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                                       timeout=READ_TIMEOUT_S)
            if high > low:
                ends[partition] = high
                assignment.append(TopicPartition(topic, partition, low))
        if assignment:
            consumer.assign(assignment)
        deadline = time.monotonic() + READ_TIMEOUT_S
        while ends and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=500, timeout=0.5):
                if msg.error() is not None:
                    continue
                partition, offset = msg.partition() or 0, msg.offset() or 0
                letters.append(_letter(msg, partition, offset))
                if offset + 1 >= ends.get(partition, 0):
                    ends.pop(partition, None)
        if ends:
            raise KafkaClientError(f"cannot read all of {topic} within {READ_TIMEOUT_S:.0f}s: "
                                   f"partitions {sorted(ends)} unfinished")
    except KafkaException as exc:
        raise translate(exc, f"cannot read {topic}") from exc
    finally:
        consumer.close()
    keys = sorted({letter.key for letter in letters if letter.key})
    states: dict[str, str] = {}
    if keys:
        with engine.connect() as conn:
            states = {k: s for k, s, _ in conn.execute(sql.STATES_OF_KEYS, {"keys": keys})}
    return [dataclasses.replace(letter, row_status=states.get(letter.key or ""))
            for letter in letters]


def _letter(msg: Any, partition: int, offset: int) -> DeadLetter:
    headers = list(msg.headers() or [])
    raw_key = msg.key()
    key = raw_key.decode(errors="replace") if isinstance(raw_key, bytes) else raw_key

    def text(name: str) -> str:
        value = header_value(headers, name)
        return value.decode(errors="replace") if value is not None else ""

    letter = DeadLetter(
        partition, offset, key, dt.datetime.fromtimestamp(msg.timestamp()[1] / 1000, dt.UTC),
        text(DLQ_CLASS_HEADER), text(DLQ_REASON_HEADER), text(DLQ_TOPIC_HEADER),
        sum(1 for name, _ in headers if name == ERROR_HEADER))
    try:
        event = decode(EmailRequested, msg.value(), headers)
    except SchemaError:
        return letter  # poison: dead-lettered byte for byte, not ours to send
    return dataclasses.replace(letter, recipient=event.recipient, message_key=event.message_key,
                               subject=event.subject)


def render_dead_letters(letters: Sequence[DeadLetter]) -> list[str]:
    if not letters:
        return ["the dead-letter topic is empty"]
    lines = []
    for letter in letters:
        state = letter.row_status or "no outbox row"
        lines.append(" | ".join([
            letter.at.strftime("%Y-%m-%dT%H:%M:%SZ"), letter.key or "-", letter.classification,
            f"attempts={letter.attempts}", letter.reason or "-",
            f"row={state}" + (" (replayable)" if letter.replayable else "")]))
    replayable = sum(1 for letter in letters if letter.replayable)
    lines.append(f"{len(letters)} dead letter(s), {replayable} replayable with "
                 "`postroom dlq replay`")
    return lines


def plan_replay(letters: Sequence[DeadLetter], engine: sa.Engine,
                key: str | None) -> RedrivePlan:
    """Rows to replay from the dead letters: those of ``key`` (an idempotency key or a message
    key), or all when ``key`` is None. Letters whose row is no longer failed or dead are skipped
    with the reason."""
    chosen = [letter for letter in letters if key is None or key in (letter.key,
                                                                     letter.message_key)]
    skipped: dict[str, str] = {}
    if key is not None and not chosen:
        skipped[key] = "not on the dead-letter topic"
    for letter in chosen:
        name = letter.key or f"{letter.partition}@{letter.offset}"
        if letter.recipient is None:
            skipped[name] = f"unreadable record ({letter.reason or 'poison'}): not an email to send"
        elif letter.row_status is None:
            skipped[name] = "no outbox row (purged?)"
        elif not letter.replayable:
            skipped[name] = f"row is {letter.row_status} (replayed already)"
    keys = sorted({letter.key for letter in chosen if letter.replayable and letter.key})
    rows = _redrivable(engine, keys, None) if keys else ()
    return RedrivePlan(rows, tuple(sorted(skipped.items())))


def plan_requeue(engine: sa.Engine, message_key: str, recipient: str | None) -> RedrivePlan:
    """Rows of ``message_key`` (and ``recipient``) that ended failed or dead."""
    rows = _redrivable(engine, [message_key], recipient)
    skipped: tuple[tuple[str, str], ...] = ()
    if not rows:
        who = f"{message_key}" + (f" for {recipient}" if recipient else "")
        skipped = ((who, "no failed or dead row (nothing to send again)"),)
    return RedrivePlan(rows, skipped)


def _redrivable(engine: sa.Engine, keys: Iterable[str],
                recipient: str | None) -> tuple[RedriveRow, ...]:
    with engine.connect() as conn:
        found = conn.execute(sql.REDRIVABLE, {"keys": list(keys), "recipient": recipient})
        return tuple(RedriveRow(r.id, r.idempotency_key, r.recipient, r.status, r.attempts)
                     for r in found)


def redrive(engine: sa.Engine, plan: RedrivePlan) -> list[RedriveRow]:
    """Put the plan's rows back on the relay's queue; returns those this call moved."""
    if not plan.rows:
        return []
    with engine.begin() as conn:
        moved = conn.execute(sql.REDRIVE, {"ids": [row.id for row in plan.rows]}).all()
        conn.execute(sql.NOTIFY_RELAY)
    for row in moved:
        log.info("key=%s redriven after %d attempt(s) (was %s)", row.idempotency_key,
                 row.attempts, row.was)
    return [RedriveRow(r.id, r.idempotency_key, r.recipient, r.was, r.attempts) for r in moved]


def render_plan(plan: RedrivePlan, verb: str) -> list[str]:
    lines = [f"will {verb} {len(plan.rows)} row(s)" + (":" if plan.rows else "")]
    lines += [f"  {row.idempotency_key} ({row.status} after {row.attempts} attempt(s))"
              for row in plan.rows]
    lines += [f"  skip {key}: {why}" for key, why in plan.skipped]
    return lines


def plan_json(plan: RedrivePlan, done: Sequence[RedriveRow] | None) -> str:
    return json.dumps({
        "rows": [dataclasses.asdict(row) for row in plan.rows],
        "skipped": [{"key": key, "why": why} for key, why in plan.skipped],
        "done": None if done is None else [row.idempotency_key for row in done]})
