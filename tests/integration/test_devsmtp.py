"""The dev SMTP server misbehaves as configured, driven by the standard library's smtplib."""

from __future__ import annotations

import mailbox
import signal
import smtplib
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from postroom.devkit.devsmtp import DevSmtpServer
from postroom.devkit.devsmtp_maildir import read_maildir

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


def run_cli(args: list[str], talk: Callable[[int], None]) -> tuple[str, str]:
    """Run ``postroom devsmtp ARGS``, call ``talk(port)`` once it listens, stop it with SIGTERM:
    its first stdout line and its stderr (it must exit 0)."""
    proc = subprocess.Popen([sys.executable, "-m", "postroom.devkit.devsmtp", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("devsmtp listening on "), line
        talk(int(line.rsplit(":", 1)[1]))
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0
    return line, err


def test_cli_serves_until_sigterm(tmp_path: Path) -> None:
    def talk(port: int) -> None:
        with smtplib.SMTP("127.0.0.1", port, timeout=10) as client:
            client.ehlo()
            assert rcpt_reply(client, "x@example.com")[0] == 550
            client.sendmail(SENDER, ["y@example.com"], MESSAGE)

    line, err = run_cli(["--port", "0", "--reject", "x@example.com",
                         "--maildir", str(tmp_path / "md")], talk)
    assert line.startswith("devsmtp listening on 127.0.0.1:")
    assert "reject x@example.com" in err
    assert "accept y@example.com" in err
    assert [m.rcpt for m in read_maildir(tmp_path / "md")] == ["y@example.com"]


@pytest.mark.parametrize(("caps", "kept"), [
    ({"max_kept": 3}, ["r2@example.com", "r3@example.com", "r4@example.com"]),
    ({"max_kept_bytes": 2 * len(MESSAGE) + 10}, ["r3@example.com", "r4@example.com"]),
])
def test_only_the_newest_messages_are_kept_in_memory(
        caps: dict[str, int], kept: list[str]) -> None:
    dev = DevSmtpServer("127.0.0.1", 0, **caps)
    dev.start()
    try:
        with smtplib.SMTP("127.0.0.1", dev.port, timeout=10) as client:
            for n in range(5):
                client.sendmail(SENDER, [f"r{n}@example.com"], MESSAGE)
    finally:
        dev.stop()
    assert [m.rcpt for m in dev.messages] == kept
    assert dev.forgotten == 5 - len(kept)


@pytest.mark.parametrize(("host", "warned"), [
    ("127.0.0.1", False), ("::1", False), ("localhost", False), ("127.0.0.2", False),
    ("0.0.0.0", True), ("::", True), ("192.0.2.10", True), ("mail.example.com", True),  # noqa: S104
])
def test_a_bind_beyond_loopback_is_warned_about(host: str, warned: bool) -> None:
    from postroom.devkit.devsmtp_cli import bind_warning

    warning = bind_warning(host)
    assert (warning is not None) == warned
    if warning is not None:
        assert host in warning and "not on a loopback address" in warning


def test_cli_warns_when_it_listens_beyond_loopback() -> None:
    line, err = run_cli(["--host", "0.0.0.0", "--port", "0"], lambda port: None)  # noqa: S104
    assert line.startswith("devsmtp listening on 0.0.0.0:")
    assert "WARNING: devsmtp listens on 0.0.0.0, not on a loopback address" in err
    assert run_cli(["--port", "0"], lambda port: None)[1] == ""


def test_cli_takes_an_existing_empty_directory_as_its_maildir(tmp_path: Path) -> None:
    # `mkdir md` first, as a user does: the standard library left out cur/new/tmp and every
    # delivery was answered "500 Error: (FileNotFoundError)".
    (tmp_path / "md").mkdir()

    def talk(port: int) -> None:
        with smtplib.SMTP("127.0.0.1", port, timeout=10) as client:
            assert client.sendmail(SENDER, ["y@example.com"], MESSAGE) == {}

    line, _err = run_cli(["--port", "0", "--maildir", str(tmp_path / "md")], talk)
    assert line.startswith("devsmtp listening on 127.0.0.1:")
    assert [m.rcpt for m in read_maildir(tmp_path / "md")] == ["y@example.com"]


def test_a_maildir_it_cannot_write_is_a_temporary_local_error_not_the_recipients(
        tmp_path: Path) -> None:
    with DevSmtpServer("127.0.0.1", 0, maildir=tmp_path / "md") as dev:
        (tmp_path / "md" / "tmp").rmdir()  # the disk goes away under the running server
        with smtplib.SMTP("127.0.0.1", dev.port, timeout=10) as client:
            client.ehlo()
            client.mail(SENDER)
            client.rcpt("y@example.com")
            code, reply = client.data(MESSAGE)
        assert (code, reply) == (451, b"4.3.0 local error in processing")
        assert dev.count() == 0


def test_a_fault_of_the_server_itself_is_answered_451_not_500(
        monkeypatch: pytest.MonkeyPatch) -> None:
    with DevSmtpServer("127.0.0.1", 0) as dev:
        def broken(*_args: object) -> None:
            raise RuntimeError("a bug")

        monkeypatch.setattr(dev._handler, "_keep", broken)
        with smtplib.SMTP("127.0.0.1", dev.port, timeout=10) as client:
            client.ehlo()
            client.mail(SENDER)
            client.rcpt("y@example.com")
            assert client.data(MESSAGE) == (451, b"4.3.0 local error in processing")


def test_throttle_every_answers_every_nth_rcpt_with_the_rate_limit() -> None:
    with DevSmtpServer("127.0.0.1", 0, throttle_every=3) as dev, \
            smtplib.SMTP("127.0.0.1", dev.port, timeout=10) as client:
        client.ehlo()
        codes = [rcpt_reply(client, f"r{n}@example.com")[0] for n in range(7)]
        assert codes == [250, 250, 450, 250, 250, 450, 250]
        assert dev.throttled_replies == 2
