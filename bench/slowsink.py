"""`python -m bench.slowsink --port N --delay-ms 100`: the delivery benchmark's slow server, an SMTP
sink that answers the end of each message after a fixed delay and does nothing else.

It stands for "a server that takes 100 ms per message" (issue 26, target 3). The dev server
(postroom devsmtp, aiosmtpd with its scripting and a log line per message) cost 0.6-0.7 ms of CPU
and about 7 ms of turn-around per message on top of its delay: the pipelined client, which only
writes, got 0.94 of the 200/s that 20 connections allow and 0.89 of 640/s at 64. This one parses
lines with an asyncio protocol, advertises PIPELINING, 8BITMIME, SMTPUTF8 and
ENHANCEDSTATUSCODES, keeps nothing, and stops reading the connection until the delayed reply is
written, so replies keep their order under pipelining and a client cannot fill its buffer.

It also times each client's turn-around, the part of a message's time that is the client's and
the wire's, not the delay: from its 250 to a message's end until the next MAIL, and from a 354
until the message's end. ``XTURN`` (a verb of this server alone) answers ``250`` and those
figures since the last XTURN as JSON, and starts them again.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
from collections.abc import Sequence

EHLO_REPLY = (b"250-bench-slowsink\r\n250-PIPELINING\r\n250-8BITMIME\r\n250-SMTPUTF8\r\n"
              b"250 ENHANCEDSTATUSCODES\r\n")
END_OF_DATA = b"\r\n.\r\n"
MAX_LINE = 4096  # a command line longer than this is refused and the connection closed


class Turnaround:
    """The clients' turn-around on every connection of one server, in seconds."""

    def __init__(self) -> None:
        self.after_250: list[float] = []  # the 250 to a message's end -> the next MAIL read
        self.after_354: list[float] = []  # a 354 written -> the message's end read

    def take(self) -> dict[str, dict[str, float]]:
        """The figures so far (count, p50, p90 and mean in ms), and start again."""
        taken = {"after_250": _summary(self.after_250), "after_354": _summary(self.after_354)}
        self.after_250, self.after_354 = [], []
        return taken


def _summary(seconds: list[float]) -> dict[str, float]:
    if not seconds:
        return {"count": 0}
    ordered = sorted(seconds)
    return {"count": len(ordered), "p50_ms": statistics.median(ordered) * 1000,
            "p90_ms": ordered[int(len(ordered) * 0.9)] * 1000,
            "mean_ms": statistics.fmean(ordered) * 1000}


class SlowSession(asyncio.Protocol):
    """One client's connection: commands answered at once, each message's end after the delay."""

    def __init__(self, delay_s: float, turnaround: Turnaround | None = None) -> None:
        self.delay_s = delay_s
        self.turnaround = turnaround or Turnaround()
        self.accepted_at: float | None = None  # when the 250 to the last message was written
        self.started_data_at: float | None = None  # when the last 354 was written
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.in_data = False
        self.waiting = False  # a delayed reply is due: read nothing further until it is written
        self.messages = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(b"220 bench-slowsink ESMTP\r\n")

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.waiting:
            self._serve()

    def _serve(self) -> None:
        replies: list[bytes] = []
        while self.transport is not None and not self.waiting:
            if self.in_data:
                end = self.buffer.find(END_OF_DATA)
                if end < 0:
                    # Keep only what may be the start of the terminator: the content is discarded.
                    self.buffer = self.buffer[-(len(END_OF_DATA) - 1):]
                    break
                self.buffer = self.buffer[end + len(END_OF_DATA):]
                if self.started_data_at is not None:
                    self.turnaround.after_354.append(self._now() - self.started_data_at)
                    self.started_data_at = None
                self.in_data, self.waiting = False, True
                self.transport.pause_reading()  # what comes next waits for the delayed reply
                self.messages += 1
                asyncio.get_running_loop().call_later(self.delay_s, self._accepted)
                break
            end = self.buffer.find(b"\r\n")
            if end < 0:
                if len(self.buffer) > MAX_LINE:
                    replies.append(b"500 5.5.2 line too long\r\n")
                    self._close(replies)
                break
            line, self.buffer = self.buffer[:end], self.buffer[end + 2:]
            verb = line[:4].upper()
            if verb == b"EHLO":
                replies.append(EHLO_REPLY)
            elif verb == b"HELO":
                replies.append(b"250 bench-slowsink\r\n")
            elif verb == b"MAIL":
                if self.accepted_at is not None:
                    self.turnaround.after_250.append(self._now() - self.accepted_at)
                    self.accepted_at = None
                replies.append(b"250 2.1.0 Ok\r\n")
            elif verb == b"RCPT":
                replies.append(b"250 2.1.5 Ok\r\n")
            elif verb == b"DATA":
                replies.append(b"354 End data with <CR><LF>.<CR><LF>\r\n")
                self.started_data_at = self._now()
                # The content's first line may be the terminator's dot: match it as a line.
                self.in_data, self.buffer = True, b"\r\n" + self.buffer
            elif line.upper() == b"XTURN":
                replies.append(b"250 " + json.dumps(self.turnaround.take()).encode() + b"\r\n")
            elif verb in (b"RSET", b"NOOP"):
                replies.append(b"250 2.0.0 Ok\r\n")
            elif verb == b"QUIT":
                replies.append(b"221 2.0.0 Bye\r\n")
                self._close(replies)
                return
            else:
                replies.append(b"502 5.5.2 command not implemented\r\n")
        if replies and self.transport is not None:
            self.transport.write(b"".join(replies))

    def _accepted(self) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        self.waiting = False
        self.transport.write(b"250 2.0.0 Ok: queued\r\n")
        self.accepted_at = self._now()
        self.transport.resume_reading()
        self._serve()

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()

    def _close(self, replies: list[bytes]) -> None:
        if self.transport is not None:
            self.transport.write(b"".join(replies))
            self.transport.close()
            self.transport = None
        replies.clear()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


async def serve(host: str, port: int, delay_s: float, *, backlog: int = 1000) -> None:
    """Serve until SIGTERM or SIGINT."""
    loop = asyncio.get_running_loop()
    turnaround = Turnaround()
    server = await loop.create_server(lambda: SlowSession(delay_s, turnaround), host, port,
                                      backlog=backlog)
    stopped = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopped.set)
    async with server:
        await stopped.wait()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.slowsink", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay-ms", type=int, required=True,
                        help="milliseconds from a message's end to the server's 250")
    args = parser.parse_args(argv)
    if args.delay_ms < 0:
        parser.error("--delay-ms must not be negative")
    asyncio.run(serve(args.host, args.port, args.delay_ms / 1000))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
