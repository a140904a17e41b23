"""What the bounce intake answers an MTA: which addresses of the bounce domain it takes (a
signed token, or the bare address with the token inside the report), and, for a message, which
results it publishes. The rows and the results topic are protocols, so tests use fakes; an
outage of either is a 4xx (the MTA keeps the report and tries again), never a lost report."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from postroom.bounces.errors import BouncesError, Refusal, UnusableReportError
from postroom.bounces.limits import LogBudget
from postroom.bounces.mapping import OutboxRow, results_for
from postroom.bounces.reports import Report, parse_report
from postroom.metrics import BOUNCE_HELD_TOTAL, BOUNCE_REFUSED_TOTAL, BOUNCE_REPORTS_TOTAL, Metrics
from postroom.schemas.codec import EmailResult
from postroom.verp import ExpiredTokenError, ForgedTokenError, TokenError, read_token

log = logging.getLogger(__name__)

HELD_REPLY = "451 4.3.0 cannot record the report now, try again later"
ACCEPTED_REPLY = "250 2.0.0 report recorded"
IGNORED_REPLY = "250 2.0.0 accepted, nothing to record"
UNKNOWN_REPLY = "550 5.1.1 no such email"
NOT_OURS_REPLY = "550 5.1.1 no such address"
FORGED_REPLY = "550 5.7.1 token not valid"
EXPIRED_REPLY = "550 5.1.1 token expired"
_TOKEN_REPLIES = {Refusal.FORGED_TOKEN: FORGED_REPLY, Refusal.EXPIRED_TOKEN: EXPIRED_REPLY}
# Refusal lines logged at most, each REFUSAL_LOG_INTERVAL_S: anyone can send junk, a line each
# (one connection's tiny messages were 150 lines a second); every refusal is counted
# (postroom_bounce_refused_total{reason}), and a line says how many were left out before it.
REFUSAL_LOG_LINES = 10
REFUSAL_LOG_INTERVAL_S = 1.0


class UnavailableError(BouncesError):
    """The database or Kafka cannot answer now: the report waits at the MTA."""


class Rows(Protocol):
    def row(self, outbox_id: int) -> OutboxRow | None:
        """The row of ``outbox_id``, None when there is none; UnavailableError on an outage."""


class Results(Protocol):
    def publish(self, results: Sequence[EmailResult]) -> None:
        """Publish and wait for the broker's acknowledgements; UnavailableError if not all come."""


@dataclasses.dataclass(frozen=True)
class BounceConfig:
    """The settings the intake reads (from POSTROOM_BOUNCE_*)."""

    address: str
    secrets: tuple[bytes, ...]
    max_age: dt.timedelta


def _token_refusal(exc: TokenError) -> Refusal:
    if isinstance(exc, ForgedTokenError):
        return Refusal.FORGED_TOKEN
    if isinstance(exc, ExpiredTokenError):
        return Refusal.EXPIRED_TOKEN
    return Refusal.MALFORMED_TOKEN


@dataclasses.dataclass(frozen=True)
class Accepted:
    """A recipient of the bounce domain taken at RCPT: the row its token names, or None for
    the bare address (the token is looked for in the report)."""

    address: str
    outbox_id: int | None


