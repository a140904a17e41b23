"""Every SQL statement postroom runs against the outbox, in one place: one module per role
(publish, record, enqueue, suppression, reads, operators), all of it importable from here.

The relay never scans the outbox: unpublished rows are also in ``outbox_queue`` (an insert trigger
puts them there) until Kafka has acknowledged them, so the relay's cost follows the backlog, not
the history, and the outbox row itself is written once when published, in place.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Each module is imported when one of its names is first asked for: a job's enqueue takes
# enqueue's statements (plain text) without the others, which load SQLAlchemy.
if TYPE_CHECKING:
    from postroom.relay.sql.enqueue import (
        HAS_TRACE_COLUMNS,
        INSERT_EMAILS,
        INSERT_EMAILS_COLUMNS,
        INSERT_ROW,
        INSERT_ROWS,
        insert_emails,
        insert_row,
        insert_rows,
        outbox_of,
    )
    from postroom.relay.sql.operators import (
        COUNT_PURGEABLE_LEDGER,
        COUNT_PURGEABLE_OUTBOX,
        FAILURES_REPORT,
        FINAL_FAILURES,
        NOTIFY_RELAY,
        PURGE_LEDGER_BATCH,
        PURGE_OUTBOX_BATCH,
        REDRIVABLE,
        REDRIVE,
        STATES_OF_KEYS,
        UNDELIVERED_STATES,
    )
    from postroom.relay.sql.publish import (
        CLAIM_DUE,
        MARK_FAILED,
        MARK_PUBLISHED,
        MARK_SUPPRESSED,
        PIN_CLAIM_PLAN,
        RELEASE_CLAIMS,
        claim_due,
        pin_claim_plan,
        take_claims_owner,
    )
    from postroom.relay.sql.reads import (
        OUTBOX_BACKLOG,
        STATUS_COLUMNS,
        outbox_backlog,
        status_count_query,
        status_query,
    )
    from postroom.relay.sql.record import (
        ADD_SOFT_BOUNCES,
        CLEAR_SOFT_BOUNCES,
        RECORD_BOUNCE,
        RECORD_COMPLAINT,
        RECORD_DELAY,
        RECORD_RESULT,
        ROW_OF_REPORT,
        SUPPRESS_SOFT_BOUNCES,
    )
    from postroom.relay.sql.suppression import (
        PURGE_SUPPRESSION,
        SUPPRESSION_ADD,
        SUPPRESSION_LIST,
        SUPPRESSION_REMOVE,
    )
    from postroom.relay.sql.tables import NOTIFY_CHANNEL, metadata, outbox

_MODULES = ("enqueue", "operators", "publish", "reads", "record", "suppression", "tables")

__all__ = [
    "ADD_SOFT_BOUNCES",
    "CLAIM_DUE",
    "CLEAR_SOFT_BOUNCES",
    "COUNT_PURGEABLE_LEDGER",
    "COUNT_PURGEABLE_OUTBOX",
    "FAILURES_REPORT",
    "FINAL_FAILURES",
    "HAS_TRACE_COLUMNS",
    "INSERT_EMAILS",
    "INSERT_EMAILS_COLUMNS",
    "INSERT_ROW",
    "INSERT_ROWS",
    "MARK_FAILED",
    "MARK_PUBLISHED",
    "MARK_SUPPRESSED",
    "NOTIFY_CHANNEL",
    "NOTIFY_RELAY",
    "OUTBOX_BACKLOG",
    "PIN_CLAIM_PLAN",
    "PURGE_LEDGER_BATCH",
    "PURGE_OUTBOX_BATCH",
    "PURGE_SUPPRESSION",
    "RECORD_BOUNCE",
    "RECORD_COMPLAINT",
    "RECORD_DELAY",
    "RECORD_RESULT",
    "REDRIVABLE",
    "REDRIVE",
    "RELEASE_CLAIMS",
    "ROW_OF_REPORT",
    "STATES_OF_KEYS",
    "STATUS_COLUMNS",
    "SUPPRESSION_ADD",
    "SUPPRESSION_LIST",
    "SUPPRESSION_REMOVE",
    "SUPPRESS_SOFT_BOUNCES",
    "UNDELIVERED_STATES",
    "claim_due",
    "insert_emails",
    "insert_row",
    "insert_rows",
    "metadata",
    "outbox",
    "outbox_backlog",
    "outbox_of",
    "pin_claim_plan",
    "status_count_query",
    "status_query",
    "take_claims_owner",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        for module_name in _MODULES:
            module = importlib.import_module(f"{__name__}.{module_name}")
            if name in vars(module):
                value = vars(module)[name]
                globals()[name] = value
                return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
