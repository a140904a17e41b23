"""What a delivery result or a report writes to its outbox row: the checks and parameters of one
result, and the statements that apply a batch of results, reports and soft bounces."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import re
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from postroom.errors import first_line
from postroom.relay import sql
from postroom.rules import ascii_domain_address, respelled_key
from postroom.schemas.codec import DeliveryStatus, EmailResult
from postroom.settings import Settings

# What a result's texts may put in a row: an SMTP reply is a few lines, a Message-ID at most one
# header line, an enhanced code a few characters. Longer text is cut, marked by "...".
ERROR_MAX_CHARS = 2000
MESSAGE_ID_MAX_CHARS = 998
ENHANCED_CODE_MAX_CHARS = 32
# How far ahead of the recorder's clock a result may be dated: hosts' clocks differ by seconds,
# not a day. A later date is forged or broken, and would be read as a date to compute from (a
# suppression's expiry, past the end of datetime at 9999-12-31), a sent_at no purge reaches, or
# an entry past the year 9999 that `suppression list` cannot read back.
RESULT_MAX_AHEAD_S = 86400.0
# PostgreSQL text holds no NUL, and psycopg cannot send a lone surrogate.
_NUL = "\x00"
_SURROGATE = re.compile("[\ud800-\udfff]")


def spellings(result: EmailResult) -> dict[str, str]:
    """The key and recipient a result names its row by, as written and as a row holds them
    since migration 0015 (the domain as A-labels): a result of an event published before the
    upgrade matches its rewritten row, and one of a row an earlier release wrote after it
    matches that row (the same for ASCII addresses). ``mailbox`` is the address a report
    suppresses."""
    return {"idempotency_key": result.idempotency_key, "recipient": result.recipient,
            "mailbox": ascii_domain_address(result.recipient),
            "mailbox_key": respelled_key(result.idempotency_key, result.recipient)}


def result_params(result: EmailResult, max_attempt: int) -> dict[str, Any]:
    return {
        "max_attempt": max_attempt,
        **spellings(result),
        "outbox_id": result.outbox_id,
        "status": result.status.value,
        "attempt": result.attempt,
        "error": result.error,
        "smtp_code": result.smtp_code,
        "enhanced_code": result.enhanced_code,
        "message_id": result.message_id,
        "occurred_at": result.occurred_at,
        "next_attempt_at": result.next_attempt_at,
    }


def result_problem(result: EmailResult, now: dt.datetime | None = None) -> str | None:
    """Why ``result`` cannot be a result the sender (or postroom bounces) wrote at ``now``
    (None: the wall clock), or None. The row itself is matched in RECORD_RESULT (id, key and
    recipient), and so is the attempt's upper bound: a redriven row's attempts go on past the
    tiers, so a result may be at most ``max_attempt`` past the row's."""
    for name, text in (("key", result.idempotency_key), ("recipient", result.recipient)):
        if _NUL in text or _SURROGATE.search(text):
            return f"its {name} holds a NUL or a lone surrogate: it names no row"
    # A 'retrying' result of attempt 0: an email that waits on the sender's configuration
    # before its first attempt (a wait is no attempt).
    lowest = 0 if result.status is DeliveryStatus.RETRYING else 1
    if result.attempt < lowest:
        return f"attempt {result.attempt} is below {lowest}"
    latest = (now or dt.datetime.now(dt.UTC)) + dt.timedelta(seconds=RESULT_MAX_AHEAD_S)
    if result.occurred_at > latest:
        return (f"it occurred at {result.occurred_at.isoformat()}, more than "
                f"{RESULT_MAX_AHEAD_S / 3600:g} h ahead of this clock")
    if result.status is DeliveryStatus.RETRYING and result.next_attempt_at is None:
        return "a retrying result without next_attempt_at"
    if result.status is not DeliveryStatus.RETRYING and result.next_attempt_at is not None:
        return f"a {result.status.value} result with next_attempt_at"
    if result.status is DeliveryStatus.SENT and result.error is not None:
        return "a sent result with an error"
    return None


