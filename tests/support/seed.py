"""The September part of the seed's story (postroom.devkit.story), for every scenario test:
queue the report twice as a rerun of the job would, then check how each row ends and what the
mail server received."""

from __future__ import annotations

import email
import email.policy
from collections import Counter
from pathlib import Path

import sqlalchemy as sa

from postroom import enqueue
from postroom.devkit.devsmtp import DevSmtpServer
from postroom.devkit.story import DEFERRED, FINAL_STATUSES, REFUSED, SEPTEMBER, SEPTEMBER_ENDS
from postroom.devkit.wait import wait_until
from support.pipeline import outbox_rows

XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"


def seed_server() -> DevSmtpServer:
    """The story's mail server: refuses old.manager, defers ops twice (not started yet)."""
    return DevSmtpServer(port=0, reject={REFUSED}, defer=DEFERRED)


def enqueue_september(engine: sa.Engine, report: Path) -> list[int]:
    """Queue September twice (the report job runs twice by mistake); how many rows each queued."""
    queued = []
    for _ in range(2):
        with engine.begin() as conn:
            queued.append(enqueue(conn, key=SEPTEMBER.key, recipients=list(SEPTEMBER.recipients),
                                  subject=SEPTEMBER.subject, body=SEPTEMBER.body,
                                  attachments=[report]))
    return queued


def check_september(engine: sa.Engine, server: DevSmtpServer, mail_from: str,
                    timeout_s: float = 60) -> None:
    """Wait until every September row is final, then check the outcome table and the mail."""
    rows = wait_until(lambda: (r := outbox_rows(engine, SEPTEMBER.key))
                      and all(x.status in FINAL_STATUSES for x in r) and r, timeout_s,
                      "September delivered")
    table = {r.recipient: r for r in rows}
    assert {k: (v.status, v.attempts) for k, v in table.items()} == SEPTEMBER_ENDS == {
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
    assert parsed["Subject"] == SEPTEMBER.subject == "Sales report — September 2026"
    assert parsed["From"] == mail_from
