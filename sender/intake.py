"""What becomes of each record the sender reads: admitted and started as an attempt, held until its
retry tier's time, dead-lettered as poison, or held (its partition paused) while the schema
registry cannot say how it was written, an infrastructure fault that is waited out."""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Protocol

from postroom.errors import KafkaFatalError, first_line
from postroom.kafka import Record
from postroom.metrics import REGISTRY_UNAVAILABLE_TOTAL, RETRY_LATENESS_SECONDS, Metrics
from postroom.schemas.errors import SchemaUnavailableError
from postroom.schemas.framing import SchemaById
from postroom.sender.admission import Admission, Admitted, admit, readable_key
from postroom.sender.errors import AcceptedUnrecordedError, PoisonRecordError
from postroom.sender.publishing import origin_of
from postroom.sender.retry import due_in_s, lateness_s
from postroom.sender.routing import Origin
from postroom.topics import tier_of_retry_topic

log = logging.getLogger(__name__)

# A record whose writer schema the registry cannot give now waits, its partition paused, this
# long at first, twice as long each time it fails again, up to the most.
REGISTRY_RETRY_FIRST_S = 1.0
REGISTRY_RETRY_MOST_S = 30.0

Task = Coroutine[Any, Any, None]


class Holds(Protocol):
    """The consumer's side of a held partition (sender/consumer.py's SenderConsumer)."""

    @property
    def assigned(self) -> frozenset[tuple[str, int]]: ...

    def hold_until_due(self, record: Record, due: dt.datetime) -> None: ...


class Intake:
    """``dispatch(records, ...)`` after each fetch; ``start(task, record)`` runs what a record
    becomes, its offset stored once the task ends."""

    def __init__(self, topic_prefix: str, admission: Admission, holds: Holds, metrics: Metrics, *,
                 start: Callable[[Task, Record], None],
                 deliver: Callable[[Origin, Admitted], Task],
                 poison: Callable[[Record, PoisonRecordError, dt.datetime], Task]) -> None:
        self._prefix = topic_prefix
        self._admission = admission
        self._holds = holds
        self._metrics = metrics
        self._start = start
        self._deliver = deliver
        self._poison = poison
        self._registry_wait_s = REGISTRY_RETRY_FIRST_S
        self._registry_down_since: float | None = None
        self._registry_held: set[tuple[str, int]] = set()  # partitions waiting for it

    def dispatch(self, records: Sequence[Record], now: dt.datetime,
                 schema_by_id: SchemaById | None) -> None:
        held_back: set[tuple[str, int]] = set()
        waited = False
        for record in records:
            if record.tp in held_back:
                continue  # we rewound this partition; its later records come again
            tier = tier_of_retry_topic(self._prefix, record.topic)
            try:
                admitted = admit(record.value, record.headers, key=record.key, tier=tier,
                                 now=now, admission=self._admission, schema_by_id=schema_by_id)
            except SchemaUnavailableError as exc:
                self._wait_for_registry(record, exc, now)
                held_back.add(record.tp)
                waited = True
                continue
            except PoisonRecordError as exc:
                if record.tp in self._registry_held:
                    self._registry_answers(record.tp)  # it said what the record is
                self._start(self._poison(record, exc, now), record)
                continue
            except Exception as exc:  # no record may stop the sender
                # admit() raises nothing else (tests/unit/sender/test_record_boundary_properties);
                # were it to, the record is poison with the error's name, not a crash loop.
                log.exception("admitting %s[%d]@%d failed", record.topic, record.partition,
                              record.offset)
                poison = PoisonRecordError(f"unexpected {type(exc).__name__} while reading the "
                                           "record")
                self._start(self._poison(record, poison, now), record)
                continue
            if record.tp in self._registry_held:
                self._registry_answers(record.tp)
            event = admitted.event
            if tier is not None:
                if due_in_s(event.not_before, now) > 0:
                    self._holds.hold_until_due(record, event.not_before or now)
                    held_back.add(record.tp)
                    continue
                if event.not_before is not None:
                    self._metrics.observe(RETRY_LATENESS_SECONDS,
                                          lateness_s(event.not_before, now))
            self._start(self._delivered(record, admitted,
                                        self._deliver(origin_of(record), admitted)), record)
        if waited:
            self._registry_wait_s = min(self._registry_wait_s * 2, REGISTRY_RETRY_MOST_S)

    async def _delivered(self, record: Record, admitted: Admitted, delivery: Task) -> None:
        """The record's delivery; one that raises (a fault of ours, not of the record's content,
        which admission refuses) ends as poison naming the error, dead-lettered with its row
        ``failed`` (``postroom dlq replay`` sends it again once the fault is fixed). Left to
        raise, nothing would read the record again, its partition's commit point would stay
        behind it and its row would never end. A shutdown's cancellation is not such a fault,
        nor a Kafka client in its fatal state (the sender exits on it), nor an email a server
        accepted whose result cannot be published: those raise on, the record read again later
        (the ledger answers a sent one sent), never ended failed."""
        try:
            await delivery
        except (AcceptedUnrecordedError, KafkaFatalError):
            raise
        except Exception as exc:
            log.exception("the delivery of %s[%d]@%d failed; dead-lettering it as poison",
                          record.topic, record.partition, record.offset)
            poison = PoisonRecordError(
                f"the sender failed on it: {type(exc).__name__}: {first_line(exc)}",
                key=readable_key(record.key), event=admitted.event,
                attempt_base=admitted.attempt_base)
            await self._poison(record, poison, dt.datetime.now(dt.UTC))

    def _wait_for_registry(self, record: Record, exc: SchemaUnavailableError,
                           now: dt.datetime) -> None:
        """Hold ``record``'s partition at it until the registry may answer: an infrastructure
        fault, not poison. Logged once per outage; each hold is counted."""
        self._metrics.inc(REGISTRY_UNAVAILABLE_TOTAL)
        if self._registry_down_since is None:
            self._registry_down_since = time.monotonic()
            log.warning("the schema registry cannot give a writer schema (%s); records that need "
                        "it wait, their partitions paused, and are read again every %.0f-%.0fs",
                        exc, REGISTRY_RETRY_FIRST_S, REGISTRY_RETRY_MOST_S)
        self._registry_held.add(record.tp)
        self._holds.hold_until_due(record, now + dt.timedelta(seconds=self._registry_wait_s))

    def _registry_answers(self, tp: tuple[str, int]) -> None:
        self._registry_held.discard(tp)
        # A held partition revoked meanwhile waits elsewhere now.
        self._registry_held.intersection_update(self._holds.assigned)
        if self._registry_held or self._registry_down_since is None:
            return
        log.info("the schema registry answers again after %.0fs; delivering what waited",
                 time.monotonic() - self._registry_down_since)
        self._registry_down_since = None
        self._registry_wait_s = REGISTRY_RETRY_FIRST_S
