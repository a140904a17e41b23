"""How `dlq list` and `dlq replay` read the dead-letter topic, without a broker: positions, the
spans to read, and pages from an in-memory consumer (page size, where the next page starts, the
end of a partition before its high watermark, a limit, a slow broker, one that stops)."""

from __future__ import annotations

from collections import deque
from typing import Any

import pytest

from postroom.errors import KafkaClientError
from postroom.kafka import KafkaError
from postroom.relay import dlq
from postroom.relay.dlq import Position, Progress, Span, read_pages, spans_to_read

TOPIC = "t.email.dead"


@pytest.mark.parametrize(("text", "position"), [
    ("0:0", Position(0, 0)), (" 3:1000 ", Position(3, 1000)), ("12:9", Position(12, 9))])
def test_a_position_is_partition_colon_offset(text: str, position: Position) -> None:
    assert Position.parse(text) == position
    assert Position.parse(str(position)) == position


@pytest.mark.parametrize("text", ["", "3", "3:", ":3", "-1:0", "1:-1", "a:b", "1:2:3", "1: 2"])
def test_a_position_that_is_not_one_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="PARTITION:OFFSET"):
        Position.parse(text)


WATERMARKS = {2: (0, 5), 0: (10, 20), 1: (0, 0)}


@pytest.mark.parametrize(("after", "spans"), [
    (None, [Span(0, 10, 20), Span(2, 0, 5)]),       # partition 1 is empty
    (Position(0, 15), [Span(0, 15, 20), Span(2, 0, 5)]),
    (Position(0, 3), [Span(0, 10, 20), Span(2, 0, 5)]),  # below the low watermark: from it
    (Position(0, 20), [Span(2, 0, 5)]),
    (Position(1, 0), [Span(2, 0, 5)]),
    (Position(2, 4), [Span(2, 4, 5)]),
    (Position(2, 5), []),
    (Position(7, 0), []),
])
def test_the_spans_to_read_go_on_from_a_position(after: Position | None,
                                                 spans: list[Span]) -> None:
    assert spans_to_read(WATERMARKS, after) == spans


class Msg:
    def __init__(self, partition: int, offset: int, error: Any = None) -> None:
        self._partition, self._offset, self._error = partition, offset, error

    def error(self) -> Any:
        return self._error

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return f"k{self._partition}-{self._offset}".encode()

    def value(self) -> bytes:
        return b"\x07not avro"

    def headers(self) -> list[tuple[str, bytes]]:
        return []

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_700_000_000_000 + self._offset)


class Eof:
    def code(self) -> int:
        return KafkaError._PARTITION_EOF


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Consumer:
    """Serves each assigned partition's records (a partition -> offsets), ``batch`` at a time,
    then its end of partition; ``step_s`` of the clock passes on each consume, and ``silent``
    consumes answer nothing first (a slow broker)."""

    def __init__(self, records: dict[int, list[int]], clock: Clock, *, batch: int = 7,
                 step_s: float = 0.0, silent: int = 0, eof: bool = True) -> None:
        self.records, self.clock, self.batch, self.step_s = records, clock, batch, step_s
        self.silent, self.eof = silent, eof
        self.queue: deque[Msg] = deque()
        self.assigned: list[tuple[int, int]] = []

    def assign(self, partitions: list[Any]) -> None:
        [tp] = partitions
        self.assigned.append((tp.partition, tp.offset))
        self.queue = deque(Msg(tp.partition, o) for o in self.records[tp.partition]
                           if o >= tp.offset)
        if self.eof:
            self.queue.append(Msg(tp.partition, -1, Eof()))

    def consume(self, num_messages: int, timeout: float) -> list[Msg]:
        self.clock.now += self.step_s
        if self.silent:
            self.silent -= 1
            return []
        return [self.queue.popleft() for _ in range(min(self.batch, num_messages, len(self.queue)))]


def pages(consumer: Consumer, spans: list[Span], clock: Clock, **kwargs: Any,
          ) -> list[tuple[list[tuple[int, int]], Position | None]]:
    options = {"limit": None, "page_letters": 10, **kwargs}
    return [([(x.partition, x.offset) for x in letters], following) for letters, following in
            read_pages(consumer, TOPIC, spans, clock=clock, **options)]


