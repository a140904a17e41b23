"""The console's pages of dead letters (postroom web): a page reads at most its size of records
from the tail of each partition, never the whole topic; one letter found by its place."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from postroom.errors import KafkaClientError
from postroom.headers import ERROR_HEADER
from postroom.kafka import (
    KafkaException,
    TopicPartition,
    check_reachable,
    make_reader,
    message_headers,
    watermarks,
)
from postroom.kafka import translate as translate_kafka_error
from postroom.relay import sql
from postroom.relay.redrive import DeadLetter, _one_line, letter_of
from postroom.schemas.registry import schema_lookup
from postroom.settings import Settings
from postroom.topics import dead_letter_topic

READ_TIMEOUT_S = 30.0  # the window's records, and each metadata look-up


@dataclasses.dataclass(frozen=True)
class LetterHistory:
    """A dead letter with the error of each attempt its history headers hold, oldest first."""

    letter: DeadLetter
    errors: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class DeadLetterPage:
    letters: tuple[LetterHistory, ...]  # newest first
    before: dict[int, int] | None  # the next page's cursor (partition -> offset it ends before)


def read_dead_letter_page(settings: Settings, engine: sa.Engine,
                          before: dict[int, int] | None, size: int) -> DeadLetterPage:
    """The ``size`` newest dead letters before the cursor ``before`` (None: the topic's end),
    reading at most ``size`` records of each partition; with their rows' states. A page takes
    a run of each partition's newest records, merged by time, so no record is skipped."""
    def window(low: int, high: int, partition: int) -> tuple[int, int]:
        end = high if before is None else max(low, min(high, before.get(partition, low)))
        return max(low, end - size), end

    read, bounds = _read_windows(settings, window)
    shown = merge_newest(read, size)
    cursor = {p: min([h.letter.offset for h in shown if h.letter.partition == p], default=end)
              for p, (_, end) in bounds.items()}
    more = any(cursor[p] > low for p, (low, _) in bounds.items())
    return DeadLetterPage(tuple(_with_states(engine, shown)), cursor if more else None)


def merge_newest(read: Sequence[LetterHistory], size: int) -> list[LetterHistory]:
    """The ``size`` newest of ``read``, taking each partition's records from its highest offset
    down (a run of each), the newer head first. Pure."""
    stacks: dict[int, list[LetterHistory]] = {}
    for history in sorted(read, key=lambda h: h.letter.offset):
        stacks.setdefault(history.letter.partition, []).append(history)
    shown: list[LetterHistory] = []
    while len(shown) < size and any(stacks.values()):
        partition = max((p for p, stack in stacks.items() if stack),
                        key=lambda p: (stacks[p][-1].letter.at, -p))
        shown.append(stacks[partition].pop())
    return shown


def read_dead_letter_at(settings: Settings, engine: sa.Engine, partition: int,
                        offset: int) -> LetterHistory | None:
    """The dead letter at ``partition``/``offset``, or None when the topic holds none there."""
    def window(low: int, high: int, part: int) -> tuple[int, int]:
        return (offset, offset + 1) if part == partition and low <= offset < high else (0, 0)

    read, _ = _read_windows(settings, window)
    return next(iter(_with_states(engine, read)), None)


def _with_states(engine: sa.Engine, read: Sequence[LetterHistory]) -> list[LetterHistory]:
    keys = sorted({h.letter.key for h in read if h.letter.key and "\x00" not in h.letter.key})
    states: dict[str, str] = {}
    if keys:
        with engine.connect() as conn:
            states = {k: s for k, s, _ in conn.execute(sql.STATES_OF_KEYS, {"keys": keys})}
    return [dataclasses.replace(h, letter=dataclasses.replace(
        h.letter, row_status=states.get(h.letter.key or ""))) for h in read]


def _read_windows(settings: Settings, window_of: Any
                  ) -> tuple[list[LetterHistory], dict[int, tuple[int, int]]]:
    """The records of each partition's window [start, end) (``window_of(low, high, partition)``),
    and each partition's (low watermark, window end)."""
    schema_by_id = schema_lookup(settings)
    topic = dead_letter_topic(settings.topic_prefix)
    check_reachable(settings)
    consumer = make_reader(settings, f"postroom-dlq-reader-{uuid.uuid4().hex[:8]}")
    read: list[LetterHistory] = []
    bounds: dict[int, tuple[int, int]] = {}
    try:
        metadata = consumer.list_topics(topic, timeout=READ_TIMEOUT_S)
        if topic not in metadata.topics or metadata.topics[topic].error is not None:
            raise KafkaClientError(f"cannot read the dead letters: no topic {topic} "
                                   "(run `postroom topics create`)")
        ends: dict[int, int] = {}
        assignment = []
        for partition in sorted(metadata.topics[topic].partitions):
            low, high = watermarks(consumer, TopicPartition(topic, partition), READ_TIMEOUT_S)
            start, end = window_of(low, high, partition)
            bounds[partition] = (low, end)
            if end > start:
                ends[partition] = end
                assignment.append(TopicPartition(topic, partition, start))
        if assignment:
            consumer.assign(assignment)
        deadline = time.monotonic() + READ_TIMEOUT_S
        while ends and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=500, timeout=0.5):
                partition, offset = msg.partition() or 0, msg.offset() or 0
                if msg.error() is not None or offset >= ends.get(partition, -1):
                    continue
                read.append(LetterHistory(letter_of(msg, partition, offset, schema_by_id),
                                          _errors(msg)))
                if offset + 1 >= ends[partition]:
                    ends.pop(partition)
        if ends:
            raise KafkaClientError(f"cannot read {topic} within {READ_TIMEOUT_S:.0f}s: "
                                   f"partitions {sorted(ends)} unfinished")
    except KafkaException as exc:
        raise translate_kafka_error(exc, f"cannot read {topic}") from exc
    finally:
        consumer.close()
    return read, bounds


def _errors(msg: Any) -> tuple[str, ...]:
    return tuple(_one_line(value.decode(errors="replace"), 300)
                 for name, value in message_headers(msg)
                 if name == ERROR_HEADER and isinstance(value, bytes))
