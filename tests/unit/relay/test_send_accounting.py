"""Which claimed rows the relay counts as acknowledged, from the producer's failure reports.

The broker is replaced by a stand-in producer that fails chosen keys: what is under test is the
accounting, the relay's own logic; tests/integration/relay runs the real producer and broker.
"""

from __future__ import annotations

import collections
import datetime as dt
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from postroom.errors import KafkaClientError
from postroom.kafka import KafkaError, KafkaException
from postroom.relay import producing
from postroom.relay.publisher import Relay
from postroom.relay.rounds import Sent
from postroom.schemas.codec import load_schema
from postroom.settings import Settings
from support.metrics import counter

CREATED = dt.datetime(2026, 9, 30, tzinfo=dt.UTC)


class Failure:
    def name(self) -> str:
        return "_MSG_TIMED_OUT"

    def str(self) -> str:
        return "Local: Message timed out"


class Record:
    def __init__(self, key: bytes) -> None:
        self._key = key

    def key(self) -> bytes:
        return self._key


class StandInProducer:
    """Takes records; on flush() reports the keys in ``fail`` as failed, and nothing else (as
    delivery.report.only.error does); raises BufferError once ``room`` records are queued."""

    def __init__(self, fail: set[bytes], room: int = 1_000_000) -> None:
        self.fail, self.room = fail, room
        self.queued: list[tuple[bytes, Callable[..., None]]] = []
        self.produced: list[bytes] = []

    def produce(self, topic: str, *, key: bytes, value: bytes, headers: Any,
                on_delivery: Callable[..., None]) -> None:
        if len(self.queued) >= self.room:
            raise BufferError("queue full")
        self.queued.append((key, on_delivery))
        self.produced.append(key)

    def poll(self, timeout: float) -> int:
        return 0

    def flush(self, timeout: float) -> int:
        for key, callback in self.queued:
            if key in self.fail:
                callback(Failure(), Record(key))
        self.queued.clear()
        return 0

    def __len__(self) -> int:
        return len(self.queued)


def claimed_rows(count: int) -> list[Any]:
    """Rows shaped as the claim returns them: the email-requested fields, in order, by name."""
    row = collections.namedtuple("Claimed", load_schema("email_requested").field_names)  # type: ignore[misc]
    return [row(f"k|r{n}@example.com", "k", n, f"r{n}@example.com", "", "S", "b", [], "normal",
                CREATED, 1, None, None, []) for n in range(1, count + 1)]


def relay_with(producer: StandInProducer) -> Relay:
    settings = Settings(database_url="postgresql+psycopg://unused/unused",
                        kafka_bootstrap_servers="127.0.0.1:1")
    return Relay(settings, sa.create_engine("postgresql+psycopg://unused/unused"),
                 producer_factory=lambda: producer)  # type: ignore[arg-type, return-value]


@pytest.mark.parametrize(("fail", "acked", "released"), [
    (set(), [1, 2, 3, 4], []),
    ({b"k|r2@example.com"}, [1, 3, 4], [2]),
    ({b"k|r1@example.com", b"k|r4@example.com"}, [2, 3], [1, 4]),
])
def test_rows_not_reported_failed_are_acknowledged(
        fail: set[bytes], acked: list[int], released: list[int]) -> None:
    relay = relay_with(StandInProducer(fail))
    assert relay._send(claimed_rows(4)) == Sent(acked, released)


def test_rows_the_producer_could_not_take_are_released_too(
        monkeypatch: pytest.MonkeyPatch) -> None:
    relay = relay_with(StandInProducer({b"k|r1@example.com"}, room=2))
    # A full local queue is retried until the producer's timeout; none here, to keep it short.
    monkeypatch.setattr(producing, "PRODUCER_MESSAGE_TIMEOUT_MS", 0)
    assert relay._send(claimed_rows(4)) == Sent([2], [1, 3, 4])


def test_rows_whose_event_is_over_the_cap_are_neither_produced_nor_released() -> None:
    producer = StandInProducer(set())
    relay = relay_with(producer)
    relay._settings = Settings(event_max_bytes=100)
    rows = claimed_rows(3)
    rows[1] = rows[1]._replace(body="b" * 200)
    assert relay._send(rows) == Sent([1, 3], [], [2])


def test_rows_that_cannot_become_an_event_are_poison_and_the_others_go_out() -> None:
    producer = StandInProducer(set())
    relay = relay_with(producer)
    rows = claimed_rows(5)
    rows[0] = rows[0]._replace(attachments=[None])
    rows[2] = rows[2]._replace(created_at=None)  # an infinite created_at, as the claim gives it
    rows[4] = rows[4]._replace(priority="urgent")
    sent = relay._send(rows)
    assert (sent.acked, sent.released, sent.too_large) == ([2, 4], [], [])
    assert [row_id for row_id, _ in sent.poison] == [1, 3, 5]
    assert all(error.startswith("poison: ") for _, error in sent.poison)
    assert "attachments holds None" in sent.poison[0][1]
    assert producer.produced == [b"k|r2@example.com", b"k|r4@example.com"]
    assert relay._account(5, sent) == 2
    assert relay.stats.poison == 3
    assert counter(relay.metrics, "relay_poison_total") == 3



class RefusingProducer(StandInProducer):
    """Refuses the ``nth`` record with a KafkaException (not a full queue, not too large)."""

    def __init__(self, nth: int) -> None:
        super().__init__(set())
        self.nth = nth
        self.flushed_before_raising: list[bytes] = []

    def produce(self, topic: str, *, key: bytes, value: bytes, headers: Any,
                on_delivery: Callable[..., None]) -> None:
        if len(self.produced) + 1 == self.nth:
            self.flushed_before_raising = []
            raise KafkaException(KafkaError(KafkaError._STATE, "producer fenced"))
        super().produce(topic, key=key, value=value, headers=headers, on_delivery=on_delivery)

    def flush(self, timeout: float) -> int:
        self.flushed_before_raising = [key for key, _ in self.queued]
        return super().flush(timeout)


def test_a_round_refused_part_way_waits_for_what_it_produced_before_it_raises() -> None:
    # The failed round's claims end with its connections (relay/connections.py): what it had
    # produced must have been delivered or failed by then, not still be on its way while another
    # round claims and produces the same rows.
    producer = RefusingProducer(nth=3)
    with pytest.raises(KafkaClientError, match="producing row_id=3 failed"):
        relay_with(producer)._send(claimed_rows(4))
    assert producer.flushed_before_raising == [b"k|r1@example.com", b"k|r2@example.com"]
    assert len(producer) == 0


@pytest.mark.parametrize("rows_of", [
    pytest.param(lambda rows: [rows[0]._replace(body="b" * 200),
                               rows[1]._replace(attachments=[None])], id="too-large-and-poison"),
    pytest.param(lambda rows: [rows[0]._replace(body="b" * 200)], id="too-large-only"),
])
def test_a_claim_of_refused_rows_only_publishes_nothing_and_goes_on(
        rows_of: Callable[[list[Any]], list[Any]]) -> None:
    # The poison storm found it: a claim holding one row over the cap and one poison row made
    # the publish-delay observation take min() of no row, and the relay exited.
    producer = StandInProducer(set())
    relay = relay_with(producer)
    relay._settings = Settings(event_max_bytes=100)
    rows = rows_of(claimed_rows(2))
    sent = relay._send(rows)
    assert (sent.acked, sent.released) == ([], [])
    assert len(sent.too_large) + len(sent.poison) == len(rows)
    assert producer.produced == []
    assert relay.metrics.summary("relay_publish_delay_seconds") is None
