"""A local SMTP server for development and tests that misbehaves on purpose (aiosmtpd).

It rejects, defers, slows down or drops chosen recipients, and keeps what it accepts in memory
and, optionally, in a Maildir another process reads (devsmtp_maildir); devsmtp_cli runs it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import mailbox
import re
import ssl
import threading
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import NamedTuple

from aiosmtpd.smtp import SMTP, Envelope, Session

from postroom.devkit.devsmtp_session import DevController

logger = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 1025  # the usual port of a dev SMTP server; not Mailpit's published 8025 (its web UI)
SERVER_HOSTNAME = "devsmtp.localhost"  # fixed, so aiosmtpd skips its reverse DNS lookup
REJECT_REPLY = "550 5.1.1 User unknown"
DEFER_REPLY = "451 4.3.0 try again later"
# Gmail's answer to a sender going too fast for one domain.
THROTTLE_REPLY = ("450 4.2.1 The user you are trying to contact is receiving mail at a rate that "
                  "prevents additional messages from being delivered")
# A fault of this server (its Maildir, a bug): temporary, never the recipient's refusal.
LOCAL_ERROR_REPLY = "451 4.3.0 local error in processing"
STOP_TIMEOUT_S = 2.0
# What the server keeps in memory: the newest messages, at most this many and this many bytes.
DEFAULT_MAX_KEPT = 10_000
DEFAULT_MAX_KEPT_BYTES = 256 * 1024 * 1024


class ReceivedMessage(NamedTuple):
    """One accepted message for one recipient."""

    mail_from: str
    rcpt: str
    message_id: str | None
    raw: bytes
    # The MAIL and RCPT parameters as aiosmtpd keeps them (upper-cased), e.g. RET=HDRS.
    mail_options: tuple[str, ...] = ()
    rcpt_options: tuple[str, ...] = ()


class _Handler:
    """aiosmtpd hooks; they run on the server's thread, so shared state sits behind a lock."""

    def __init__(
        self,
        *,
        reject: Iterable[str],
        defer: Mapping[str, int],
        drop: Iterable[str],
        latency_ms: int,
        maildir: Path | None,
        max_kept: int = DEFAULT_MAX_KEPT,
        max_kept_bytes: int = DEFAULT_MAX_KEPT_BYTES,
        pipelining: bool = True,
        dsn: bool = False,
        throttle_every: int = 0,
    ) -> None:
        self.pipelining = pipelining
        self.throttle_every = throttle_every  # every Nth RCPT TO answered THROTTLE_REPLY (0: none)
        self.rcpts = 0
        self.dsn = dsn
        self.max_kept = max_kept
        self.max_kept_bytes = max_kept_bytes
        self.kept_bytes = 0
        self.forgotten = 0
        self.reject = {_norm(a) for a in reject}
        self.defer = {_norm(a): n for a, n in defer.items()}
        self.drop = {_norm(a) for a in drop}
        self.latency_ms = latency_ms
        self.maildir = open_maildir(maildir) if maildir is not None else None
        self.lock = threading.Lock()
        self.messages: collections.deque[ReceivedMessage] = collections.deque()
        self.deferred: dict[str, int] = {}
        self.throttle: set[str] = set()  # recipient domains answered THROTTLE_REPLY
        self.throttled_replies = 0
        self.connections = 0
        self.peak_connections = 0
        self._open: set[SMTP] = set()   # every client connection, greeted or not
        self._live: set[SMTP] = set()   # the greeted ones among them
        self._all_closed: asyncio.Event | None = None

    def reset(self) -> None:
        with self.lock:
            self.messages.clear()
            self.kept_bytes = 0
            self.deferred.clear()
            self.connections = 0
            self.peak_connections = len(self._live)

    # Connections are counted once a client greets, so aiosmtpd's own start-up probe is not one.
    def _greeted(self, server: SMTP) -> None:
        with self.lock:
            if server in self._live:
                return  # the second EHLO after STARTTLS
            self._live.add(server)
            self.connections += 1
            self.peak_connections = max(self.peak_connections, len(self._live))

    def opened(self, server: SMTP) -> None:
        with self.lock:
            self._open.add(server)

    def closed(self, server: SMTP) -> None:
        with self.lock:
            self._open.discard(server)
            self._live.discard(server)
            if not self._open and self._all_closed is not None:
                self._all_closed.set()  # on the server's loop, where connection_lost runs

    async def close_connections(self, timeout_s: float) -> None:
        """Close every client connection and wait, so none outlives the server's event loop."""
        all_closed = asyncio.Event()
        with self.lock:
            servers = list(self._open)
            self._all_closed = all_closed
            if not servers:
                all_closed.set()
        for server in servers:
            if server.transport is not None:
                server.transport.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(all_closed.wait(), timeout_s)

    async def handle_EHLO(
        self, server: SMTP, session: Session, envelope: Envelope, hostname: str,
        responses: list[str],
    ) -> list[str]:
        session.host_name = hostname
        self._greeted(server)
        if self.pipelining:
            # aiosmtpd reads each command from its buffer in turn, so a group works; it just
            # does not say so.
            responses.insert(len(responses) - 1, "250-PIPELINING")
        if self.dsn:
            responses.insert(len(responses) - 1, "250-DSN")
        return responses

    async def handle_HELO(
        self, server: SMTP, session: Session, envelope: Envelope, hostname: str,
    ) -> str:
        session.host_name = hostname
        self._greeted(server)
        return f"250 {server.hostname}"

    async def handle_RCPT(
        self, server: SMTP, session: Session, envelope: Envelope, address: str,
        rcpt_options: list[str],
    ) -> str:
        key = _norm(address)
        with self.lock:
            self.rcpts += 1
            throttled = key.rpartition("@")[2] in self.throttle or (
                self.throttle_every > 0 and self.rcpts % self.throttle_every == 0)
            if throttled:
                self.throttled_replies += 1
        if throttled:
            logger.info("devsmtp throttle %s", address, extra={"rcpt": address,
                                                               "reply": THROTTLE_REPLY})
            return THROTTLE_REPLY
        if key in self.reject:
            logger.info("devsmtp reject %s", address, extra={"rcpt": address, "reply": REJECT_REPLY})
            return REJECT_REPLY
        with self.lock:
            seen = self.deferred.get(key, 0)
            defer = seen < self.defer.get(key, 0)
            if defer:
                self.deferred[key] = seen + 1
        if defer:
            logger.info("devsmtp defer %s (%d of %d)", address, seen + 1, self.defer[key],
                        extra={"rcpt": address, "reply": DEFER_REPLY})
            return DEFER_REPLY
        envelope.rcpt_tos.append(address)
        envelope.rcpt_options.extend(rcpt_options)
        return "250 2.1.5 Ok"

    async def handle_DATA(
        self, server: SMTP, session: Session, envelope: Envelope,
    ) -> str:
        if any(_norm(r) in self.drop for r in envelope.rcpt_tos):
            logger.info("devsmtp drop %s", ",".join(envelope.rcpt_tos),
                        extra={"rcpt": envelope.rcpt_tos})
            if isinstance(server.transport, asyncio.Transport):
                server.transport.abort()
            # aiosmtpd notices the lost connection and cancels this session's task.
            await asyncio.Event().wait()
        if self.latency_ms:
            await asyncio.sleep(self.latency_ms / 1000)
        raw: bytes = envelope.original_content or b""
        mail_from: str = envelope.mail_from or ""
        message_id = _message_id(raw)
        queue_id = uuid.uuid4().hex[:12].upper()
        for rcpt in envelope.rcpt_tos:
            if self.maildir is not None:
                # Delivered-To and Return-Path keep the envelope for readers of the Maildir.
                stamped = (f"Return-Path: <{mail_from}>\r\nDelivered-To: {rcpt}\r\n"
                           .encode() + raw)
                try:
                    self.maildir.add(stamped)
                except OSError as exc:
                    logger.warning("devsmtp cannot store the message in the Maildir: %s", exc)
                    return LOCAL_ERROR_REPLY  # our disk, not the recipient: try again later
            with self.lock:
                self._keep(ReceivedMessage(mail_from, rcpt, message_id, raw,
                                           tuple(envelope.mail_options),
                                           tuple(envelope.rcpt_options)))
            logger.info("devsmtp accept %s %s", rcpt, message_id,
                        extra={"rcpt": rcpt, "message_id": message_id, "queue_id": queue_id})
        return f"250 2.0.0 Ok queued as {queue_id}"

    async def handle_exception(self, error: Exception) -> str:
        # aiosmtpd answers a handler's exception with a 500, which a client takes for the
        # recipient's permanent refusal; a fault of this server is a temporary one.
        logger.warning("devsmtp local error: %s: %s", type(error).__name__, error)
        return LOCAL_ERROR_REPLY

    def _keep(self, message: ReceivedMessage) -> None:
        """Keep ``message``, forgetting the oldest ones past the caps (under the lock)."""
        self.messages.append(message)
        self.kept_bytes += len(message.raw)
        while self.messages and (len(self.messages) > self.max_kept
                                 or self.kept_bytes > self.max_kept_bytes):
            self.kept_bytes -= len(self.messages.popleft().raw)
            if self.forgotten == 0:
                logger.warning("devsmtp keeps at most %d messages / %d bytes in memory; "
                               "forgetting the oldest", self.max_kept, self.max_kept_bytes)
            self.forgotten += 1


