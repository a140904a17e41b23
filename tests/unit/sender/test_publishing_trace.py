"""The sender's writes carry the email's trace context: a poison record's value-less dead letter
and its failed result carry the record's own context (a valid one only)."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

from postroom.kafka import Record
from postroom.metrics import Metrics
from postroom.schemas.framing import SCHEMALESS
from postroom.sender.errors import PoisonRecordError
from postroom.sender.publishing import OutcomePublisher
from postroom.tracing import TraceContext, from_headers

NOW = dt.datetime(2026, 10, 1, 6, 0, tzinfo=dt.UTC)
CONTEXT = TraceContext("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", 1)


class Producer:
    def __init__(self) -> None:
        self.records: list[tuple[str, Any, Any, list[tuple[str, Any]]]] = []

    async def produce(self, topic: str, key: Any, value: Any,
                      headers: list[tuple[str, Any]]) -> None:
        self.records.append((topic, key, value, list(headers)))


def poison_of(headers: list[tuple[str, Any]]) -> list[tuple[str, TraceContext | None]]:
    producer = Producer()
    publisher = OutcomePublisher("t.", producer, Metrics())  # type: ignore[arg-type]
    publisher.framing = SCHEMALESS
    record = Record("t.email.normal", 0, 7, b"k|a@example.com", b"\x00garbage", headers)
    poison = PoisonRecordError("not our contract", copy_record=False, key="k|a@example.com",
                               row_id=3)
    asyncio.run(publisher.poison(record, poison, NOW))
    return [(topic, from_headers(h)) for topic, _key, _value, h in producer.records]


def test_a_poison_records_dead_letter_and_result_carry_its_context() -> None:
    assert poison_of([*CONTEXT.headers(), ("postroom.row_id", b"3")]) == [
        ("t.email.dead", CONTEXT), ("t.email.results", CONTEXT)]


def test_a_malformed_context_on_a_poison_record_is_carried_by_neither() -> None:
    assert poison_of([("traceparent", b"00-zz-01")]) == [
        ("t.email.dead", None), ("t.email.results", None)]
