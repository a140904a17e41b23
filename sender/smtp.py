"""Talks SMTP: a pool of persistent aiosmtplib connections that delivers one message to one recipient.

Every server reply or network failure comes back as an :class:`~sender.outcome.SmtpReply` naming the
stage that produced it; deciding what it means is :mod:`sender.outcome`'s job.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import functools
import logging
import re
import socket
import ssl
from email.message import EmailMessage
from functools import partial
from pathlib import Path
from typing import cast

import aiosmtplib
from aiosmtplib.email import parse_address

from postroom.errors import ConfigError, PostroomError, UnsafeHeaderError
from postroom.rules import ascii_domain_address
from postroom.settings import Secret, Settings, TlsMode
from sender.message import dsn_mail_parameters, dsn_rcpt_parameters
from sender.outcome import Failure, SmtpReply, Stage
from sender.pipelining import (
    MAIL_ACCEPTED,
    RCPT_ACCEPTED,
    SERVICE_UNAVAILABLE,
    START_MAIL_INPUT,
    OnAccepted,
    Pipeline,
    data_bytes,
    is_accepted,
)
from sender.render import Payload, is_plain_address, payload_of

logger = logging.getLogger(__name__)

QUIT_TIMEOUT_S = 5.0
_UNREACHABLE_ERRNOS = {errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EHOSTDOWN, errno.ENETDOWN,
                       errno.EADDRNOTAVAIL}
_REFUSED_TEXT = "Connection refused"


@dataclasses.dataclass(frozen=True)
class SmtpConfig:
    """How to reach and talk to the SMTP server."""

    host: str
    port: int
    # The defaults are the settings' defaults, defined there once.
    tls: TlsMode = Settings.smtp_tls
    username: str | None = None
    password: Secret | None = None
    connect_timeout_s: float = Settings.smtp_connect_timeout_s
    timeout_s: float = Settings.smtp_timeout_s
    concurrency: int = Settings.smtp_concurrency
    local_hostname: str | None = None  # the EHLO name; None: this host's FQDN, looked up once
    tls_ca_file: Path | None = None    # extra CA certificates trusted besides the system's
    insecure_auth_without_tls: bool = Settings.smtp_insecure_auth_without_tls
    pipelining: bool = Settings.smtp_pipelining  # MAIL, RCPT, DATA as one group when offered

    @classmethod
    def from_settings(cls, settings: Settings) -> SmtpConfig:
        return cls(
            host=settings.smtp_host,
            port=settings.smtp_port,
            tls=settings.smtp_tls,
            username=settings.smtp_username,
            password=settings.smtp_password,
            connect_timeout_s=settings.smtp_connect_timeout_s,
            timeout_s=settings.smtp_timeout_s,
            concurrency=settings.smtp_concurrency,
            tls_ca_file=settings.smtp_tls_ca_file,
            insecure_auth_without_tls=settings.smtp_insecure_auth_without_tls,
            pipelining=settings.smtp_pipelining,
        )


def starttls_required(config: SmtpConfig) -> bool:
    """Whether a server without STARTTLS is refused: ``starttls`` says so, and ``auto`` does
    too when there is a password to protect, unless plain-text AUTH is explicitly allowed."""
    if config.tls is TlsMode.STARTTLS:
        return True
    return (config.tls is TlsMode.AUTO and config.username is not None
            and not config.insecure_auth_without_tls)


# A connection of the pool: aiosmtplib's, or taken over from it to pipeline.
Connection = aiosmtplib.SMTP | Pipeline


class _Failed(Exception):  # internal control flow; never escapes this module
    """Ends a dialogue early with the reply to report."""

    def __init__(self, reply: SmtpReply) -> None:
        super().__init__(reply.text)
        self.reply = reply


class SmtpSlot:
    """A sending slot of an :class:`SmtpPool`, held by the ``async with pool.slot()`` block."""

    def __init__(self, pool: SmtpPool) -> None:
        self._pool = pool

    async def send(self, message: EmailMessage | Payload, sender: str, recipient: str,
                   on_accepted: OnAccepted | None = None, *,
                   dsn_envid: str | None = None) -> SmtpReply:
        """Deliver ``message`` to ``recipient`` alone; the final reply, or why there was none.
        ``on_accepted`` is told a 250 to the message as soon as it is read. With ``dsn_envid``,
        a server that offers DSN is asked for notices of failure and delay (RFC 3461) naming
        it; one that does not offer it gets the same commands as without."""
        return await self._pool._send_in_slot(payload_of(message), sender, recipient, on_accepted,
                                              dsn_envid)


class _HeldSlot:
    """``async with pool.slot()``: a class, not contextlib's generator-based manager, which cost
    1.6% of the sender's CPU on a fast server (one per email)."""

    __slots__ = ("_pool",)

    def __init__(self, pool: SmtpPool) -> None:
        self._pool = pool

    async def __aenter__(self) -> SmtpSlot:
        await self._pool._slots.acquire()
        return self._pool._slot

    async def __aexit__(self, *_: object) -> None:
        self._pool._slots.release()


