"""What happens to one admitted event: claim its key while it waits for its destination's turn, send
it, classify the reply, mark a delivery in the ledger, route and publish the outcome, release the
claim. The decisions are the pure modules'; the I/O goes through sender/ports.py's protocols, with
the clock passed in, so every path runs against in-memory fakes (tests/unit/sender/test_attempt.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from functools import partial

from postroom.errors import first_line
from postroom.metrics import (
    ATTACHMENTS_WAITING_TOTAL,
    ATTEMPTS_TOTAL,
    CLAIMS_RENEWED_TOTAL,
    DESTINATIONS_PAUSED,
    DUPLICATES_SUPPRESSED_TOTAL,
    ERRORS_AFTER_ACCEPTED_TOTAL,
    LEDGER_MARK_SECONDS,
    OUTCOMES_TOTAL,
    REPEATED_ATTEMPTS_SUPPRESSED_TOTAL,
    SENT_MARK_WINDOW_SECONDS,
    SERVER_FAULTS_TOTAL,
    SMTP_REPLY_SECONDS,
    THROTTLED_TOTAL,
    Metrics,
)
from postroom.schemas.codec import DeliveryStatus, EmailRequested
from postroom.sender.admission import Admitted
from postroom.sender.attempt_state import DONE, InHand, Known, KnownDone, KnownSent, Sent, Turn
from postroom.sender.claims import Claim, ClaimResult, needs_renewal
from postroom.sender.errors import AcceptedUnrecordedError
from postroom.sender.ledger_calls import LedgerCalls
from postroom.sender.outcome import Verdict, classify_reply, waits_for_configuration
from postroom.sender.ports import ClaimsLedger, Clock, DestinationLine, MailSlot, MailTransport, Outcomes
from postroom.sender.retry import Action, RetryPolicy
from postroom.sender.routing import Origin, Routing, already_sent, outcome_line, route
from postroom.sender.throttle import is_throttling
from postroom.tracing import OFF, Span, TraceContext, Tracing, from_headers, kafka_attributes

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class AttemptRules:
    """What the core needs of the settings."""

    topic_prefix: str
    policy: RetryPolicy
    destination_of: Callable[[str], str]  # a recipient's destination (sender/throttle.py)
    throttle_max_wait_s: float  # POSTROOM_THROTTLE_MAX_WAIT
    group: str | None = None  # the consumer group, for the spans' attributes


class Attempts:
    """``await deliver(origin, admitted)`` for each event; it returns once the event's outcome
    is published and its claim released, or when the event needs nothing more (sent before,
    or this attempt already made)."""

    def __init__(self, rules: AttemptRules, *, ledger: ClaimsLedger, transport: MailTransport,
                 line: DestinationLine, outcomes: Outcomes, metrics: Metrics, clock: Clock,
                 tracing: Tracing = OFF) -> None:
        self._rules = rules
        self._tracing = tracing
        self._ledger = ledger
        self._transport = transport
        self._line = line
        self._outcomes = outcomes
        self._metrics = metrics
        self._clock = clock
        self._calls = LedgerCalls(ledger, metrics, clock)
        # The keys this process is delivering, each set once its delivery ends. The ledger
        # tells senders apart by their owner, not one task of a sender from another: a copy of
        # a record (a relay's publish again, a partition read again) whose first delivery waited
        # past its lease in its destination's line could claim the key as the same owner, and
        # both would send. A copy waits here for the first instead. A copy of the same attempt
        # whose first delivery ended knowing it sent or done is answered as the ledger would
        # (asking it would say so, one copy after another, each holding a place in flight:
        # after a sender's kill a partition read again holds many copies of each key). Any
        # other copy asks the ledger: an attempt that only waited for our configuration went
        # back to its tier unmade, and its next read may come before its claim is released.
        self._in_hand: dict[str, InHand] = {}

    async def deliver(self, origin: Origin, admitted: Admitted) -> None:
        """Claim, send and record one event; then publish where its outcome routes it. Its
        records carry the event's trace context on (this attempt's span's, with tracing). A
        copy of an event this process is delivering waits for that delivery to end first."""
        event = admitted.event
        key = event.idempotency_key
        while (first := self._in_hand.get(key)) is not None:
            await first.ended.wait()
            if first.known is not None and first.attempt == event.attempt:
                await self._copy_done(origin, event, first.known)
                return
        mine = self._in_hand[key] = InHand(event.attempt)
        try:
            try:
                mine.known = await self._deliver(origin, admitted, mine)
            except Exception:
                if mine.accepted is None:
                    raise
                # After the server's acceptance nothing of ours may end the email otherwise.
                log.exception("key=%s accepted by the server, then an error of ours; recorded "
                              "as sent", key)
                mine.known = await self._accepted_anyway(origin, event, mine, mine.accepted)
        finally:
            del self._in_hand[key]
            mine.ended.set()

    async def _copy_done(self, origin: Origin, event: EmailRequested,
                         sent: KnownSent | KnownDone) -> None:
        """A copy of the attempt this sender has just made: what the ledger would answer it,
        without asking (a key sent: its result again, as for any copy; an attempt done:
        nothing)."""
        key = event.idempotency_key
        if isinstance(sent, KnownDone):
            self._metrics.inc(REPEATED_ATTEMPTS_SUPPRESSED_TOTAL)
            log.info("key=%s attempt=%d made by this sender just now; not making it again",
                     key, event.attempt)
            return
        self._metrics.inc(DUPLICATES_SUPPRESSED_TOTAL)
        log.info("key=%s accepted by the server just now; not sending again", key)
        context = from_headers(origin.headers)
        await self._outcomes.result(
            key, already_sent(event, sent.message_id, self._clock.utcnow()),
            () if context is None else context.headers())

    async def dead_letter_once(self, key: str, dead_letter: Callable[[], Awaitable[None]]) -> None:
        """``await dead_letter()`` once per record, whoever reads it (LedgerCalls.dead_letter_once)."""
        await self._calls.dead_letter_once(key, dead_letter)

    async def _accepted_anyway(self, origin: Origin, event: EmailRequested, hand: InHand,
                               message_id: str) -> KnownSent:
        """A server accepted the message (``message_id``) and an error of ours came after:
        counted, the ``sent`` mark written if it had not committed, and the ``sent`` result
        published if it was not out. AcceptedUnrecordedError when that result cannot be
        published: the record is then read again (its offset is not stored), and the ledger
        answers it sent."""
        key = event.idempotency_key
        self._metrics.inc(ERRORS_AFTER_ACCEPTED_TOTAL)
        if not hand.marked:
            try:
                await self._calls.call("mark sent", partial(self._ledger.mark_sent, key,
                                                             message_id))
            except Exception:
                self._metrics.inc(ERRORS_AFTER_ACCEPTED_TOTAL)
                log.exception("key=%s: the sent mark failed again; a copy read later may be "
                              "sent again", key)
        if not hand.result_out:
            context = from_headers(origin.headers)
            try:
                await self._outcomes.result(
                    key, already_sent(event, message_id, self._clock.utcnow()),
                    () if context is None else context.headers())
            except Exception as exc:
                raise AcceptedUnrecordedError(
                    f"key={key} was accepted by the server but its result cannot be published: "
                    f"{first_line(exc)}") from exc
        return KnownSent(message_id)

    async def _deliver(self, origin: Origin, admitted: Admitted, hand: InHand) -> Known:
        """The delivery; what it knows of its attempt now: its key sent (and its Message-ID),
        the attempt done, or neither. ``hand`` learns of the server's acceptance, the mark and
        the result as they happen."""
        event = admitted.event
        with self._tracing.span(
                f"process {origin.topic}", from_headers(origin.headers), kind="consumer",
                attributes=lambda: {
                    **kafka_attributes("process", origin.topic, partition=origin.partition,
                                       key=event.idempotency_key, offset=origin.offset,
                                       group=self._rules.group),
                    "postroom.outbox_id": event.outbox_id,
                    "postroom.attempt": event.attempt}) as span:
            routing = await self._claim_and_send(origin, admitted, span.context, hand)
            if not isinstance(routing, Routing):
                return routing
            span.set(lambda: {"postroom.status": routing.status.value})
            await self._publish(origin, event, routing, span)
            hand.result_out = True
        done = None
        if routing.status is not DeliveryStatus.SENT:
            done = await self._calls.release_after(event, routing)
        if not routing.waited:
            self._metrics.inc(OUTCOMES_TOTAL, status=routing.status.value)
        if routing.status is DeliveryStatus.SENT:
            return KnownSent(routing.result.message_id)
        return DONE if done is not None else None

    async def _publish(self, origin: Origin, event: EmailRequested, routing: Routing,
                       span: Span) -> None:
        key = event.idempotency_key
        forward = routing.forward
        if forward is None:
            # No gather: it is a task per call.
            await self._outcomes.result(key, routing.result, span.headers())
            return
        not_before = forward.event.not_before
        with self._tracing.span(
                f"send {forward.topic}", span.context, kind="producer",
                attributes=lambda: {
                    **kafka_attributes("send", forward.topic, key=key),
                    "postroom.attempt": forward.event.attempt,
                    "postroom.retry.not_before": not_before.isoformat() if not_before else None,
                }) as scheduled:
            await asyncio.gather(
                self._outcomes.result(key, routing.result, span.headers()),
                self._outcomes.forward(origin, event, forward, self._clock.utcnow(),
                                       scheduled.headers()))

    async def _claim_and_send(self, origin: Origin, admitted: Admitted,
                              trace: TraceContext | None,
                              hand: InHand) -> Routing | KnownSent | KnownDone:
        """Send the event once its destination lets it and its claim is ours, and route the
        outcome; what is known when nothing more is to be done (a server accepted its key
        before: its result is published here; or this attempt was made already). A throttling
        reply defers the send without counting it as an attempt, until
        POSTROOM_THROTTLE_MAX_WAIT has passed."""
        event = admitted.event
        key = event.idempotency_key
        destination = self._rules.destination_of(event.recipient)
        deferred_since: float | None = None
        busy_waits = 0
        while True:
            may_defer = (deferred_since is None or self._clock.monotonic() - deferred_since
                         < self._rules.throttle_max_wait_s)
            claim, claimed_at = await self._claim_in_line(destination, key, event.attempt)
            if claim.claim is Claim.MINE:
                sent = await self._send_in_turn(destination, event, claim, claimed_at, may_defer,
                                                trace, hand)
                if sent is None:
                    log.warning("key=%s is no longer ours after it waited for its turn (another "
                                "sender took it, or a server accepted it); asking the ledger "
                                "again", key)
                    continue
                # The slot and the destination are free again: the next send need not wait
                # for this one's ledger write.
                if not sent.throttled:
                    return await self._conclude(origin, admitted, sent, hand)
                await self._defer(event)
                deferred_since = deferred_since or self._clock.monotonic()
                continue
            if claim.claim is Claim.SENT:
                self._metrics.inc(DUPLICATES_SUPPRESSED_TOTAL)
                log.info("key=%s already accepted by the server; not sending again", key)
                await self._outcomes.result(
                    key, already_sent(event, claim.message_id, self._clock.utcnow()),
                    () if trace is None else trace.headers())
                return KnownSent(claim.message_id)
            if claim.claim is Claim.DONE:
                # Its result and its retry or dead letter went out with the attempt.
                self._metrics.inc(REPEATED_ATTEMPTS_SUPPRESSED_TOTAL)
                log.info("key=%s attempt=%d already made and its outcome published; not "
                         "making it again", key, event.attempt)
                return DONE
            await self._calls.wait_busy(key, claim, first=busy_waits == 0)
            busy_waits += 1

    async def _claim_in_line(self, destination: str, key: str,
                             attempt: int) -> tuple[ClaimResult, float]:
        """Claim ``key`` while it waits in its destination's line, so the claim's round trip
        overlaps the sends before it; the claim and when it was taken. When it is ours, the
        destination has let its send start (release it after the send)."""
        await self._line.queue(destination)
        try:
            claim = await self._calls.call("claim", partial(self._ledger.claim, key, attempt))
            claimed_at = self._clock.monotonic()
            if claim.claim is Claim.MINE:
                await self._line.acquire(destination)
        finally:
            self._line.unqueue(destination)
        return claim, claimed_at

    async def _send_in_turn(self, destination: str, event: EmailRequested, claim: ClaimResult,
                            claimed_at: float, may_defer: bool, trace: TraceContext | None,
                            hand: InHand) -> Sent | None:
        """Send through a held connection, the destination's turn given back after it; None
        when the claim was lost while the send waited."""
        throttled = False
        turn = Turn(self._line, destination)
        try:
            async with self._transport.slot() as slot:
                if not await self._still_ours(event.idempotency_key, claim, claimed_at):
                    return None
                with self._tracing.span("smtp send", trace, kind="client", attributes=lambda: {
                        "postroom.attempt": event.attempt,
                        "postroom.destination": destination}) as smtp:
                    sent = await self._send(event, slot, may_defer, turn.give_back_now, hand)
                    smtp.set(lambda: {
                        "postroom.smtp.reply_code": sent.reply.code,
                        "postroom.smtp.failure": (sent.reply.failure.value
                                                  if sent.reply.failure else None),
                        "postroom.smtp.stage": sent.reply.stage.value,
                        "postroom.throttled": sent.throttled})
                    if not 200 <= (sent.reply.code or 0) < 300:
                        smtp.error(sent.reply.text[:200] if sent.reply.text else "no reply")
                throttled = sent.throttled
                return sent
        finally:
            await turn.give_back(throttled=throttled)

    async def _still_ours(self, key: str, claim: ClaimResult, claimed_at: float) -> bool:
        """Renew a claim that waited too long for its turn, or that an ended ledger session took;
        False when another sender has it now. Called as the send starts."""
        if not needs_renewal(self._clock.monotonic() - claimed_at,
                             claim.session == self._ledger.session):
            return True
        kept = await self._calls.call("renew", partial(self._ledger.renew, key))
        self._metrics.inc(CLAIMS_RENEWED_TOTAL, result="kept" if kept else "lost")
        return kept

    async def _send(self, event: EmailRequested, slot: MailSlot, may_defer: bool,
                    on_accepted: Callable[[], None], hand: InHand) -> Sent:
        key = event.idempotency_key
        started = self._clock.monotonic()
        marks: list[tuple[asyncio.Future[float], float]] = []

        def accepted(message_id: str) -> None:
            # The duplicate window opens as the 250 is read: its mark leaves from here, before
            # the send's coroutine resumes, the slot and the destination are given back, or the
            # loop turns. Called from the connection's read: nothing may raise out of it (the
            # transport would drop the connection and the accepted send would count as failed).
            hand.accepted = message_id
            try:
                marks.append((self._ledger.start_mark(key, message_id),
                              self._clock.monotonic()))
            except Exception:
                # The conclusion writes the mark with a call of its own.
                self._metrics.inc(ERRORS_AFTER_ACCEPTED_TOTAL)
                log.exception("key=%s: starting the sent mark failed", key)
            try:
                on_accepted()
            except Exception:
                self._metrics.inc(ERRORS_AFTER_ACCEPTED_TOTAL)
                log.exception("key=%s: giving the destination's turn back failed", key)

        reply, message_id = await slot.send(event, self._clock.utcnow(), accepted)
        mark, read_at = marks[0] if marks else (None, self._clock.monotonic())
        self._metrics.observe(SMTP_REPLY_SECONDS, read_at - started, stage=reply.stage.value)
        return Sent(reply, message_id, read_at, mark, may_defer and is_throttling(reply))

    async def _defer(self, event: EmailRequested) -> None:
        """A throttling reply: the claim is released without an attempt, nothing is published,
        and the send waits for its destination's pause."""
        key = event.idempotency_key
        await self._calls.call("release", partial(self._ledger.release, key))
        self._metrics.inc(THROTTLED_TOTAL)
        self._metrics.set(DESTINATIONS_PAUSED, self._line.paused())
        log.info("key=%s domain=%s attempt=%d throttled by the server: deferred, not counted as "
                 "an attempt", key, event.recipient.rpartition("@")[2], event.attempt)

    async def _conclude(self, origin: Origin, admitted: Admitted, sent: Sent,
                        hand: InHand) -> Routing:
        """Classify the reply, decide what comes next, mark a delivery sent in the ledger, and
        route the outcome. A failed attempt keeps its claim until its outcome is published."""
        reply, message_id = sent.reply, sent.message_id
        event = admitted.event
        outcome = classify_reply(reply)
        now = self._clock.utcnow()
        # A redriven email has a fresh budget: its retry tiers count from the redrive.
        in_round = event.attempt - admitted.attempt_base
        if waits_for_configuration(reply):
            # No attempt was made: counted as a wait, neither an attempt nor an outcome.
            self._metrics.inc(ATTACHMENTS_WAITING_TOTAL)
            decision = self._rules.policy.wait(in_round, now)
        else:
            self._metrics.inc(ATTEMPTS_TOTAL, verdict=outcome.verdict.value)
            if outcome.server_fault and outcome.verdict is not Verdict.SENT:
                self._metrics.inc(SERVER_FAULTS_TOTAL, stage=reply.stage.value)
            decision = self._rules.policy.decide(outcome, in_round, now)
        if decision.action is Action.DONE_SENT:
            # The duplicate window, from the reply read to the mark's commit: a crash before the
            # mark commits sends the key again.
            committed_at = await self._calls.call(
                "mark sent", partial(self._ledger.mark_sent, event.idempotency_key, message_id),
                sent.mark)
            hand.marked = True
            window_s = committed_at - sent.read_at  # the mark started with the read
            self._metrics.observe(SENT_MARK_WINDOW_SECONDS, window_s)
            self._metrics.observe(LEDGER_MARK_SECONDS, window_s, operation="sent")
        log.log(*outcome_line(event, decision, outcome.reason))
        return route(self._rules.topic_prefix, origin, event, outcome, decision, message_id, now)
