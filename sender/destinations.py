"""Holds each destination's throttling state for one sender and makes sends wait their turn: the
decisions are sender/throttle.py's; this is the asyncio side (waiting, waking)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from sender.throttle import Destination, ThrottleLimits, finished, started, wait_s


class DestinationGate:
    """``await acquire(d)`` before a send to destination ``d``, ``await release(d, throttled)``
    after it. Sends to other destinations never wait on ``d``."""

    def __init__(self, limits: ThrottleLimits, clock: Callable[[], float] = time.monotonic) -> None:
        self._limits = limits
        self._clock = clock
        self._states: dict[str, Destination] = {}
        # One lock; a condition per destination, so a finished send wakes only the sends waiting
        # for its destination, and only as many as may start (one condition for all woke every
        # waiter on every release: ~100 wake-ups per email when all mail goes to one domain).
        self._lock = asyncio.Lock()
        self._changed: dict[str, asyncio.Condition] = {}
        self.waiting = 0  # sends waiting for their destination right now

    def _condition(self, name: str) -> asyncio.Condition:
        condition = self._changed.get(name)
        if condition is None:
            condition = self._changed[name] = asyncio.Condition(self._lock)
        return condition

    async def acquire(self, name: str) -> None:
        changed = self._condition(name)
        async with changed:
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
                    try:
                        if delay is None:  # until a send ends
                            await changed.wait()
                        else:
                            await asyncio.wait_for(changed.wait(), timeout=delay)
                    except TimeoutError:
                        pass  # the pause or the rate gap is over: look again
                    except asyncio.CancelledError:
                        changed.notify(1)  # a wake-up meant for us goes to the next waiter
                        raise
            finally:
                if counted:
                    self.waiting -= 1

    async def release(self, name: str, *, throttled: bool) -> None:
        changed = self._condition(name)
        async with changed:
            dest = self._states.get(name) or Destination.fresh(self._limits)
            dest = self._states[name] = finished(dest, self._limits, self._clock(), throttled)
            changed.notify(max(1, dest.limit - dest.in_flight))

    def paused(self) -> int:
        """Destinations paused by a throttling reply now."""
        now = self._clock()
        return sum(1 for dest in self._states.values() if dest.paused_until_s > now)
