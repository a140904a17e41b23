"""Attachments come only from the configured root, end to end through the real pipeline."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import sqlalchemy as sa

from postroom import enqueue
from postroom.devkit.wait import wait_until
from postroom.settings import Settings, TlsMode
from sender.devsmtp import DevSmtpServer
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
