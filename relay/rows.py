"""Decides whether a claimed outbox row can become an email-requested event, and encodes it. Pure.

Rows are written by enqueue() and, as the docs allow, by SQL: :func:`event_value` is the relay's
one boundary for what a row holds. It returns the event's Avro value or raises PoisonRowError
saying why the row can never be one (the relay marks it ``failed``, ``poison: <reason>``).
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Sequence
from typing import Any

from postroom import rules
from postroom.errors import InvalidContentError, printable
from postroom.headers import ATTEMPT_BASE_MAX
from postroom.relay.errors import PoisonRowError
from postroom.schemas.codec import Schema, encode_values
from postroom.schemas.errors import SchemaError
from postroom.topics import Priority

# The claim's columns, as the contract names its fields (the relay checks the claim's names).
FIELDS = ("idempotency_key", "message_key", "outbox_id", "recipient", "sender", "subject", "body",
          "attachments", "priority", "created_at", "attempt", "not_before", "html", "inline")
POISON_PREFIX = "poison: "
# A redriven row's attempts so far travel as postroom.attempt_base (attempt - 1), which the
# sender reads up to ATTEMPT_BASE_MAX: a row past it would be refused there, after publishing.
ATTEMPT_MAX = ATTEMPT_BASE_MAX + 1
LONG_RANGE = (-(1 << 63), 1 << 63)
# The times a reader decodes (Python's datetime: years 1 to 9999), in milliseconds since 1970.
CREATED_RANGE_MS = (-62_135_596_800_000, 253_402_300_799_999)
# A reason goes into last_error and a log line, and may quote what the row held.
_PRIORITIES = frozenset(p.value for p in Priority)


def event_value(schema: Schema, row: Sequence[Any]) -> bytes:
    """The schemaless Avro value of the event of a claimed ``row`` (the claim's columns in
    FIELDS order), checked by the rules enqueue and the sender apply.

    PoisonRowError, and nothing else, when the row can never become an event the sender
    accepts: a column of the wrong type or NULL, a NULL or nested item in an array, an unknown
    priority, an infinite created_at, attempts out of range, a bad address, subject, key or
    attachment path. The caps that are settings (the body's, the attachments') are the sender's
    to apply, with its own settings; the relay applies the event's (POSTROOM_EVENT_MAX_BYTES).
    """
    try:
        check_row(row)
        return encode_values(schema, row)
    except (InvalidContentError, SchemaError) as exc:
        raise PoisonRowError(printable(str(exc))) from None


def check_row(row: Sequence[Any]) -> None:
    """InvalidContentError saying why ``row`` breaks the rules, else None."""
    if len(row) != len(FIELDS):
        raise InvalidContentError(f"the row has {len(row)} columns, not {len(FIELDS)}")
    (key, message_key, outbox_id, recipient, sender, subject, body, attachments, priority,
     created_at, attempt, not_before, html, inline) = row
    if not _is_int(outbox_id) or not LONG_RANGE[0] <= outbox_id < LONG_RANGE[1]:
        raise InvalidContentError(f"id {outbox_id!r} is not a 64-bit integer")
    if not isinstance(priority, str) or priority not in _PRIORITIES:
        raise InvalidContentError(f"priority {_short(priority)} is not one of "
                                  f"{sorted(_PRIORITIES)}")
    if not isinstance(created_at, dt.datetime) and (
            not _is_int(created_at) or not CREATED_RANGE_MS[0] <= created_at <= CREATED_RANGE_MS[1]):
        # Milliseconds since the epoch; the claim gives NULL for an infinite timestamp.
        raise InvalidContentError(f"created_at {_short(created_at)} (ms since 1970) is not a time "
                                  "a reader can read (years 1 to 9999)")
    if not _is_int(attempt) or not 1 <= attempt <= ATTEMPT_MAX:
        raise InvalidContentError(f"the attempt {_short(attempt)} (the row's attempts + 1 when "
                                  f"it was queued) is out of range 1..{ATTEMPT_MAX}")
    if not_before is not None:
        raise InvalidContentError("not_before must be NULL in a claimed row")
    rules.check_idempotency_key(key)
    if isinstance(recipient, str) and len(recipient) > rules.MAX_ADDRESS_LEN:
        # Not quoted whole, as check_address would.
        raise InvalidContentError(f"recipient {_short(recipient)} is {len(recipient)} "
                                  f"characters, longer than {rules.MAX_ADDRESS_LEN}")
    rules.check_address(recipient)
    rules.check_shared(rules.require_str(sender, "sender"), rules.require_str(subject, "subject"),
                       rules.require_str(message_key, "message key"))
    if "\x00" in rules.require_str(body, "body"):
        raise InvalidContentError("body contains a NUL character")
    if html is not None and "\x00" in rules.require_str(html, "html"):
        raise InvalidContentError("html contains a NUL character")
    _check_paths(attachments, "attachments")
    _check_paths(inline, "inline")
    if inline and html is None:
        raise InvalidContentError("inline images need an html body that shows them")



def _check_paths(paths: object, what: str) -> None:
    if not isinstance(paths, list | tuple):
        raise InvalidContentError(f"{what} {_short(paths)} is not an array")
    rules.check_attachment_count(len(paths))
    for path in paths:
        if not isinstance(path, str):
            # A NULL item, or an item of a multi-dimensional array.
            raise InvalidContentError(f"{what} holds {_short(path)}, not a path")
        _check_path(path)


# A report's recipients share its attachments; a path's check (~20 us) is made once per path
# that passes.
_check_path = functools.lru_cache(maxsize=4096)(rules.check_attachment_path)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def epoch_s(created_at: int | dt.datetime) -> float:
    """Seconds since the epoch of a claimed row's created_at (milliseconds, or a datetime)."""
    return created_at.timestamp() if isinstance(created_at, dt.datetime) else created_at / 1000
