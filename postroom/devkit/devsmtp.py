"""A local SMTP server for development and tests that misbehaves on purpose (aiosmtpd).

It rejects, defers, slows down or drops chosen recipients, and keeps what it accepts in memory
and, optionally, in a Maildir another process reads (devsmtp_maildir); devsmtp_cli runs it. This
module runs the server and answers what it holds; what it answers is devsmtp_handler's.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterable, Mapping
from pathlib import Path

from postroom.devkit.devsmtp_handler import (
    DEFAULT_MAX_KEPT,
    DEFAULT_MAX_KEPT_BYTES,
    DevHandler,
    ReceivedMessage,
    normalise_address,
)
from postroom.devkit.devsmtp_session import DevController

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 1025  # the usual port of a dev SMTP server; not Mailpit's published 8025 (its web UI)
SERVER_HOSTNAME = "devsmtp.localhost"  # fixed, so aiosmtpd skips its reverse DNS lookup
STOP_TIMEOUT_S = 2.0


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
        self._handler = DevHandler(reject=reject, defer=defer or {}, drop=drop,
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
        wanted = None if rcpt is None else normalise_address(rcpt)
        return sum(1 for m in self.messages
                   if wanted is None or normalise_address(m.rcpt) == wanted)

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


if __name__ == "__main__":  # `python -m postroom.devkit.devsmtp`, as before devsmtp_cli
    from postroom.devkit.devsmtp_cli import main
    raise SystemExit(main())
