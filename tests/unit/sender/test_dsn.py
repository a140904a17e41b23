"""VERP return paths and DSN requests (RFC 3461): the parameters as a table, the commands a
scripted server on loopback reads in the pipelined and the plain dialogue, and the delivery that
picks the envelope sender. Without a bounce address every command is as before, byte for byte."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import re
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from postroom.schemas.codec import EmailRequested
from postroom.sender.delivery import Delivery
from postroom.sender.message import dsn_mail_parameters, dsn_rcpt_parameters, xtext
from postroom.sender.outcome import Failure, SmtpReply, Stage
from postroom.sender.smtp import SmtpPool
from postroom.sender.smtp_config import SmtpConfig
from postroom.settings import Settings, TlsMode
from postroom.verp import read_token
from support.fuzz import examples

NOW = dt.datetime(2026, 10, 1, 7, 0, tzinfo=dt.UTC)
SECRET = b"0123456789abcdef-test-secret"
BOUNCES = "bounces@bounce.example.com"
EVENT = EmailRequested(
    idempotency_key="sales-2026-09|old.manager@example.com", message_key="sales-2026-09",
    outbox_id=4242, recipient="old.manager@example.com", sender="Reports <reports@example.com>",
    subject="Sales", body="Revenue 1,200", attachments=(), priority="normal", created_at=NOW)


@pytest.mark.parametrize(("text", "encoded"), [
    ("abc-123", "abc-123"),
    ("a+b=c", "a+2Bb+3Dc"),
    ("two words", "two+20words"),
    ("é", "+C3+A9"),
    ("tab\there", "tab+09here"),
    ("~!", "~!"),
])
def test_xtext(text: str, encoded: str) -> None:
    assert xtext(text) == encoded


def test_the_mail_parameters_ask_for_headers_only_and_name_the_envelope() -> None:
    assert dsn_mail_parameters("4y-5ea-abcdefghijklmnop") == (
        "RET=HDRS", "ENVID=4y-5ea-abcdefghijklmnop")


@pytest.mark.parametrize(("recipient", "parameters"), [
    ("ceo@example.com", ("NOTIFY=FAILURE,DELAY", "ORCPT=rfc822;ceo@example.com")),
    ("a+tag@example.com", ("NOTIFY=FAILURE,DELAY", "ORCPT=rfc822;a+2Btag@example.com")),
    ("jürgen@example.com", ("NOTIFY=FAILURE,DELAY",)),  # rfc822 ORCPT is ASCII only
])
def test_the_rcpt_parameters(recipient: str, parameters: tuple[str, ...]) -> None:
    assert dsn_rcpt_parameters(recipient) == parameters


class ScriptedServer:
    """An SMTP server on loopback offering ``extensions``, keeping every command line it reads."""

    def __init__(self, extensions: Sequence[str]) -> None:
        self.extensions = list(extensions)
        self.lines: list[bytes] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"220 scripted ESMTP\r\n")
        while line := await reader.readline():
            command = line.rstrip(b"\r\n")
            self.lines.append(command)
            verb = command.split(b" ", 1)[0].upper()
            if verb == b"EHLO":
                offered = ["scripted", *self.extensions]
                writer.write(b"".join(f"250{'-' if i < len(offered) - 1 else ' '}{x}\r\n".encode()
                                      for i, x in enumerate(offered)))
            elif verb == b"DATA":
                writer.write(b"354 go ahead\r\n")
                while (await reader.readline()) != b".\r\n":
                    pass
                writer.write(b"250 2.0.0 queued\r\n")
            elif verb == b"QUIT":
                writer.write(b"221 bye\r\n")
                await writer.drain()
                break
            else:
                writer.write(b"250 2.0.0 ok\r\n")
            await writer.drain()
        writer.close()

    def envelope(self) -> list[bytes]:
        return [line for line in self.lines if line.startswith((b"MAIL", b"RCPT"))]


def dialogue(extensions: Sequence[str], *, pipelining: bool, envelope_sender: str,
             dsn_envid: str | None) -> ScriptedServer:
    """The server's record of one send through a pool of postroom's to it."""
    scripted = ScriptedServer(extensions)

    async def run() -> None:
        server = await asyncio.start_server(scripted.handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        config = SmtpConfig("127.0.0.1", port, tls=TlsMode.NONE, local_hostname="client.test",
                            pipelining=pipelining, timeout_s=5)
        try:
            async with SmtpPool(config) as pool:
                payload = await Delivery("reports@example.com", None, 10.0)._payload(EVENT, NOW)
                reply = await pool.send(payload, envelope_sender, EVENT.recipient,
                                        dsn_envid=dsn_envid)
        finally:
            server.close()
            await server.wait_closed()
        assert (reply.code, reply.failure) == (250, None)

    asyncio.run(run())
    return scripted


DSN_OFFERED = ["PIPELINING", "8BITMIME", "DSN"]


@pytest.mark.parametrize("pipelining", [True, False], ids=["pipelined", "plain"])
def test_a_server_offering_dsn_is_asked_for_notices(pipelining: bool) -> None:
    server = dialogue(DSN_OFFERED, pipelining=pipelining,
                      envelope_sender="bounces+tok-1@bounce.example.com", dsn_envid="tok-1")
    assert server.envelope() == [
        b"MAIL FROM:<bounces+tok-1@bounce.example.com> BODY=8BITMIME RET=HDRS ENVID=tok-1",
        b"RCPT TO:<old.manager@example.com> NOTIFY=FAILURE,DELAY "
        b"ORCPT=rfc822;old.manager@example.com"]


@pytest.mark.parametrize("pipelining", [True, False], ids=["pipelined", "plain"])
def test_a_server_without_dsn_gets_the_return_path_alone(pipelining: bool) -> None:
    server = dialogue(["PIPELINING", "8BITMIME"], pipelining=pipelining,
                      envelope_sender="bounces+tok-1@bounce.example.com", dsn_envid="tok-1")
    assert server.envelope() == [b"MAIL FROM:<bounces+tok-1@bounce.example.com> BODY=8BITMIME",
                                 b"RCPT TO:<old.manager@example.com>"]


@pytest.mark.parametrize("pipelining", [True, False], ids=["pipelined", "plain"])
def test_without_a_bounce_address_every_command_is_as_before(pipelining: bool) -> None:
    """The whole dialogue, byte for byte, as the release before VERP wrote it."""
    server = dialogue(DSN_OFFERED, pipelining=pipelining, envelope_sender="reports@example.com",
                      dsn_envid=None)
    assert server.lines == [b"EHLO client.test", b"MAIL FROM:<reports@example.com> BODY=8BITMIME",
                            b"RCPT TO:<old.manager@example.com>", b"DATA", b"QUIT"]


class RecordingSlot:
    """A slot that records what the delivery hands it and accepts."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.messages: list[Any] = []

    async def send(self, message: Any, sender: str, recipient: str, on_accepted: Any = None,
                   **kwargs: Any) -> Any:
        self.calls.append((sender, recipient, kwargs))
        self.messages.append(message)
        return SmtpReply(Stage.DATA, 250, "2.0.0 queued")


