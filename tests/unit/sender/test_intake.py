"""What becomes of each record read (sender/intake.py), without Kafka: started as an attempt,
dead-lettered as poison, held until its retry is due, or held while the registry cannot answer."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Coroutine
from typing import Any

import pytest

from postroom.kafka import Record
from postroom.metrics import Metrics
from postroom.rules import SizeLimits
from postroom.schemas.codec import EmailRequested, Schema, encode
from postroom.schemas.errors import SchemaUnavailableError
from postroom.schemas.framing import confluent_prefix
from postroom.schemas.framing import headers_for as schema_headers
from postroom.sender.admission import Admission, Admitted
from postroom.sender.errors import AcceptedUnrecordedError, PoisonRecordError
from postroom.sender.intake import REGISTRY_RETRY_FIRST_S, Intake
from postroom.sender.routing import Origin
from postroom.topics import priority_topic, retry_topic
from support.metrics import counter

PREFIX = "t."
NOW = dt.datetime(2026, 12, 2, 20, 0, tzinfo=dt.UTC)
DELAYS_S = (60.0, 300.0)
HIGH = priority_topic(PREFIX, "high")


def event(attempt: int = 1, not_before: dt.datetime | None = None) -> EmailRequested:
    return EmailRequested(
        idempotency_key="k|ops@example.com", message_key="k", outbox_id=7,
        recipient="ops@example.com", sender="reports@example.com", subject="S", body="b",
        attachments=(), priority="high", created_at=NOW, attempt=attempt, not_before=not_before)


def record(topic: str, offset: int, value: bytes | None = None, *, partition: int = 0,
           of: EmailRequested | None = None, framed: bool = True) -> Record:
    the_event = of or event()
    if value is None:
        value = encode(the_event)
    headers: list[tuple[str, str | bytes | None]] = [*schema_headers(the_event)] if framed else []
    return Record(topic, partition, offset, b"k|ops@example.com", value, headers)


class Holds:
    def __init__(self) -> None:
        self.held: list[tuple[tuple[str, int], int, dt.datetime]] = []
        self.assigned: frozenset[tuple[str, int]] = frozenset()

    def hold_until_due(self, record: Record, due: dt.datetime) -> None:
        self.held.append((record.tp, record.offset, due))


class Started:
    """What the intake starts: each task is named by what made it, with its arguments."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, int, dict[str, Any]]] = []
        self._made: dict[str, Any] = {}

    async def _task(self) -> None:
        raise AssertionError("not run here")

    def deliver(self, origin: Origin, admitted: Admitted) -> Coroutine[Any, Any, None]:
        self._made = {"name": "deliver", "origin": origin, "admitted": admitted}
        return self._task()

    def poison(self, record: Record, poison: PoisonRecordError,
               now: dt.datetime) -> Coroutine[Any, Any, None]:
        self._made = {"name": "poison", "reason": poison.reason}
        return self._task()

    def start(self, task: Coroutine[Any, Any, None], record: Record) -> None:
        self.runs.append((self._made.pop("name"), record.offset, self._made))
        # A delivery is started inside the task that ends it as poison should it raise.
        inner = task.cr_frame.f_locals.get("delivery") if task.cr_frame is not None else None
        task.close()
        if inner is not None:
            inner.close()


def intake() -> tuple[Intake, Holds, Started, Metrics]:
    holds, started, metrics = Holds(), Started(), Metrics()
    return Intake(PREFIX, Admission.for_tiers(SizeLimits(), DELAYS_S), holds, metrics,
                  start=started.start, deliver=started.deliver,
                  poison=started.poison), holds, started, metrics


def test_an_event_is_started_as_its_attempt_with_where_it_was_read() -> None:
    take, holds, started, _ = intake()
    take.dispatch([record(HIGH, 5)], NOW, None)
    [(name, offset, args)] = started.runs
    assert (name, offset) == ("deliver", 5)
    assert args["origin"] == Origin(HIGH, 0, 5, tuple(record(HIGH, 5).headers))
    assert args["admitted"].event == event()
    assert holds.held == []


