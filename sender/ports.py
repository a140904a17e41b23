"""The small interfaces the sender's attempt core (sender/attempt.py) talks to: the claims ledger,
the mail transport, the destinations' line, where outcomes go, and the clock. The adapters are
sender/ledger.py, sender/transport.py, sender/destinations.py and sender/publishing.py;
tests/unit/sender/fakes.py holds an in-memory fake of each."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Protocol

from postroom.schemas.codec import EmailRequested, EmailResult
from postroom.sender.claims import ClaimResult
from postroom.sender.outcome import SmtpReply
from postroom.sender.routing import Forward, Origin

TraceHeaders = tuple[tuple[str, bytes], ...]


class ClaimsLedger(Protocol):
    """Who may send a key: claims, their renewal and release, and the ``sent`` marks."""

    @property
    def session(self) -> int:
        """Which claims session is open: a claim taken on an earlier one must be renewed."""
        ...

    async def claim(self, key: str, attempt: int) -> ClaimResult: ...

    async def renew(self, key: str) -> bool: ...

    async def release(self, key: str, done_attempt: int | None = None) -> None: ...

    def start_mark(self, key: str, message_id: str) -> asyncio.Future[float]:
        """Start the ``sent`` mark without waiting; the future holds when its commit was read."""
        ...

    async def mark_sent(self, key: str, message_id: str) -> float: ...


class MailSlot(Protocol):
    """One held connection to the mail server."""

    async def send(self, event: EmailRequested, now: dt.datetime,
                   on_accepted: Callable[[str], None]) -> tuple[SmtpReply, str]:
        """The reply to ``event``'s one send and its Message-ID; ``on_accepted`` is called with
        the Message-ID the moment the server's acceptance is read."""
        ...


class MailTransport(Protocol):
    def slot(self) -> AbstractAsyncContextManager[MailSlot]:
        """A connection held for one send, waiting for one to be free."""
        ...


class DestinationLine(Protocol):
    """Each destination's turn: ``queue`` and ``unqueue`` around the claim, ``acquire`` before a
    send and ``release`` after it, or ``release_now`` from a callback once the server accepted
    the message (sender/destinations.py's DestinationGate)."""

    async def queue(self, name: str) -> None: ...

    def unqueue(self, name: str) -> None: ...

    async def acquire(self, name: str) -> None: ...

    async def release(self, name: str, *, throttled: bool) -> None: ...

    def release_now(self, name: str, *, throttled: bool = False) -> None: ...

    def paused(self) -> int: ...


class Outcomes(Protocol):
    """Where an attempt's outcome goes: the result, and its retry or dead letter; each returns
    once the broker has it. ``trace``: the trace context headers the record carries."""

    async def result(self, key: str, result: EmailResult, trace: TraceHeaders = ()) -> None: ...

    async def forward(self, origin: Origin, event: EmailRequested, forward: Forward,
                      now: dt.datetime, trace: TraceHeaders = ()) -> None: ...


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def utcnow(self) -> dt.datetime: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The clock of a running sender: ``time.monotonic``, the UTC wall clock, ``asyncio.sleep``."""

    def monotonic(self) -> float:
        return time.monotonic()

    def utcnow(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