def storable(text: str | None, max_chars: int) -> str | None:
    """``text`` as a row can hold it: a NUL shown as ``\\x00``, a lone surrogate as U+FFFD, at
    most ``max_chars`` long (cut with "...")."""
    if text is None:
        return None
    if _NUL in text:
        text = text.replace(_NUL, "\\x00")
    if not text.isascii() and _SURROGATE.search(text):
        text = _SURROGATE.sub("\ufffd", text)
    return text if len(text) <= max_chars else text[:max_chars - 3] + "..."


def storable_result(result: EmailResult) -> EmailResult:
    """``result`` with its error, Message-ID and enhanced code as a row can hold them."""
    error = storable(result.error, ERROR_MAX_CHARS)
    message_id = storable(result.message_id, MESSAGE_ID_MAX_CHARS)
    enhanced_code = storable(result.enhanced_code, ENHANCED_CODE_MAX_CHARS)
    if (error, message_id, enhanced_code) == (result.error, result.message_id,
                                              result.enhanced_code):
        return result
    return dataclasses.replace(result, error=error, message_id=message_id,
                               enhanced_code=enhanced_code)


# What postroom bounces publishes: reports about an email the server had accepted.
REPORT_STATUSES = frozenset({DeliveryStatus.BOUNCED, DeliveryStatus.DELAYED,
                             DeliveryStatus.COMPLAINED})
_REPORT_STATEMENT = {DeliveryStatus.BOUNCED: sql.RECORD_BOUNCE,
                     DeliveryStatus.DELAYED: sql.RECORD_DELAY,
                     DeliveryStatus.COMPLAINED: sql.RECORD_COMPLAINT}
SUPPRESSION_REASON_MAX_CHARS = 500
SERVICE_CLOSING = 421


@dataclasses.dataclass(frozen=True)
class ReportPolicy:
    """What the reports do beside their rows: how long an address stays suppressed, and how many
    dead rows in a row suppress it (0: none)."""

    expiry_s: float
    soft_limit: int

    @classmethod
    def from_settings(cls, settings: Settings) -> ReportPolicy:
        return cls(settings.suppression_expiry_s, settings.soft_bounce_limit)


@dataclasses.dataclass
class ReportsApplied:
    """What a batch's reports and soft bounces did: rows changed, by report status, and the
    addresses suppressed (or kept longer), by source."""

    changed: int = 0
    ignored: int = 0
    suppressed: dict[str, int] = dataclasses.field(default_factory=dict)

    def suppress(self, source: str, count: int) -> None:
        if count:
            self.suppressed[source] = self.suppressed.get(source, 0) + count


def report_error(result: EmailResult) -> str:
    """The last error a report leaves on its row: what it is, its Status, the diagnostic
    (``bounced 5.1.1: smtp; 550 5.1.1 <a@example.com>: user unknown``)."""
    code = f" {result.enhanced_code}" if result.enhanced_code else ""
    text = result.error or (f"SMTP {result.smtp_code}" if result.smtp_code else "no diagnostic")
    return storable(f"{result.status.value}{code}: {text}", ERROR_MAX_CHARS) or ""


def report_params(result: EmailResult, policy: ReportPolicy) -> dict[str, Any]:
    error = report_error(result)
    reason = " ".join(error.split())
    return {
        "outbox_id": result.outbox_id,
        **spellings(result),
        "error": error,
        "smtp_code": result.smtp_code,
        "enhanced_code": result.enhanced_code,
        "reason": storable(reason, SUPPRESSION_REASON_MAX_CHARS),
        "source": "complaint" if result.status is DeliveryStatus.COMPLAINED else "bounce",
        # From when the report was made, not when it is read: read again, it asks the same.
        "expires_at": result.occurred_at + dt.timedelta(seconds=policy.expiry_s),
    }


def apply_reports(conn: sa.Connection, reports: Sequence[EmailResult], policy: ReportPolicy,
                  applied: ReportsApplied, *, each: bool = False) -> list[tuple[EmailResult, str]]:
    """Apply bounced, delayed and complained results in order, one statement each (they are a
    few in a thousand; two for one row must see each other). ``each``: under a savepoint each,
    returning those the database refused with why, as apply_each does."""
    refused: list[tuple[EmailResult, str]] = []
    for report in reports:
        statement, params = _REPORT_STATEMENT[report.status], report_params(report, policy)
        try:
            with conn.begin_nested() if each else contextlib.nullcontext():
                changed, suppressed = conn.execute(statement, params).one()
        except sa.exc.DBAPIError as exc:
            if not (each and refuses_the_data(exc)):
                raise
            refused.append((report, first_line(exc)))
            continue
        if changed and report.status is not DeliveryStatus.COMPLAINED:
            applied.changed += 1
        elif suppressed:
            applied.changed += 1
        else:
            applied.ignored += 1
        applied.suppress(params["source"], suppressed)
    return refused