class Intake:
    """Decides the replies of one bounce listener; thread-safe (it keeps no session state)."""

    def __init__(self, config: BounceConfig, rows: Rows, results: Results, metrics: Metrics,
                 clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._config = config
        self._log_budget = LogBudget(REFUSAL_LOG_LINES, REFUSAL_LOG_INTERVAL_S, monotonic)
        self._log_lock = threading.Lock()
        self._local, _, self._domain = config.address.rpartition("@")
        self._rows = rows
        self._results = results
        self._metrics = metrics
        self._clock = clock

    def _refuse(self, refusal: Refusal, detail: str) -> None:
        self._metrics.inc(BOUNCE_REFUSED_TOTAL, reason=refusal.value)
        with self._log_lock:
            left_out = self._log_budget.take()
        if left_out is None:
            return
        log.warning("bounce refused (%s): %s%s", refusal.value, detail,
                    f" ({left_out} refusals before this one not logged)" if left_out else "")

    def _read(self, text: str) -> int:
        return read_token(text, self._config.address, self._config.secrets, self._clock(),
                          self._config.max_age)

    def recipient(self, address: str) -> Accepted | str:
        """What RCPT TO ``address`` gets: Accepted, or the reply that refuses it."""
        local, _, domain = address.rpartition("@")
        if domain.lower() != self._domain.lower() or not local.lower().startswith(
                self._local.lower()):
            self._refuse(Refusal.NO_TOKEN, f"RCPT to another address ({domain[:100]!r})")
            return NOT_OURS_REPLY
        if local.lower() == self._local.lower():
            return Accepted(address, None)
        try:
            return Accepted(address, self._read(address))
        except TokenError as exc:
            refusal = _token_refusal(exc)
            self._refuse(refusal, f"RCPT {local[:80]!r}: {exc}")
            return _TOKEN_REPLIES.get(refusal, NOT_OURS_REPLY)

    def _outbox_id(self, accepted: Accepted, report: Report) -> int | None:
        if accepted.outbox_id is not None:
            return accepted.outbox_id
        errors: list[TokenError] = []
        for hint in report.token_hints:
            try:
                return self._read(hint)
            except TokenError as exc:
                errors.append(exc)
        # The worst of what was found: a forged token says more than a missing one.
        refusals = [_token_refusal(exc) for exc in errors]
        for refusal in (Refusal.FORGED_TOKEN, Refusal.EXPIRED_TOKEN, Refusal.MALFORMED_TOKEN):
            if refusal in refusals:
                self._refuse(refusal, f"report to {accepted.address[:80]!r}: the token in it")
                return None
        self._refuse(Refusal.NO_TOKEN, f"report to {accepted.address[:80]!r} names no token")
        return None

    def message(self, recipients: Sequence[Accepted], raw: bytes) -> str:
        """The reply to DATA: the report's results published and acknowledged (250), nothing to
        record (250, counted), a token naming no row (550), or an outage (451)."""
        try:
            report = parse_report(raw)
        except UnusableReportError as exc:
            self._refuse(exc.refusal, str(exc))
            return IGNORED_REPLY
        now = self._clock()
        results: list[EmailResult] = []
        unknown = 0
        seen: set[int] = set()
        try:
            for accepted in recipients:
                outbox_id = self._outbox_id(accepted, report)
                if outbox_id is None or outbox_id in seen:
                    continue
                seen.add(outbox_id)
                row = self._rows.row(outbox_id)
                if row is None:
                    unknown += 1
                    self._refuse(Refusal.UNKNOWN_ROW, f"outbox_id={outbox_id}")
                    continue
                mapped = results_for(report, row, now)
                for _ in range(mapped.mismatched):
                    self._refuse(Refusal.RECIPIENT_MISMATCH,
                                 f"outbox_id={outbox_id}: a notice about another recipient")
                results.extend(mapped.results)
                log.info("bounce report %s for outbox_id=%d key=%s domain=%s: %d result(s)",
                         report.describe(), outbox_id, row.idempotency_key,
                         row.recipient.rpartition("@")[2], len(mapped.results))
            if results:
                self._results.publish(results)
        except UnavailableError as exc:
            self._metrics.inc(BOUNCE_HELD_TOTAL)
            log.warning("bounce report held (%s): answered 451, the MTA tries again", exc)
            return HELD_REPLY
        for result in results:
            self._metrics.inc(BOUNCE_REPORTS_TOTAL, status=result.status.value)
        if results:
            return ACCEPTED_REPLY
        return UNKNOWN_REPLY if unknown and unknown == len(seen) else IGNORED_REPLY
