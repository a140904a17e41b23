"""Turns a report about one outbox row into the results the recorder applies: one EmailResult per
notice that concerns the row's recipient. Pure: the row and the clock are arguments."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence

from postroom.bounces.reports import Notice, Report
from postroom.errors import printable
from postroom.schemas.codec import EmailResult


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


def _same(a: str, b: str) -> bool:
    return a.strip().casefold() == b.strip().casefold()


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

