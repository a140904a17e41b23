"""Per-destination throttling on the real stack: a server that answers one recipient domain with
Gmail's 450 4.2.1 rate limit. That domain's mail waits, no attempt counted; the other domain's
mail goes out meanwhile at its own speed; when the limit lifts, the waiting mail goes out once."""

from __future__ import annotations

import dataclasses

import pytest
import sqlalchemy as sa

from postroom import enqueue
from postroom.devkit.devsmtp import DevSmtpServer
from postroom.devkit.wait import wait_until
from postroom.settings import Settings, TlsMode
from support.metrics import counter
from support.pipeline import Pipeline, outbox_rows

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SLOW = [f"s{n}@slow.example" for n in range(6)]
FAST = [f"f{n}@fast.example" for n in range(20)]


def test_a_throttled_domain_waits_without_burning_attempts_and_others_keep_going(
        settings: Settings, engine: sa.Engine) -> None:
    with DevSmtpServer(port=0) as server:
        server.throttle("slow.example")
        settings = dataclasses.replace(
            settings, smtp_host="127.0.0.1", smtp_port=server.port, smtp_tls=TlsMode.NONE,
            smtp_connect_timeout_s=2.0, smtp_timeout_s=5.0, smtp_concurrency=4,
            retry_delays_s=(1.0, 2.0), throttle_pause_s=0.2, throttle_max_wait_s=600.0)
        pipeline = Pipeline(settings, engine).start()
        try:
            with engine.begin() as conn:
                enqueue(conn, key="slow", subject="S", body="b", recipients=SLOW)
                enqueue(conn, key="fast", subject="F", body="b", recipients=FAST)
            # Every fast.example email goes out on its first attempt while slow.example is
            # throttled the whole time.
            wait_until(lambda: [r.status for r in outbox_rows(engine, "fast")] == ["sent"] * 20,
                       60, "every fast.example email sent")
            assert [r.attempts for r in outbox_rows(engine, "fast")] == [1] * 20
            assert server.throttled_replies >= 1
            slow = outbox_rows(engine, "slow")
            # Deferred, not failed: no result was written, no attempt counted, no retry tier.
            assert {(r.status, r.attempts) for r in slow} == {("published", 0)}
            assert server.count() == 20
            sender = pipeline.sender
            assert sender is not None
            assert counter(sender.sender.metrics, "throttled_total") >= 1
            assert counter(sender.sender.metrics, "outcomes_total", status="retrying") == 0

            server.throttle()  # the limit lifts
            wait_until(lambda: [r.status for r in outbox_rows(engine, "slow")] == ["sent"] * 6,
                       60, "every slow.example email sent once the limit lifted")
            assert [r.attempts for r in outbox_rows(engine, "slow")] == [1] * 6
            assert sorted(m.rcpt for m in server.messages) == sorted(SLOW + FAST)
        finally:
            pipeline.stop()
