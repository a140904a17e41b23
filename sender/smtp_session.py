"""One SMTP connection's dialogue over aiosmtplib: opening it (connect, greet, STARTTLS, AUTH)
and one transaction on it (MAIL, RCPT, DATA), and closing it. Which connection is used when is
the pool's business (sender/smtp.py); what a reply means is sender/outcome.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
from functools import partial
from typing import cast

import aiosmtplib
from aiosmtplib.email import parse_address

from postroom.errors import UnsafeHeaderError
from postroom.rules import ascii_domain_address
from postroom.sender.message import dsn_mail_parameters, dsn_rcpt_parameters
from postroom.sender.outcome import Failure, SmtpReply, Stage
from postroom.sender.pipelining import (
    MAIL_ACCEPTED,
    RCPT_ACCEPTED,
    SERVICE_UNAVAILABLE,
    START_MAIL_INPUT,
    OnAccepted,
    Pipeline,
    data_bytes,
    is_accepted,
)
from postroom.sender.render import Payload, is_plain_address
from postroom.sender.smtp_config import SmtpConfig, starttls_required, tls_context
from postroom.sender.smtp_replies import code_reply, connect_failure, error_reply, out_of_turn
from postroom.settings import TlsMode

logger = logging.getLogger(__name__)

QUIT_TIMEOUT_S = 5.0

# A connection of the pool: aiosmtplib's, or taken over from it to pipeline.
Connection = aiosmtplib.SMTP | Pipeline


class DialogueFailed(Exception):  # internal control flow; never escapes the SMTP client
    """Ends a dialogue early with the reply to report."""

    def __init__(self, reply: SmtpReply) -> None:
        super().__init__(reply.text)
        self.reply = reply


class SmtpOpener:
    """Opens the pool's connections as its config says: connected, greeted, upgraded to TLS and
    logged in; the EHLO name is looked up once, on the first."""

    def __init__(self, config: SmtpConfig) -> None:
        self.config = config
        self._tls_context = tls_context(config) if config.tls is not TlsMode.NONE else None
        self._local_hostname = config.local_hostname

    async def open_for_sending(self) -> Connection:
        """A connection as :meth:`open` makes it, pipelining when the server offers it and
        POSTROOM_SMTP_PIPELINING allows."""
        smtp = await self.open()
        if not (self.config.pipelining and smtp.supports_extension("pipelining")):
            return smtp
        try:
            return Pipeline.take_over(smtp, self.config.timeout_s)
        except aiosmtplib.SMTPServerDisconnected as exc:
            discard(smtp)
            raise DialogueFailed(SmtpReply(Stage.EHLO, None, str(exc), Failure.RESET)) from exc

    async def open(self) -> aiosmtplib.SMTP:
        """A connected, greeted, TLS-upgraded and logged-in client, or DialogueFailed."""
        cfg = self.config
        if self._local_hostname is None:
            self._local_hostname = await asyncio.to_thread(socket.getfqdn)
        smtp = aiosmtplib.SMTP(
            hostname=cfg.host, port=cfg.port, local_hostname=self._local_hostname,
            timeout=cfg.timeout_s, use_tls=cfg.tls is TlsMode.TLS, start_tls=False,
            tls_context=self._tls_context,
        )
        stage = Stage.CONNECT
        try:
            try:
                await smtp.connect(timeout=cfg.connect_timeout_s)
            except aiosmtplib.SMTPConnectResponseError as exc:
                raise DialogueFailed(code_reply(Stage.GREETING, exc)) from exc
            except aiosmtplib.SMTPConnectError as exc:
                raise DialogueFailed(connect_failure(exc)) from exc
            stage = Stage.EHLO
            await _greet(smtp)
            if self._wants_starttls(smtp):
                stage = Stage.STARTTLS
                await smtp.starttls()
                stage = Stage.EHLO
                await _greet(smtp)
            if cfg.username is not None:
                stage = Stage.AUTH
                await self._login(smtp, cfg.username)
        except DialogueFailed:
            discard(smtp)
            raise
        except Exception as exc:
            discard(smtp)
            reply = error_reply(stage, exc)
            if reply is None:
                raise
            raise DialogueFailed(reply) from exc
        except BaseException:  # cancelled mid-handshake
            discard(smtp)
            raise
        logger.debug("smtp connected", extra={"host": cfg.host, "port": cfg.port,
                                              "tls": smtp.get_transport_info("sslcontext")
                                              is not None})
        return smtp

    def _wants_starttls(self, smtp: aiosmtplib.SMTP) -> bool:
        offered = smtp.supports_extension("starttls")
        if starttls_required(self.config) and not offered:
            why = ("server does not offer STARTTLS" if self.config.tls is TlsMode.STARTTLS else
                   "server does not offer STARTTLS; refusing to send the AUTH password in clear "
                   "text (POSTROOM_SMTP_TLS=auto with a username requires it)")
            raise DialogueFailed(SmtpReply(Stage.STARTTLS, None, why, Failure.TLS))
        return offered and self.config.tls in (TlsMode.STARTTLS, TlsMode.AUTO)

    async def _login(self, smtp: aiosmtplib.SMTP, username: str) -> None:
        cfg = self.config
        encrypted = smtp.get_transport_info("sslcontext") is not None
        if not encrypted and not cfg.insecure_auth_without_tls:
            raise DialogueFailed(SmtpReply(
                Stage.AUTH, None, "refusing to send the AUTH password over a connection without "
                "TLS (POSTROOM_SMTP_TLS=none); POSTROOM_SMTP_INSECURE_AUTH_WITHOUT_TLS=true "
                "allows it", Failure.CONFIG))
        if not smtp.supports_extension("auth"):
            over = "TLS" if smtp.get_transport_info("sslcontext") is not None else "plain text"
            raise DialogueFailed(SmtpReply(Stage.AUTH, None, f"server does not offer AUTH over {over}",
                                           Failure.REFUSED))
        password = cfg.password.reveal() if cfg.password is not None else ""
        try:
            await smtp.login(username, password)
        except aiosmtplib.SMTPException as exc:
            if type(exc) is not aiosmtplib.SMTPException:
                raise  # a reply, a timeout or a disconnect: mapped like any other stage
            # aiosmtplib's own refusal: no AUTH mechanism both sides know.
            raise DialogueFailed(SmtpReply(Stage.AUTH, None, exc.message, Failure.CONFIG)) from exc


async def transaction(
    smtp: Connection, message: Payload, sender: str, recipient: str,
    on_accepted: OnAccepted | None, dsn_envid: str | None = None,
) -> tuple[SmtpReply, bool]:
    """MAIL, RCPT, DATA: the final reply, and whether the connection can be reused."""
    utf8 = not (sender.isascii() and recipient.isascii()) or _headers_need_utf8(message)
    if utf8 and not smtp.supports_extension("smtputf8"):
        return SmtpReply(Stage.MAIL_FROM, None,
                         "a non-ASCII address needs SMTPUTF8, which the server does not offer",
                         Failure.BAD_MESSAGE), True
    eight_bit = smtp.supports_extension("8bitmime")
    try:
        content = (await asyncio.to_thread(partial(message.serialise, utf8=utf8,
                                                   eight_bit=eight_bit))
                   if message.heavy else message.serialise(utf8=utf8, eight_bit=eight_bit))
    except UnsafeHeaderError as exc:
        return SmtpReply(Stage.LOCAL, None, str(exc), Failure.BAD_MESSAGE), True
    except (ValueError, TypeError, LookupError, UnicodeError) as exc:
        return SmtpReply(Stage.LOCAL, None, f"cannot serialise the message: {exc}",
                         Failure.BAD_MESSAGE), True
    options = []
    if smtp.supports_extension("size"):
        options.append(f"SIZE={len(content)}")
    if eight_bit:
        options.append("BODY=8BITMIME")
    if utf8:
        options.append("SMTPUTF8")
    rcpt_options: tuple[str, ...] = ()
    if dsn_envid is not None and smtp.supports_extension("dsn"):
        options.extend(dsn_mail_parameters(dsn_envid))
        rcpt_options = dsn_rcpt_parameters(recipient)
    encoding = "utf-8" if utf8 else "ascii"
    # Not smtp.mail() and smtp.rcpt(): they parse and quote the checked addresses again.
    mail = b" ".join([b"MAIL", b"FROM:<" + sender.encode(encoding) + b">",
                      *(option.encode("ascii") for option in options)])
    rcpt = b" ".join([b"RCPT TO:<" + recipient.encode(encoding) + b">",
                      *(option.encode("ascii") for option in rcpt_options)])
    stage = Stage.MAIL_FROM
    message_written = False
    try:
        if isinstance(smtp, Pipeline):
            response = await smtp.transaction(mail, rcpt, content, on_accepted)
        else:
            await _command(smtp, MAIL_ACCEPTED, mail)
            stage = Stage.RCPT_TO
            await _command(smtp, RCPT_ACCEPTED, rcpt)
            stage = Stage.DATA
            # The DATA command and the message as two commands, not smtp.data(), which
            # raises alike for a 2xx to DATA (no message was written: out of turn) and for
            # a 2xx to the message other than 250 (a delivery).
            await _command(smtp, (START_MAIL_INPUT,), b"DATA")
            message_written = True
            response = await _message(smtp, content)
            if on_accepted is not None:
                on_accepted(response.code, response.message)
    except aiosmtplib.SMTPResponseException as exc:
        if isinstance(smtp, Pipeline):
            stage = smtp.stage
        reply = code_reply(stage, exc)
        if not message_written:
            # A 2xx to the message is taken above (and by the Pipeline): past this point
            # a 2xx or 3xx ended MAIL, RCPT or DATA, where the dialogue has no place for it.
            reply = out_of_turn(reply)
        if reply.code is None or reply.code == SERVICE_UNAVAILABLE or not smtp.is_connected:
            discard(smtp)
            return reply, False
        return reply, await _reset(smtp)
    except Exception as exc:
        discard(smtp)
        failure = error_reply(smtp.stage if isinstance(smtp, Pipeline) else stage, exc)
        if failure is None:
            raise
        return failure, False
    return SmtpReply(Stage.DATA, response.code, response.message), True


async def _command(smtp: aiosmtplib.SMTP, accepted: tuple[int, ...], command: bytes) -> None:
    """One command; SMTPResponseException unless its reply's code is one of ``accepted``."""
    response = await smtp.execute_command(command)
    if response.code not in accepted:
        raise aiosmtplib.SMTPResponseException(response.code, response.message)


