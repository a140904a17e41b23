"""Holds each destination's throttling state for one sender and makes sends wait their turn: the
decisions are sender/throttle.py's; this is the asyncio side (waiting, waking)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Callable

from postroom.sender.throttle import Destination, ThrottleLimits, finished, started, wait_s


def _resolve(woken: asyncio.Future[None]) -> None:
    if not woken.done():
        woken.set_result(None)


class DestinationGate:
    """``await acquire(d)`` before a send to destination ``d``, ``await release(d, throttled)``
    after it. Sends to other destinations never wait on ``d``.

    ``await queue(d)`` first and ``unqueue(d)`` once ``acquire`` returned (or the send was given
    up) hold a place in ``d``'s line: at most ``queued_per_send`` times its concurrency limit of
    sends wait for ``acquire`` at once. The sender claims each key in the line, so the claims of
    the next sends are taken while the sends before them run, and no more of them than that."""

    def __init__(self, limits: ThrottleLimits, clock: Callable[[], float] = time.monotonic,
                 queued_per_send: int = 1) -> None:
        self._limits = limits
        self._clock = clock
        self._states: dict[str, Destination] = {}
        self._line_length = limits.concurrency * queued_per_send
        self._lines: dict[str, asyncio.Semaphore] = {}
        # The sends waiting for each destination's turn, a future each, so a finished send wakes
        # only the sends waiting for its destination, and only as many as may start (one
        # condition for all woke every waiter on every release: ~100 wake-ups per email when all
        # mail goes to one domain); futures rather than a condition, so a release needs no lock
        # and can be made from a callback (release_now).
        self._waiters: dict[str, collections.deque[asyncio.Future[None]]] = {}
        # Sends between queue() and unqueue() per destination. A destination with none, nothing
        # in flight or waiting, and a state a fresh one would have is forgotten: a sender that
        # mails many domains for months would otherwise keep an entry for every one.
        self._in_line: dict[str, int] = {}
        self.waiting = 0  # sends waiting for their destination right now

    async def queue(self, name: str) -> None:
        line = self._lines.get(name)
        if line is None:
            line = self._lines[name] = asyncio.Semaphore(self._line_length)
        self._in_line[name] = self._in_line.get(name, 0) + 1
        try:
            if not line.locked():
                await line.acquire()
                return
            self.waiting += 1
            try:
                await line.acquire()
            finally:
                self.waiting -= 1
        except BaseException:
            self._leave_line(name)
            raise

    def unqueue(self, name: str) -> None:
        self._lines[name].release()
        self._leave_line(name)

    def _leave_line(self, name: str) -> None:
        self._in_line[name] -= 1
        self._forget_if_at_rest(name)

    def _forget_if_at_rest(self, name: str) -> None:
        if self._in_line.get(name, 0) > 0 or self._waiters.get(name):
            return
        dest = self._states.get(name)
        if dest is not None and not (  # at rest: as a fresh one, but for times now past
                dest.in_flight == 0 and dest.burst == 0 and dest.limit == self._limits.concurrency
                and dest.pause_s == self._limits.pause_s
                and max(dest.paused_until_s, dest.next_start_s) <= self._clock()):
            return
        for table in (self._states, self._lines, self._waiters, self._in_line):
            table.pop(name, None)

    def known(self) -> int:
        """Destinations this gate holds an entry of (those not at rest)."""
        return len(set(self._states) | set(self._lines) | set(self._waiters) | set(self._in_line))

    async def acquire(self, name: str) -> None:
        counted = False
        try:
            while True:
                dest = self._states.get(name) or Destination.fresh(self._limits)
                now = self._clock()
                delay = wait_s(dest, now)
                if delay == 0.0:
                    self._states[name] = started(dest, self._limits, now)
                    return
                if not counted:
                    self.waiting += 1
                    counted = True
                loop = asyncio.get_running_loop()
                woken = loop.create_future()
                # Looked up each time: a destination at rest may have been forgotten meanwhile.
                waiters = self._waiters.get(name)
                if waiters is None:
                    waiters = self._waiters[name] = collections.deque()
                waiters.append(woken)
                # Until a send ends, or the pause or rate gap is over (then look again). A timer
                # rather than asyncio.wait_for, which in 3.11 swallows a cancellation that comes
                # once the future is done: a send cancelled at shutdown then started anyway.
                timer = None if delay is None else loop.call_later(delay, _resolve, woken)
                try:
                    await woken
                except asyncio.CancelledError:
                    if woken.done() and not woken.cancelled():
                        self._wake(name, 1)  # a wake-up meant for us goes to the next waiter
                    raise
                finally:
                    if timer is not None:
                        timer.cancel()
                    if not woken.done():
                        woken.cancel()
                    with contextlib.suppress(ValueError):  # not popped by a wake-up
                        waiters.remove(woken)
        finally:
            if counted:
                self.waiting -= 1

    async def release(self, name: str, *, throttled: bool) -> None:
        """The send to ``name`` ended; ``throttled``: its reply was throttling."""
        self.release_now(name, throttled=throttled)

    def release_now(self, name: str, *, throttled: bool = False) -> None:
        """:meth:`release`, from a callback: the sends it lets start are woken at once."""
        dest = self._states.get(name) or Destination.fresh(self._limits)
        dest = self._states[name] = finished(dest, self._limits, self._clock(), throttled)
        self._wake(name, max(1, dest.limit - dest.in_flight))
        self._forget_if_at_rest(name)

    def _wake(self, name: str, count: int) -> None:
        """Wake up to ``count`` of the sends waiting for ``name``, the longest waiting first
        (each looks at the destination again when it runs; one that may not start waits anew)."""
        waiters = self._waiters.get(name)
        while count > 0 and waiters:
            woken = waiters.popleft()
            if not woken.done():
                woken.set_result(None)
                count -= 1

    def paused(self) -> int:
        """Destinations paused by a throttling reply now."""
        now = self._clock()
        return sum(1 for dest in self._states.values() if dest.paused_until_s > now)