class DevSmtpServer:
    """A misbehaving SMTP server on a thread of its own; ``start()`` returns once it answers.

    ``reject``: RCPT TO gets ``550 5.1.1``. ``defer``: RCPT TO gets ``451 4.3.0`` for the first N
    tries of each address. ``drop``: the connection is closed after the message content, with no
    reply. ``latency_ms``: delay before replying to the message content. ``tls_context``: offer
    STARTTLS with this server context. ``pipelining``: offer PIPELINING (RFC 2920). ``dsn``: offer
    DSN (RFC 3461) and keep its parameters in each message's ``mail_options``.
    ``throttle_every``: every Nth RCPT TO of the server's life gets the rate limit reply, whatever
    its address. ``port=0`` picks a free port (read ``.port`` after start).
    """

    def __init__(
        self,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        reject: Iterable[str] = (),
        defer: Mapping[str, int] | None = None,
        latency_ms: int = 0,
        maildir: Path | None = None,
        drop: Iterable[str] = (),
        *,
        tls_context: ssl.SSLContext | None = None,
        max_kept: int = DEFAULT_MAX_KEPT,
        max_kept_bytes: int = DEFAULT_MAX_KEPT_BYTES,
        pipelining: bool = True,
        dsn: bool = False,
        throttle_every: int = 0,
    ) -> None:
        self.host = host
        self._port = port
        self._handler = _Handler(reject=reject, defer=defer or {}, drop=drop,
                                 latency_ms=latency_ms, maildir=maildir, max_kept=max_kept,
                                 max_kept_bytes=max_kept_bytes, pipelining=pipelining,
                                 dsn=dsn, throttle_every=throttle_every)
        self._tls_context = tls_context
        self._controller: DevController | None = None

    @property
    def port(self) -> int:
        return self._controller.port if self._controller is not None else self._port

    @property
    def messages(self) -> list[ReceivedMessage]:
        """Accepted messages, oldest first (a copy)."""
        with self._handler.lock:
            return list(self._handler.messages)

    @property
    def forgotten(self) -> int:
        """Accepted messages no longer kept in memory (past max_kept or max_kept_bytes)."""
        return self._handler.forgotten

    @property
    def connections(self) -> int:
        """Client connections that greeted the server since start (or reset)."""
        return self._handler.connections

    @property
    def peak_connections(self) -> int:
        """The most client connections open at once since start (or reset)."""
        return self._handler.peak_connections

    def start(self) -> None:
        controller = DevController(
            self._handler, hostname=self.host, port=self._port,
            server_hostname=SERVER_HOSTNAME, tls_context=self._tls_context,
            ready_timeout=10.0,
        )
        try:
            controller.start()
        except BaseException:
            controller.stop(no_assert=True)
            if not controller.loop.is_closed():
                controller.loop.close()
            raise
        self._controller = controller

    def stop(self) -> None:
        if self._controller is not None:
            # aiosmtpd's stop() cancels sessions but may close the loop before their sockets;
            # and a client may connect again while the others close, so stop listening first.
            controller = self._controller

            async def close_all() -> None:
                if isinstance(controller.server, asyncio.Server):
                    controller.server.close()
                await self._handler.close_connections(STOP_TIMEOUT_S)

            closing = asyncio.run_coroutine_threadsafe(close_all(), controller.loop)
            closing.result(STOP_TIMEOUT_S + 1)
            controller.stop()
            self._controller = None

    def __enter__(self) -> DevSmtpServer:
        self.start()
        return self

    def __exit__(self, *_exc_info: object) -> None:
        self.stop()

    def message_ids(self) -> list[str | None]:
        return [m.message_id for m in self.messages]

    def count(self, rcpt: str | None = None) -> int:
        """Accepted messages, for one recipient or all."""
        return sum(1 for m in self.messages if rcpt is None or _norm(m.rcpt) == _norm(rcpt))

    def reset(self) -> None:
        """Forget accepted messages, defer counts and connection counts (the Maildir stays)."""
        self._handler.reset()

    def throttle(self, *domains: str) -> None:
        """From now on answer RCPT TO of these recipient domains (only) with Gmail's
        ``450 4.2.1`` rate limit; ``throttle()`` with none lifts it."""
        with self._handler.lock:
            self._handler.throttle = {d.strip().lower() for d in domains}

    @property
    def throttled_replies(self) -> int:
        """How many RCPT TO were answered with the rate limit."""
        with self._handler.lock:
            return self._handler.throttled_replies

    @property
    def rcpts(self) -> int:
        """How many RCPT TO were answered, whatever the reply (a rejected send counts too)."""
        with self._handler.lock:
            return self._handler.rcpts


