"""The destination gate: a finished send wakes only the sends that may start, a cancelled
waiter passes its wake-up on, and a destination's line holds a bounded number of sends."""

from __future__ import annotations

import asyncio

from postroom.sender.destinations import DestinationGate
from postroom.sender.throttle import ThrottleLimits

WAITERS = 50


class CountingClock:
    """A clock that counts how often the gate looks at a destination."""

    def __init__(self) -> None:
        self.looks = 0

    def __call__(self) -> float:
        self.looks += 1
        return 0.0


def test_each_release_wakes_one_waiter_not_all_of_them() -> None:
    clock = CountingClock()
    gate = DestinationGate(ThrottleLimits(1, 0.0, 1.0), clock)
    order: list[int] = []

    async def send(n: int) -> None:
        await gate.acquire("example.com")
        order.append(n)
        await asyncio.sleep(0)
        await gate.release("example.com", throttled=False)

    async def run() -> None:
        await asyncio.gather(*(send(n) for n in range(WAITERS)))

    asyncio.run(run())
    assert sorted(order) == list(range(WAITERS))
    # Each send looks once or twice when it starts and once when it ends; waking every waiter
    # on every release made it about WAITERS * WAITERS / 2.
    assert clock.looks <= 4 * WAITERS


def test_other_destinations_do_not_wait() -> None:
    gate = DestinationGate(ThrottleLimits(1, 0.0, 1.0))

    async def run() -> bool:
        await gate.acquire("busy.example")
        other = asyncio.ensure_future(gate.acquire("free.example"))
        await asyncio.wait_for(other, 1.0)
        return other.done()

    assert asyncio.run(run())


def test_a_cancelled_waiter_passes_its_wake_up_on() -> None:
    gate = DestinationGate(ThrottleLimits(1, 0.0, 1.0))

    async def run() -> bool:
        await gate.acquire("example.com")
        first = asyncio.ensure_future(gate.acquire("example.com"))
        second = asyncio.ensure_future(gate.acquire("example.com"))
        await asyncio.sleep(0.01)
        await gate.release("example.com", throttled=False)  # meant for `first`...
        first.cancel()                                       # ...which goes away meanwhile
        await asyncio.wait_for(second, 1.0)
        return second.done() and not second.cancelled()

    assert asyncio.run(run())


def test_a_line_holds_its_length_of_sends_and_lets_the_next_in_as_one_leaves() -> None:
    gate = DestinationGate(ThrottleLimits(2, 0.0, 1.0), queued_per_send=2)

    async def run() -> tuple[int, int, bool, bool, bool]:
        for _ in range(4):
            await asyncio.wait_for(gate.queue("busy.example"), 1.0)
        fifth = asyncio.ensure_future(gate.queue("busy.example"))
        await asyncio.sleep(0.01)
        waiting_while_full = gate.waiting
        # Another destination has a line of its own.
        await asyncio.wait_for(gate.queue("free.example"), 1.0)
        blocked = not fifth.done()
        gate.unqueue("busy.example")
        await asyncio.wait_for(fifth, 1.0)
        return waiting_while_full, gate.waiting, blocked, fifth.done(), not fifth.cancelled()

    waiting_while_full, waiting_after, blocked, entered, not_cancelled = asyncio.run(run())
    assert waiting_while_full == 1  # counted as waiting for its destination
    assert waiting_after == 0
    assert blocked and entered and not_cancelled


def test_a_turn_given_back_without_awaiting_lets_the_next_send_start_one_loop_turn_later() -> None:
    """release_now, for a reply's callback (no coroutine to await in), wakes the waiting send
    at once: it has started by the loop's next turn."""
    gate = DestinationGate(ThrottleLimits(1, 0.0, 1.0))

    async def run() -> tuple[bool, bool]:
        await gate.acquire("example.com")
        second = asyncio.ensure_future(gate.acquire("example.com"))
        await asyncio.sleep(0.01)
        waited = not second.done()
        gate.release_now("example.com")
        await asyncio.sleep(0)
        return waited, second.done()

    assert asyncio.run(run()) == (True, True)


def test_a_send_cancelled_just_after_its_wake_up_does_not_start() -> None:
    """A send waiting out a rate gap, woken by a release and cancelled before it runs (a
    shutdown), raises CancelledError and takes no turn (asyncio.wait_for in 3.11 swallowed such
    a cancellation, and the send started a second later)."""
    gate = DestinationGate(ThrottleLimits(2, 1.0, 1.0))  # two at once, one start a second

    async def run() -> tuple[bool, bool]:
        await gate.acquire("example.com")
        second = asyncio.ensure_future(gate.acquire("example.com"))
        await asyncio.sleep(0.01)  # waiting for the rate gap
        gate.release_now("example.com")
        second.cancel()
        try:
            await asyncio.wait_for(second, 3.0)
        except asyncio.CancelledError:
            pass
        third = asyncio.ensure_future(gate.acquire("example.com"))
        await asyncio.wait_for(third, 3.0)  # the one turn left is free: the second took none
        return second.cancelled(), third.done()

    assert asyncio.run(run()) == (True, True)


def test_a_destination_at_rest_is_forgotten_and_a_throttled_one_is_not() -> None:
    """A sender mailing many domains keeps no entry for those with nothing going on; one still
    paused or held back keeps its state, or its pause would be forgotten."""
    now = [0.0]
    gate = DestinationGate(ThrottleLimits(2, 0.0, 5.0), clock=lambda: now[0])

    async def send(name: str, *, throttled: bool = False) -> None:
        await gate.queue(name)
        try:
            await gate.acquire(name)
        finally:
            gate.unqueue(name)
        await gate.release(name, throttled=throttled)

    async def main() -> None:
        for n in range(1000):
            await send(f"d{n}.example")
        assert gate.known() == 0
        await send("slow.example", throttled=True)
        assert gate.known() == 1 and gate.paused() == 1
        now[0] += 6.0  # the pause is over; the limit still halved until a clean send
        assert gate.known() == 1
        await send("slow.example")
        await send("slow.example")
        assert gate.known() == 0

    asyncio.run(main())
