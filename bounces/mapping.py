"""Turns a report about one outbox row into the results the recorder applies: one EmailResult per
notice that concerns the row's recipient. Pure: the row and the clock are arguments."""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from collections.abc import Sequence

from postroom.bounces.reports import Notice, Report
from postroom.errors import InvalidContentError, printable
from postroom.rules import canonical_domain
from postroom.schemas.codec import EmailResult

_XTEXT = re.compile(r"\+([0-9A-F]{2})")  # RFC 3461 4: ORCPT's encoding
_UNITEXT = re.compile(r"\\x\{([0-9A-Fa-f]{1,6})\}")  # RFC 6533 3: utf-8-addr-xtext
_MAX_CODE_POINT = 0x10FFFF


@dataclasses.dataclass(frozen=True)
class OutboxRow:
    """The fields of the row a token names that a result carries (read, never written here)."""

    outbox_id: int
    idempotency_key: str
    recipient: str
    attempts: int
    status: str


@dataclasses.dataclass(frozen=True)
class Mapped:
    """The results to publish and how many notices named another recipient (ignored, counted)."""

    results: tuple[EmailResult, ...]
    mismatched: int


def _mailbox(address: str) -> str:
    """One spelling of a mailbox to compare: without blanks and angle brackets, its domain as
    the row holds it (canonical_domain: an MTA may write the U-label), case-folded."""
    address = address.strip().strip("<>").strip()
    local, at, domain = address.rpartition("@")
    if at:
        try:
            address = f"{local}@{canonical_domain(domain)}"
        except InvalidContentError:
            pass  # no domain a row holds: compared as written, and so never the row's
    return address.casefold()


def _unitext(match: re.Match[str]) -> str:
    code = int(match.group(1), 16)
    return chr(code) if code <= _MAX_CODE_POINT else match.group(0)


def _spellings(named: str) -> set[str]:
    """The mailboxes a report's address may stand for: as written, and decoded from the
    encodings an MTA may leave on it (ORCPT's xtext, copied as sent; RFC 6533's ``\\x{HEX}``
    in a utf-8 address)."""
    decoded = _UNITEXT.sub(_unitext, named)
    forms = {named, decoded, *(_XTEXT.sub(lambda m: chr(int(m.group(1), 16)), form)
                                for form in (named, decoded))}
    return {_mailbox(form) for form in forms}


def _same(named: str, recipient: str) -> bool:
    return _mailbox(recipient) in _spellings(named)


def concerns(notice: Notice, row: OutboxRow, notices: int) -> bool:
    """Whether ``notice`` (one of ``notices`` in its report) is about ``row``'s recipient: named
    so, or unnamed (the signed token names the row), or a complaint's only notice (a forwarded
    address complains under its final name); a DSN's and a heuristic's address must be the row's
    own (a late DSN for an outbox id a restore gave again names the old address)."""
    if notice.recipient is None or _same(notice.recipient, row.recipient):
        return True
    return not notice.exact_recipient and notices == 1


def _error(notice: Notice) -> str:
    if notice.diagnostic:
        return printable(notice.diagnostic)
    return f"{notice.status.value}: Status {notice.enhanced_code or 'unknown'}"


def results_for(report: Report, row: OutboxRow, now: dt.datetime) -> Mapped:
    """The results ``report`` makes for ``row`` at ``now``: its key, id and recipient, the
    attempt the row has reached, the notice's Status, SMTP code and diagnostic."""
    notices: Sequence[Notice] = report.notices
    results = tuple(
        EmailResult(idempotency_key=row.idempotency_key, outbox_id=row.outbox_id,
                    recipient=row.recipient, status=notice.status,
                    attempt=max(row.attempts, 1), occurred_at=now,
                    smtp_code=notice.smtp_code, enhanced_code=notice.enhanced_code,
                    error=_error(notice))
        for notice in notices if concerns(notice, row, len(notices)))
    return Mapped(results, len(notices) - len(results))

