"""Bounces through a real MTA: the pipeline (relay, sender, recorder) sends through a throwaway
Postfix smarthost that answers 250 to everything, relays example.com to a devsmtp next hop that
rejects (550 5.1.1) or defers (451) chosen recipients, and routes the bounce domain to
`postroom bounces`. Postfix's own DSNs then change the rows: the rejected recipient goes sent then
bounced, the deferred one gets a delay notice then its final bounce; a forged DSN changes nothing;
the job's next run finds the bounced address suppressed, and neither the smarthost nor the next
hop sees an attempt for it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import smtplib
from pathlib import Path

import pytest
import sqlalchemy as sa

from postroom import enqueue
from postroom.devkit.devsmtp import DevSmtpServer
from postroom.devkit.ports import free_ports
from postroom.devkit.wait import wait_until
from postroom.settings import Settings, TlsMode
from postroom.verp import make_token, return_path
from support.metrics import counter
from support.pipeline import Pipeline, outbox_rows
from support.postfix import IntakeThread, started_smarthost

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BOUNCE = "bounces@bounce.example.com"
SECRET = b"integration-bounce-secret-0123456789"
GONE, SLOW, OK = "gone@example.com", "slow@example.com", "ok@example.com"
QUEUE_LIFETIME_S = 4  # the deferred recipient's final bounce comes about this long after
DELAY_WARNING_S = 1
FIXTURES = Path(__file__).parents[2] / "fixtures" / "bounces"


def rows_by_recipient(engine: sa.Engine, key: str) -> dict[str, sa.Row]:  # type: ignore[type-arg]
    return {row.recipient: row for row in outbox_rows(engine, key)}


def test_postfix_dsns_bounce_and_delay_rows_and_a_forged_one_changes_nothing(
        settings: Settings, engine: sa.Engine) -> None:
    smarthost_port, intake_port = free_ports(2)
    settings = dataclasses.replace(
        settings, bounce_address=BOUNCE, bounce_secrets=(SECRET,),
        bounce_listen=("127.0.0.1", intake_port), smtp_host="127.0.0.1", smtp_port=smarthost_port,
        smtp_tls=TlsMode.NONE, smtp_connect_timeout_s=2.0, smtp_timeout_s=5.0,
        mail_from="reports@example.org", retry_delays_s=(0.5, 0.5))
    nexthop = DevSmtpServer(port=0, reject=[GONE], defer={SLOW: 10_000})
    nexthop.start()
    routes = {"example.com": ("127.0.0.1", nexthop.port),
              "bounce.example.com": ("127.0.0.1", intake_port)}
    try:
        with (started_smarthost(smarthost_port, routes, queue_lifetime_s=QUEUE_LIFETIME_S,
                                delay_warning_s=DELAY_WARNING_S) as smarthost,
              IntakeThread(settings, engine) as intake):
            pipeline = Pipeline(settings, engine).start()
            try:
                with engine.begin() as conn:
                    enqueue(conn, key="report-2026-11", recipients=[GONE, SLOW, OK],
                            subject="Sales report", body="attached")

                # The smarthost took all three (250); the next hop refused gone@ at once.
                rows = wait_until(lambda: (r := rows_by_recipient(engine, "report-2026-11"))
                                  and r[GONE].status == "bounced" and r, 30, "gone@ to bounce")
                assert rows[GONE].enhanced_code == "5.1.1"
                assert rows[GONE].sent_at is not None  # it was sent (accepted) first
                assert "550 5.1.1" in rows[GONE].last_error
                assert rows[OK].status == "sent"

                # slow@: a delay notice (last error, state kept), then the final bounce.
                delayed = wait_until(lambda: (r := rows_by_recipient(engine, "report-2026-11"))
                                     and r[SLOW].last_error and r, 30, "slow@'s delay notice")
                assert delayed[SLOW].status == "sent"
                assert "4.3.0" in delayed[SLOW].last_error
                # The intake counts a report once the broker took its result, and the recorder
                # may write the row before the intake's thread counts it.
                wait_until(lambda: counter(intake.metrics, "bounce_reports_total",
                                           status="delayed") >= 1, 10, "the delay to be counted")
                rows = wait_until(lambda: (r := rows_by_recipient(engine, "report-2026-11"))
                                  and r[SLOW].status == "bounced" and r,
                                  QUEUE_LIFETIME_S + 20, "slow@'s final bounce")
                assert rows[SLOW].enhanced_code == "4.3.0"

                # A forged DSN for ok@'s row, straight to the intake: refused, the row unchanged.
                with engine.connect() as conn:
                    ok_id = conn.execute(sa.text("SELECT id FROM outbox WHERE recipient = :r"),
                                         {"r": OK}).scalar_one()
                forged = make_token(ok_id, b"not-the-secret-of-this-platform",
                                    dt.datetime.now(dt.UTC))
                raw = (FIXTURES / "postfix_failed.eml").read_bytes().replace(b"1-a-aaaa",
                                                                              forged.encode())
                with smtplib.SMTP("127.0.0.1", intake_port, timeout=10) as client:
                    with pytest.raises(smtplib.SMTPRecipientsRefused) as refused:
                        client.sendmail("", [return_path(BOUNCE, forged)], raw)
                assert refused.value.recipients[return_path(BOUNCE, forged)][0] == 550
                assert intake.refused("forged_token") == 1
                assert rows_by_recipient(engine, "report-2026-11")[OK].status == "sent"
                assert "bounces+" in smarthost.log()  # the DSNs went to the VERP return paths

                # The job's next run: gone@ is suppressed by its bounce, never tried again.
                tried = smarthost.log().count(f"to=<{GONE}>")
                with engine.begin() as conn:
                    enqueue(conn, key="report-2026-12", recipients=[GONE, OK],
                            subject="Sales report", body="attached")
                rows = wait_until(lambda: (r := rows_by_recipient(engine, "report-2026-12"))
                                  and {x.status for x in r.values()} == {"suppressed", "sent"}
                                  and r, 30, "the next run to finish")
                assert (rows[GONE].status, rows[OK].status) == ("suppressed", "sent")
                assert rows[GONE].attempts == 0
                assert smarthost.log().count(f"to=<{GONE}>") == tried
                assert nexthop.count(OK) == 2 and nexthop.count(GONE) == 0
            finally:
                pipeline.stop()
    finally:
        nexthop.stop()
