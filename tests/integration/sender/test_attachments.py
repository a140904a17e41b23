"""Attachments come only from the configured root, end to end through the real pipeline."""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

import pytest
import sqlalchemy as sa

from postroom import enqueue
from postroom.devkit.devsmtp import DevSmtpServer
from postroom.devkit.scratch import scratch_env
from postroom.devkit.wait import wait_until
from postroom.metrics import Metrics
from postroom.settings import Settings, TlsMode
from support.commands import run_postroom
from support.metrics import counter
from support.pipeline import Pipeline, outbox_rows

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def run_one(settings: Settings, engine: sa.Engine, attachment: Path, wanted: str) -> sa.Row:
    server = DevSmtpServer(port=0)
    server.start()
    smtp = dataclasses.replace(settings, smtp_host="127.0.0.1", smtp_port=server.port,
                               smtp_tls=TlsMode.NONE, smtp_timeout_s=5.0)
    with engine.begin() as conn:
        enqueue(conn, key="k", recipients=["a@example.com"], subject="S", body="b",
                attachments=[attachment])
    pipeline = Pipeline(smtp, engine).start()
    try:
        rows = wait_until(lambda: [r for r in outbox_rows(engine, "k") if r.status == wanted], 30,
                          f"the row to be {wanted}")
    finally:
        pipeline.stop()
        server.stop()
    assert server.count() == 0
    return rows[0]


def test_a_path_outside_the_root_fails_permanently_unread(
        settings: Settings, engine: sa.Engine, tmp_path: Path) -> None:
    root = tmp_path / "reports"
    root.mkdir()
    secret = tmp_path / "elsewhere.xlsx"
    secret.write_bytes(b"not for mail")
    row = run_one(dataclasses.replace(settings, attachments_root=root), engine, secret, "failed")
    assert row.attempts == 1
    assert "outside" in row.last_error and str(root) in row.last_error


def test_without_a_root_attachments_wait_for_the_configuration(
        settings: Settings, engine: sa.Engine, tmp_path: Path) -> None:
    report = tmp_path / "report.xlsx"
    report.write_bytes(b"PK")
    row = run_one(dataclasses.replace(settings, attachments_root=None), engine, report, "retrying")
    assert "POSTROOM_ATTACHMENTS_ROOT is not set" in row.last_error
    assert row.next_attempt_at is not None


def test_without_a_root_they_wait_uncounted_and_go_once_the_sender_has_one(
        settings: Settings, engine: sa.Engine, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "reports"
    root.mkdir()
    report = root / "report.xlsx"
    report.write_bytes(b"PK")
    server = DevSmtpServer(port=0)
    server.start()
    # Two short tiers: a transient failure would be dead within about a second and a half.
    base = dataclasses.replace(settings, smtp_host="127.0.0.1", smtp_port=server.port,
                               smtp_tls=TlsMode.NONE, smtp_timeout_s=5.0,
                               retry_delays_s=(0.3, 0.3))
    with engine.begin() as conn:
        enqueue(conn, key="k", recipients=["a@example.com", "b@example.com"], subject="S",
                body="b", attachments=[report])
    metrics = Metrics()
    pipeline = Pipeline(dataclasses.replace(base, attachments_root=None), engine,
                        metrics=metrics).start()
    try:
        wait_until(lambda: counter(metrics, "attachments_waiting_total") >= 10, 30,
                   "the emails to wait on their tier several times over")
        rows = outbox_rows(engine, "k")
    finally:
        pipeline.stop()
    # A wait is no attempt (issue 45): TRIES 0, no attempt or outcome counted, and
    # `postroom status` names the setting whole within its column.
    assert [(r.status, r.attempts) for r in rows] == [("retrying", 0)] * 2
    assert all("POSTROOM_ATTACHMENTS_ROOT is not set" in r.last_error for r in rows)
    assert counter(metrics, "attempts_total", verdict="transient") == 0
    assert counter(metrics, "outcomes_total", status="retrying") == 0
    shown = run_postroom("status", "--key", "k", env={**os.environ, **scratch_env(settings)},
                         timeout_s=60)
    assert shown.returncode == 0, shown.stderr
    for line in shown.stdout.splitlines()[2:]:
        cells = line.split(None, 6)  # recipient, state, tries, created (2), sent, error
        assert cells[1:3] == ["retrying", "0"], line
        assert "POSTROOM_ATTACHMENTS_ROOT is not set" in cells[6], line
    said = [r for r in caplog.records if "POSTROOM_ATTACHMENTS_ROOT is not set" in r.getMessage()
            and r.levelno >= logging.ERROR]
    assert len(said) == 1 and "restart the sender" in said[0].getMessage()
    assert server.count() == 0

    pipeline = Pipeline(dataclasses.replace(base, attachments_root=root), engine).start()
    try:
        wait_until(lambda: [r.status for r in outbox_rows(engine, "k")] == ["sent"] * 2, 30,
                   "the emails to be sent once the sender has the root")
    finally:
        pipeline.stop()
        server.stop()
    assert server.count() == 2
