"""An SMTP connection taken over from aiosmtplib after its greeting, STARTTLS and AUTH, to send
MAIL, RCPT and DATA as one group where the server offers PIPELINING (RFC 2920), and the message
from the read of the group's 354, without waiting for the send's coroutine to wake.

aiosmtplib writes each command and waits for its reply: four writes and four reply wake-ups per
email, the largest share of the sender's CPU left on a fast server (docs/benchmarks.md). Its
protocol keeps one reply at a time and drops data that arrives while one is waiting to be read,
so pipelined replies need a protocol of their own: this one. aiosmtplib stays the client for
connecting, TLS and login; the pool's opener (sender/smtp_session.py) hands a connection over with
:meth:`Pipeline.take_over` and from then on talks to it only through this class, which offers the
few aiosmtplib calls the pool makes (``execute_command``, ``rset``, ``supports_extension``,
``close``).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from typing import cast

import aiosmtplib
from aiosmtplib.protocol import (
    MAX_LINE_LENGTH,
    MAX_RESPONSE_LENGTH,
    PERIOD_REGEX,
    normalize_message_line_endings,
)
from aiosmtplib.response import SMTPResponse

from postroom.sender.outcome import Stage

# aiosmtplib's bounds on a reply line and a whole reply, so that a reply means the same whether
# it was read here or by aiosmtplib (POSTROOM_SMTP_PIPELINING off): beyond them, "Response too long".
MAX_REPLY_LINE_BYTES = MAX_LINE_LENGTH
MAX_REPLY_BYTES = MAX_RESPONSE_LENGTH
SMTP_OK = 250
SMTP_WILL_FORWARD = 251
START_MAIL_INPUT = 354
SERVICE_UNAVAILABLE = 421  # the server is closing the connection
# The replies that let a transaction go on, whether pipelined or not (sender/smtp_session.py).
MAIL_ACCEPTED = (SMTP_OK,)
RCPT_ACCEPTED = (SMTP_OK, SMTP_WILL_FORWARD)

GROUP_STAGES = (Stage.MAIL_FROM, Stage.RCPT_TO, Stage.DATA)  # the commands written together
# Told the server's acceptance of a message (its code and text) the moment the reply is read,
# before the send's coroutine resumes: the sender's ``sent`` mark starts from here.
OnAccepted = Callable[[int, str], None]


class Pipeline(asyncio.Protocol):
    """One greeted (and, as configured, encrypted and logged-in) connection that pipelines."""

    def __init__(self, transport: asyncio.Transport, extensions: dict[str, str],
                 timeout_s: float) -> None:
        self.transport: asyncio.Transport | None = transport
        self._extensions = extensions
        self._timeout_s = timeout_s
        self._buffer = bytearray()
        self._scanned = 0  # how much of the buffer is whole continuation lines (``250-...``)
        self._replies: collections.deque[SMTPResponse] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        # The wait for a reply ends at _deadline. One timer serves every wait: it is armed when
        # none is, and when it fires early (the reply it was armed for came long ago) it is armed
        # again for the wait then in progress, if any. A fast server's connection arms about one
        # per timeout period, not one per reply (asyncio.timeout's was 5% of the sender's CPU).
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._lost: aiosmtplib.SMTPException | None = None
        self._on_accepted: OnAccepted | None = None  # for the reply to the message being sent
        # The message of the group in flight, written from the read of the group's last reply
        # when all three let it go on: the send's coroutine is not woken between the 354 and
        # the message (on a busy loop that wake-up waited behind every other connection's).
        self._group: _Group | None = None
        # Replies owed for what was written. One that comes when none is owed (a server that
        # answers a message twice, say) would be read as the next command's: the connection is
        # out of step and is given up, as an idle server's 421 gives it up.
        self._owed = 0
        self.stage = Stage.MAIL_FROM  # whose reply the last transaction waited for

    @classmethod
    def take_over(cls, smtp: aiosmtplib.SMTP, timeout_s: float) -> Pipeline:
        """The connection of ``smtp`` (idle: every reply read), which must not be used again."""
        transport = smtp.transport
        # uvloop's transports are not asyncio.Transport subclasses; they have its methods.
        if transport is None or transport.is_closing():
            raise aiosmtplib.SMTPServerDisconnected("Connection lost")
        pipeline = cls(cast(asyncio.Transport, transport), dict(smtp.esmtp_extensions), timeout_s)
        transport.set_protocol(pipeline)
        return pipeline

    # -- what the pool calls, as it calls aiosmtplib's ------------------------------------------

    @property
    def is_connected(self) -> bool:
        return self._lost is None and self.transport is not None and not self.transport.is_closing()

    def supports_extension(self, extension: str) -> bool:
        return extension.lower() in self._extensions

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
        self._set_lost(aiosmtplib.SMTPServerDisconnected("Connection closed"))
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def execute_command(self, *args: bytes,
                              timeout: float | None = None) -> SMTPResponse:  # noqa: ASYNC109 - as aiosmtplib's
        """One command and its reply (RSET, QUIT)."""
        self._write(b" ".join(args) + b"\r\n")
        self._owed += 1
        reply = await self._reply(self._timeout_s if timeout is None else timeout)
        if reply.code == SERVICE_UNAVAILABLE:
            self.close()
        return reply

    async def rset(self) -> SMTPResponse:
        reply = await self.execute_command(b"RSET")
        if reply.code != SMTP_OK:
            raise aiosmtplib.SMTPResponseException(reply.code, reply.message)
        return reply

    # -- the transaction -----------------------------------------------------------------------

    async def transaction(self, mail: bytes, rcpt: bytes, content: bytes,
                          on_accepted: OnAccepted | None = None) -> SMTPResponse:
        """MAIL, RCPT and DATA in one write, then the message, written as soon as the 354 is
        read: the final reply. A refusal raises aiosmtplib.SMTPResponseException, a lost
        connection or a timeout what aiosmtplib raises; ``stage`` says whose reply it was. Every
        reply of the group is read before a refusal is raised, so the connection is ready for
        RSET. ``on_accepted`` is called from the read of a 250 to the message, before this
        returns (or is cancelled)."""
        self.stage = Stage.MAIL_FROM
        group = _Group(data_bytes(content), on_accepted)
        self._write(mail + b"\r\n" + rcpt + b"\r\n" + b"DATA\r\n")
        self._owed += len(GROUP_STAGES)
        self._group = group
        try:
            replies = []
            for stage in GROUP_STAGES:
                self.stage = stage
                reply = await self._reply(self._timeout_s)
                if reply.code == SERVICE_UNAVAILABLE:  # the server closes: no more replies come
                    self.close()
                    raise aiosmtplib.SMTPResponseException(reply.code, reply.message)
                replies.append(reply)
            mail_reply, rcpt_reply, data_reply = replies
            refused = _refusal(mail_reply, rcpt_reply, data_reply)
            if refused is not None:
                self.stage, reply = refused
                if data_reply.code == START_MAIL_INPUT:
                    # A server that said 354 anyway gets an empty message with no recipient.
                    self._write(b".\r\n")
                    self._owed += 1
                    await self._reply(self._timeout_s)
                raise aiosmtplib.SMTPResponseException(reply.code, reply.message)
            # The read of the 354 wrote the message; the next reply to come is its reply.
            final = await self._reply(self._timeout_s)
        finally:
            self._group = None
            self._on_accepted = None
        if final.code == SERVICE_UNAVAILABLE:
            self.close()
        if not is_accepted(final.code):
            raise aiosmtplib.SMTPResponseException(final.code, final.message)
        return final

    def _write(self, data: bytes) -> None:
        if not self.is_connected or self.transport is None:
            raise self._lost or aiosmtplib.SMTPServerDisconnected("Connection lost")
        self.transport.write(data)

    async def _reply(self, timeout_s: float) -> SMTPResponse:
        loop = asyncio.get_running_loop()
        # From the start of the wait, not from the last bytes read: a server that drips a reply
        # a byte at a time times out as aiosmtplib's wait_for does.
        deadline = loop.time() + timeout_s
        while not self._replies:
            if self._lost is not None:
                raise self._lost
            waiter = self._waiter = loop.create_future()
            self._deadline = deadline
            if self._timer is None or self._timer.when() > self._deadline:
                self._arm(loop)
            try:
                await waiter
            except _ReplyTimedOut:
                # The late reply would be read as the next command's: the connection is done.
                self.close()
                raise aiosmtplib.SMTPReadTimeoutError(
                    "Timed out waiting for server response") from None
            finally:
                self._waiter = None
        return self._replies.popleft()

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(self._deadline, self._on_timer, loop)

    def _on_timer(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        waiter = self._waiter
        if waiter is None or waiter.done():
            return  # no wait in progress: the next one arms a timer
        if loop.time() >= self._deadline:
            waiter.set_exception(_ReplyTimedOut())
        else:
            self._arm(loop)

    # -- asyncio.Protocol ------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        self._buffer.extend(data)
        try:
            while self._reply_may_be_whole() and (reply := _take_reply(self._buffer)) is not None:
                self._scanned = 0
                if self._owed == 0:
                    self._out_of_step(reply)
                    return
                self._owed -= 1
                self._replies.append(reply)
                if self._on_accepted is not None:
                    on_accepted, self._on_accepted = self._on_accepted, None
                    if is_accepted(reply.code):
                        # The send is woken first, so at the loop's next turn it runs (and gives
                        # its connection back) before whatever the acceptance wakes: the next
                        # send, given the destination's turn by on_accepted, then finds both.
                        self._wake()
                        on_accepted(reply.code, reply.message)
                elif self._group is not None:
                    self._group_replied(self._group, reply)
        except aiosmtplib.SMTPResponseException as exc:
            self._buffer.clear()
            self._scanned = 0
            self.close()
            self._set_lost(exc, replace=True)
        if len(self._buffer) > MAX_REPLY_BYTES:
            self._buffer.clear()
            self._scanned = 0
            self.close()
            self._set_lost(aiosmtplib.SMTPResponseException(-1, "Response too long"),
                           replace=True)
        self._wake()

    def _out_of_step(self, reply: SMTPResponse) -> None:
        """A reply nothing written asked for: what comes next cannot be told apart from it."""
        self._buffer.clear()
        self._scanned = 0
        self.close()
        self._set_lost(aiosmtplib.SMTPServerDisconnected(
            f"reply out of turn: {reply.code} {reply.message[:200]!r}"), replace=True)

    def _group_replied(self, group: _Group, reply: SMTPResponse) -> None:
        """A reply read while ``group`` is in flight. Once its three replies are in and all let
        the transaction go on, its message is written, and the next reply is the one told."""
        group.replies.append(reply)
        if len(group.replies) < len(GROUP_STAGES):
            return
        self._group = None  # written now or never: a refusal is the send's to handle
        if _refusal(*group.replies) is None and self.is_connected and self.transport is not None:
            self._on_accepted = group.on_accepted
            self.transport.write(group.message)
            self._owed += 1

    def _reply_may_be_whole(self) -> bool:
        """Whether the bytes read since the last look hold a line that can end a reply (one
        without ``-`` after its code) or a line too long: only then is the reply parsed. A
        server that drips a reply of thousands of continuation lines, one a segment, would
        otherwise have every line before parsed again on each segment (seconds of the event
        loop for 32 KiB)."""
        buffer = self._buffer
        while True:
            end = buffer.find(b"\n", self._scanned)
            if end < 0:
                return len(buffer) - self._scanned >= MAX_REPLY_LINE_BYTES
            if (buffer[self._scanned + 3:self._scanned + 4] != b"-" or end + 1 > MAX_REPLY_BYTES
                    or end + 1 - self._scanned > MAX_REPLY_LINE_BYTES):
                return True
            self._scanned = end + 1

    def eof_received(self) -> bool:
        self._set_lost(aiosmtplib.SMTPServerDisconnected("Unexpected EOF received"))
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        lost = aiosmtplib.SMTPServerDisconnected("Connection lost")
        lost.__cause__ = exc
        self._set_lost(lost)
        self.transport = None

    def _set_lost(self, exc: aiosmtplib.SMTPException, *, replace: bool = False) -> None:
        if self._lost is None or replace:
            self._lost = exc
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class _Group:
    """A transaction's message, waiting for its group's replies, and who is told its 250."""

    __slots__ = ("message", "on_accepted", "replies")

    def __init__(self, message: bytes, on_accepted: OnAccepted | None) -> None:
        self.message = message
        self.on_accepted = on_accepted
        self.replies: list[SMTPResponse] = []


class _ReplyTimedOut(Exception):
    """The timer's word to the wait it ended."""


