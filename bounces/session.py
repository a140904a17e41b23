"""One SMTP session of the bounce intake: aiosmtpd's, admitted against the session caps (421
past them), reading DATA through bounces.pruning so its memory does not grow with the message,
with AUTH off, its envelope reset after a fault of ours, and a counter of replies in place of
aiosmtpd's log line per command."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from aiosmtpd.smtp import SMTP, syntax

from postroom.bounces.errors import Refusal
from postroom.bounces.limits import (
    COMMANDS_MAX,
    ERRORS_MAX,
    JUNK_COMMANDS,
    JUNK_COMMANDS_MAX,
    RECIPIENTS_MAX,
    Admission,
    SessionLimits,
)
from postroom.bounces.pruning import Kept, Pruner
from postroom.metrics import (
    BOUNCE_REFUSED_TOTAL,
    BOUNCE_REPLIES_TOTAL,
    BOUNCE_SESSIONS_TOTAL,
    Metrics,
)

log = logging.getLogger(__name__)
# aiosmtpd logs each session's peer and every command line at INFO: a flood of sessions would be
# a flood of lines. Its warnings stay; the replies are counted (postroom_bounce_replies_total).
logging.getLogger("mail.log").setLevel(logging.WARNING)

# Fixed, so aiosmtpd does no reverse lookup, and never the relay's own name (Postfix refuses a
# next hop that greets with its myhostname as a mail loop).
SERVER_HOSTNAME = "postroom-bounces.invalid"
SESSION_TIMEOUT_S = 300.0  # RFC 5321 4.5.3.2.7: the server's timeout is at least 5 minutes
# A session's whole life: each command and each piece of DATA (a byte is one) resets the idle
# timeout, so a client could hold a session, and a hundred the intake, for ever. A 38 MiB report
# at 22 KiB/s fits; a relay reuses a connection 300 s at most (Postfix's
# smtp_connection_reuse_time_limit). Past it, 421: the MTA tries again, nothing is lost.
SESSION_MAX_S = 1800.0
_DOT_LINE = b".\r\n"
_END = b"\r\n.\r\n"  # RFC 5321 4.1.1.4: the end of the mail data
TOO_MANY_REPLY = f"421 4.7.0 {SERVER_HOSTNAME} too many connections, try again later"
TOO_MANY_FROM_CLIENT_REPLY = (f"421 4.7.0 {SERVER_HOSTNAME} too many connections from your "
                              "address, try again later")
TOO_LARGE_REPLY = "552 5.3.4 message too big for the bounce intake"
NO_AUTH_REPLY = "502 5.5.1 AUTH not available"
TOO_MANY_RECIPIENTS_REPLY = "452 4.5.3 too many recipients"
TOO_MANY_ERRORS_REPLY = f"421 4.7.0 {SERVER_HOSTNAME} too many errors"
TOO_LONG_REPLY = f"421 4.4.2 {SERVER_HOSTNAME} session too long, try again later"
# aiosmtpd's per-session budget of each command: 421 and closed past it.
_COMMAND_LIMITS = {"*": COMMANDS_MAX, **dict.fromkeys(JUNK_COMMANDS, JUNK_COMMANDS_MAX)}


async def read_data(reader: asyncio.StreamReader, pruner: Pruner, limit: int,
                    on_progress: Callable[[], object]) -> int:
    """Read one message's DATA from ``reader`` up to its end (``.`` alone on a line), feeding
    ``pruner`` while no more than ``limit`` bytes have come (the rest is read and dropped);
    the bytes received. ``on_progress`` is called at each piece (the session's timeout).

    In place of aiosmtpd's own DATA reader (SMTP.smtp_DATA), which keeps every line and then
    their join: the reports read from both are compared in tests/unit/bounces/test_session.py.
    Pieces come from StreamReader.readuntil's LimitOverrunError (how much is there without a
    ``.<CRLF>`` in it), so the reader never takes a byte past the end of the message."""
    received = 0
    # The last bytes read before this piece: the CRLF that opens the final "." line may have
    # come in the piece before (a LimitOverrunError's piece ends anywhere, "\r" or "\r\n"
    # included). DATA starts a line: an empty message is ".\r\n" alone.
    before = b"\r\n"
    while True:
        ends = False
        try:
            piece = await reader.readuntil(_DOT_LINE)
        except asyncio.LimitOverrunError as exc:
            piece = await reader.read(exc.consumed)
        else:
            ends = (before + piece[-len(_END):]).endswith(_END)
            if ends:
                piece = piece[:-len(_DOT_LINE)]
        if received <= limit and piece:
            pruner.feed(piece)
        received += len(piece)
        on_progress()
        if ends:
            return received
        before = (before + piece[-2:])[-2:]


class BounceSession(SMTP):
    """aiosmtpd's session with the intake's bounds. ``handler`` has aiosmtpd's hooks (RCPT,
    DATA: the DATA hook reads ``envelope.original_content``, the kept message)."""

    def __init__(self, handler: Any, metrics: Metrics, limits: SessionLimits,
                 data_size_limit: int, session_max_s: float = SESSION_MAX_S) -> None:
        # SMTPUTF8: the DSN of an email to a UTF-8 address needs it, or the MTA cannot send it.
        super().__init__(handler, data_size_limit=data_size_limit, hostname=SERVER_HOSTNAME,
                         ident="postroom bounces", timeout=SESSION_TIMEOUT_S,
                         enable_SMTPUTF8=True, auth_exclude_mechanism=("LOGIN", "PLAIN"),
                         command_call_limit=_COMMAND_LIMITS)
        self._errors = 0  # 4xx and 5xx replies given in this session
        self._session_max_s = session_max_s
        self._ends: asyncio.TimerHandle | None = None
        self._metrics = metrics
        self._limits = limits
        self._client: str | None = None
        self._admission: Admission | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._admission is None:  # not the second call, after STARTTLS (which is off)
            peer = transport.get_extra_info("peername")
            self._client = str(peer[0]) if isinstance(peer, tuple) and peer else "unknown"
            self._admission = self._limits.admit(self._client)
            self._metrics.inc(BOUNCE_SESSIONS_TOTAL, outcome=self._admission.value)
            if self._admission is not Admission.ADMITTED:
                # Answered and closed before aiosmtpd starts the session: nothing is read.
                reply = (TOO_MANY_REPLY if self._admission is Admission.TOO_MANY
                         else TOO_MANY_FROM_CLIENT_REPLY)
                self._metrics.inc(BOUNCE_REPLIES_TOTAL, code="421")
                if self._limits.refused_in_a_row == 1:
                    # Once until a session is admitted again: a refusal costs a client one
                    # connect, and would cost us a line each. The metric counts them all.
                    log.warning("bounce session refused (%s): client %s; further refusals "
                                "until one is admitted counted in postroom_bounce_sessions_total",
                                self._admission.value, self._client)
                transport.write(reply.encode() + b"\r\n")  # type: ignore[attr-defined]
                transport.close()
                return
            self._ends = asyncio.get_running_loop().call_later(self._session_max_s,
                                                               self._too_long)
        super().connection_made(transport)

    def _too_long(self) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        self._metrics.inc(BOUNCE_REPLIES_TOTAL, code="421")
        self.transport.write(TOO_LONG_REPLY.encode() + b"\r\n")  # type: ignore[attr-defined]
        self.transport.close()

    def connection_lost(self, error: Exception | None) -> None:
        if self._admission is not Admission.ADMITTED:
            return
        self._admission = Admission.TOO_MANY  # released once, whatever calls follow
        if self._ends is not None:
            self._ends.cancel()
        if self._client is not None:
            self._limits.release(self._client)
        super().connection_lost(error)

    def eof_received(self) -> bool | None:
        if self._admission is not Admission.ADMITTED:
            return False
        return super().eof_received()

    def data_received(self, data: bytes) -> None:
        if self._admission is Admission.ADMITTED:
            super().data_received(data)

    async def push(self, status: Any) -> None:
        reply = status.encode() if isinstance(status, str) else bytes(status)
        self._metrics.inc(BOUNCE_REPLIES_TOTAL, code=reply[:3].decode("ascii", "replace"))
        if reply.startswith(b"552"):  # at MAIL (its SIZE) or after DATA
            self._metrics.inc(BOUNCE_REFUSED_TOTAL, reason=Refusal.TOO_LARGE.value)
            log.warning("bounce refused (%s): over %d bytes", Refusal.TOO_LARGE.value,
                        self.data_size_limit)
        await super().push(status)
        if reply[:1] in (b"4", b"5") and not reply.startswith(b"421"):
            self._errors += 1
            if self._errors >= ERRORS_MAX and self.transport is not None:
                self._metrics.inc(BOUNCE_REPLIES_TOTAL, code="421")
                await super().push(TOO_MANY_ERRORS_REPLY)
                self.transport.close()

    async def handle_exception(self, error: Exception) -> str:
        # A fault of ours: the MTA tries again, and may do so on this connection with MAIL at
        # once (RFC 5321 4.1.4 allows it without RSET), which must not meet this envelope.
        self.envelope = self._create_envelope()
        status: str = await super().handle_exception(error)
        return status

    async def smtp_AUTH(self, arg: str) -> None:
        # No @syntax: HELP does not list it. Nobody logs in to the bounce intake.
        await self.push(NO_AUTH_REPLY)

    @syntax("RCPT TO: <address>", extended=" [SP <mail-parameters>]")
    async def smtp_RCPT(self, arg: str | None) -> None:
        if self.transport is None or self.transport.is_closing():
            return  # pipelined after our 421: not read, nor logged
        if self.envelope is not None and len(self.envelope.rcpt_tos) >= RECIPIENTS_MAX:
            await self.push(TOO_MANY_RECIPIENTS_REPLY)
            return
        await super().smtp_RCPT(arg)

    @syntax("DATA")
    async def smtp_DATA(self, arg: str) -> None:
        if await self.check_helo_needed():
            return
        envelope = self.envelope
        if envelope is None or not envelope.rcpt_tos:
            await self.push("503 5.5.1 Error: need RCPT command")
            return
        if arg:
            await self.push("501 5.5.4 Syntax: DATA")
            return
        await self.push("354 End data with <CR><LF>.<CR><LF>")
        limit = self.data_size_limit or 0
        pruner = Pruner()
        received = await read_data(self._reader, pruner, limit, self._reset_timeout)
        if received > limit:
            # RFC 5321 4.2.5: answered once the whole message has been read.
            self.envelope = self._create_envelope()
            await self.push(TOO_LARGE_REPLY)
            return
        kept: Kept = pruner.close()
        if kept.pruned:
            log.debug("bounce message of %d bytes read, %d kept", received, len(kept.message))
        envelope.original_content = envelope.content = kept.message
        status = await self._call_handler_hook("DATA")
        self.envelope = self._create_envelope()
        await self.push(status)
