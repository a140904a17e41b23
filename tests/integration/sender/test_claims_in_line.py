"""A key is claimed while it waits for its destination's turn, on the real stack. A claim that
waited longer than sender/claims.py's RENEW_AFTER_S is renewed as its send starts; one that is
no longer ours by then is not sent (here another sender's 250 was recorded meanwhile)."""

from __future__ import annotations

import dataclasses

import pytest
import sqlalchemy as sa

from postroom import enqueue
from postroom.devkit.devsmtp import DevSmtpServer
from postroom.devkit.wait import wait_until
from postroom.metrics import Metrics
from postroom.sender import claims
from postroom.settings import Settings, TlsMode
from support.metrics import counter
from support.pipeline import Pipeline, outbox_rows

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SERVER_LATENCY_MS = 2000  # the first send holds the destination this long
RENEW_AFTER_S = 0.5       # so the second key's claim, taken meanwhile, is old at its send
ELSEWHERE = "<accepted-elsewhere@example.com>"


def ledger_state(engine: sa.Engine, message_key: str) -> str | None:
    with engine.connect() as conn:
        return conn.execute(sa.text(
            "SELECT l.state FROM sender_ledger l JOIN outbox o USING (idempotency_key) "
            "WHERE o.message_key = :k"), {"k": message_key}).scalar_one_or_none()


@pytest.mark.parametrize("taken_meanwhile", [False, True], ids=["kept", "lost"])
def test_a_claim_that_waited_is_renewed_before_its_send(
        settings: Settings, engine: sa.Engine, monkeypatch: pytest.MonkeyPatch,
        taken_meanwhile: bool) -> None:
    monkeypatch.setattr(claims, "RENEW_AFTER_S", RENEW_AFTER_S)
    with DevSmtpServer(port=0, latency_ms=SERVER_LATENCY_MS) as server:
        settings = dataclasses.replace(
            settings, smtp_host="127.0.0.1", smtp_port=server.port, smtp_tls=TlsMode.NONE,
            smtp_connect_timeout_s=2.0, smtp_timeout_s=10.0, smtp_concurrency=1,
            destination_concurrency=1)
        metrics = Metrics()
        pipeline = Pipeline(settings, engine, metrics=metrics).start()
        try:
            with engine.begin() as conn:
                enqueue(conn, key="first", subject="S", body="b", recipients=["a@example.com"])
            wait_until(lambda: ledger_state(engine, "first") == "sending", 30,
                       "the first key claimed")
            with engine.begin() as conn:
                enqueue(conn, key="second", subject="S", body="b", recipients=["b@example.com"])
            # Claimed in the destination's line while the first is still at the server.
            wait_until(lambda: ledger_state(engine, "second") == "sending", 30,
                       "the second key claimed in line")
            assert server.count() == 0, "the first send ended before the second was claimed"
            if taken_meanwhile:
                with engine.begin() as conn:
                    conn.execute(sa.text(
                        "UPDATE sender_ledger SET state = 'sent', lease_until = NULL, "
                        "message_id = :m WHERE idempotency_key = "
                        "(SELECT idempotency_key FROM outbox WHERE message_key = 'second')"),
                        {"m": ELSEWHERE})
            wait_until(lambda: [r.status for r in outbox_rows(engine, "first")
                                + outbox_rows(engine, "second")] == ["sent", "sent"],
                       30, "both rows recorded sent")
        finally:
            pipeline.stop()
    [second] = outbox_rows(engine, "second")
    renewed = metrics.counters("claims_renewed_total")
    if taken_meanwhile:
        assert [m.rcpt for m in server.messages] == ["a@example.com"]
        assert second.message_id == ELSEWHERE
        assert renewed == {(("result", "lost"),): 1}
        assert counter(metrics, "duplicates_suppressed_total") == 1
    else:
        assert [m.rcpt for m in server.messages] == ["a@example.com", "b@example.com"]
        assert renewed == {(("result", "kept"),): 1}
