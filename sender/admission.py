"""Decides whether a record read from Kafka may be delivered: its headers, key and value decoded,
the rules enqueue applies, plus bounds on what only an event carries (attempt, not_before, its
size). Pure.

Anyone able to write to the priority or retry topics can hand the sender a record. :func:`admit`
is the one boundary: it returns what may be delivered, or raises PoisonRecordError (dead-lettered
as ``poison`` with the reason, its row ended by a ``failed`` result, never sent); only a writer
schema the registry cannot give now raises SchemaUnavailableError instead (the record waits).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence

from postroom import rules
from postroom.errors import InvalidContentError
from postroom.headers import (
    ATTEMPT_BASE_HEADER,
    ROW_ID_HEADER,
    PostroomHeaders,
    read_headers,
)
from postroom.schemas.codec import EmailRequested
from postroom.schemas.decoding import decode
from postroom.schemas.errors import SchemaError, SchemaUnavailableError
from postroom.schemas.framing import SchemaById, header_value
from postroom.sender.errors import PoisonRecordError

# Senders' clocks may differ a little: a not_before up to this far past the longest delay waits.
CLOCK_SKEW_ALLOWANCE_S = 300.0
# Header bytes a record may carry beyond its value: the schema header and the history the retry
# tiers add (one line of at most a few hundred characters per attempt).
HEADERS_ALLOWANCE_BYTES = 32 * 1024

Headers = Sequence[tuple[str, str | bytes | None]]


@dataclasses.dataclass(frozen=True)
class Admission:
    """What the sender accepts: the size caps, the number of attempts, the longest retry delay."""

    limits: rules.SizeLimits
    max_attempt: int
    max_delay_s: float

    @classmethod
    def for_tiers(cls, limits: rules.SizeLimits, retry_delays_s: Sequence[float]) -> Admission:
        return cls(limits, len(retry_delays_s) + 1, max(retry_delays_s, default=0.0))


@dataclasses.dataclass(frozen=True, slots=True)
class Admitted:
    """A record the sender may deliver: its event, and the attempts its row had before this
    round of the retry chain (its ``postroom.attempt_base`` header)."""

    event: EmailRequested
    attempt_base: int = 0


def record_size(value: bytes | None, headers: Headers) -> int:
    """Bytes of a record's value and headers, as the broker counts them (near enough)."""
    return len(value or b"") + sum(len(k) + len(v or b"") for k, v in headers)


def readable_key(key: bytes | str | None) -> str | None:
    """A record's key as text fit to name an outbox row in a result (UTF-8, one line, no longer
    than the relay writes), else None."""
    if key is None:
        return None
    if isinstance(key, bytes):
        if len(key) > 4 * rules.IDEMPOTENCY_KEY_MAX_CHARS:
            return None
        try:
            key = key.decode()
        except UnicodeDecodeError:
            return None
    if not key.strip() or len(key) > rules.IDEMPOTENCY_KEY_MAX_CHARS \
            or rules.has_control(key, tab_allowed=True) or not key.isprintable():
        return None
    return key


def admit(value: bytes | None, headers: Headers, *, key: bytes | str | None = None,
          tier: int | None = None, now: dt.datetime, admission: Admission,
          schema_by_id: SchemaById | None = None) -> Admitted:
    """The event a record holds, read from its value, key and headers of any content; ``tier``:
    the retry tier of the topic it was read from (None for a priority topic).

    PoisonRecordError when the record is too large, unreadable or breaks the rules (its attempts
    counted from its ``postroom.attempt_base`` header); SchemaUnavailableError when the registry
    cannot give its writer schema now. Nothing else.
    """
    size = record_size(value, headers)
    most = admission.limits.event_max_bytes + HEADERS_ALLOWANCE_BYTES
    if size > most:
        raise PoisonRecordError(f"the record is {size} bytes, over the limit of {most} "
                                "(POSTROOM_EVENT_MAX_BYTES plus headers)", copy_record=False,
                                key=readable_key(key), row_id=_row_id(headers),
                                attempt_base=_attempt_base(headers))
    try:
        found = read_headers(headers)
    except InvalidContentError as exc:
        raise PoisonRecordError(str(exc), key=readable_key(key), row_id=_row_id(headers),
                                attempt_base=_attempt_base(headers)) from None
    try:
        event = decode(EmailRequested, value, headers, schema_by_id=schema_by_id)
    except SchemaUnavailableError:
        raise
    except SchemaError as exc:
        raise _poison(str(exc), key, found) from None
    refusal = refuse_event(event, tier=tier, now=now, admission=admission,
                           attempt_base=found.attempt_base)
    if refusal is not None:
        raise _poison(refusal, key, found, event)
    return Admitted(clamp_not_before(event, now, admission), found.attempt_base)