def test_a_record_no_sender_of_ours_wrote_is_started_as_poison() -> None:
    take, _, started, _ = intake()
    take.dispatch([record(HIGH, 5, b"not avro"), record(HIGH, 6)], NOW, None)
    assert [(name, offset) for name, offset, _ in started.runs] == [("poison", 5), ("deliver", 6)]


def test_a_retry_not_yet_due_holds_its_partition_and_only_its_partition() -> None:
    take, holds, started, metrics = intake()
    due = NOW + dt.timedelta(seconds=30)
    tier = retry_topic(PREFIX, 1)
    take.dispatch([record(tier, 1, of=event(2, due)), record(tier, 2, of=event(2)),
                   record(tier, 3, partition=1, of=event(2, NOW - dt.timedelta(seconds=2)))],
                  NOW, None)
    assert holds.held == [((tier, 0), 1, due)]  # offset 2 comes again with its partition
    assert [(name, offset) for name, offset, _ in started.runs] == [("deliver", 3)]
    assert metrics.summary("retry_lateness_seconds") == (1, 2.0, 2.0)


def test_the_registry_not_answering_holds_the_partition_longer_each_time() -> None:
    take, holds, started, metrics = intake()

    def no_answer(schema_id: int) -> Schema:
        raise SchemaUnavailableError(f"no answer for {schema_id}")

    def framed(offset: int) -> Record:
        return record(HIGH, offset, confluent_prefix(1) + encode(event()), framed=False)

    take.dispatch([framed(1), framed(2)], NOW, no_answer)
    take.dispatch([framed(1)], NOW, no_answer)
    assert holds.held == [((HIGH, 0), 1, NOW + dt.timedelta(seconds=REGISTRY_RETRY_FIRST_S)),
                          ((HIGH, 0), 1, NOW + dt.timedelta(seconds=2 * REGISTRY_RETRY_FIRST_S))]
    assert started.runs == []
    assert counter(metrics, "registry_unavailable_total") == 2
    # It answers (the record is read); the next outage starts from the first wait again.
    holds.assigned = frozenset({(HIGH, 0)})
    take.dispatch([record(HIGH, 1)], NOW, no_answer)
    take.dispatch([framed(2)], NOW, no_answer)
    assert holds.held[-1] == ((HIGH, 0), 2, NOW + dt.timedelta(seconds=REGISTRY_RETRY_FIRST_S))


def test_a_delivery_that_raises_ends_as_poison_naming_the_error() -> None:
    """A fault of ours on one record: its task ends it as poison (dead letter, row failed)
    rather than leave it unread behind its partition's commit point."""
    poisoned: list[PoisonRecordError] = []
    tasks: list[Coroutine[Any, Any, None]] = []

    async def deliver(origin: Origin, admitted: Admitted) -> None:
        raise RuntimeError("a fault of ours")

    async def poison(record: Record, why: PoisonRecordError, now: dt.datetime) -> None:
        poisoned.append(why)

    take = Intake(PREFIX, Admission.for_tiers(SizeLimits(), DELAYS_S), Holds(), Metrics(),
                  start=lambda task, record: tasks.append(task), deliver=deliver, poison=poison)
    take.dispatch([record(HIGH, 5)], NOW, None)
    [task] = tasks
    asyncio.run(task)
    [why] = poisoned
    assert why.reason == "the sender failed on it: RuntimeError: a fault of ours"
    assert why.event == event()


def test_an_email_a_server_accepted_is_never_ended_as_poison() -> None:
    """Its result could not be published: the task fails (the record is read again later, and
    the ledger answers it sent), no dead letter and no failed result."""
    poisoned: list[PoisonRecordError] = []
    tasks: list[Coroutine[Any, Any, None]] = []

    async def deliver(origin: Origin, admitted: Admitted) -> None:
        raise AcceptedUnrecordedError("accepted, and the result cannot be published")

    async def poison(record: Record, why: PoisonRecordError, now: dt.datetime) -> None:
        poisoned.append(why)

    take = Intake(PREFIX, Admission.for_tiers(SizeLimits(), DELAYS_S), Holds(), Metrics(),
                  start=lambda task, record: tasks.append(task), deliver=deliver, poison=poison)
    take.dispatch([record(HIGH, 5)], NOW, None)
    [task] = tasks
    with pytest.raises(AcceptedUnrecordedError):
        asyncio.run(task)
    assert poisoned == []
