"""Talks SMTP: a pool of persistent aiosmtplib connections that delivers one message to one recipient.

Every server reply or network failure comes back as an :class:`~sender.outcome.SmtpReply` naming the
stage that produced it; deciding what it means is :mod:`postroom.sender.outcome`'s job. Each connection's
dialogue is sender/smtp_session.py's, the config sender/smtp_config.py's.
"""

from __future__ import annotations

import asyncio
import logging
import re
from email.message import EmailMessage

from postroom.errors import PostroomError
from postroom.sender.outcome import Failure, SmtpReply, Stage
from postroom.sender.pipelining import SERVICE_UNAVAILABLE, OnAccepted
from postroom.sender.render import Payload, payload_of
from postroom.sender.smtp_config import SmtpConfig
from postroom.sender.smtp_replies import one_line
from postroom.sender.smtp_session import (
    Connection,
    DialogueFailed,
    SmtpOpener,
    discard,
    envelope,
    quit_connection,
    transaction,
)
from postroom.settings import Settings

logger = logging.getLogger(__name__)


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
        self._opener = SmtpOpener(config)
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
                smtp = await self._opener.open_for_sending()
            reply, healthy = await transaction(smtp, message, sender, recipient, on_accepted,
                                               dsn_envid)
            if reused and _stale(reply):
                # The server dropped the idle connection before we spoke; nothing was sent.
                logger.debug("smtp idle connection went stale; reconnecting",
                             extra={"stage": reply.stage.value, "code": reply.code})
                discard(smtp)
                smtp = await self._opener.open_for_sending()
                reply, healthy = await transaction(smtp, message, sender, recipient,
                                                   on_accepted, dsn_envid)
        except DialogueFailed as failed:
            if smtp is not None:
                discard(smtp)
            return _log(failed.reply, recipient)
        except BaseException:
            if smtp is not None:
                discard(smtp)  # mid-dialogue: the connection's state is unknown
            raise
        if healthy and smtp.is_connected and not self._closed:
            self._idle.append(smtp)
        else:
            await quit_connection(smtp)
        return _log(reply, recipient)

    async def probe(self) -> SmtpReply:
        """Connect, greet, upgrade and log in as a send would, then QUIT: whether sends can work.

        A 250 at EHLO when all went well; otherwise the reply or failure that stopped it.
        """
        try:
            smtp = await self._opener.open()
        except DialogueFailed as failed:
            return failed.reply
        tls = smtp.get_transport_info("sslcontext") is not None
        await quit_connection(smtp)
        text = "connected" + (" with TLS" if tls else " without TLS")
        if self.config.username is not None:
            text += ", logged in" + ("" if tls else "; WARNING: the AUTH password went in clear "
                                     "text (POSTROOM_SMTP_INSECURE_AUTH_WITHOUT_TLS=true)")
        return SmtpReply(Stage.EHLO, 250, text)

    async def close(self) -> None:
        """QUIT every idle connection; connections still sending are closed when they finish."""
        self._closed = True
        idle, self._idle = self._idle, []
        await asyncio.gather(*(quit_connection(smtp) for smtp in idle))
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
            discard(smtp)
        return None


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



def _log(reply: SmtpReply, recipient: str) -> SmtpReply:
    domain = recipient.rpartition("@")[2].lower()
    # An accepted email's line is the sender's outcome line; this one is for debugging.
    level = logging.DEBUG if reply.code is not None and 200 <= reply.code < 300 else logging.WARNING
    logger.log(level, "smtp %s %s %s: %s", domain, reply.stage.value,
               reply.code if reply.code is not None else reply.failure, one_line(reply.text),
               extra={"recipient_domain": domain, "stage": reply.stage.value,
                      "code": reply.code, "failure": reply.failure and reply.failure.value})
    return reply