async def _message(smtp: aiosmtplib.SMTP, content: bytes) -> aiosmtplib.SMTPResponse:
    """The message after DATA's 354, written and its reply read as the second half of
    aiosmtplib's execute_data_command (its command lock, its pending-reply mark: the pin below
    6 in pyproject.toml holds them, as for sender/pipelining.py); SMTPResponseException unless a
    2xx takes it. smtp.data() raises alike for a 2xx to the DATA command and to the message."""
    protocol = smtp.protocol
    if protocol is None or protocol._command_lock is None:
        raise aiosmtplib.SMTPServerDisconnected("Connection lost")
    try:
        async with protocol._command_lock:
            protocol._response_pending = True
            protocol.write(data_bytes(content))
            response = await protocol.read_response(timeout=smtp.timeout)
    except (aiosmtplib.SMTPServerDisconnected, aiosmtplib.SMTPTimeoutError):
        smtp.close()
        raise
    if not is_accepted(response.code):
        raise aiosmtplib.SMTPResponseException(response.code, response.message)
    return response


async def _greet(smtp: aiosmtplib.SMTP) -> None:
    """EHLO, falling back to HELO for a server that refuses EHLO but stays connected."""
    try:
        await smtp.ehlo()
    except aiosmtplib.SMTPHeloError as exc:
        if exc.code == SERVICE_UNAVAILABLE or not smtp.is_connected:
            raise
        await smtp.helo()