def _refusal(mail: SMTPResponse, rcpt: SMTPResponse,
             data: SMTPResponse) -> tuple[Stage, SMTPResponse] | None:
    """The first reply of the group that refused, with its stage; None when all went on."""
    if mail.code not in MAIL_ACCEPTED:
        return Stage.MAIL_FROM, mail
    if rcpt.code not in RCPT_ACCEPTED:
        return Stage.RCPT_TO, rcpt
    if data.code != START_MAIL_INPUT:
        return Stage.DATA, data
    return None


def is_accepted(code: int) -> bool:
    """Whether the reply to a message's content takes it: any 2xx (RFC 5321 4.2.1 judges a
    reply by its first digit), not only 250. A 251 there is a delivery: sent again, it arrives
    again."""
    return 200 <= code < 300


def data_bytes(content: bytes) -> bytes:
    """``content`` as it goes after DATA, as aiosmtplib writes it: every line ending CRLF, a line
    starting with a period given another, and the ending period. A message the email package
    wrote (every line CRLF, none starting with a period) is only given its period: three
    counts and a find cost less than the two regular expressions' passes."""
    lines = content.count(b"\n")
    if (lines == content.count(b"\r\n") == content.count(b"\r") and content.endswith(b"\r\n")
            and b"\n." not in content and not content.startswith(b".")):
        return content + b".\r\n"
    return PERIOD_REGEX.sub(b"..", normalize_message_line_endings(content)) + b".\r\n"


