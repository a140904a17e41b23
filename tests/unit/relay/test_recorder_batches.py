"""How the recorder gathers a batch of results: what a busy topic and a burst's end each give."""

from __future__ import annotations

from typing import Any, cast

from confluent_kafka import Message

from postroom.relay.recorder import BATCH_MAX, BATCH_WAIT_S, GAP_S, QUIET_S, gather


class Topic:
    """A consume() that hands out scripted reads, advancing a fake clock by each read's wait."""

    def __init__(self, reads: list[int], *, waits_out_empty_reads: bool = True) -> None:
        self.reads = list(reads)
        self.asked: list[tuple[int, float]] = []
        self.now = 0.0
        self.offset = 0
        self._waits_out_empty = waits_out_empty_reads

    def consume(self, num_messages: int, timeout_s: float) -> list[Message]:
        self.asked.append((num_messages, timeout_s))
        count = min(self.reads.pop(0) if self.reads else 0, num_messages)
        if count == 0 and self._waits_out_empty:
            self.now += timeout_s
        records: list[Any] = list(range(self.offset, self.offset + count))
        self.offset += count
        return cast(list[Message], records)

    def clock(self) -> float:
        return self.now


def test_nothing_there_returns_after_one_short_read() -> None:
    topic = Topic([])
    assert gather(topic.consume, topic.clock) == []
    assert topic.asked == [(BATCH_MAX, QUIET_S)]


def test_a_burst_is_applied_once_a_read_finds_nothing_new() -> None:
    topic = Topic([300, 200, 7, 0, 50])
    batch = gather(topic.consume, topic.clock)
    assert batch == list(range(507))
    # The first read waits QUIET_S for anything; the reads after it GAP_S for more.
    assert topic.asked == [(BATCH_MAX, QUIET_S), (700, GAP_S), (500, GAP_S), (493, GAP_S)]
    assert topic.now == GAP_S  # the burst's end was seen one short read after its last record


def test_a_batch_stops_at_its_size() -> None:
    topic = Topic([600, 600, 600])
    assert len(gather(topic.consume, topic.clock)) == BATCH_MAX
    assert [n for n, _ in topic.asked] == [BATCH_MAX, BATCH_MAX - 600]


def test_a_steady_trickle_is_applied_every_batch_wait() -> None:
    class Trickle(Topic):
        def consume(self, num_messages: int, timeout_s: float) -> list[Message]:
            self.now += timeout_s  # one record at the end of every read
            return super().consume(num_messages, timeout_s)

    topic = Trickle([1] * 1000, waits_out_empty_reads=False)
    batch = gather(topic.consume, topic.clock)
    # The first read, then reads until BATCH_WAIT_S after it: the burst's end never comes, and
    # the batch ends with the first read that finishes past the wait.
    assert len(batch) == len(topic.asked)
    first_read_done = QUIET_S
    assert first_read_done + BATCH_WAIT_S <= topic.now < first_read_done + BATCH_WAIT_S + GAP_S * 2
    assert len(batch) < BATCH_MAX
