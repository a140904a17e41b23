"""The seed's design as the delivery baseline: a SQLite outbox delivered over one smtplib connection.

As /work/shared/seed describes it: one row per recipient, each due row sent on its own and its
status updated (sent; failed on 5xx; deferred with a doubling delay on 4xx or a lost connection).
"""

from __future__ import annotations

import datetime as dt
import smtplib
import sqlite3
from collections.abc import Iterable
from email.message import EmailMessage
from pathlib import Path

MAIL_FROM = "reports@example.com"
MAX_ATTEMPTS = 5
BASE_DELAY = dt.timedelta(minutes=5)
SMTP_TIMEOUT_S = 30

SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    id           INTEGER PRIMARY KEY,
    recipient    TEXT NOT NULL,
    subject      TEXT NOT NULL,
    body         TEXT NOT NULL,
    attachment   TEXT,
    status       TEXT NOT NULL DEFAULT 'pending',
    attempts     INTEGER NOT NULL DEFAULT 0,
    next_attempt TEXT NOT NULL,
    last_error   TEXT,
    sent_at      TEXT,
    UNIQUE (recipient, subject)
)"""


def open_outbox(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path)
    db.row_factory = sqlite3.Row
    db.execute(SCHEMA)
    return db


def enqueue(db: sqlite3.Connection, recipients: Iterable[str], subject: str, body: str,
            attachment: str | None, now: dt.datetime) -> int:
    """One row per recipient in one transaction; a rerun adds nothing (INSERT OR IGNORE)."""
    with db:
        cur = db.executemany(
            "INSERT OR IGNORE INTO outbox (recipient, subject, body, attachment, next_attempt) "
            "VALUES (?, ?, ?, ?, ?)",
            [(r, subject, body, attachment, now.isoformat()) for r in recipients])
    return cur.rowcount


def build(row: sqlite3.Row) -> EmailMessage:
    message = EmailMessage()
    message["From"], message["To"], message["Subject"] = MAIL_FROM, row["recipient"], row["subject"]
    message.set_content(row["body"])
    if row["attachment"]:
        path = Path(row["attachment"])
        message.add_attachment(path.read_bytes(), maintype="application",
                               subtype="vnd.openxmlformats-officedocument.spreadsheetml.sheet",
                               filename=path.name)
    return message


def defer(db: sqlite3.Connection, row: sqlite3.Row, error: str, now: dt.datetime) -> None:
    attempts = row["attempts"] + 1
    status = "failed" if attempts >= MAX_ATTEMPTS else "pending"
    db.execute("UPDATE outbox SET attempts=?, status=?, next_attempt=?, last_error=? WHERE id=?",
               (attempts, status, (now + BASE_DELAY * 2 ** (attempts - 1)).isoformat(), error,
                row["id"]))


def deliver_due(db: sqlite3.Connection, now: dt.datetime, host: str, port: int) -> dict[str, str]:
    """Send every due row over one connection, one at a time; return what happened per recipient."""
    due = db.execute("SELECT * FROM outbox WHERE status='pending' AND next_attempt<=? ORDER BY id",
                     (now.isoformat(),)).fetchall()
    if not due:
        return {}
    outcome: dict[str, str] = {}
    try:
        with smtplib.SMTP(host, port, timeout=SMTP_TIMEOUT_S) as smtp, db:
            for row in due:
                try:
                    smtp.send_message(build(row))
                    db.execute("UPDATE outbox SET status='sent', attempts=attempts+1, sent_at=? "
                               "WHERE id=?", (now.isoformat(), row["id"]))
                    outcome[row["recipient"]] = "sent"
                except smtplib.SMTPRecipientsRefused as exc:
                    code, text = exc.recipients[row["recipient"]]
                    error = f"{code} {text.decode()}"
                    if code >= 500:
                        db.execute("UPDATE outbox SET status='failed', attempts=attempts+1, "
                                   "last_error=? WHERE id=?", (error, row["id"]))
                        outcome[row["recipient"]] = f"failed ({code})"
                    else:
                        defer(db, row, error, now)
                        outcome[row["recipient"]] = f"retry later ({code})"
    except (OSError, smtplib.SMTPException) as exc:
        with db:
            for row in due:
                if row["recipient"] not in outcome:
                    defer(db, row, f"server: {exc}", now)
                    outcome[row["recipient"]] = "retry later (server)"
    return outcome