def test_from_settings_takes_the_first_secret_to_sign() -> None:
    settings = Settings(bounce_address=BOUNCES, bounce_secrets=(SECRET, b"older-secret-0123456"))
    delivery = Delivery.from_settings(settings)
    assert (delivery.bounce_address, delivery.bounce_secret) == (BOUNCES, SECRET)
    assert delivery.mail_from == settings.mail_from
    assert Delivery.from_settings(Settings()).bounce_address is None
    assert SECRET not in repr(delivery).encode()


def test_with_a_bounce_address_the_envelope_sender_is_the_signed_return_path() -> None:
    slot = RecordingSlot()
    delivery = Delivery("reports@example.com", None, 10.0, bounce_address=BOUNCES,
                        bounce_secret=SECRET)
    reply, _ = asyncio.run(delivery.send(EVENT, slot, NOW))  # type: ignore[arg-type]
    assert reply.code == 250
    [(sender, recipient, kwargs)] = slot.calls
    local, _, domain = sender.rpartition("@")
    assert domain == "bounce.example.com" and local.startswith("bounces+")
    token = kwargs["dsn_envid"]
    assert local == f"bounces+{token}"
    assert read_token(sender, BOUNCES, [SECRET], NOW, dt.timedelta(days=60)) == EVENT.outbox_id
    assert recipient == EVENT.recipient
    # the From header is the email's own
    assert b"From: Reports <reports@example.com>" in slot.messages[0].serialise(
        utf8=False, eight_bit=True)


def test_without_a_bounce_address_the_slot_is_called_as_before() -> None:
    slot = RecordingSlot()
    delivery = Delivery("reports@example.com", None, 10.0)
    asyncio.run(delivery.send(EVENT, slot, NOW))  # type: ignore[arg-type]
    assert slot.calls == [("Reports <reports@example.com>", EVENT.recipient, {})]


def test_an_email_whose_row_no_token_can_name_is_refused_not_sent() -> None:
    slot = RecordingSlot()
    delivery = Delivery("reports@example.com", None, 10.0, bounce_address=BOUNCES,
                        bounce_secret=SECRET)
    reply, _ = asyncio.run(delivery.send(dataclasses.replace(EVENT, outbox_id=0), slot,  # type: ignore[arg-type]
                                         NOW))
    assert (reply.stage, reply.failure) == (Stage.LOCAL, Failure.BAD_MESSAGE)
    assert "no return path" in reply.text and slot.calls == []


@settings(max_examples=examples(300), deadline=None)
@given(st.text(max_size=200))
def test_any_text_is_xtext_that_reads_back(text: str) -> None:
    """xtext is printable ASCII without + and = but in its escapes, and decodes to the UTF-8."""
    encoded = xtext(text)
    assert all(33 <= ord(c) <= 126 and c != "=" for c in encoded)
    decoded, rest = bytearray(), encoded
    while rest:
        if rest[0] == "+":
            assert re.fullmatch(r"[0-9A-F]{2}", rest[1:3])
            decoded.append(int(rest[1:3], 16))
            rest = rest[3:]
        else:
            decoded += rest[0].encode()
            rest = rest[1:]
    assert decoded.decode("utf-8") == text


@settings(max_examples=examples(300), deadline=None)
@given(st.emails().map(str))
def test_the_parameters_are_one_ascii_word_each(recipient: str) -> None:
    for parameter in (*dsn_rcpt_parameters(recipient), *dsn_mail_parameters(recipient)):
        assert parameter.isascii() and " " not in parameter and parameter.isprintable()
