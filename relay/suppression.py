"""The suppression list: addresses postroom does not mail (a hard bounce, a complaint, soft
bounces in a row, or an operator said so), each until its entry expires. The relay finishes an
email to such an address as ``suppressed`` without publishing it; its SQL is in relay/sql.py.

An address is held as postroom compares recipients everywhere (the outbox's keys and the
recorder's matching): its domain in its one IDNA spelling (postroom.rules.canonical_domain:
UTS-46, A-labels), the whole address in lower case, the local part too. RFC 5321 lets a local
part be case-sensitive; no provider of note makes it so, and two spellings of one mailbox must
not escape the list. A sub-address (``a+tag@``) is an address of its own.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
from typing import Any

import sqlalchemy as sa

from postroom.errors import InvalidContentError, PostroomError, printable
from postroom.relay import sql
from postroom.rules import check_recipient

REASON_MAX_CHARS = 500
OPERATOR_REASON = "added by an operator"


class Source(enum.StrEnum):
    BOUNCE = "bounce"        # a delivery status notification: Action failed (5.x.x)
    COMPLAINT = "complaint"  # a feedback report (RFC 5965): the recipient said it is unwanted
    SOFT = "soft"            # POSTROOM_SOFT_BOUNCE_LIMIT emails in a row ended dead
    OPERATOR = "operator"    # postroom suppression add


class NotSuppressedError(PostroomError):
    """The address is not on the suppression list."""


@dataclasses.dataclass(frozen=True)
class Entry:
    address: str
    reason: str
    source: Source
    created_at: dt.datetime
    expires_at: dt.datetime

    @classmethod
    def from_row(cls, row: sa.Row[Any]) -> Entry:
        return cls(row.address, row.reason, Source(row.source), row.created_at, row.expires_at)

    def as_json(self) -> dict[str, str]:
        return {"address": self.address, "reason": self.reason, "source": self.source.value,
                "created_at": self.created_at.isoformat(),
                "expires_at": self.expires_at.isoformat()}


def checked(address: object) -> str:
    """``address`` if it is one bare ``local@domain``, its domain in its one IDNA spelling
    (InvalidContentError otherwise, saying why: a domain UTS-46 refuses among others). The list
    holds it in lower case as the database lowers it (``lower()``, as the relay and the bounce
    path compare it): Python's lowering differs from a database's locale for non-ASCII letters
    (under the C locale ``lower()`` lowers ASCII letters only), which only the local part can
    still hold."""
    return check_recipient(address, what="address")


def reason_of(text: str | None) -> str:
    """A reason as an entry holds it: one printable line, at most REASON_MAX_CHARS."""
    line = printable(" ".join((text or "").split())) or OPERATOR_REASON
    return line if len(line) <= REASON_MAX_CHARS else line[:REASON_MAX_CHARS - 3] + "..."


def entries(conn: sa.Connection) -> list[Entry]:
    """Every address suppressed now, by address."""
    return [Entry.from_row(row) for row in conn.execute(sql.SUPPRESSION_LIST)]


def add(conn: sa.Connection, address: str, reason: str | None, expiry_s: float) -> Entry:
    """Suppress ``address`` for ``expiry_s`` seconds from now, as the operator's entry (it
    replaces one the address had)."""
    if not expiry_s > 0:
        raise InvalidContentError("an entry must expire after a positive time")
    row = conn.execute(sql.SUPPRESSION_ADD, {"address": checked(address),
                                             "reason": reason_of(reason),
                                             "expiry_s": expiry_s}).one()
    return Entry.from_row(row)


def remove(conn: sa.Connection, address: str) -> str:
    """Take ``address`` off the list, with the soft bounces it counted; NotSuppressedError
    when it was not on it. Returns the address as the list held it."""
    removed, held = conn.execute(sql.SUPPRESSION_REMOVE, {"address": checked(address)}).one()
    if not removed:
        raise NotSuppressedError(f"{held} is not on the suppression list")
    return str(held)
