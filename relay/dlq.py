"""Reads the dead-letter topic for `dlq list` and `dlq replay` as a stream of pages: a page of at
most PAGE_LETTERS letters is in memory at a time, whatever the topic holds, and the read has no
fixed window: it stops only when no record comes for READ_STALL_S.

The topic is read in one total order, partition by partition and by offset within each, up to the
ends it had when the read began, so a page's end is one position (``partition:offset``) from
which ``--after`` goes on.
"""

from __future__ import annotations

import dataclasses
import re
import time
import uuid
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from postroom.errors import KafkaClientError
from postroom.kafka import (
    KafkaError,
    KafkaException,
    TopicPartition,
    check_reachable,
    make_reader,
    watermarks,
)
from postroom.kafka import translate as translate_kafka_error
from postroom.relay import sql
from postroom.relay.redrive import DeadLetter, letter_of
from postroom.schemas.framing import SchemaById
from postroom.schemas.registry import schema_lookup
from postroom.settings import Settings
from postroom.topics import dead_letter_topic

# Letters per page: what is held in memory at once (with librdkafka's prefetch, bounded below).
PAGE_LETTERS = 1000
# No record (nor the end of the partition) for this long: the broker is not serving the
# partition, and the read stops saying where it was. Not a bound on the whole read.
READ_STALL_S = 30.0
METADATA_TIMEOUT_S = 30.0
CONSUME_BATCH = 500
CONSUME_WAIT_S = 0.5
# librdkafka's prefetch queue of the one partition being read (its default is 64 MiB).
READER_QUEUE_KBYTES = 16 * 1024
# Progress is said at the first page boundary, then at one at most this often.
PROGRESS_EVERY_S = 1.0

_POSITION = re.compile(r"(\d{1,9}):(\d{1,19})")


@dataclasses.dataclass(frozen=True, order=True)
class Position:
    """A record's place in the dead-letter topic's order: its partition, then its offset."""

    partition: int
    offset: int

    def __str__(self) -> str:
        return f"{self.partition}:{self.offset}"

    @classmethod
    def parse(cls, text: str) -> Position:
        """``PARTITION:OFFSET`` as a page's last line names it; ValueError otherwise."""
        found = _POSITION.fullmatch(text.strip())
        if found is None:
            raise ValueError(f"expected PARTITION:OFFSET such as 0:1000, got {text[:40]!r}")
        return cls(int(found.group(1)), int(found.group(2)))


@dataclasses.dataclass(frozen=True)
class Span:
    """The offsets of one partition to read: ``start`` up to (not including) ``end``."""

    partition: int
    start: int
    end: int


def spans_to_read(watermarks: Mapping[int, tuple[int, int]],
                  after: Position | None) -> list[Span]:
    """The partitions' offsets to read, in the topic's order, from ``after`` (the beginning
    when None) to each partition's high watermark: ``watermarks`` maps a partition to its
    (low, high) offsets. Empty spans are left out. Pure."""
    spans = []
    for partition in sorted(watermarks):
        low, high = watermarks[partition]
        start = low
        if after is not None:
            if partition < after.partition:
                continue
            if partition == after.partition:
                start = max(low, after.offset)
        if high > start:
            spans.append(Span(partition, start, high))
    return spans


@dataclasses.dataclass(frozen=True)
class Page:
    """Dead letters read in a row, oldest first (by the time each was dead-lettered), with the
    state of their outbox rows, and where the next page starts (None: the end of the topic as
    it was when the read began)."""

    letters: tuple[DeadLetter, ...]
    next: Position | None


@dataclasses.dataclass(frozen=True)
class Progress:
    read: int
    total: int  # records to read: up to the ends at the start, within the limit
    at: Position


def dead_letter_pages(settings: Settings, engine: sa.Engine, *, after: Position | None = None,
                      limit: int | None = None, page_letters: int = PAGE_LETTERS,
                      progress: Callable[[Progress], None] | None = None,
                      ) -> Generator[Page, None, None]:
    """The dead-letter topic from ``after`` (the beginning when None), at most ``limit`` letters
    (all when None), in pages of at most ``page_letters``.

    With a Schema Registry configured, records in the Confluent wire format are decoded with
    the writer schemas it holds, as the sender decodes them; an unreachable registry is an
    error (PostroomError), not a list of unreadable letters. KafkaClientError when the topic
    is missing or a partition gives nothing for READ_STALL_S. Close the iterator (or read it
    to the end) to close its consumer.
    """
    schema_by_id = schema_lookup(settings)
    topic = dead_letter_topic(settings.topic_prefix)
    check_reachable(settings)
    consumer = make_reader(settings, f"postroom-dlq-reader-{uuid.uuid4().hex[:8]}",
                           **{"enable.partition.eof": True,
                              "queued.max.messages.kbytes": READER_QUEUE_KBYTES})
    try:
        spans = spans_to_read(_watermarks(consumer, topic), after)
        for letters, following in read_pages(consumer, topic, spans, limit=limit,
                                             page_letters=page_letters,
                                             schema_by_id=schema_by_id, progress=progress):
            yield Page(with_row_states(engine, letters), following)
    except KafkaException as exc:
        raise translate_kafka_error(exc, f"cannot read {topic}") from exc
    finally:
        consumer.close()


