"""What one attempt carries between its steps (pure bookkeeping, no I/O): its turn at its
destination, its send, and what a delivery in hand knows of its attempt for a copy of it."""

from __future__ import annotations

import asyncio
import dataclasses

from postroom.sender.outcome import SmtpReply
from postroom.sender.ports import DestinationLine


class Turn:
    """A send's turn at its destination, given back once: when the server has accepted the
    message, from the read of its 250, or after the send whatever came of it."""

    __slots__ = ("_destination", "_given_back", "_line")

    def __init__(self, line: DestinationLine, destination: str) -> None:
        self._line = line
        self._destination = destination
        self._given_back = False

    def give_back_now(self) -> None:
        """The server accepted the message (a 250 is never throttling): the turn goes back from
        the read of the 250. The connection's reply woke the send's coroutine first, so at the
        loop's next turn it gives its connection back before the send given this turn looks:
        that send writes its MAIL in the turn after the 250, not in the one after that."""
        if not self._given_back:
            self._given_back = True
            self._line.release_now(self._destination)

    async def give_back(self, *, throttled: bool) -> None:
        """After the send, unless the 250 gave it back already."""
        if not self._given_back:
            self._given_back = True
            await self._line.release(self._destination, throttled=throttled)


@dataclasses.dataclass(frozen=True, slots=True)
class Sent:
    """One send: the reply, the Message-ID, when the reply was read, for a 250 its ledger mark
    (started as the reply was read), and whether the reply defers the send as throttling."""

    reply: SmtpReply
    message_id: str
    read_at: float
    mark: asyncio.Future[float] | None
    throttled: bool


@dataclasses.dataclass(frozen=True, slots=True)
class KnownSent:
    """A server accepted the key (its Message-ID, when the ledger kept one)."""

    message_id: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class KnownDone:
    """The attempt was made and its outcome is out: the ledger holds it as done."""


# What a delivery that ended knows of its attempt, for a copy of it: sent, done, or nothing
# (the attempt was not made, as a wait for our configuration: a copy must ask the ledger).
Known = KnownSent | KnownDone | None
DONE = KnownDone()


class InHand:
    """A delivery under way in this process: its attempt, set when it ends, and what it then
    knows of its attempt (sent, done), if it ended as it should (not cancelled, not failed).
    Once a server accepted its message: the Message-ID, and whether its ``sent`` mark has
    committed and its ``sent`` result is out."""

    __slots__ = ("accepted", "attempt", "ended", "known", "marked", "result_out")

    def __init__(self, attempt: int) -> None:
        self.attempt = attempt
        self.known: Known = None
        self.ended = asyncio.Event()
        self.accepted: str | None = None
        self.marked = False
        self.result_out = False
