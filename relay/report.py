"""`postroom report failures`: the rows that did not reach their recipient (failed, dead, bounced
after the server took them, or suppressed before an attempt), printed or mailed to the report
owner through postroom's own outbox (so the report is as durable as any other email)."""

from __future__ import annotations

import csv
import dataclasses
import datetime as dt
import hashlib
import io
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from postroom.errors import PostroomError
from postroom.relay import sql
from postroom.relay.outbox import enqueue
from postroom.relay.validation import check_address
from postroom.rules import SizeLimits

# Failures listed in a mailed report's body; the rest are counted (and in the CSV, when attached).
BODY_MAX_LINES = 500
# Room in the event for everything but the body (subject, keys, addresses, the Avro framing).
EVENT_ROOM_BYTES = 16 * 1024
CSV_FIELDS = ("recipient", "message_key", "idempotency_key", "subject", "status", "attempts",
              "last_error", "updated_at")
REPORTS_DIR = "postroom-reports"  # below POSTROOM_ATTACHMENTS_ROOT


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
    """Rows that ended failed, dead, bounced or suppressed and changed at or after ``since``,
    oldest first."""
    with engine.connect() as conn:
        return [Failure(**row._mapping) for row in conn.execute(sql.FAILURES_REPORT,
                                                                {"since": since})]


def render_lines(failures: Sequence[Failure], since: dt.datetime) -> list[str]:
    if not failures:
        return [f"no email ended failed, dead, bounced or suppressed since {_when(since)}"]
    lines = [f"{len(failures)} email(s) ended failed, dead, bounced or suppressed since "
             f"{_when(since)}:"]
    for f in failures:
        # A multi-line SMTP reply (or a row written by SQL) must not break the line.
        lines.append(" | ".join(" ".join(part.split()) or "-" for part in [
            f.recipient, f.message_key, f.subject, f.status, f"attempts={f.attempts}",
            f.last_error or "-"]))
    return lines


def report_key(failures: Sequence[Failure]) -> str:
    """The report's message key: the same rows in the same states give the same key, so mailing
    one report twice queues it once, and a report with a new failure is a new email."""
    digest = hashlib.sha256()
    for f in failures:
        digest.update(f"{f.id}:{f.status}:{f.attempts}\n".encode())
    return f"postroom-failures-{digest.hexdigest()[:16]}"


@dataclasses.dataclass(frozen=True)
class MailedReport:
    key: str
    queued: int
    listed: int                 # failures in the body
    attached: Path | None       # the CSV with every failure, when written
    in_csv: int = 0             # failures in the CSV (all, unless over the attachment cap)


def report_body(failures: Sequence[Failure], since: dt.datetime, limits: SizeLimits,
                attached: str | None, csv_rows: int = 0) -> tuple[str, int]:
    """The mailed report's text and how many failures it lists: at most BODY_MAX_LINES, and
    never more than the body and event caps take; what is left out is counted, and found in the
    attached CSV (``attached``: its file name) or with the command. Pure."""
    budget = min(limits.body_max_bytes, limits.event_max_bytes - EVENT_ROOM_BYTES)
    head, *lines = render_lines(failures, since)
    if attached is not None:
        where = (f"every one of them is in the attached {attached}" if csv_rows == len(failures)
                 else f"the first {csv_rows} are in the attached {attached} (the attachment cap)")
    else:
        where = (f"`postroom report failures --since {since.isoformat()}` prints them all "
                 "(with POSTROOM_ATTACHMENTS_ROOT set, the full list is attached as CSV)")
    tail = ["", "Sent by `postroom report failures`. `postroom requeue --key KEY` sends a failed "
            "email again once its address is fixed."]
    more_room = len(f"... and {len(failures)} more; {where}\n".encode()) + 64
    used = sum(len(line.encode()) + 1 for line in [head, *tail]) + more_room
    listed: list[str] = []
    for line in lines[:BODY_MAX_LINES]:
        size = len(line.encode()) + 1
        if used + size > budget:
            break
        listed.append(line)
        used += size
    more = len(lines) - len(listed)
    middle = [f"... and {more} more; {where}"] if more else (
        [f"The list is also attached as {attached}."] if attached is not None else [])
    return "\n".join([head, *listed, *middle, *tail]) + "\n", len(listed)