def _poison(reason: str, key: bytes | str | None, found: PostroomHeaders,
            event: EmailRequested | None = None) -> PoisonRecordError:
    # The key is read only for a refusal: an admitted record does not need it.
    return PoisonRecordError(reason, key=readable_key(key), event=event, row_id=found.row_id,
                             attempt_base=found.attempt_base)


def _row_id(headers: Headers) -> int | None:
    """The row id of headers that may not all be readable (for the result of a poison record)."""
    raw = header_value(headers, ROW_ID_HEADER)
    try:
        return read_headers([(ROW_ID_HEADER, raw)]).row_id
    except InvalidContentError:
        return None


def _attempt_base(headers: Headers) -> int | None:
    """The attempt base of headers that may not all be readable: None when it is unreadable."""
    raw = header_value(headers, ATTEMPT_BASE_HEADER)
    try:
        return read_headers([(ATTEMPT_BASE_HEADER, raw)]).attempt_base
    except InvalidContentError:
        return None


def refuse_event(event: EmailRequested, *, tier: int | None, now: dt.datetime,
                 admission: Admission, attempt_base: int = 0) -> str | None:
    """Why no enqueue and no sender of ours could have written ``event``, or None.

    ``tier``: the retry tier it was read from, None for a priority topic. ``attempt_base`` is
    the attempts a redriven row had before (its record's header): its attempts of this round are
    counted from there. A tier beyond today's (POSTROOM_RETRY_DELAYS shortened while retries
    waited on it) holds attempts up to its own number.
    """
    low = 1 + attempt_base
    high = max(admission.max_attempt, (tier or 0) + 1) + attempt_base
    if not low <= event.attempt <= high:
        return f"attempt {event.attempt} is outside {low}..{high}"
    # Tier 1 also holds a first attempt our configuration kept back (a wait is no attempt:
    # RetryPolicy.wait); the later tiers hold attempts from the second on.
    first = low if tier == 1 else low + 1
    if tier is not None and event.attempt < first:
        return f"attempt {event.attempt} on retry tier {tier}, where attempts start at {first}"
    try:
        _check_content(event, admission.limits)
    except InvalidContentError as exc:
        return str(exc)
    return None


def clamp_not_before(event: EmailRequested, now: dt.datetime,
                     admission: Admission) -> EmailRequested:
    """``event``, due now when its not_before is further ahead than the longest retry delay
    allows (POSTROOM_RETRY_DELAYS shortened while it waited, or a clock far ahead): it is
    attempted at once rather than held for a delay no tier has any more."""
    if event.not_before is None:
        return event
    latest = now + dt.timedelta(seconds=admission.max_delay_s + CLOCK_SKEW_ALLOWANCE_S)
    if event.not_before <= latest:
        return event
    return dataclasses.replace(event, not_before=now)


def _check_content(event: EmailRequested, limits: rules.SizeLimits) -> None:
    """The rules of enqueue, on what the event carries."""
    rules.check_address(event.recipient)
    rules.check_shared(event.sender, event.subject, event.message_key)
    rules.check_idempotency_key(event.idempotency_key)
    rules.check_body(event.body, limits.body_max_bytes)
    rules.check_attachment_count(len(event.attachments))
    for path in event.attachments:
        rules.check_attachment_path(path)

