"""The chaos suite's SMTP server: it logs every reply it gives, and misbehaves when told to.

Each recipient's fate is fixed by its address (``accept-``, ``defer<n>-``, ``reject-``,
``never-``, and the poison storm's ``garble-`` and ``garble250-``, whose replies are broken
bytes); faults are switched on and off while it runs: down, drops in DATA, slow replies.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time
from typing import Any

from aiosmtpd.smtp import SMTP, Envelope, Session

from postroom.devkit import devsmtp, devsmtp_handler
from postroom.devkit.ports import free_port

DEFER_REPLY = "451 4.3.0 try again later"
REJECT_REPLY = "550 5.1.1 User unknown"
_DEFERRED = re.compile(r"^defer(\d+)-")
# A ``garble-`` recipient's first RCPT is deferred with one of these (its log says 451): NUL,
# invalid UTF-8, a 100 KB line, a multi-line reply with a broken line, no code at all. A
# ``garble250-`` recipient's DATA is accepted with a broken text (its log says 250).
GARBLED_DEFERRALS: tuple[bytes, ...] = (
    b"451 4.3.0 try\x00again later",
    b"451 4.3.0 \xff\xfe\xc3( later",
    b"451 4.3.0 " + b"x" * 100_000,
    b"451-4.3.0 first line\r\n451-\xff\x00\xfe\r\n451 4.3.0 last line",
    b"\xff\xfe\x00 no code at all",
)
GARBLED_ACCEPTS: tuple[bytes, ...] = (
    b"250 2.0.0 Ok \xff\xfe\x00 queued",
    b"250-2.0.0 Ok\r\n250 \xc3(\x00",
)


@dataclasses.dataclass(frozen=True)
class Reply:
    """One reply the server gave (or the drop it did instead), with when it was decided."""

    at: float            # time.time() when the reply was decided (a 250: the message queued)
    rcpt: str
    code: int            # 250, 451, 550; 0 for a connection dropped in DATA
    message_id: str | None = None
    late_s: float = 0.0  # how long the 250 was held back on purpose (slow-reply fault)
    replied_at: float | None = None  # when the 250 was written; None: the client went first


def planned_deferrals(rcpt: str) -> int:
    """How many 451s a recipient gets before it is accepted (``never-``: always)."""
    local = rcpt.lower()
    if local.startswith("never-"):
        return 1 << 30
    if local.startswith("garble-"):
        return 1
    match = _DEFERRED.match(local)
    return int(match.group(1)) if match else 0


class _Handler(devsmtp_handler.DevHandler):
    """devsmtp's connection bookkeeping (a clean stop with clients connected), our own replies."""

    def __init__(self) -> None:
        super().__init__(reject=(), defer={}, drop=(), latency_ms=0, maildir=None)
        self.replies: list[Reply] = []
        self.drop_data = False
        self.slow_s = 0.0
        self.stopping = False  # down() began: no more mail is taken

    async def close_connections(self, timeout_s: float) -> None:
        self.stopping = True
        await super().close_connections(timeout_s)

    def _log(self, reply: Reply) -> None:
        with self.lock:
            self.replies.append(reply)

    async def handle_RCPT(self, server: SMTP, session: Session, envelope: Envelope,
                          address: str, rcpt_options: list[str]) -> str:
        rcpt = address.lower()
        if rcpt.startswith("reject-"):
            self._log(Reply(time.time(), rcpt, 550))
            return REJECT_REPLY
        with self.lock:
            seen = self.deferred.get(rcpt, 0)
            defer = seen < planned_deferrals(rcpt)
            if defer:
                self.deferred[rcpt] = seen + 1
        if defer:
            self._log(Reply(time.time(), rcpt, 451))
            if rcpt.startswith("garble-"):
                return _garbled(GARBLED_DEFERRALS, rcpt)
            return DEFER_REPLY
        envelope.rcpt_tos.append(address)
        return "250 2.1.5 Ok"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        rcpts = [r.lower() for r in envelope.rcpt_tos]
        if self.drop_data:
            for rcpt in rcpts:
                self._log(Reply(time.time(), rcpt, 0))
            if isinstance(server.transport, asyncio.Transport):
                server.transport.abort()
            await asyncio.Event().wait()  # aiosmtpd cancels the session on the lost connection
        message_id = devsmtp_handler.message_id_of(envelope.original_content or b"")
        slow_s = self.slow_s
        received_at = time.time()
        if not slow_s:
            # Like a server that scans the content, then queues it and answers at once: a
            # client gone during the scan leaves nothing delivered.
            await asyncio.sleep(LATENCY_S)
            if self.stopping:
                # Going down: the connection is closing and the reply could not reach the client,
                # so, like a server that stops taking mail when it shuts down, nothing is queued.
                # (Queued and never answered would be a duplicate the server made, which the
                # slow-reply fault covers.)
                return "421 4.3.2 shutting down"
            replied_at = time.time()
            for rcpt in rcpts:
                self._log(Reply(replied_at, rcpt, 250, message_id, 0.0, replied_at))
            if rcpts and all(r.startswith("garble250-") for r in rcpts):
                return _garbled(GARBLED_ACCEPTS, rcpts[0])
            return "250 2.0.0 Ok"
        # The slow-reply fault: queued (delivered) at once, the answer held back past the
        # client's timeout, so the client cannot know it was delivered.
        replied: float | None = None
        try:
            await asyncio.sleep(slow_s)
            replied = time.time()
            return "250 2.0.0 Ok"
        finally:
            for rcpt in rcpts:
                self._log(Reply(received_at, rcpt, 250, message_id, slow_s, replied))


LATENCY_S = 0.02  # the "server that takes 20 ms per message"


def _garbled(replies: tuple[bytes, ...], rcpt: str) -> str:
    """One of ``replies``, fixed by the address (its number: ``<kind>-<tag>-<n>@``), as aiosmtpd
    writes it: it pushes bytes unchanged, the handler's annotation notwithstanding."""
    number = rcpt.split("@", 1)[0].rsplit("-", 1)[-1]
    return replies[int(number) % len(replies) if number.isdecimal() else 0]  # type: ignore[return-value]


class ChaosMailServer:
    """The server on a thread of its own; ``down()`` and ``up()`` keep its port and its log."""

    def __init__(self) -> None:
        self._handler = _Handler()
        self._server: devsmtp.DevSmtpServer | None = None
        self.port = free_port()

    def up(self) -> None:
        server = devsmtp.DevSmtpServer(port=self.port)
        self._handler.stopping = False
        server._handler = self._handler
        server.start()
        self._server = server

    def down(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def set_faults(self, *, drop_data: bool = False, slow_s: float = 0.0) -> None:
        self._handler.drop_data = drop_data
        self._handler.slow_s = slow_s

    @property
    def replies(self) -> list[Reply]:
        with self._handler.lock:
            return list(self._handler.replies)

    def __enter__(self) -> ChaosMailServer:
        self.up()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.down()