def _take_reply(buffer: bytearray) -> SMTPResponse | None:
    """The first complete reply in ``buffer``, removed from it; None when it is not all there.
    Multi-line replies (``250-...``) are joined with newlines, as aiosmtplib joins them."""
    offset = 0
    text = bytearray()
    while True:
        end = buffer.find(b"\n", offset, offset + MAX_REPLY_LINE_BYTES)
        if end < 0:
            if len(buffer) - offset >= MAX_REPLY_LINE_BYTES:
                raise aiosmtplib.SMTPResponseException(-1, "Response too long")
            return None
        if end + 1 > MAX_REPLY_BYTES:
            raise aiosmtplib.SMTPResponseException(-1, "Response too long")
        line = bytes(buffer[offset:end + 1])
        offset = end + 1
        try:
            code = int(line[:3])
        except ValueError:
            shown = line.decode("utf-8", errors="replace").strip()
            raise aiosmtplib.SMTPResponseException(
                -1, f"Malformed SMTP response line: {shown}") from None
        if text:  # as aiosmtplib joins them: an empty line so far takes no newline
            text += b"\n"
        text += line[4:].strip(b" \t\r\n")
        if line[3:4] != b"-":
            del buffer[:offset]
            return SMTPResponse(code, text.decode("utf-8", "surrogateescape"))