def test_pages_hold_at_most_their_size_and_name_where_the_next_starts() -> None:
    clock = Clock()
    records = {0: list(range(10, 22)), 2: list(range(5))}
    got = pages(Consumer(records, clock), [Span(0, 10, 22), Span(2, 0, 5)], clock)
    assert [len(letters) for letters, _ in got] == [10, 7]
    assert got[0][1] == Position(0, 20)
    assert got[1][1] is None
    read = [x for letters, _ in got for x in letters]
    assert read == [(0, o) for o in range(10, 22)] + [(2, o) for o in range(5)]


def test_a_page_that_ends_a_partition_names_the_next_partitions_start() -> None:
    clock = Clock()
    got = pages(Consumer({0: list(range(10)), 1: [3, 4]}, clock),
                [Span(0, 0, 10), Span(1, 3, 5)], clock)
    assert got[0][1] == Position(1, 3)


def test_a_limit_stops_the_read_and_names_where_it_goes_on() -> None:
    clock = Clock()
    records = {0: list(range(12)), 1: list(range(8))}
    spans = [Span(0, 0, 12), Span(1, 0, 8)]
    first = pages(Consumer(records, clock), spans, clock, limit=15)
    assert [len(letters) for letters, _ in first] == [10, 5]
    assert first[-1][1] == Position(1, 3)
    rest = pages(Consumer(records, clock), spans_to_read({0: (0, 12), 1: (0, 8)}, Position(1, 3)),
                 clock)
    assert [x for letters, _ in rest for x in letters] == [(1, o) for o in range(3, 8)]


def test_a_partition_ends_at_its_end_of_partition_before_its_high_watermark() -> None:
    """Offsets below the high watermark may hold no record (a transaction's marker, compaction):
    the read went on waiting for them until its window closed."""
    clock = Clock()
    got = pages(Consumer({0: [0, 1, 4], 1: [0]}, clock), [Span(0, 0, 7), Span(1, 0, 1)], clock)
    assert [x for letters, _ in got for x in letters] == [(0, 0), (0, 1), (0, 4), (1, 0)]


def test_records_written_after_the_read_began_are_left_for_the_next() -> None:
    clock = Clock()
    got = pages(Consumer({0: list(range(9))}, clock, eof=False), [Span(0, 0, 6)], clock)
    assert [x for letters, _ in got for x in letters] == [(0, o) for o in range(6)]


def test_a_slow_read_goes_on_for_as_long_as_records_come() -> None:
    """Two minutes of reading, a record every few seconds: no window closes on it (it was 30 s
    for the whole topic)."""
    clock = Clock()
    got = pages(Consumer({0: list(range(50))}, clock, batch=1, step_s=3.0), [Span(0, 0, 50)],
                clock)
    assert clock.now > 4 * dlq.READ_STALL_S
    assert sum(len(letters) for letters, _ in got) == 50


def test_a_partition_that_gives_nothing_stops_the_read_saying_where() -> None:
    clock = Clock()
    consumer = Consumer({0: list(range(12)), 1: [0]}, clock, batch=1, step_s=1.0)
    spans = [Span(0, 0, 12), Span(1, 0, 1)]
    reading = read_pages(consumer, TOPIC, spans, limit=None, page_letters=10, clock=clock)
    assert len(next(reading)[0]) == 10
    consumer.queue.clear()  # the broker stops serving partition 0
    with pytest.raises(KafkaClientError, match=r"nothing from partition 0 at offset 10 for 30s "
                                               r"\(10 of 13 record\(s\) read; `--after 0:10`"):
        next(reading)


def test_progress_is_said_at_page_boundaries_at_most_once_a_second() -> None:
    clock = Clock()
    said: list[Progress] = []
    got = pages(Consumer({0: list(range(50))}, clock, batch=10, step_s=0.6), [Span(0, 0, 50)],
                clock, progress=said.append)
    assert len(got) == 5
    assert said and all(p.total == 50 for p in said)
    assert [p.read for p in said] == sorted({p.read for p in said})
    assert len(said) < len(got)
