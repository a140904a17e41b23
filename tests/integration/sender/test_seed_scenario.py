"""The seed's story end to end on the real stack: relay -> Kafka -> sender -> SMTP -> recorder.

Four recipients of the September report: finance and ceo accepted at once, old.manager rejected
550 and failed after one attempt, ops deferred 451 twice and sent after three attempts on the
retry tiers. Then the outage: the October report waits while the server is down and goes out
when it is back.
"""

from __future__ import annotations

import dataclasses
import email
import email.policy
from collections import Counter
from pathlib import Path

import pytest
import sqlalchemy as sa

from postroom import enqueue
from postroom.settings import Settings, TlsMode
from sender.devsmtp import DevSmtpServer
from support.pipeline import Pipeline, outbox_rows, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TEAM = ["finance@example.com", "ops@example.com", "old.manager@example.com", "ceo@example.com"]
XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
TERMINAL = {"sent", "failed", "dead"}


def make_workbook(path: Path) -> Path:
    from openpyxl import Workbook

    book = Workbook()
    sheet = book.active
    sheet.append(["region", "sales"])
    sheet.append(["north", 1200])
    book.save(path)
    return path


@pytest.fixture
def smtp_settings(settings: Settings, tmp_path: Path) -> Settings:
    return dataclasses.replace(
        settings, smtp_host="127.0.0.1", smtp_port=0, smtp_tls=TlsMode.AUTO,
        smtp_connect_timeout_s=2.0, smtp_timeout_s=5.0, smtp_concurrency=4,
        attachments_root=tmp_path, mail_from="reports@example.com",
        retry_delays_s=(1.0, 2.0, 4.0, 8.0))


def test_the_seed_scenario(smtp_settings: Settings, engine: sa.Engine, tmp_path: Path,
                           kafka_settings: Settings) -> None:
    report = make_workbook(tmp_path / "sales_2026-09.xlsx")
    server = DevSmtpServer(port=0, reject={"old.manager@example.com"},
                           defer={"ops@example.com": 2})
    server.start()
    settings = dataclasses.replace(smtp_settings, smtp_port=server.port)
    pipeline = Pipeline(settings, engine).start()
    try:
        with engine.begin() as conn:
            queued = enqueue(conn, key="sales-2026-09", recipients=TEAM,
                             subject="Sales report — September 2026",
                             body="The September sales report is attached.", attachments=[report])
        with engine.begin() as conn:
            queued_again = enqueue(conn, key="sales-2026-09", recipients=TEAM,
                                   subject="Sales report — September 2026",
                                   body="The September sales report is attached.",
                                   attachments=[report])
        assert (queued, queued_again) == (4, 0)

        rows = wait_for(lambda: (r := outbox_rows(engine, "sales-2026-09"))
                        and all(x.status in TERMINAL for x in r) and r, 60, "September delivered")
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
        assert parsed["Subject"] == "Sales report — September 2026"
        assert parsed["From"] == "reports@example.com"

        # The outage: the server goes away, the October report waits, then goes out.
        port = server.port
        server.stop()
        with engine.begin() as conn:
            enqueue(conn, key="sales-2026-10", recipients=["finance@example.com"],
                    subject="Sales report — October 2026",
                    body="The October sales report is attached.", attachments=[report])
        waiting = wait_for(lambda: [r for r in outbox_rows(engine, "sales-2026-10")
                                    if r.status == "retrying"], 30, "October to be retrying")
        assert "refused" in waiting[0].last_error.lower()
        assert waiting[0].next_attempt_at is not None
        restarted = DevSmtpServer(port=port)
        restarted.start()
        try:
            october = wait_for(lambda: [r for r in outbox_rows(engine, "sales-2026-10")
                                        if r.status == "sent"], 40, "October delivered")
            assert october[0].attempts >= 2
            assert [m.rcpt for m in restarted.messages] == ["finance@example.com"]
        finally:
            restarted.stop()
    finally:
        pipeline.stop()
        server.stop()
