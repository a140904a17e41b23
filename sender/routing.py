"""Decides where the outcome of one delivery attempt goes: the result to publish, and the record for
the next retry tier or the dead-letter topic with the headers that carry its history. Pure.

The service encodes and produces what :func:`route` returns; the schema header each record needs
is added there, with the encoding.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Sequence

# The header names live in the base: the relay's redrive reads them too.
from postroom.headers import (
    ATTEMPT_BASE_HEADER,
    DLQ_CLASS_HEADER,
    DLQ_OFFSET_HEADER,
    DLQ_PARTITION_HEADER,
    DLQ_REASON_HEADER,
    DLQ_TOPIC_HEADER,
    ERROR_HEADER,
)
from postroom.schemas.codec import DeliveryStatus, EmailRequested, EmailResult
from postroom.sender.admission import readable_key
from postroom.sender.errors import PoisonRecordError
from postroom.sender.outcome import Outcome, Verdict
from postroom.sender.retry import Action, RetryDecision
from postroom.topics import dead_letter_topic, retry_topic

STATUS_OF = {Action.DONE_SENT: DeliveryStatus.SENT, Action.RETRY: DeliveryStatus.RETRYING,
             Action.FAIL: DeliveryStatus.FAILED, Action.DEAD: DeliveryStatus.DEAD}
CLASSIFICATION_OF = {Action.FAIL: "permanent", Action.DEAD: "transient-exhausted"}

Headers = tuple[tuple[str, str | bytes | None], ...]
ATTEMPT_MAX = (1 << 31) - 1  # the results schema's int


@dataclasses.dataclass(frozen=True)
class Origin:
    """Where the event of an attempt was read."""

    topic: str
    partition: int
    offset: int
    headers: Headers = ()


@dataclasses.dataclass(frozen=True)
class Forward:
    """An event to produce besides the result: to the next retry tier, or to the dead letters."""

    topic: str
    event: EmailRequested
    headers: Headers


@dataclasses.dataclass(frozen=True)
class Routing:
    status: DeliveryStatus
    result: EmailResult
    forward: Forward | None = None
    waited: bool = False  # our configuration kept the attempt back: no attempt, no outcome


def route(prefix: str, origin: Origin, event: EmailRequested, outcome: Outcome,
          decision: RetryDecision, message_id: str, now: dt.datetime) -> Routing:
    """What to publish after ``event``, read at ``origin``, ended with ``outcome`` at ``now``."""
    status = STATUS_OF[decision.action]
    failed = outcome.verdict is not Verdict.SENT
    waited = failed and not decision.counted
    result = EmailResult(
        idempotency_key=event.idempotency_key, outbox_id=event.outbox_id,
        recipient=event.recipient, status=status,
        # A wait (our configuration kept the attempt back) is no attempt: its result counts
        # the attempts made before it, 0 for an email never attempted.
        attempt=event.attempt - 1 if waited else event.attempt, occurred_at=now,
        smtp_code=outcome.code, enhanced_code=outcome.enhanced_code,
        error=outcome.reason if failed else None, next_attempt_at=decision.not_before,
        message_id=message_id if decision.action is Action.DONE_SENT else None)
    earlier = errors_of(origin.headers)
    if waited:
        # A wait keeps its attempt's number: its line replaces
        # the line its last wait wrote, or a record waiting for days would grow by a line a
        # round until it was too large to read (dead-lettered as poison after about a week).
        mark = f"attempt={event.attempt} "
        earlier = tuple((k, v) for k, v in earlier
                        if not (k == ERROR_HEADER and _text(v).startswith(mark)))
    history = (*earlier, *(
        ((ERROR_HEADER, f"attempt={event.attempt} at={now.isoformat()} {outcome.reason}"),)
        if failed else ()))
    forward = None
    if decision.action is Action.RETRY:
        retry = dataclasses.replace(event, attempt=event.attempt + decision.counted,
                                    not_before=decision.not_before)
        forward = Forward(retry_topic(prefix, decision.tier or 1), retry, history)
    elif decision.action in CLASSIFICATION_OF:
        forward = Forward(dead_letter_topic(prefix), event, (
            *history, *dead_letter_headers(origin, CLASSIFICATION_OF[decision.action],
                                           outcome.reason)))
    return Routing(status, result, forward, waited)


def too_large_to_forward(event: EmailRequested, topic: str, now: dt.datetime) -> EmailResult:
    """The result of an event whose retry or dead letter Kafka refused as too large: it cannot
    go on, so it ends here as a permanent failure."""
    return EmailResult(
        idempotency_key=event.idempotency_key, outbox_id=event.outbox_id,
        recipient=event.recipient, status=DeliveryStatus.FAILED, attempt=event.attempt,
        occurred_at=now, error=f"its record for {topic} is too large for Kafka; not retried")


def already_sent(event: EmailRequested, message_id: str | None, now: dt.datetime) -> EmailResult:
    """The result of an event whose key a server accepted before (a redelivery): sent, once."""
    return EmailResult(
        idempotency_key=event.idempotency_key, outbox_id=event.outbox_id,
        recipient=event.recipient, status=DeliveryStatus.SENT, attempt=event.attempt,
        occurred_at=now, message_id=message_id)


def outcome_line(event: EmailRequested, decision: RetryDecision,
                 reason: str) -> tuple[int, str]:
    """The log level and line that say what became of an attempt (failures name the domain)."""
    key, attempt = event.idempotency_key, event.attempt
    if decision.action is Action.RETRY and not decision.counted:
        # The wait was said once at ERROR (Delivery.send); a line per email per tier delay
        # would repeat it for as long as the setting is missing.
        return logging.DEBUG, (f"key={key} attempt={attempt} waits ({reason}): retry tier "
                               f"{decision.tier} at {decision.not_before}, not an attempt")
    if decision.action is Action.RETRY:
        return logging.INFO, (f"key={key} attempt={attempt} transient ({reason}): retry tier "
                              f"{decision.tier} at {decision.not_before}")
    if decision.action in CLASSIFICATION_OF:
        what = ("failed permanently" if decision.action is Action.FAIL
                else "dead after the last retry tier")
        return logging.ERROR, (f"key={key} domain={event.recipient.rpartition('@')[2]} "
                               f"attempt={attempt} {what}: {reason}")
    return logging.INFO, f"key={key} attempt={attempt} sent: {reason}"


def errors_of(headers: Sequence[tuple[str, str | bytes | None]]) -> Headers:
    """The history a record carries along the retry chain: one error per failed attempt, and
    the attempt base of a redriven email."""
    return tuple((k, v) for k, v in headers if k in (ERROR_HEADER, ATTEMPT_BASE_HEADER))


def _text(value: str | bytes | None) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value or ""


def dead_letter_headers(origin: Origin, classification: str, reason: str) -> Headers:
    """Where a dead letter came from and why it is dead (``poison`` for an unreadable record)."""
    return ((DLQ_TOPIC_HEADER, origin.topic), (DLQ_PARTITION_HEADER, str(origin.partition)),
            (DLQ_OFFSET_HEADER, str(origin.offset)), (DLQ_CLASS_HEADER, classification),
            (DLQ_REASON_HEADER, reason))


POISON_PREFIX = "poison: "


def poison_result(poison: PoisonRecordError, now: dt.datetime) -> EmailResult | None:
    """The ``failed`` result that ends the outbox row of a poison record (last error
    ``poison: <reason>``), named as the recorder matches rows: by the event's key, row id and
    recipient when it decoded with a readable key, else by the record's key (the relay writes
    the idempotency key there), its row id header and the key's address. None when neither key
    is readable: such a record is only dead-lettered."""
    event, attempt = poison.event, None
    if event is not None and readable_key(event.idempotency_key) is not None \
            and readable_key(event.recipient) is not None:
        key, outbox_id, recipient = event.idempotency_key, event.outbox_id, event.recipient
        if 1 <= event.attempt <= ATTEMPT_MAX:
            attempt = event.attempt
    elif poison.key is not None:
        key, outbox_id, recipient = poison.key, poison.row_id or 0, recipient_of_key(poison.key)
    else:
        return None
    if attempt is None:
        attempt = (poison.attempt_base or 0) + 1
    return EmailResult(
        idempotency_key=key, outbox_id=outbox_id, recipient=recipient,
        status=DeliveryStatus.FAILED, attempt=attempt, occurred_at=now,
        error=POISON_PREFIX + poison.reason)


def recipient_of_key(key: str) -> str:
    """The address of an idempotency key ``message_key|address`` (the message key's own ``|``
    and ``\\`` escaped by a ``\\``); empty when it has no unescaped ``|``."""
    escaped = False
    for index, char in enumerate(key):
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == "|":
            return key[index + 1:]
    return ""
