"""The VERP return path and the DSN request (RFC 3461) against real servers: the dev SMTP server
(aiosmtpd) offering DSN or not, and Postfix's smtp-sink, which offers DSN and PIPELINING and
writes each message's MAIL and RCPT arguments into its dump."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from email import message_from_bytes
from pathlib import Path

import pytest

from postroom.devkit.devsmtp import DevSmtpServer
from postroom.devkit.ports import free_port, listening
from postroom.devkit.wait import wait_until
from postroom.schemas.codec import EmailRequested
from postroom.sender.delivery import Delivery
from postroom.sender.smtp import SmtpPool
from postroom.sender.smtp_config import SmtpConfig
from postroom.settings import TlsMode
from postroom.verp import read_token

pytestmark = pytest.mark.integration

NOW = dt.datetime.now(dt.UTC)
SECRET = b"0123456789abcdef-test-secret"
BOUNCES = "bounces@bounce.example.com"
EVENT = EmailRequested(
    idempotency_key="sales-2026-09|old.manager@example.com", message_key="sales-2026-09",
    outbox_id=4242, recipient="old.manager@example.com", sender="Reports <reports@example.com>",
    subject="Sales", body="Revenue 1,200", attachments=(), priority="normal", created_at=NOW)
DSN = {"RET", "ENVID", "NOTIFY", "ORCPT"}
SMTP_SINK = shutil.which("smtp-sink") or "/usr/sbin/smtp-sink"


def deliver(port: int, *, pipelining: bool, bounce_address: str | None = BOUNCES) -> str:
    """Send EVENT through a pool of postroom's to ``port``; the envelope sender it used."""
    delivery = Delivery("reports@example.com", None, 20.0, bounce_address=bounce_address,
                        bounce_secret=SECRET)
    config = SmtpConfig("127.0.0.1", port, tls=TlsMode.NONE, local_hostname="client.test",
                        pipelining=pipelining, timeout_s=10)

    async def run() -> None:
        async with SmtpPool(config) as pool, pool.slot() as slot:
            reply, _ = await delivery.send(EVENT, slot, NOW)
        assert reply.code == 250, reply

    asyncio.run(run())
    return delivery.envelope_sender(EVENT, NOW)[0]


@pytest.fixture(params=[True, False], ids=["pipelined", "plain"])
def pipelining(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


def test_the_dev_server_offering_dsn_reads_the_request(pipelining: bool) -> None:
    with DevSmtpServer(port=0, dsn=True, pipelining=pipelining) as server:
        return_path = deliver(server.port, pipelining=pipelining)
        [received] = server.messages
    assert received.mail_from == return_path
    assert read_token(return_path, BOUNCES, [SECRET], NOW, dt.timedelta(days=1)) == 4242
    token = return_path.partition("+")[2].partition("@")[0]
    assert received.mail_options[-2:] == ("RET=HDRS", f"ENVID={token.upper()}")
    assert received.rcpt_options == ("NOTIFY=FAILURE,DELAY", "ORCPT=RFC822;OLD.MANAGER@EXAMPLE.COM")
    assert message_from_bytes(received.raw)["From"] == "Reports <reports@example.com>"


def test_the_dev_server_without_dsn_gets_the_return_path_and_no_request(pipelining: bool) -> None:
    with DevSmtpServer(port=0, pipelining=pipelining) as server:
        return_path = deliver(server.port, pipelining=pipelining)
        [received] = server.messages
    assert received.mail_from == return_path
    assert not DSN & {option.partition("=")[0] for option in received.mail_options}
    assert received.rcpt_options == ()


def test_without_a_bounce_address_the_dev_server_sees_the_from_address(pipelining: bool) -> None:
    with DevSmtpServer(port=0, dsn=True, pipelining=pipelining) as server:
        deliver(server.port, pipelining=pipelining, bounce_address=None)
        [received] = server.messages
    assert received.mail_from == "reports@example.com"
    assert not DSN & {option.partition("=")[0] for option in received.mail_options}
    assert received.rcpt_options == ()


@pytest.fixture
def smtp_sink() -> Iterator[tuple[int, Path]]:
    """Postfix's smtp-sink on a loopback port, appending each message to a dump file. Root must
    name a user for it (-u); its directory must be that user's to write, as /tmp's own is."""
    assert Path(SMTP_SINK).is_file(), "Postfix's smtp-sink is needed (apt-get install postfix)"
    directory = Path(tempfile.mkdtemp(prefix="postroom-sink-"))
    directory.chmod(0o777)
    dump = directory / "dump"
    port = free_port()
    user = ["-u", "nobody"] if os.geteuid() == 0 else []
    process = subprocess.Popen([SMTP_SINK, *user, "-D", str(dump), f"127.0.0.1:{port}", "10"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: listening(port), 10, "smtp-sink to listen")
        yield port, dump
    finally:
        process.terminate()
        process.wait(10)
        shutil.rmtree(directory, ignore_errors=True)


def test_smtp_sink_reads_the_request_as_written(smtp_sink: tuple[int, Path],
                                                pipelining: bool) -> None:
    port, dump = smtp_sink
    return_path = deliver(port, pipelining=pipelining)
    token = return_path.partition("+")[2].partition("@")[0]
    headers = message_from_bytes(dump.read_bytes())
    assert headers["X-Mail-Args"] == f"<{return_path}> BODY=8BITMIME RET=HDRS ENVID={token}"
    assert headers["X-Rcpt-Args"] == ("<old.manager@example.com> NOTIFY=FAILURE,DELAY "
                                      "ORCPT=rfc822;old.manager@example.com")
    assert headers["From"] == "Reports <reports@example.com>"
