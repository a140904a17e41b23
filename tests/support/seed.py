"""The seed's September report: four recipients, and the outcome table every scenario test checks.

finance and ceo accepted at once, old.manager rejected 550 and failed after one attempt, ops
deferred 451 twice and sent after three attempts on the retry tiers.
"""

from __future__ import annotations

import email
import email.policy
from collections import Counter
from pathlib import Path

import sqlalchemy as sa

from postroom import enqueue
from sender.devsmtp import DevSmtpServer
from support.pipeline import outbox_rows, wait_for

TEAM = ["finance@example.com", "ops@example.com", "old.manager@example.com", "ceo@example.com"]
XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
TERMINAL = {"sent", "failed", "dead"}
KEY = "sales-2026-09"
SUBJECT = "Sales report — September 2026"
BODY = "The September sales report is attached."


def make_workbook(path: Path) -> Path:
    from openpyxl import Workbook

    book = Workbook()
    sheet = book.active
    sheet.append(["region", "sales"])
    sheet.append(["north", 1200])
    book.save(path)
    return path


def seed_server() -> DevSmtpServer:
    """The September report's mail server: rejects old.manager, defers ops twice."""
    return DevSmtpServer(port=0, reject={"old.manager@example.com"},
                         defer={"ops@example.com": 2})


def enqueue_september(engine: sa.Engine, report: Path) -> tuple[int, int]:
    """Queue the report for the team, then once more as a rerun of the job would."""
    counts = []
    for _ in range(2):
        with engine.begin() as conn:
            counts.append(enqueue(conn, key=KEY, recipients=TEAM, subject=SUBJECT, body=BODY,
                                  attachments=[report]))
    return counts[0], counts[1]


def check_september(engine: sa.Engine, server: DevSmtpServer, mail_from: str,
                    timeout_s: float = 60) -> None:
    """Wait until every row is final, then check the outcome table and what the server got."""
    rows = wait_for(lambda: (r := outbox_rows(engine, KEY))
                    and all(x.status in TERMINAL for x in r) and r, timeout_s,
                    "September delivered")
    table = {r.recipient: r for r in rows}
    assert {k: (v.status, v.attempts) for k, v in table.items()} == {
        "finance@example.com": ("sent", 1),
        "ops@example.com": ("sent", 3),
        "old.manager@example.com": ("failed", 1),
        "ceo@example.com": ("sent", 1),
    }
    failed = table["old.manager@example.com"]
    assert (failed.smtp_code, failed.enhanced_code) == (550, "5.1.1")
    assert "User unknown" in failed.last_error
    assert failed.sent_at is None
    # ops keeps its last deferral as the record of why it took three attempts.
    assert "451" in table["ops@example.com"].last_error
    assert table["finance@example.com"].last_error is None
    assert all(table[r].sent_at is not None for r in
               ("finance@example.com", "ops@example.com", "ceo@example.com"))

    received = server.messages
    assert sorted(m.rcpt for m in received) == [
        "ceo@example.com", "finance@example.com", "ops@example.com"]
    ids = Counter(m.message_id for m in received)
    assert len(ids) == 3 and max(ids.values()) == 1
    assert {table[m.rcpt].message_id for m in received} == set(ids)
    parsed = email.message_from_bytes(received[0].raw, policy=email.policy.default)
    parts = [p.get_content_type() for p in parsed.walk()]
    assert XLSX in parts and "text/plain" in parts
    assert parsed["Subject"] == SUBJECT
    assert parsed["From"] == mail_from