# A cell a spreadsheet would read as a formula (OWASP's CSV injection list).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(text: str) -> str:
    """``text`` as a spreadsheet shows it and never runs it: one starting a formula gets a
    leading ``'`` (a job's subject or a server's reply may start with ``=``). Pure."""
    return "'" + text if text.startswith(FORMULA_STARTS) else text


def render_csv(failures: Sequence[Failure]) -> str:
    """Every failure as CSV with a header row (spreadsheets read it, no cell a formula). Pure."""
    return csv_lines((), header=True) + csv_lines(failures)


def csv_lines(failures: Iterable[Failure], *, header: bool = False) -> str:
    """The CSV lines of ``failures`` (after the header row when ``header``): render_csv in
    pieces, for a stream. Pure."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    if header:
        writer.writerow(CSV_FIELDS)
    for f in failures:
        writer.writerow([*map(csv_cell, (f.recipient, f.message_key, f.idempotency_key,
                                         f.subject, f.status)),
                         f.attempts, csv_cell(f.last_error or ""), f.updated_at.isoformat()])
    return out.getvalue()


def _write_csv(directory: Path, key: str, failures: Sequence[Failure],
               max_bytes: int) -> tuple[Path, int]:
    """Write the CSV as ``directory/REPORTS_DIR/<key>.csv`` (whole, or its first rows within
    ``max_bytes``), atomically: (path, failures in it)."""
    rows = len(failures)
    text = render_csv(failures)
    while len(text.encode()) > max_bytes and rows:
        rows = rows * max_bytes // len(text.encode()) if rows > 1 else 0
        text = render_csv(failures[:rows])
    folder = directory / REPORTS_DIR
    if folder.is_symlink():
        # The sender follows no symbolic link below its root; nor does the report write through one.
        raise PostroomError(f"{folder} is a symbolic link; the report writes only to a real "
                            "directory below POSTROOM_ATTACHMENTS_ROOT")
    path = folder / f"{key}.csv"
    partial = path.with_suffix(".csv.tmp")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        partial.write_text(text, encoding="utf-8", newline="")
        os.replace(partial, path)
    except OSError as exc:
        raise PostroomError(f"cannot write the report's CSV below POSTROOM_ATTACHMENTS_ROOT "
                            f"({directory}): {exc}") from exc
    return path, rows


def mail_report(conn: sa.Connection, failures: Sequence[Failure], since: dt.datetime,
                to: str, limits: SizeLimits, attachments_root: Path | None) -> MailedReport:
    """Queue the report for ``to`` in the caller's transaction. The body lists what fits; with
    ``attachments_root`` (the directory the senders read attachments from) the full list is
    written below it as CSV and attached."""
    key = report_key(failures)
    check_address(to)  # a refused address leaves no CSV behind
    attached, in_csv = None, 0
    if attachments_root is not None:
        attached, in_csv = _write_csv(attachments_root, key, failures,
                                      min(limits.attachment_max_bytes,
                                          limits.attachments_total_max_bytes))
    body, listed = report_body(failures, since, limits,
                               attached.name if attached is not None else None, in_csv)
    queued = enqueue(conn, key=key, recipients=[to], subject=(
        f"postroom: {len(failures)} undeliverable email(s) since {_when(since)}"), body=body,
        attachments=[attached] if attached is not None else [], limits=limits)
    return MailedReport(key, queued, listed, attached, in_csv)


def render_json(failures: Sequence[Failure]) -> list[str]:
    return [json.dumps(f.as_json()) for f in failures]


def _when(moment: dt.datetime) -> str:
    utc = moment.astimezone(dt.UTC)
    return f"{utc.year:04d}-{utc:%m-%d %H:%M} UTC"  # %Y gives year 1 as "1"
