"""An HTML report with an inline chart and a workbook, from enqueue() to the mail server."""

from __future__ import annotations

import dataclasses
import email
import email.policy
from email.message import EmailMessage
from pathlib import Path

import pytest
import sqlalchemy as sa

from postroom import enqueue
from postroom.devkit.devsmtp import DevSmtpServer
from postroom.devkit.wait import wait_until
from postroom.settings import Settings, TlsMode
from support.pipeline import Pipeline, outbox_rows

pytestmark = pytest.mark.integration

PNG = b"\x89PNG\r\n\x1a\n" + bytes(64)
HTML = '<h1>September</h1><table><tr><td>Revenue</td><td>1,200</td></tr></table><img src="cid:chart.png">'


def test_an_html_report_arrives_as_alternative_related_and_mixed(
        settings: Settings, engine: sa.Engine, tmp_path: Path) -> None:
    (tmp_path / "chart.png").write_bytes(PNG)
    (tmp_path / "sales.xlsx").write_bytes(b"PK\x03\x04 workbook")
    server = DevSmtpServer(port=0)
    server.start()
    with engine.begin() as conn:
        assert enqueue(conn, key="html-report", recipients=["finance@example.com"],
                       subject="Sales", body="Revenue 1,200", html=HTML,
                       inline=[tmp_path / "chart.png"],
                       attachments=[tmp_path / "sales.xlsx"]) == 1
    smtp = dataclasses.replace(settings, smtp_host="127.0.0.1", smtp_port=server.port,
                               smtp_tls=TlsMode.NONE, attachments_root=tmp_path)
    pipeline = Pipeline(smtp, engine).start()
    try:
        wait_until(lambda: [r.status for r in outbox_rows(engine, "html-report")] == ["sent"], 60,
                 "the report to be sent")
    finally:
        pipeline.stop()
        server.stop()
    [received] = server.messages
    message = email.message_from_bytes(received.raw, policy=email.policy.default)
    assert isinstance(message, EmailMessage)
    assert message.get_content_type() == "multipart/mixed"
    alternative, workbook = message.iter_parts()
    assert alternative.get_content_type() == "multipart/alternative"
    text, related = alternative.iter_parts()
    assert text.get_content_type() == "text/plain"
    assert [p.get_content_type() for p in related.iter_parts()] == ["text/html", "image/png"]
    html, chart = related.iter_parts()
    assert "<td>1,200</td>" in html.get_content()  # type: ignore[attr-defined]
    assert chart["Content-ID"] == "<chart.png>" and chart.get_payload(decode=True) == PNG
    assert workbook.get_filename() == "sales.xlsx"