async def _reset(smtp: Connection) -> bool:
    """RSET after a refused command; False when the connection is no longer usable."""
    try:
        await smtp.rset()
    except (aiosmtplib.SMTPException, OSError):
        discard(smtp)
        return False
    return smtp.is_connected


async def quit_connection(smtp: Connection) -> None:
    """QUIT, waiting at most QUIT_TIMEOUT_S for the reply, then close at once."""
    if smtp.is_connected:
        with contextlib.suppress(aiosmtplib.SMTPException, OSError):
            # Not smtp.quit(): that closes TLS gracefully, waiting on the server's close_notify.
            await smtp.execute_command(b"QUIT", timeout=QUIT_TIMEOUT_S)
    discard(smtp)


def discard(smtp: Connection) -> None:
    """Close at once, without a TLS shutdown round trip that could outlive the event loop."""
    transport = smtp.transport
    # Not isinstance(transport, asyncio.WriteTransport): uvloop's transports are not subclasses.
    if transport is not None and not transport.is_closing():
        cast(asyncio.WriteTransport, transport).abort()
    smtp.close()


def _headers_need_utf8(message: Payload) -> bool:
    """Whether an address in ``message``'s headers has a non-ASCII local part (its domain goes
    as IDNA): it is written as UTF-8 only under SMTPUTF8 (RFC 6532), and without it the email
    package puts an encoded word in the addr-spec (``=?utf-8?q?jos=C3=A9?=@example.com``), which
    RFC 2047 forbids. The envelope says nothing of the From when its sender is the return path
    (POSTROOM_BOUNCE_ADDRESS)."""
    return not all(envelope(address)[0].isascii() for address in message.header_addresses)


def envelope(address: str) -> tuple[str, str | None]:
    """The address to put on a MAIL or RCPT line for ``address`` (a bare address or a
    ``Name <address>``), a non-ASCII domain in its IDNA form (only a non-ASCII local part needs
    SMTPUTF8); and why it cannot go there, if it cannot."""
    if is_plain_address(address):
        return address, None  # the recipient, almost always: nothing to parse
    return _parsed_envelope(address)


@functools.lru_cache(maxsize=1024)
def _parsed_envelope(address: str) -> tuple[str, str | None]:
    if not address or any(ord(c) < 32 or ord(c) == 127 for c in address):
        return address, f"address {address!r} is empty or holds control characters"
    try:
        return ascii_domain_address(parse_address(address)), None
    except ValueError as exc:
        return address, str(exc)

