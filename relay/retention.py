"""`postroom purge`: deletes finished outbox rows and their ledger entries in short batches.

Only final rows (sent, failed, dead) that are not queued again; ledger rows only when no outbox
row needs them and when they are older than every topic's retention, so a consumer group reset to
the beginning of a topic still finds each key it already sent.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Callable

import sqlalchemy as sa

from relay import sql

log = logging.getLogger(__name__)

BATCH_ROWS = 1000
PAUSE_BETWEEN_BATCHES_S = 0.05  # lets autovacuum and other writers in between batches


@dataclasses.dataclass(frozen=True)
class PurgePlan:
    outbox_cutoff: dt.datetime
    ledger_cutoff: dt.datetime | None  # None: topics keep records forever, so keep the ledger
    ledger_reason: str
    outbox_rows: int
    ledger_rows: int


def ledger_cutoff(outbox_cutoff: dt.datetime, now: dt.datetime,
                  retention_s: float | None) -> tuple[dt.datetime | None, str]:
    """The ledger's cutoff: the outbox's, or older when a topic keeps records longer. Pure."""
    if retention_s is None:
        return None, ("a topic keeps its records forever (retention.ms=-1): ledger rows are "
                      "kept, so a replayed topic finds every key it already sent")
    by_retention = now - dt.timedelta(seconds=retention_s)
    if by_retention < outbox_cutoff:
        return by_retention, (f"ledger rows younger than the topics' retention "
                              f"({_days(retention_s)}) are kept: a consumer group reset to the "
                              "beginning must find each key it already sent")
    return outbox_cutoff, f"the topics' retention ({_days(retention_s)}) is shorter than the cutoff"


def plan(engine: sa.Engine, older_than_s: float, now: dt.datetime,
         retention_s: float | None) -> PurgePlan:
    outbox_cutoff = now - dt.timedelta(seconds=older_than_s)
    cutoff, reason = ledger_cutoff(outbox_cutoff, now, retention_s)
    with engine.connect() as conn:
        outbox_rows = conn.execute(sql.COUNT_PURGEABLE_OUTBOX, {"cutoff": outbox_cutoff}).one()[0]
        ledger_rows = 0 if cutoff is None else conn.execute(
            sql.COUNT_PURGEABLE_LEDGER, {"cutoff": cutoff, "outbox_cutoff": outbox_cutoff}
        ).scalar_one()
    return PurgePlan(outbox_cutoff, cutoff, reason, int(outbox_rows), int(ledger_rows))


def purge(engine: sa.Engine, plan: PurgePlan, batch: int = BATCH_ROWS,
          progress: Callable[[str], None] = log.info) -> tuple[int, int]:
    """Delete what the plan counted, batch by batch: (outbox rows, ledger rows) deleted."""
    outbox_done = _in_batches(engine, sql.PURGE_OUTBOX_BATCH, 0, "outbox", progress,
                              cutoff=plan.outbox_cutoff, batch=batch)
    ledger_done = 0
    if plan.ledger_cutoff is not None:
        ledger_done = _in_batches(engine, sql.PURGE_LEDGER_BATCH, "", "ledger", progress,
                                  cutoff=plan.ledger_cutoff, batch=batch)
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
    return f"{days:g} days" if days >= 1 else f"{seconds / 3600:g} hours"
