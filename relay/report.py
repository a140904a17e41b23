"""`postroom report failures`: the rows that ended failed or dead, printed or mailed to the report
owner through postroom's own outbox (so the report is as durable as any other email)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from relay import sql
from relay.outbox import enqueue


@dataclasses.dataclass(frozen=True)
class Failure:
    id: int
    recipient: str
    message_key: str
    idempotency_key: str
    subject: str
    status: str
    attempts: int
    last_error: str | None
    updated_at: dt.datetime

    def as_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "updated_at": self.updated_at.isoformat()}


def failures_since(engine: sa.Engine, since: dt.datetime) -> list[Failure]:
    """Rows that ended failed or dead and changed at or after ``since``, oldest first."""
    with engine.connect() as conn:
        return [Failure(**row._mapping) for row in conn.execute(sql.FAILURES_REPORT,
                                                                {"since": since})]


def render_lines(failures: Sequence[Failure], since: dt.datetime) -> list[str]:
    if not failures:
        return [f"no email ended failed or dead since {_when(since)}"]
    lines = [f"{len(failures)} email(s) ended failed or dead since {_when(since)}:"]
    for f in failures:
        lines.append(" | ".join([f.recipient, f.message_key, f.subject, f.status,
                                 f"attempts={f.attempts}", f.last_error or "-"]))
    return lines


def report_key(failures: Sequence[Failure]) -> str:
    """The report's message key: the same rows in the same states give the same key, so mailing
    one report twice queues it once, and a report with a new failure is a new email."""
    digest = hashlib.sha256()
    for f in failures:
        digest.update(f"{f.id}:{f.status}:{f.attempts}\n".encode())
    return f"postroom-failures-{digest.hexdigest()[:16]}"


def mail_report(conn: sa.Connection, failures: Sequence[Failure], since: dt.datetime,
                to: str, attachment_max_bytes: int) -> tuple[str, int]:
    """Queue the report for ``to`` in the caller's transaction: (message key, rows queued)."""
    key = report_key(failures)
    body = "\n".join([*render_lines(failures, since), "",
                      "Sent by `postroom report failures`. `postroom requeue --key KEY` sends "
                      "a failed email again once its address is fixed."]) + "\n"
    queued = enqueue(conn, key=key, recipients=[to], subject=(
        f"postroom: {len(failures)} undeliverable email(s) since {_when(since)}"), body=body,
        attachment_max_bytes=attachment_max_bytes)
    return key, queued


def render_json(failures: Sequence[Failure]) -> list[str]:
    return [json.dumps(f.as_json()) for f in failures]


def _when(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
