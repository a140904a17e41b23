"""In-memory fakes of the ports the sender's attempt core talks to (sender/ports.py), as
procrastinate's in-memory connector and dramatiq's stub broker are: a ledger that keeps its rows
in a dict, a mail transport that answers from a list, a destinations' line, an outcomes sink and
a clock that moves only when told (or slept on). Every call is written to one shared ``trace``."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
from collections.abc import Callable
from typing import Any

from postroom.schemas.codec import EmailRequested, EmailResult
from postroom.sender.claims import ClaimResult, KeyState, decide_claims
from postroom.sender.errors import LedgerUnavailableError
from postroom.sender.outcome import SmtpReply, Stage
from postroom.sender.ports import TraceHeaders
from postroom.sender.routing import Forward, Origin

EPOCH = dt.datetime(2026, 12, 2, 20, 0, tzinfo=dt.UTC)
OK = SmtpReply(Stage.DATA, 250, "2.0.0 queued")

Trace = list[tuple[Any, ...]]


class FakeClock:
    """Time stands still until ``advance`` or ``sleep``; ``on_sleep`` runs at each sleep, as if
    the world moved on meanwhile (another sender answered, say)."""

    def __init__(self, trace: Trace) -> None:
        self.now_s = 0.0
        self.trace = trace
        self.on_sleep: Callable[[], None] | None = None

    def monotonic(self) -> float:
        return self.now_s

    def utcnow(self) -> dt.datetime:
        return EPOCH + dt.timedelta(seconds=self.now_s)

    def advance(self, seconds: float) -> None:
        self.now_s += seconds

    async def sleep(self, seconds: float) -> None:
        self.trace.append(("sleep", seconds))
        self.now_s += seconds
        if self.on_sleep is not None:
            self.on_sleep()
        await asyncio.sleep(0)


@dataclasses.dataclass
class Row:
    state: str  # 'sending', 'sent' or 'released', as in sender_ledger
    owner: str
    lease_until_s: float | None
    attempt: int
    message_id: str | None = None
    done_attempt: int | None = None


class InMemoryLedger:
    """``sender_ledger`` in a dict, with its statements' rules (sender/ledger_sql.py) and the
    same decision (sender/claims.py). ``unavailable[op]`` calls of ``op`` fail first."""

    def __init__(self, clock: FakeClock, owner: str = "me", lease_s: float = 30.0) -> None:
        self.clock = clock
        self.trace = clock.trace
        self.owner = owner
        self.lease_s = lease_s
        self.rows: dict[str, Row] = {}
        self.session = 1
        self.dead_owners: set[str] = set()
        self.unavailable: dict[str, int] = {}

    def _maybe_fail(self, op: str) -> None:
        if self.unavailable.get(op, 0) > 0:
            self.unavailable[op] -= 1
            self.trace.append((op, "unavailable"))
            raise LedgerUnavailableError("connection refused")

    def _takes(self, row: Row | None, owner: str, attempt: int) -> bool:
        if row is None:
            return True
        free = row.state == "released" or (row.state == "sending" and (
            (row.lease_until_s or 0) < self.clock.now_s
            or (row.owner != owner and row.owner in self.dead_owners)))
        return free and (row.done_attempt is None or row.done_attempt < attempt)

    def take(self, key: str, attempt: int, owner: str) -> str | None:
        """What the claim statement does for one key; the owner it was taken from."""
        row = self.rows.get(key)
        taken_from = row.owner if row is not None and row.state == "sending" else None
        self.rows[key] = Row("sending", owner, self.clock.now_s + self.lease_s, attempt,
                             None, row.done_attempt if row is not None else None)
        return taken_from

    async def claim(self, key: str, attempt: int) -> ClaimResult:
        self._maybe_fail("claim")
        row = self.rows.get(key)
        taken: dict[str, str | None] = {}
        others: list[KeyState] = []
        if self._takes(row, self.owner, attempt):
            taken[key] = self.take(key, attempt, self.owner)
        elif row is not None:
            lease = (None if row.lease_until_s is None
                     else EPOCH + dt.timedelta(seconds=row.lease_until_s))
            others.append(KeyState(key, row.state, lease, row.attempt, row.message_id,
                                   row.done_attempt))
        [result] = decide_claims([(key, attempt)], taken, others, self.session)
        self.trace.append(("claim", key, attempt, result.claim.value))
        await asyncio.sleep(0)
        return result

    async def renew(self, key: str) -> bool:
        self._maybe_fail("renew")
        row = self.rows.get(key)
        kept = row is not None and row.owner == self.owner and row.state == "sending"
        if kept and row is not None:
            row.lease_until_s = self.clock.now_s + self.lease_s
        self.trace.append(("renew", key, kept))
        return kept

    async def release(self, key: str, done_attempt: int | None = None) -> None:
        self._maybe_fail("release")
        self.trace.append(("release", key, done_attempt))
        row = self.rows.get(key)
        if row is None or row.owner != self.owner or row.state != "sending":
            return
        row.state, row.lease_until_s = "released", None
        if done_attempt is not None:
            row.done_attempt = max(row.done_attempt or 0, done_attempt)

    def _mark(self, key: str, message_id: str) -> None:
        row = self.rows.setdefault(key, Row("sent", self.owner, None, 0))
        row.state, row.lease_until_s, row.message_id = "sent", None, message_id

    def start_mark(self, key: str, message_id: str) -> asyncio.Future[float]:
        self.trace.append(("mark", key, message_id))
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        if self.unavailable.get("mark", 0) > 0:
            self.unavailable["mark"] -= 1
            future.set_exception(LedgerUnavailableError("the mark failed"))
        else:
            self._mark(key, message_id)
            future.set_result(self.clock.now_s)
        return future

    async def mark_sent(self, key: str, message_id: str) -> float:
        self._maybe_fail("mark")
        self.trace.append(("mark again", key, message_id))
        self._mark(key, message_id)
        return self.clock.now_s

    async def close(self) -> None:
        self.trace.append(("close",))


class FakeSlot:
    def __init__(self, transport: FakeTransport) -> None:
        self._transport = transport

    async def send(self, event: EmailRequested, now: dt.datetime,
                   on_accepted: Callable[[str], None]) -> tuple[SmtpReply, str]:
        transport = self._transport
        transport.clock.advance(transport.send_s)
        if transport.raises is not None:
            raise transport.raises
        reply = transport.replies.pop(0) if transport.replies else transport.otherwise
        message_id = f"<{len(transport.sent)}.{event.outbox_id}@fake>"
        transport.sent.append((event, reply))
        transport.trace.append(("send", event.idempotency_key, reply.code))
        if reply.stage is Stage.DATA and reply.code is not None and 200 <= reply.code < 300:
            on_accepted(message_id)
        if transport.loop_turns_after_reply:
            # As a real connection's reply: read in a callback, the send resumes a turn later.
            for _ in range(transport.loop_turns_after_reply):
                await asyncio.sleep(0)
            transport.trace.append(("send resumed", event.idempotency_key))
        return reply, message_id


class _Held:
    def __init__(self, transport: FakeTransport) -> None:
        self._transport = transport

    async def __aenter__(self) -> FakeSlot:
        self._transport.held += 1
        return FakeSlot(self._transport)

    async def __aexit__(self, *_: object) -> None:
        self._transport.held -= 1


class FakeTransport:
    """Answers each send with the next of ``replies``, then with ``otherwise`` (or raises
    ``raises``); each send takes ``send_s`` of the clock."""

    def __init__(self, clock: FakeClock, replies: list[SmtpReply] | None = None,
                 otherwise: SmtpReply = OK, send_s: float = 0.0) -> None:
        self.clock = clock
        self.trace = clock.trace
        self.replies = list(replies or [])
        self.otherwise = otherwise
        self.send_s = send_s
        self.sent: list[tuple[EmailRequested, SmtpReply]] = []
        self.held = 0
        self.raises: BaseException | None = None  # what every send raises, when set
        self.loop_turns_after_reply = 0  # loop turns between a reply and the send's return

    def slot(self) -> _Held:
        return _Held(self)


class FakeLine:
    """Every destination's turn comes at once; ``on_acquire`` runs (once each, in order) as a
    send's turn comes, as if it had waited (the clock moved, another sender took its key)."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.on_acquire: list[Callable[[], None]] = []
        self.queued = 0
        self.in_turn = 0
        self.paused_now = 0

    async def queue(self, name: str) -> None:
        self.queued += 1

    def unqueue(self, name: str) -> None:
        self.queued -= 1

    async def acquire(self, name: str) -> None:
        self.in_turn += 1
        if self.on_acquire:
            self.on_acquire.pop(0)()

    async def release(self, name: str, *, throttled: bool) -> None:
        self.release_now(name, throttled=throttled)

    def release_now(self, name: str, *, throttled: bool = False) -> None:
        self.in_turn -= 1
        self.trace.append(("turn over", name, throttled))
        if throttled:
            self.paused_now = 1

    def paused(self) -> int:
        return self.paused_now


class FakeOutcomes:
    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.results: list[EmailResult] = []
        self.forwards: list[tuple[Origin, Forward]] = []
        # The trace context headers each record would carry: ("result" | topic, headers).
        self.trace_headers: list[tuple[str, TraceHeaders]] = []

    async def result(self, key: str, result: EmailResult, trace: TraceHeaders = ()) -> None:
        self.trace.append(("result", key, result.status.value))
        self.results.append(result)
        self.trace_headers.append(("result", trace))

    async def forward(self, origin: Origin, event: EmailRequested, forward: Forward,
                      now: dt.datetime, trace: TraceHeaders = ()) -> None:
        self.trace.append(("forward", forward.topic, forward.event.attempt))
        self.forwards.append((origin, forward))
        self.trace_headers.append((forward.topic, trace))