def is_soft_bounce(result: EmailResult) -> bool:
    """Whether ``result`` is a soft bounce of its address: the email ended dead on the server's
    own temporary refusal (a 4xx reply). Not when no reply came (the server was down or
    unreachable: every address would count) nor on 421, the server closing for itself."""
    return (result.status is DeliveryStatus.DEAD and result.smtp_code is not None
            and 400 <= result.smtp_code < 500 and result.smtp_code != SERVICE_CLOSING)


def apply_soft_bounces(conn: sa.Connection, results: Sequence[EmailResult],
                       policy: ReportPolicy, applied: ReportsApplied) -> list[str]:
    """Count the batch's soft bounces towards their addresses, clear what sent emails'
    addresses counted, and suppress each address that reached the limit: the addresses
    suppressed."""
    if policy.soft_limit <= 0:
        return []
    dead = [r for r in results if is_soft_bounce(r)]
    sent = [r for r in results if r.status is DeliveryStatus.SENT]
    # An address counts as the mailbox it names (its domain as A-labels), however its row
    # spells it (results.spellings).
    if dead:
        conn.execute(sql.ADD_SOFT_BOUNCES, {
            "ids": [r.outbox_id for r in dead], "recipients": [r.recipient for r in dead],
            "mailboxes": [ascii_domain_address(r.recipient) for r in dead],
            "occurred_at": [r.occurred_at for r in dead]})
    if sent:
        conn.execute(sql.CLEAR_SOFT_BOUNCES, {
            "recipients": [ascii_domain_address(r.recipient) for r in sent],
            "occurred_at": [r.occurred_at for r in sent]})
    if not dead:
        return []
    suppressed = list(conn.execute(sql.SUPPRESS_SOFT_BOUNCES, {
        "addresses": sorted({ascii_domain_address(r.recipient) for r in dead}),
        "soft_limit": policy.soft_limit,
        "expiry_s": policy.expiry_s}).scalars())
    applied.suppress("soft", len(suppressed))
    return suppressed


def apply_results(conn: sa.Connection, results: Sequence[EmailResult], max_attempt: int) -> int:
    """Apply results in order; returns how many moved a row forward. One statement per result
    (a later one for the same row sees what an earlier one did), all sent at once: psycopg's
    executemany pipelines them, so a batch waits for one round trip, not one per result."""
    if not results:
        return 0
    return conn.execute(sql.RECORD_RESULT,
                        [result_params(result, max_attempt) for result in results]).rowcount


def apply_each(conn: sa.Connection, results: Sequence[EmailResult], max_attempt: int,
               ) -> tuple[int, list[tuple[EmailResult, str]]]:
    """Apply results one at a time, each under a savepoint, when a batch failed on what one of
    them held: (how many moved a row forward, the results the database refused with why)."""
    changed = 0
    refused: list[tuple[EmailResult, str]] = []
    for result in results:
        try:
            with conn.begin_nested():
                changed += conn.execute(sql.RECORD_RESULT,
                                        result_params(result, max_attempt)).rowcount
        except sa.exc.DBAPIError as exc:
            if not refuses_the_data(exc):
                raise
            refused.append((result, first_line(exc)))
    return changed, refused


def refuses_the_data(exc: sa.exc.DBAPIError) -> bool:
    """Whether the database refused what a statement carried (SQLSTATE class 22, a data
    exception, or 23, an integrity violation): only that is one result's doing. Anything else (a
    read-only standby after a failover, a revoked grant, a lost connection) is the database's,
    and would refuse every result alike: the batch then waits, uncommitted."""
    if isinstance(exc, (sa.exc.DataError, sa.exc.IntegrityError)):
        return True  # psycopg refuses a NUL itself, as a DataError without a SQLSTATE
    state = getattr(exc.orig, "sqlstate", None) or ""
    return state.startswith(("22", "23"))
