"""The attempt core's calls to the ledger: each tried until the ledger answers, with one warning
per outage, the wait for a key another sender holds, the release of a claim once an attempt's
outcome is out, and the claim that lets a poison record be dead-lettered once."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from typing import TypeVar

from postroom.metrics import LEDGER_MARK_SECONDS, POISON_REPEATED_TOTAL, Metrics
from postroom.schemas.codec import DeliveryStatus, EmailRequested
from postroom.sender.claims import Claim, ClaimResult, busy_wait_s
from postroom.sender.errors import LedgerUnavailableError
from postroom.sender.ports import ClaimsLedger, Clock
from postroom.sender.routing import Routing

# Its lines keep the attempt core's logger, whose name they carried before this module was split
# from sender/attempt.py (logs are read and filtered by it).
log = logging.getLogger("postroom.sender.attempt")

# A ledger call that fails is tried again after LEDGER_RETRY_FIRST_S, then after twice the wait
# before, up to LEDGER_RETRY_S: 0.25, 0.75, 1.75, 3.75, 5.75 ... s after its first failure. A
# sent mark keeps the duplicate window open until it commits (a sender killed meanwhile leaves
# its key in doubt, and the key is mailed again); with a flat 2 s wait, a database back after a
# restart of half a second waited 1.5 s more for the marks, now a quarter of a second. A longer
# outage is asked every LEDGER_RETRY_S, as before (a try that connects to a host that does not
# answer at all waits out the connection's timeout first, sender/ledger_session.py). A sender logs
# at most one warning about the ledger every LEDGER_RETRY_S, whichever of its calls failed; the
# rest log at DEBUG (a database restart under full load made each call in flight warn within the
# same second: 57 and 54 lines from the two senders of one chaos run). The first call to get
# through after a warning logs that the ledger answers again, and the next failure warns at once.
# Each call (each batch of calls that failed together) connects once a try, one at a time per
# connection.
LEDGER_RETRY_FIRST_S = 0.25
LEDGER_RETRY_S = 2.0


def ledger_retry_waits() -> Iterator[float]:
    """The waits between the tries of one ledger call: 0.25, 0.5, 1, 2, 2, ... seconds."""
    wait_s = LEDGER_RETRY_FIRST_S
    while True:
        yield wait_s
        wait_s = min(wait_s * 2, LEDGER_RETRY_S)


T = TypeVar("T")


class LedgerCalls:
    """The ledger as one sender's attempts call it (the clock passed in)."""

    def __init__(self, ledger: ClaimsLedger, metrics: Metrics, clock: Clock) -> None:
        self._ledger = ledger
        self._metrics = metrics
        self._clock = clock
        self._warned_at: float | None = None  # monotonic; see LEDGER_RETRY_S

    async def dead_letter_once(self, key: str, dead_letter: Callable[[], Awaitable[None]]) -> None:
        """``await dead_letter()`` once per record, whoever reads it: ``key``, the record's
        origin (claims.dead_letter_key), is claimed as attempt 1 and released done once the dead
        letter and its result are out; a copy read again (a rebalance, a restart before its
        offset's commit) finds it done and publishes nothing; one read while the first is under
        way waits for its answer. A dead letter that raises gives the claim back undone."""
        busy_waits = 0
        while True:
            claim = await self.call("claim", partial(self._ledger.claim, key, 1))
            if claim.claim is Claim.MINE:
                break
            if claim.claim is not Claim.BUSY:
                self._metrics.inc(POISON_REPEATED_TOTAL)
                log.info("%s: dead-lettered already; not again", key)
                return
            await self.wait_busy(key, claim, first=busy_waits == 0)
            busy_waits += 1
        try:
            await dead_letter()
        except Exception:
            await self.call("release", partial(self._ledger.release, key))
            raise
        await self.call("release", partial(self._ledger.release, key, 1))

    async def release_after(self, event: EmailRequested, routing: Routing) -> int | None:
        """Give the claim up only now that the outcome is out: a copy of this record read again
        (we die before its offset is committed, or its partition moves) finds the attempt done.
        An attempt that waited (forwarded with its number kept) was not made: its copies must
        find it not done, or the next read of the wait would be taken for a repeat. The attempt
        released as done, or None."""
        started = self._clock.monotonic()
        waited = routing.waited or (
            routing.status is DeliveryStatus.RETRYING and routing.forward is not None
            and routing.forward.event.attempt == event.attempt)
        done = None if waited else event.attempt
        await self.call("release", partial(self._ledger.release, event.idempotency_key,
                                                   done))
        self._metrics.observe(LEDGER_MARK_SECONDS, self._clock.monotonic() - started,
                              operation="release")
        return done

    async def wait_busy(self, key: str, claim: ClaimResult, *, first: bool) -> None:
        """Another sender holds the key: ask again just past its lease, or sooner."""
        wait_s = busy_wait_s(claim.lease_until, self._clock.utcnow())
        log.log(logging.INFO if first else logging.DEBUG,
                "key=%s is being sent elsewhere (lease until %s); asking again in %.1fs",
                key, claim.lease_until, wait_s)
        await self._clock.sleep(wait_s)

    async def call(self, what: str, call: Callable[[], Awaitable[T]],
                           started: Awaitable[T] | None = None) -> T:
        """``call()`` until the ledger answers (a shutdown cancels the wait); ``started``: the
        first such call, already under way."""
        waits = ledger_retry_waits()
        tries = 0
        while True:
            try:
                if started is not None:
                    first, started = started, None
                    answer = await first
                else:
                    answer = await call()
            except LedgerUnavailableError as exc:
                tries += 1
                wait_s = next(waits)
                now = self._clock.monotonic()
                warned = self._warned_at
                loud = warned is None or now - warned >= LEDGER_RETRY_S
                if loud:
                    self._warned_at = now
                log.log(logging.WARNING if loud else logging.DEBUG,
                        "ledger %s failed on try %d (%s); retrying in %gs", what, tries, exc,
                        wait_s)
                await self._clock.sleep(wait_s)
                continue
            if tries and self._warned_at is not None:
                # The first call to get through after a warning says so, and the next failure
                # warns at once: a new outage is not hidden in the last one's 2 s.
                self._warned_at = None
                log.info("ledger %s answered on try %d: the ledger answers again", what,
                         tries + 1)
            return answer
