"""Decides whether a record read from Kafka may be delivered: the rules enqueue applies, plus bounds
on what only an event carries (attempt, not_before, its size). Pure.

Anyone able to write to the priority or retry topics can hand the sender an event; what fails here
goes to the dead-letter topic as ``poison`` with the reason, and is never sent.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
from collections.abc import Sequence

from postroom import rules
from postroom.errors import InvalidContentError
from postroom.headers import attempt_base
from schemas.codec import EmailRequested, SchemaById, SchemaError, decode

# Senders' clocks may differ a little: a not_before this far past the longest delay is refused.
CLOCK_SKEW_ALLOWANCE_S = 300.0
# Header bytes a record may carry beyond its value: the schema header and the history the retry
# tiers add (one line of at most a few hundred characters per attempt).
HEADERS_ALLOWANCE_BYTES = 32 * 1024


@dataclasses.dataclass(frozen=True)
class Refusal:
    """Why a record is poison; ``copy_record`` False when it is too large to copy to the
    dead-letter topic (its value and headers stay where they are, in the source topic)."""

    reason: str
    copy_record: bool = True


@dataclasses.dataclass(frozen=True)
class Admission:
    """What the sender accepts: the size caps, the number of attempts, the longest retry delay."""

    limits: rules.SizeLimits
    max_attempt: int
    max_delay_s: float

    @classmethod
    def for_tiers(cls, limits: rules.SizeLimits, retry_delays_s: Sequence[float]) -> Admission:
        return cls(limits, len(retry_delays_s) + 1, max(retry_delays_s, default=0.0))


def record_size(value: bytes | None, headers: Sequence[tuple[str, str | bytes | None]]) -> int:
    """Bytes of a record's value and headers, as the broker counts them (near enough)."""
    return len(value or b"") + sum(len(k) + len(v or b"") for k, v in headers)


def refuse_record(size: int, admission: Admission) -> Refusal | None:
    """A refusal for a record too large to be an event enqueue could have written."""
    most = admission.limits.event_max_bytes + HEADERS_ALLOWANCE_BYTES
    if size > most:
        return Refusal(f"the record is {size} bytes, over the limit of {most} "
                       "(POSTROOM_EVENT_MAX_BYTES plus headers)", copy_record=False)
    return None


def refuse_event(event: EmailRequested, *, on_retry_topic: bool, now: dt.datetime,
                 admission: Admission, attempt_base: int = 0) -> Refusal | None:
    """A refusal for an event no enqueue and no sender of ours could have written, or None.

    ``attempt_base`` is the attempts a redriven row had before (its record's header): its
    attempts of this round are counted from there.
    """
    low, high = 1 + attempt_base, admission.max_attempt + attempt_base
    if not low <= event.attempt <= high:
        return Refusal(f"attempt {event.attempt} is outside {low}..{high}")
    if on_retry_topic and event.attempt < low + 1:
        return Refusal(f"attempt {event.attempt} on a retry topic, where attempts start at "
                       f"{low + 1}")
    if event.not_before is not None:
        latest = now + dt.timedelta(seconds=admission.max_delay_s + CLOCK_SKEW_ALLOWANCE_S)
        if event.not_before > latest:
            return Refusal(f"not_before {event.not_before.isoformat()} is further ahead than "
                           f"the longest retry delay ({admission.max_delay_s:.0f}s)")
    try:
        _check_content(event, admission.limits)
    except InvalidContentError as exc:
        return Refusal(str(exc))
    return None


def _check_content(event: EmailRequested, limits: rules.SizeLimits) -> None:
    """The rules of enqueue, on what the event carries."""
    rules.check_address(event.recipient)
    _check_shared(event.sender, event.subject, event.message_key)
    if rules.has_control(event.idempotency_key) or not event.idempotency_key.strip():
        raise InvalidContentError("idempotency key is empty or holds a control character")
    rules.check_body(event.body, limits.body_max_bytes)
    rules.check_attachment_count(len(event.attachments))
    for path in event.attachments:
        rules.check_attachment_path(path)


@functools.lru_cache(maxsize=1024)
def _check_shared(sender: str, subject: str, message_key: str) -> None:
    """The checks of what every recipient of one report shares, once per report that passes (a
    failure is not kept: it raises every time)."""
    if sender:  # empty: the sender's POSTROOM_MAIL_FROM
        rules.check_mailbox(sender)
    rules.check_subject(subject)
    rules.check_key(message_key)


def admit(value: bytes | None, headers: Sequence[tuple[str, str | bytes | None]], *,
          on_retry_topic: bool, now: dt.datetime, admission: Admission,
          schema_by_id: SchemaById | None = None) -> EmailRequested | Refusal:
    """The event a record holds, or why it is poison: too large, unreadable, or breaking the
    rules (its attempts counted from its ``postroom.attempt_base`` header)."""
    refusal = refuse_record(record_size(value, headers), admission)
    if refusal is not None:
        return refusal
    try:
        event = decode(EmailRequested, value, list(headers), schema_by_id=schema_by_id)
    except SchemaError as exc:
        return Refusal(str(exc))
    return refuse_event(event, on_retry_topic=on_retry_topic, now=now, admission=admission,
                        attempt_base=attempt_base(list(headers))) or event