def _watermarks(consumer: Any, topic: str) -> dict[int, tuple[int, int]]:
    metadata = consumer.list_topics(topic, timeout=METADATA_TIMEOUT_S)
    if topic not in metadata.topics or metadata.topics[topic].error is not None:
        raise KafkaClientError(f"cannot read the dead letters: no topic {topic} "
                               "(run `postroom topics create`)")
    return {partition: watermarks(consumer, TopicPartition(topic, partition), METADATA_TIMEOUT_S)
            for partition in metadata.topics[topic].partitions}


def read_pages(consumer: Any, topic: str, spans: Sequence[Span], *, limit: int | None,
               page_letters: int, schema_by_id: SchemaById | None = None,
               progress: Callable[[Progress], None] | None = None,
               clock: Callable[[], float] = time.monotonic,
               ) -> Iterator[tuple[list[DeadLetter], Position | None]]:
    """(letters, where the next page starts) for each page of ``spans``, read one partition at
    a time with ``consumer`` (assigned each in turn). A partition ends at its span's end or at
    its end of partition (offsets before the high watermark may hold no record: transaction
    markers, compaction). KafkaClientError when nothing comes for READ_STALL_S."""
    total = sum(span.end - span.start for span in spans)
    total = total if limit is None else min(total, limit)
    page: list[DeadLetter] = []
    read = 0
    said: float | None = None
    for index, span in enumerate(spans):
        if limit is not None and read >= limit:
            break
        consumer.assign([TopicPartition(topic, span.partition, span.start)])
        position = span.start
        heard = clock()
        while position < span.end and (limit is None or read < limit):
            messages = consumer.consume(num_messages=CONSUME_BATCH, timeout=CONSUME_WAIT_S)
            if not messages:
                if clock() - heard > READ_STALL_S:
                    raise KafkaClientError(
                        f"cannot read {topic}: nothing from partition {span.partition} at offset "
                        f"{position} for {READ_STALL_S:.0f}s ({read} of {total} record(s) read; "
                        f"`--after {span.partition}:{position}` goes on from there)")
                continue
            heard = clock()
            for msg in messages:
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        position = span.end
                        break
                    continue  # a transient error librdkafka retries; a stall is caught above
                offset = msg.offset()
                if offset is None or offset < position:
                    continue
                if offset >= span.end:  # written since the read began
                    position = span.end
                    break
                page.append(letter_of(msg, span.partition, offset, schema_by_id))
                position, read = offset + 1, read + 1
                if len(page) >= page_letters or read == limit:
                    yield page, _following(spans, index, position)
                    page = []
                    if progress is not None and (said is None
                                                 or clock() - said >= PROGRESS_EVERY_S):
                        said = clock()
                        progress(Progress(read, total, Position(span.partition, position)))
                    if read == limit:
                        break
    if page:
        yield page, None


def _following(spans: Sequence[Span], index: int, position: int) -> Position | None:
    """Where reading goes on after ``position`` in ``spans[index]``: None at the end of all."""
    if position < spans[index].end:
        return Position(spans[index].partition, position)
    if index + 1 < len(spans):
        return Position(spans[index + 1].partition, spans[index + 1].start)
    return None


def with_row_states(engine: sa.Engine, letters: Sequence[DeadLetter]) -> tuple[DeadLetter, ...]:
    """``letters`` oldest first, each with the state of its outbox row now (one query)."""
    # No row has a key with a NUL (PostgreSQL text cannot hold one, and refuses the query).
    keys = sorted({letter.key for letter in letters if letter.key and "\x00" not in letter.key})
    states: dict[str, str] = {}
    if keys:
        with engine.connect() as conn:
            states = {k: s for k, s, _ in conn.execute(sql.STATES_OF_KEYS, {"keys": keys})}
    ordered = sorted(letters, key=lambda letter: (letter.at, letter.partition, letter.offset))
    return tuple(dataclasses.replace(letter, row_status=states.get(letter.key or ""))
                 for letter in ordered)
