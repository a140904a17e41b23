"""What a console request asks, checked: the search's filters and page, a suppression's fields, a
key to redrive. Each reader returns a value or raises FormError with one line to show. Pure."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping

from postroom.errors import PostroomError
from postroom.settings import parse_period_s

PAGE_ROWS = 50
# The outbox's and the audit's ids are PostgreSQL bigints: a larger one is no row, not a query.
ROW_ID_MAX = 2**63 - 1
KEY_MAX_CHARS = 1000
TEXT_MAX_CHARS = 500
# The outbox's states (relay/migrations/versions/0009_suppression.py's check).
STATES = ("pending", "published", "retrying", "sent", "failed", "dead", "bounced", "suppressed")


class FormError(PostroomError):
    """A field of the request is malformed."""


@dataclasses.dataclass(frozen=True)
class SearchFilter:
    message_key: str | None = None
    recipient: str | None = None
    status: str | None = None
    created_from: dt.datetime | None = None
    created_until: dt.datetime | None = None
    after: tuple[dt.datetime, int] | None = None  # the keyset: the last row of the page before

    def as_params(self) -> dict[str, str]:
        """The filters as the search form writes them (a next page's link keeps them)."""
        params = {"key": self.message_key or "", "recipient": self.recipient or "",
                  "state": self.status or "", "from": _field_time(self.created_from),
                  "until": _field_time(self.created_until)}
        return {name: value for name, value in params.items() if value}

    @property
    def empty(self) -> bool:
        return not self.as_params()


def _field_time(moment: dt.datetime | None) -> str:
    return "" if moment is None else moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M")


def text_field(form: Mapping[str, object], name: str, max_chars: int = TEXT_MAX_CHARS,
               label: str | None = None) -> str | None:
    """A text field with blanks around it removed; None when absent or blank."""
    value = form.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise FormError(f"{label or name}: expected text")
    value = value.strip()
    if len(value) > max_chars:
        raise FormError(f"{label or name}: longer than {max_chars} characters")
    if "\x00" in value:
        raise FormError(f"{label or name}: holds a NUL character")
    return value or None


def time_field(form: Mapping[str, object], name: str, label: str) -> dt.datetime | None:
    """A date (``2026-09-30``) or a date and time (``2026-09-30T14:05``, as a datetime-local
    input sends it), read as UTC; one with an offset is taken as written."""
    text = text_field(form, name, 40, label)
    if text is None:
        return None
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise FormError(f"{label}: not a date or time such as 2026-09-30T14:05 "
                        f"(UTC): {text!r}") from None
    moment = moment if moment.tzinfo is not None else moment.replace(tzinfo=dt.UTC)
    try:
        moment.astimezone(dt.UTC)  # 0001-01-01T00:00+14:00 is before the first UTC moment
    except OverflowError:
        raise FormError(f"{label}: out of range: {text!r}") from None
    return moment


def keyset(text: str | None) -> tuple[dt.datetime, int] | None:
    """The cursor of a next page (``<microseconds since 1970>_<id>``, as :func:`cursor` writes)."""
    if not text:
        return None
    micros, _, row_id = text.partition("_")
    try:
        at = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=int(micros))
        last_id = int(row_id)
    except (ValueError, OverflowError):
        last_id = -1
    if not 0 <= last_id <= ROW_ID_MAX:
        raise FormError(f"page: not a page of this search: {text[:40]!r}")
    return at, last_id


def audit_cursor(text: str | None) -> int | None:
    """The audit page's cursor: the id of the last entry of the page before."""
    if not text:
        return None
    if not (text.isascii() and text.isdigit()) or int(text) > ROW_ID_MAX:
        raise FormError(f"before: not a page of the audit: {text[:40]!r}")
    return int(text)


def cursor(at: dt.datetime, row_id: int) -> str:
    micros = (at - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)
    return f"{micros}_{row_id}"


def search_filter(query: Mapping[str, str]) -> SearchFilter:
    """The search page's filters from its query string."""
    status = text_field(query, "state", 20, "state")
    if status is not None and status not in STATES:
        raise FormError(f"state: one of {', '.join(STATES)}, not {status[:20]!r}")
    recipient = text_field(query, "recipient", 320, "recipient")
    created_from = time_field(query, "from", "from")
    created_until = time_field(query, "until", "until")
    if created_from and created_until and created_from >= created_until:
        raise FormError("from: must be before until")
    return SearchFilter(
        message_key=text_field(query, "key", KEY_MAX_CHARS, "message key"),
        recipient=recipient.lower() if recipient else None, status=status,
        created_from=created_from, created_until=created_until,
        after=keyset(text_field(query, "after", 60, "page")))


@dataclasses.dataclass(frozen=True)
class SuppressionForm:
    address: str
    reason: str | None
    expiry_s: float | None  # None: POSTROOM_SUPPRESSION_EXPIRY


def suppression_form(form: Mapping[str, object]) -> SuppressionForm:
    address = text_field(form, "address", 320, "address")
    if address is None:
        raise FormError("address: required")
    expires = text_field(form, "expires", 20, "expires")
    expiry_s = None
    if expires is not None:
        try:
            expiry_s = parse_period_s(expires)
        except ValueError as exc:
            raise FormError(f"expires: {exc}") from None
    return SuppressionForm(address, text_field(form, "reason", TEXT_MAX_CHARS, "reason"),
                           expiry_s)


def required_key(form: Mapping[str, object], name: str = "key") -> str:
    key = text_field(form, name, KEY_MAX_CHARS, name)
    if key is None:
        raise FormError(f"{name}: required")
    return key


PARTITIONS_MAX = 10_000


def letter_at(text: str | None) -> tuple[int, int]:
    """A dead letter's place, ``partition@offset``."""
    partition, at, offset = (text or "").partition("@")
    if not at or not partition.isdecimal() or not offset.isdecimal() or len(offset) > 19 \
            or int(partition) >= PARTITIONS_MAX:
        raise FormError(f"at: a dead letter's place is partition@offset, not {(text or '')[:40]!r}")
    return int(partition), int(offset)


def dlq_cursor(text: str | None) -> dict[int, int] | None:
    """A dead-letter page's cursor, ``partition:offset,...`` (as :func:`dlq_cursor_text` writes)."""
    if not text:
        return None
    cursor = {}
    for part in text.split(",")[:PARTITIONS_MAX]:
        partition, colon, offset = part.partition(":")
        if not colon or not partition.isdecimal() or not offset.isdecimal() or len(offset) > 19:
            raise FormError(f"before: not a page of the dead letters: {text[:40]!r}")
        cursor[int(partition)] = int(offset)
    return cursor


def dlq_cursor_text(cursor: dict[int, int]) -> str:
    return ",".join(f"{p}:{o}" for p, o in sorted(cursor.items()))