class SmtpPool:
    """Up to ``concurrency`` SMTP connections, opened on demand and reused across sends.

    ``send`` never raises for anything the server or the network does; it returns the reply.
    """

    def __init__(self, config: SmtpConfig) -> None:
        if config.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.config = config
        self._slots = asyncio.Semaphore(config.concurrency)
        self._slot = SmtpSlot(self)  # what a held slot sends through; it keeps no state
        self._idle: list[Connection] = []
        self._tls_context = _tls_context(config) if config.tls is not TlsMode.NONE else None
        self._local_hostname = config.local_hostname
        self._closed = False

    def slot(self) -> _HeldSlot:
        """One of the ``concurrency`` sending slots, held for an ``async with`` block: the one
        limit on connections. A caller that must do more than send while it holds the slot (the
        sender claims the key first) takes it here; ``send`` takes one for a single message."""
        if self._closed:
            raise RuntimeError("SmtpPool is closed")
        return _HeldSlot(self)

    async def send(self, message: EmailMessage | Payload, sender: str,
                   recipient: str, *, dsn_envid: str | None = None) -> SmtpReply:
        """Deliver ``message`` to ``recipient`` alone; the final reply, or why there was none."""
        async with self.slot() as slot:
            return await slot.send(message, sender, recipient, dsn_envid=dsn_envid)

    async def _send_in_slot(self, message: Payload, sender: str, recipient: str,
                            on_accepted: OnAccepted | None,
                            dsn_envid: str | None = None) -> SmtpReply:
        if self._closed:
            raise RuntimeError("SmtpPool is closed")
        (sender_at, sender_problem), (recipient_at, recipient_problem) = (
            envelope(sender), envelope(recipient))
        problem = sender_problem or recipient_problem
        if problem:
            return _log(SmtpReply(Stage.LOCAL, None, problem, Failure.BAD_MESSAGE), recipient)
        sender, recipient = sender_at, recipient_at
        smtp = self._take_idle()
        reused = smtp is not None
        try:
            if smtp is None:
                smtp = await self._open_for_sending()
            reply, healthy = await self._transaction(smtp, message, sender, recipient, on_accepted,
                                                     dsn_envid)
            if reused and _stale(reply):
                # The server dropped the idle connection before we spoke; nothing was sent.
                logger.debug("smtp idle connection went stale; reconnecting",
                             extra={"stage": reply.stage.value, "code": reply.code})
                _discard(smtp)
                smtp = await self._open_for_sending()
                reply, healthy = await self._transaction(smtp, message, sender, recipient,
                                                         on_accepted, dsn_envid)
        except _Failed as failed:
            if smtp is not None:
                _discard(smtp)
            return _log(failed.reply, recipient)
        except BaseException:
            if smtp is not None:
                _discard(smtp)  # mid-dialogue: the connection's state is unknown
            raise
        if healthy and smtp.is_connected and not self._closed:
            self._idle.append(smtp)
        else:
            await _quit(smtp)
        return _log(reply, recipient)

    async def probe(self) -> SmtpReply:
        """Connect, greet, upgrade and log in as a send would, then QUIT: whether sends can work.

        A 250 at EHLO when all went well; otherwise the reply or failure that stopped it.
        """
        try:
            smtp = await self._open()
        except _Failed as failed:
            return failed.reply
        tls = smtp.get_transport_info("sslcontext") is not None
        await _quit(smtp)
        text = "connected" + (" with TLS" if tls else " without TLS")
        if self.config.username is not None:
            text += ", logged in" + ("" if tls else "; WARNING: the AUTH password went in clear "
                                     "text (POSTROOM_SMTP_INSECURE_AUTH_WITHOUT_TLS=true)")
        return SmtpReply(Stage.EHLO, 250, text)

    async def close(self) -> None:
        """QUIT every idle connection; connections still sending are closed when they finish."""
        self._closed = True
        idle, self._idle = self._idle, []
        await asyncio.gather(*(_quit(smtp) for smtp in idle))
        await asyncio.sleep(0)  # aborted transports close their sockets on the next loop turn

    async def __aenter__(self) -> SmtpPool:
        return self

    async def __aexit__(self, *_exc_info: object) -> None:
        await self.close()

    def _take_idle(self) -> Connection | None:
        while self._idle:
            smtp = self._idle.pop()
            if smtp.is_connected:
                return smtp
            _discard(smtp)
        return None

    async def _open_for_sending(self) -> Connection:
        """A connection as _open makes it, pipelining when the server offers it and
        POSTROOM_SMTP_PIPELINING allows."""
        smtp = await self._open()
        if not (self.config.pipelining and smtp.supports_extension("pipelining")):
            return smtp
        try:
            return Pipeline.take_over(smtp, self.config.timeout_s)
        except aiosmtplib.SMTPServerDisconnected as exc:
            _discard(smtp)
            raise _Failed(SmtpReply(Stage.EHLO, None, str(exc), Failure.RESET)) from exc

    async def _open(self) -> aiosmtplib.SMTP:
        """A connected, greeted, TLS-upgraded and logged-in client, or _Failed."""
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
                raise _Failed(_code_reply(Stage.GREETING, exc)) from exc
            except aiosmtplib.SMTPConnectError as exc:
                raise _Failed(_connect_failure(exc)) from exc
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
        except _Failed:
            _discard(smtp)
            raise
        except Exception as exc:
            _discard(smtp)
            reply = _error_reply(stage, exc)
            if reply is None:
                raise
            raise _Failed(reply) from exc
        except BaseException:  # cancelled mid-handshake
            _discard(smtp)
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
            raise _Failed(SmtpReply(Stage.STARTTLS, None, why, Failure.TLS))
        return offered and self.config.tls in (TlsMode.STARTTLS, TlsMode.AUTO)

    async def _login(self, smtp: aiosmtplib.SMTP, username: str) -> None:
        cfg = self.config
        encrypted = smtp.get_transport_info("sslcontext") is not None
        if not encrypted and not cfg.insecure_auth_without_tls:
            raise _Failed(SmtpReply(
                Stage.AUTH, None, "refusing to send the AUTH password over a connection without "
                "TLS (POSTROOM_SMTP_TLS=none); POSTROOM_SMTP_INSECURE_AUTH_WITHOUT_TLS=true "
                "allows it", Failure.CONFIG))
        if not smtp.supports_extension("auth"):
            over = "TLS" if smtp.get_transport_info("sslcontext") is not None else "plain text"
            raise _Failed(SmtpReply(Stage.AUTH, None, f"server does not offer AUTH over {over}",
                                    Failure.REFUSED))
        password = cfg.password.reveal() if cfg.password is not None else ""
        try:
            await smtp.login(username, password)
        except aiosmtplib.SMTPException as exc:
            if type(exc) is not aiosmtplib.SMTPException:
                raise  # a reply, a timeout or a disconnect: mapped like any other stage
            # aiosmtplib's own refusal: no AUTH mechanism both sides know.
            raise _Failed(SmtpReply(Stage.AUTH, None, exc.message, Failure.CONFIG)) from exc

    async def _transaction(
        self, smtp: Connection, message: Payload, sender: str, recipient: str,
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
            reply = _code_reply(stage, exc)
            if not message_written:
                # A 2xx to the message is taken above (and by the Pipeline): past this point
                # a 2xx or 3xx ended MAIL, RCPT or DATA, where the dialogue has no place for it.
                reply = _out_of_turn(reply)
            if reply.code is None or reply.code == SERVICE_UNAVAILABLE or not smtp.is_connected:
                _discard(smtp)
                return reply, False
            return reply, await _reset(smtp)
        except Exception as exc:
            _discard(smtp)
            failure = _error_reply(smtp.stage if isinstance(smtp, Pipeline) else stage, exc)
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
        _discard(smtp)
        return False
    return smtp.is_connected


async def _quit(smtp: Connection) -> None:
    if smtp.is_connected:
        with contextlib.suppress(aiosmtplib.SMTPException, OSError):
            # Not smtp.quit(): that closes TLS gracefully, waiting on the server's close_notify.
            await smtp.execute_command(b"QUIT", timeout=QUIT_TIMEOUT_S)
    _discard(smtp)


def _discard(smtp: Connection) -> None:
    """Close at once, without a TLS shutdown round trip that could outlive the event loop."""
    transport = smtp.transport
    # Not isinstance(transport, asyncio.WriteTransport): uvloop's transports are not subclasses.
    if transport is not None and not transport.is_closing():
        cast(asyncio.WriteTransport, transport).abort()
    smtp.close()


def _stale(reply: SmtpReply) -> bool:
    return reply.stage is Stage.MAIL_FROM and (
        reply.failure is Failure.RESET or reply.code == SERVICE_UNAVAILABLE)


def check_smtp(settings: Settings) -> str:
    """What ``postroom check`` says of SMTP: a send's handshake works (ConfigError-free config,
    connect, greet, TLS, login); PostroomError naming the stage that failed otherwise."""

    async def probe() -> SmtpReply:
        async with SmtpPool(SmtpConfig.from_settings(settings)) as pool:
            return await pool.probe()

    reply = asyncio.run(probe())
    address = smtp_address(settings.smtp_host, settings.smtp_port)
    if reply.code != 250:
        what = reply.failure.value if reply.failure else reply.code
        where = f"at {address}"
        if reply.stage in (Stage.CONNECT, Stage.GREETING):
            # Reaching the server at all: the settings that say where it is are the ones to check.
            where += " (POSTROOM_SMTP_HOST, POSTROOM_SMTP_PORT)"
        text = _SOCKET_ADDRESS.sub("", reply.text).strip()
        raise PostroomError(f"{reply.stage.value}: {what} {where}" + (f": {text}" if text else ""))
    return f"{address} {reply.text}"


# The address tuple asyncio's errors end with ("Connect call failed ('127.0.0.1', 25)"): the
# check names the address itself, with the settings that give it.
_SOCKET_ADDRESS = re.compile(r"\s*\('[^']*'(?:,\s*\d+)+\)")


def smtp_address(host: str, port: int) -> str:
    """``host:port``, an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _tls_context(config: SmtpConfig) -> ssl.SSLContext:
    """A verifying client context: the system's CAs, plus ``tls_ca_file`` when set."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    if config.tls_ca_file is not None:
        try:
            context.load_verify_locations(cafile=config.tls_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError("POSTROOM_SMTP_TLS_CA_FILE",
                              f"cannot load {config.tls_ca_file}: {exc}") from exc
    return context


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


def _code_reply(stage: Stage, exc: aiosmtplib.SMTPResponseException) -> SmtpReply:
    if exc.code < 100:
        # aiosmtplib's code for a reply it could not parse: no real reply came.
        return SmtpReply(stage, None, _one_line(exc.message), Failure.RESET)
    return SmtpReply(stage, exc.code, exc.message)  # multi-line as sent; outcome joins it


def _out_of_turn(reply: SmtpReply) -> SmtpReply:
    """A 2xx or 3xx that ended MAIL, RCPT or the DATA command is a reply the dialogue has no
    place for (a 252 to RCPT, a 250 to DATA where 354 was due): the message was not written,
    whatever the code says, so it is a protocol error (transient), never "sent". Not for the
    reply to the message itself, whose every 2xx is a delivery."""
    if reply.code is None or reply.code >= 400:
        return reply
    return SmtpReply(reply.stage, None, _one_line(f"reply out of turn: {reply.code} {reply.text}"),
                     Failure.RESET)


def _connect_failure(exc: aiosmtplib.SMTPConnectError) -> SmtpReply:
    """Failures before the greeting was read; aiosmtplib keeps the OS error as the cause."""
    cause = exc.__cause__
    text = _one_line(str(cause) if cause is not None else exc.message)
    if isinstance(cause, aiosmtplib.SMTPTimeoutError):
        return SmtpReply(Stage.GREETING, None, "timed out waiting for the greeting",
                         Failure.TIMEOUT)
    if isinstance(cause, aiosmtplib.SMTPServerDisconnected):
        return SmtpReply(Stage.GREETING, None, "connection closed before the greeting",
                         Failure.RESET)
    if isinstance(exc, aiosmtplib.SMTPConnectTimeoutError):
        return SmtpReply(Stage.CONNECT, None, _one_line(exc.message), Failure.TIMEOUT)
    reply = _error_reply(Stage.CONNECT, cause) if isinstance(cause, Exception) else None
    return reply or SmtpReply(Stage.CONNECT, None, text, Failure.RESET)


def _error_reply(stage: Stage, exc: Exception) -> SmtpReply | None:
    """The reply for an exception with no SMTP code; None for one that is not about SMTP."""
    text = _one_line(str(exc)) or type(exc).__name__
    failure: Failure
    if isinstance(exc, aiosmtplib.SMTPResponseException):
        return _code_reply(stage, exc)
    if isinstance(exc, ssl.SSLError | ssl.CertificateError):
        failure = Failure.TLS
    elif isinstance(exc, aiosmtplib.SMTPTimeoutError | TimeoutError | ConnectionAbortedError):
        # asyncio aborts a TLS handshake that takes too long with ConnectionAbortedError.
        failure = Failure.TIMEOUT
    elif isinstance(exc, aiosmtplib.SMTPServerDisconnected | ConnectionResetError
                    | BrokenPipeError):
        failure = Failure.RESET
        if isinstance(exc.__cause__, ssl.SSLError):
            failure, text = Failure.TLS, _one_line(str(exc.__cause__))
    elif isinstance(exc, ConnectionRefusedError):
        failure = Failure.REFUSED
    elif isinstance(exc, socket.gaierror):
        failure = Failure.UNREACHABLE
    elif isinstance(exc, OSError):
        if exc.errno in _UNREACHABLE_ERRNOS:
            failure = Failure.UNREACHABLE
        elif exc.errno is None and _REFUSED_TEXT in text:
            # asyncio's "Multiple exceptions" when every address of the host refused.
            failure = Failure.REFUSED
        else:
            failure = Failure.RESET
    elif isinstance(exc, aiosmtplib.SMTPException):
        failure = Failure.RESET
    else:
        return None
    return SmtpReply(stage, None, text, failure)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _log(reply: SmtpReply, recipient: str) -> SmtpReply:
    domain = recipient.rpartition("@")[2].lower()
    # An accepted email's line is the sender's outcome line; this one is for debugging.
    level = logging.DEBUG if reply.code is not None and 200 <= reply.code < 300 else logging.WARNING
    logger.log(level, "smtp %s %s %s: %s", domain, reply.stage.value,
               reply.code if reply.code is not None else reply.failure, _one_line(reply.text),
               extra={"recipient_domain": domain, "stage": reply.stage.value,
                      "code": reply.code, "failure": reply.failure and reply.failure.value})
    return reply
