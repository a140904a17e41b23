"""`postroom purge`: deletes finished outbox rows and their ledger entries in short batches.

Only final rows (sent, bounced, failed, dead, suppressed) that are not queued again; ledger rows
only when no outbox row needs them and when they are older than every topic's retention, so a
consumer group reset to the beginning of a topic still finds each key it already sent; then the
suppression entries that expired before the cutoff and the soft bounces counted before it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import re
import time
from collections.abc import Callable

import sqlalchemy as sa

from postroom.relay import sql

log = logging.getLogger(__name__)

BATCH_ROWS = 1000
PAUSE_BETWEEN_BATCHES_S = 0.05  # lets autovacuum and other writers in between batches
# The youngest cutoff allowed without --force when the topics' retention is unknown or forever.
DEFAULT_MIN_AGE_S = 7 * 86_400.0
# What the retention figures printed count: a record stays until its segment goes.
KEPT = ": retention.ms + segment.ms"
FINAL_STATES = ("sent", "failed", "dead")
# Final too, counted in the plan only when there are some (the plan's line stays as it was).
LATER_FINAL_STATES = ("bounced", "suppressed")
MAX_AGE_S = 100 * 365 * 86_400.0  # older than any row; and a cutoff datetime can hold it

AGE_FORMS = "30d or 30days (days), 12h (hours), 90m (minutes), 2w (weeks)"
# Units that read as a month or a year, which have no fixed length: refused, never guessed (`m`
# is minutes only, `M` is refused for reading as either).
_CALENDAR_UNITS = frozenset({"mo", "mon", "mons", "month", "months", "y", "yr", "yrs", "year",
                             "years"})
_AGE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*", re.IGNORECASE)
_AGE_UNIT_S = {
    **dict.fromkeys(("w", "week", "weeks"), 7 * 86_400.0),
    **dict.fromkeys(("d", "day", "days"), 86_400.0),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), 3_600.0),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60.0),
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1.0),
}


def parse_age_s(text: str) -> float:
    """``"30d"``, ``"30days"``, ``"30 days"`` -> seconds: the one duration syntax of the
    operators' commands (`purge --older-than`, `suppression add --expires`). A number without a
    unit is refused: such a command must never guess (a bare ``30`` once meant 30 seconds, and
    ``--expires 90`` 90 seconds); so are months and years, and ``M``. Pure."""
    match = _AGE.fullmatch(text)
    shown = repr(text.strip()[:40])
    if match is None:
        if re.fullmatch(r"\s*\d+(?:\.\d+)?\s*", text):
            raise ValueError(f"{shown} has no unit; write it as {AGE_FORMS}")
        raise ValueError(f"not an age: {shown}; write it as {AGE_FORMS}")
    unit = match.group(2)
    if unit.lower() in _CALENDAR_UNITS:
        raise ValueError(f"{shown}: months and years have no fixed length; write days, e.g. "
                         f"90d (or {AGE_FORMS})")
    if unit == "M":
        raise ValueError(f"{shown}: 'M' reads as minutes or months; write 90m or 90min for "
                         f"minutes, 30d for about a month (or {AGE_FORMS})")
    unit_s = _AGE_UNIT_S.get(unit.lower())
    if unit_s is None:
        raise ValueError(f"unknown unit {match.group(2)[:20]!r} in {shown}; write it as "
                         f"{AGE_FORMS}")
    value = float(match.group(1)) * unit_s
    if value <= 0:
        raise ValueError(f"an age must be more than 0: {shown}")
    if value > MAX_AGE_S:
        years = f"{MAX_AGE_S / 86_400 / 365:g} years"
        raise ValueError(f"at most {years} ({MAX_AGE_S / 86_400:.0f}d): more than {years} is "
                         f"past any row's age or expiry, got {shown}")
    return value


def minimum_age_s(retention_s: float | None) -> tuple[float, str]:
    """The youngest cutoff purge takes without ``--force``, and where it comes from: the topics'
    retention when they have one, else DEFAULT_MIN_AGE_S. Pure."""
    if retention_s is None or retention_s <= 0:
        return DEFAULT_MIN_AGE_S, f"the minimum of {_days(DEFAULT_MIN_AGE_S)}"
    return retention_s, f"the topics' retention ({_days(retention_s)})"


@dataclasses.dataclass(frozen=True)
class PurgePlan:
    outbox_cutoff: dt.datetime
    ledger_cutoff: dt.datetime | None  # None: topics keep records forever, so keep the ledger
    ledger_reason: str
    outbox_by_state: dict[str, int]
    ledger_rows: int

    @property
    def outbox_rows(self) -> int:
        return sum(self.outbox_by_state.values())


def render_plan(plan: PurgePlan, older_than_s: float) -> list[str]:
    """What a purge will delete, in the words `postroom purge` prints before deleting."""
    cutoff = plan.outbox_cutoff.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    counts = ", ".join([*(f"{plan.outbox_by_state.get(state, 0)} {state}" for state in FINAL_STATES),
                        *(f"{plan.outbox_by_state[state]} {state}" for state in LATER_FINAL_STATES
                          if plan.outbox_by_state.get(state))])
    return [f"cutoff {cutoff} ({_days(older_than_s)} ago): outbox rows that ended sent, bounced, "
            f"failed, dead or suppressed before it and are not queued again",
            f"outbox: {plan.outbox_rows} row(s) to delete ({counts})",
            f"ledger: {plan.ledger_rows} row(s) to delete; {plan.ledger_reason}"]


def ledger_cutoff(outbox_cutoff: dt.datetime, now: dt.datetime,
                  retention_s: float | None) -> tuple[dt.datetime | None, str]:
    """The ledger's cutoff: the outbox's, or older when a topic keeps records longer
    (``retention_s``: the longest a topic keeps a record, postroom.kafka.topic_retention's
    record_life_s).
    Pure."""
    if retention_s is None:
        return None, ("a topic keeps its records forever (retention.ms=-1): ledger rows are "
                      "kept, so a replayed topic finds every key it already sent")
    by_retention = now - dt.timedelta(seconds=retention_s)
    if by_retention < outbox_cutoff:
        # Not "the topics' retention", which is retention.ms alone (minimum_age_s): one dry
        # run named two different retentions.
        return by_retention, (f"ledger rows younger than the longest a topic may keep a record "
                              f"({_days(retention_s)}{KEPT}) are kept: a consumer group reset "
                              "to the beginning must find each key it already sent")
    return outbox_cutoff, (f"the longest a topic may keep a record ({_days(retention_s)}{KEPT}) "
                           "is shorter than the cutoff")


def plan(engine: sa.Engine, older_than_s: float, now: dt.datetime,
         retention_s: float | None) -> PurgePlan:
    outbox_cutoff = now - dt.timedelta(seconds=older_than_s)
    cutoff, reason = ledger_cutoff(outbox_cutoff, now, retention_s)
    with engine.connect() as conn:
        by_state = {str(state): int(count) for state, count in conn.execute(
            sql.COUNT_PURGEABLE_OUTBOX, {"cutoff": outbox_cutoff})}
        ledger_rows = 0 if cutoff is None else conn.execute(
            sql.COUNT_PURGEABLE_LEDGER, {"cutoff": cutoff, "outbox_cutoff": outbox_cutoff}
        ).scalar_one()
    return PurgePlan(outbox_cutoff, cutoff, reason, by_state, int(ledger_rows))


def purge(engine: sa.Engine, plan: PurgePlan, batch: int = BATCH_ROWS,
          progress: Callable[[str], None] = log.info) -> tuple[int, int]:
    """Delete what the plan counted, batch by batch: (outbox rows, ledger rows) deleted."""
    outbox_done = _in_batches(engine, sql.PURGE_OUTBOX_BATCH, 0, "outbox", progress,
                              cutoff=plan.outbox_cutoff, batch=batch)
    ledger_done = 0
    if plan.ledger_cutoff is not None:
        ledger_done = _in_batches(engine, sql.PURGE_LEDGER_BATCH, "", "ledger", progress,
                                  cutoff=plan.ledger_cutoff, batch=batch)
    with engine.begin() as conn:
        expired, counted = conn.execute(sql.PURGE_SUPPRESSION,
                                        {"cutoff": plan.outbox_cutoff}).one()
    if expired or counted:
        progress(f"deleted {expired} suppression entr(ies) expired before the cutoff and "
                 f"{counted} soft bounce(s) counted before it")
    return outbox_done, ledger_done


def _in_batches(engine: sa.Engine, statement: sa.TextClause, start: object, what: str,
                progress: Callable[[str], None], **params: object) -> int:
    """Run a keyset-batched DELETE ... RETURNING key until it deletes nothing; each batch is its
    own transaction and starts after the largest key the previous one deleted."""
    done, after = 0, start
    while True:
        with engine.begin() as conn:
            keys = [row[0] for row in conn.execute(statement, {"after": after, **params})]
        if not keys:
            return done
        done += len(keys)
        after = max(keys)
        progress(f"deleted {done} {what} row(s) so far")
        time.sleep(PAUSE_BETWEEN_BATCHES_S)


def _days(seconds: float) -> str:
    days = seconds / 86_400
    value, unit = ((days, "day") if days >= 1 else (seconds / 3600, "hour") if seconds >= 3600
                   else (seconds / 60, "minute"))
    shown = f"{value:,.0f}" if value >= 100 else f"{value:.3g}"
    return f"{shown} {unit}" + ("" if shown == "1" else "s")