def open_maildir(path: Path) -> mailbox.Maildir:
    """The Maildir at ``path``, its ``cur``, ``new`` and ``tmp`` created when missing: the
    standard library creates them only when ``path`` itself does not exist yet, so an existing
    empty directory (``mkdir md``) failed every delivery."""
    for sub in ("cur", "new", "tmp"):
        (path / sub).mkdir(parents=True, exist_ok=True)
    return mailbox.Maildir(path, create=False)


# A Message-ID header line and its folded continuations, in the header block.
_MESSAGE_ID = re.compile(rb"^message-id[ \t]*:(.*(?:\r?\n[ \t].*)*)", re.IGNORECASE | re.MULTILINE)
_HEADER_END = re.compile(rb"\r?\n\r?\n")


def _message_id(raw: bytes) -> str | None:
    """The Message-ID, unfolded. Found with a regular expression over the header block: parsing
    every header with the ``email`` package was a fifth of this server's CPU at full load, CPU that
    a benchmark's client on the same machine then lacks."""
    end = _HEADER_END.search(raw)
    match = _MESSAGE_ID.search(raw, 0, end.start() if end else len(raw))
    if match is None:
        return None
    return " ".join(match.group(1).decode("utf-8", "replace").split()) or None


def _norm(address: str) -> str:
    return address.strip().strip("<>").lower()


if __name__ == "__main__":  # `python -m postroom.devkit.devsmtp`, as before devsmtp_cli
    from postroom.devkit.devsmtp_cli import main
    raise SystemExit(main())
