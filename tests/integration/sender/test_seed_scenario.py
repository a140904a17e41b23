"""The seed's story (postroom.devkit.story, which `make demo` tells) end to end on the real stack:
relay -> Kafka -> sender -> SMTP -> recorder.

Four recipients of the September report: finance and ceo accepted at once, old.manager rejected
550 and failed after one attempt, ops deferred 451 twice and sent after three attempts on the
retry tiers. Then the outage: the October report waits while the server is down and goes out
when it is back.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import sqlalchemy as sa

from postroom import enqueue
from postroom.devkit.devsmtp import DevSmtpServer
from postroom.devkit.story import OCTOBER, make_workbook
from postroom.devkit.wait import wait_until
from postroom.settings import Settings, TlsMode
from support.pipeline import Pipeline, outbox_rows
from support.seed import check_september, enqueue_september, seed_server

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def smtp_settings(settings: Settings, tmp_path: Path) -> Settings:
    return dataclasses.replace(
        settings, smtp_host="127.0.0.1", smtp_port=0, smtp_tls=TlsMode.AUTO,
        smtp_connect_timeout_s=2.0, smtp_timeout_s=5.0, smtp_concurrency=4,
        attachments_root=tmp_path, mail_from="reports@example.com",
        retry_delays_s=(1.0, 2.0, 4.0, 8.0))


def test_the_seed_scenario(smtp_settings: Settings, engine: sa.Engine, tmp_path: Path,
                           kafka_settings: Settings) -> None:
    report = make_workbook(tmp_path)
    server = seed_server()
    server.start()
    settings = dataclasses.replace(smtp_settings, smtp_port=server.port)
    pipeline = Pipeline(settings, engine).start()
    try:
        assert enqueue_september(engine, report) == [4, 0]
        check_september(engine, server, mail_from="reports@example.com")

        # The outage: the server goes away, the October report waits, then goes out.
        port = server.port
        server.stop()
        with engine.begin() as conn:
            enqueue(conn, key=OCTOBER.key, recipients=list(OCTOBER.recipients),
                    subject=OCTOBER.subject, body=OCTOBER.body, attachments=[report])
        waiting = wait_until(lambda: [r for r in outbox_rows(engine, OCTOBER.key)
                                      if r.status == "retrying"], 30, "October to be retrying")
        assert "refused" in waiting[0].last_error.lower()
        assert waiting[0].next_attempt_at is not None
        restarted = DevSmtpServer(port=port)
        restarted.start()
        try:
            october = wait_until(lambda: [r for r in outbox_rows(engine, OCTOBER.key)
                                          if r.status == "sent"], 40, "October delivered")
            assert october[0].attempts >= 2
            assert [m.rcpt for m in restarted.messages] == ["finance@example.com"]
        finally:
            restarted.stop()
    finally:
        pipeline.stop()
        server.stop()
