"""`postroom bounces` as a process manager runs it: it listens once the database and the broker
answer, records a DSN, and stops cleanly on SIGTERM; without a bounce address it says so in one
line."""

from __future__ import annotations

import datetime as dt
import os
import smtplib
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa

from postroom import enqueue
from postroom.devkit.ports import free_port
from postroom.devkit.processes import PostroomProcesses
from postroom.devkit.scratch import scratch_env
from postroom.schemas.codec import DeliveryStatus, EmailResult
from postroom.schemas.decoding import decode
from postroom.settings import Settings
from postroom.topics import results_topic
from postroom.verp import make_token, return_path
from support.commands import run_postroom, start_postroom

pytestmark = pytest.mark.integration

BOUNCE = "bounces@bounce.example.com"
SECRET = "command-test-bounce-secret-0123"  # noqa: S105 - a test's own
FIXTURES = Path(__file__).parents[2] / "fixtures" / "bounces"


def test_the_command_records_a_dsn_and_stops_cleanly(
        settings: Settings, engine: sa.Engine, tmp_path: Path,
        consume: Callable[..., list]) -> None:
    port = free_port()
    env = {**os.environ, **scratch_env(settings), "POSTROOM_BOUNCE_ADDRESS": BOUNCE,
           "POSTROOM_BOUNCE_SECRET": SECRET, "POSTROOM_BOUNCE_LISTEN": f"127.0.0.1:{port}"}
    with engine.begin() as conn:
        enqueue(conn, key="k", recipients=["gone@example.com"], subject="S", body="b")
        outbox_id = conn.execute(sa.text("SELECT id FROM outbox")).scalar_one()
    token = make_token(outbox_id, SECRET.encode(), dt.datetime.now(dt.UTC))
    raw = (FIXTURES / "postfix_failed.eml").read_bytes().replace(b"1-a-aaaa", token.encode())
    with PostroomProcesses(env, tmp_path, {"bounces": "bounces"},
                           starter=start_postroom) as processes:
        processes.wait_logged("bounce intake listening", 60)
        with smtplib.SMTP("127.0.0.1", port, timeout=30) as client:
            client.sendmail("", [return_path(BOUNCE, token)], raw)
        assert processes.stop("bounces") == 0
        assert "bounce report dsn bounced/5.1.1" in processes.log("bounces")
        assert processes.complaints() == {}
    [record] = consume(settings, [results_topic(settings.topic_prefix)], 1)
    result = decode(EmailResult, record.value, record.headers)
    assert (result.outbox_id, result.status) == (outbox_id, DeliveryStatus.BOUNCED)


def test_without_a_bounce_address_it_says_so_in_one_line(settings: Settings) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POSTROOM_BOUNCE")}
    done = run_postroom("bounces", env={**env, **scratch_env(settings)}, timeout_s=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "postroom bounces: configuration error: POSTROOM_BOUNCE_ADDRESS: postroom bounces needs "
        "the bounce address (bounces@<the bounce domain>) and POSTROOM_BOUNCE_SECRET"]
