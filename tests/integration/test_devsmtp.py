"""The dev SMTP server misbehaves as configured, driven by the standard library's smtplib."""

from __future__ import annotations

import mailbox
import signal
import smtplib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sender.devsmtp import DevSmtpServer, read_maildir

pytestmark = pytest.mark.integration

SENDER = "reports@example.com"
MESSAGE = b"Message-ID: <m1@example.com>\r\nSubject: September\r\n\r\nThe report.\r\n"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[DevSmtpServer]:
    dev = DevSmtpServer(
        "127.0.0.1", 0,
        reject={"old.manager@example.com"},
        defer={"ops@example.com": 2},
        latency_ms=200,
        maildir=tmp_path / "maildir",
        drop={"flaky@example.com"},
    )
    dev.start()
    yield dev
    dev.stop()


def rcpt_reply(client: smtplib.SMTP, rcpt: str) -> tuple[int, bytes]:
    client.mail(SENDER)
    try:
        return client.rcpt(rcpt)
    finally:
        client.rset()


def test_rejected_address_gets_550_5_1_1(server: DevSmtpServer) -> None:
    with smtplib.SMTP("127.0.0.1", server.port, timeout=10) as client:
        client.ehlo()
        assert rcpt_reply(client, "old.manager@example.com") == (550, b"5.1.1 User unknown")
    assert server.count() == 0


def test_deferred_address_gets_451_twice_then_is_accepted(server: DevSmtpServer) -> None:
    with smtplib.SMTP("127.0.0.1", server.port, timeout=10) as client:
        client.ehlo()
        assert rcpt_reply(client, "ops@example.com") == (451, b"4.3.0 try again later")
        assert rcpt_reply(client, "OPS@example.com") == (451, b"4.3.0 try again later")
        assert client.sendmail(SENDER, ["ops@example.com"], MESSAGE) == {}
    assert server.count("ops@example.com") == 1


def test_latency_delays_the_reply_to_the_message(server: DevSmtpServer) -> None:
    with smtplib.SMTP("127.0.0.1", server.port, timeout=10) as client:
        started = time.monotonic()
        client.sendmail(SENDER, ["finance@example.com"], MESSAGE)
        elapsed = time.monotonic() - started
    assert elapsed >= 0.2


def test_accepted_messages_are_kept_in_memory_and_in_the_maildir(
    server: DevSmtpServer, tmp_path: Path,
) -> None:
    with smtplib.SMTP("127.0.0.1", server.port, timeout=10) as client:
        client.sendmail(SENDER, ["finance@example.com", "ceo@example.com"], MESSAGE)
    assert server.count() == 2
    assert server.message_ids() == ["<m1@example.com>", "<m1@example.com>"]
    assert [(m.mail_from, m.rcpt) for m in server.messages] == [
        (SENDER, "finance@example.com"), (SENDER, "ceo@example.com")]
    assert server.messages[0].raw == MESSAGE

    assert len(mailbox.Maildir(tmp_path / "maildir", create=False)) == 2
    stored = sorted(read_maildir(tmp_path / "maildir"), key=lambda m: m.rcpt)
    assert [(m.mail_from, m.rcpt, m.message_id) for m in stored] == [
        (SENDER, "ceo@example.com", "<m1@example.com>"),
        (SENDER, "finance@example.com", "<m1@example.com>"),
    ]

    server.reset()
    assert server.count() == 0
    assert server.connections == 0


def test_drop_closes_the_connection_without_a_reply(server: DevSmtpServer) -> None:
    with smtplib.SMTP("127.0.0.1", server.port, timeout=10) as client:
        client.ehlo()
        client.mail(SENDER)
        assert client.rcpt("flaky@example.com")[0] == 250
        with pytest.raises(smtplib.SMTPServerDisconnected):
            client.data(MESSAGE)
    assert server.count() == 0


def test_connections_are_counted_once_they_greet(server: DevSmtpServer) -> None:
    for _ in range(2):
        with smtplib.SMTP("127.0.0.1", server.port, timeout=10) as client:
            client.ehlo()
            client.ehlo()
    assert server.connections == 2
    assert server.peak_connections == 1


def test_cli_serves_until_sigterm(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "sender.devsmtp", "--port", "0", "--reject", "x@example.com",
         "--maildir", str(tmp_path / "md")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("devsmtp listening on 127.0.0.1:")
        port = int(line.rsplit(":", 1)[1])
        with smtplib.SMTP("127.0.0.1", port, timeout=10) as client:
            client.ehlo()
            assert rcpt_reply(client, "x@example.com")[0] == 550
            client.sendmail(SENDER, ["y@example.com"], MESSAGE)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0
    assert "reject x@example.com" in err
    assert "accept y@example.com" in err
    assert [m.rcpt for m in read_maildir(tmp_path / "md")] == ["y@example.com"]
