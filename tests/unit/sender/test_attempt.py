"""The attempt core (sender/attempt.py) over in-memory fakes: every claim state crossed with a claim
lost while it waited for its turn and with the reply (sent, transient, permanent, throttled and
deferred, throttled past the deferral's end), in milliseconds."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from unit.sender.fakes import (
    EPOCH,
    OK,
    FakeClock,
    FakeLine,
    FakeOutcomes,
    FakeSlot,
    FakeTransport,
    InMemoryLedger,
    Row,
    Trace,
)

from postroom.metrics import (
    DUPLICATES_SUPPRESSED_TOTAL,
    Metrics,
)
from postroom.schemas.codec import EmailRequested
from postroom.sender.admission import Admitted
from postroom.sender.attempt import AttemptRules, Attempts
from postroom.sender.claims import RENEW_AFTER_S, Claim, dead_letter_key
from postroom.sender.destinations import DestinationGate
from postroom.sender.errors import AcceptedUnrecordedError, LedgerUnavailableError
from postroom.sender.ledger_calls import LEDGER_RETRY_FIRST_S, LEDGER_RETRY_S
from postroom.sender.outcome import Failure, SmtpReply, Stage
from postroom.sender.retry import RetryPolicy
from postroom.sender.routing import Origin
from postroom.sender.throttle import ThrottleLimits
from postroom.topics import dead_letter_topic, retry_topic
from postroom.tracing import OFF, TraceContext, Tracing, from_headers
from support.metrics import counter

PREFIX = "t."
KEY = "k|ops@example.com"
ORIGIN = Origin("t.email.requested", 0, 41)
DELAYS_S = (60.0, 300.0)
THROTTLE_MAX_WAIT_S = 10.0
THROTTLING = SmtpReply(Stage.RCPT_TO, 450, "4.2.1 rate limited, slow down")
TRANSIENT = SmtpReply(Stage.RCPT_TO, 451, "4.3.0 try again later")
PERMANENT = SmtpReply(Stage.RCPT_TO, 550, "5.1.1 user unknown")


def event(attempt: int = 1, attachments: tuple[str, ...] = ()) -> EmailRequested:
    return EmailRequested(
        idempotency_key=KEY, message_key="k", outbox_id=7, recipient="ops@example.com",
        sender="reports@example.com", subject="S", body="b", attachments=attachments,
        priority="normal", created_at=EPOCH, attempt=attempt)


@dataclasses.dataclass
class World:
    trace: Trace
    clock: FakeClock
    ledger: InMemoryLedger
    transport: FakeTransport
    line: FakeLine
    outcomes: FakeOutcomes
    metrics: Metrics
    attempts: Attempts

    def deliver(self, admitted: Admitted, origin: Origin = ORIGIN) -> None:
        async def main() -> None:
            await asyncio.wait_for(self.attempts.deliver(origin, admitted), 5)

        asyncio.run(main())

    def count(self, name: str, **labels: str) -> float:
        return counter(self.metrics, name, **labels)

    def calls(self, what: str) -> list[tuple[Any, ...]]:
        return [step for step in self.trace if step[0] == what]


def world(replies: list[SmtpReply] | None = None, *, otherwise: SmtpReply = OK,
          send_s: float = 0.0, line: Any = None, tracing: Tracing = OFF) -> World:
    trace: Trace = []
    clock = FakeClock(trace)
    ledger = InMemoryLedger(clock)
    transport = FakeTransport(clock, replies, otherwise, send_s)
    the_line = line if line is not None else FakeLine(trace)
    outcomes = FakeOutcomes(trace)
    metrics = Metrics()
    rules = AttemptRules(PREFIX, RetryPolicy(DELAYS_S), lambda recipient: "example.com",
                         THROTTLE_MAX_WAIT_S)
    attempts = Attempts(rules, ledger=ledger, transport=transport, line=the_line,
                        outcomes=outcomes, metrics=metrics, clock=clock, tracing=tracing)
    return World(trace, clock, ledger, transport, FakeLine(trace) if line is not None else the_line,
                 outcomes, metrics, attempts)


def other_gives_up(ledger: InMemoryLedger) -> None:
    """The other sender holding the key releases it without an attempt (it was deferred)."""
    row = ledger.rows.get(KEY)
    if row is not None and row.owner == "other" and row.state == "sending":
        row.state, row.lease_until_s = "released", None


# -- the table -----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Expected:
    sends: int
    results: tuple[str, ...]
    forwards: tuple[tuple[str, int], ...]   # (topic, attempt)
    row: tuple[str, int | None]             # the ledger row's state and done attempt after
    verdict: str                            # of the one attempt counted
    throttled: int = 0                      # sends deferred, not counted


# What each reply leads to when the claim is ours at once.
REPLIES: dict[str, tuple[list[SmtpReply], SmtpReply, float, Expected]] = {
    "sent": ([OK], OK, 0.0, Expected(1, ("sent",), (), ("sent", None), "sent")),
    "transient": ([TRANSIENT], OK, 0.0, Expected(
        1, ("retrying",), ((retry_topic(PREFIX, 1), 2),), ("released", 1), "transient")),
    "permanent": ([PERMANENT], OK, 0.0, Expected(
        1, ("failed",), ((dead_letter_topic(PREFIX), 1),), ("released", 1), "permanent")),
    # Deferred once (the claim released, nothing published), then sent.
    "throttled, then sent": ([THROTTLING], OK, 0.0, Expected(
        2, ("sent",), (), ("sent", None), "sent", throttled=1)),
    # Each send takes 4 s: deferred at 4, 8, 12 and 16 s; the fifth, 12 s after the first
    # deferral (POSTROOM_THROTTLE_MAX_WAIT is 10 s), counts as a transient failure.
    "throttled past the deferral": ([], THROTTLING, 4.0, Expected(
        5, ("retrying",), ((retry_topic(PREFIX, 1), 2),), ("released", 1), "transient",
        throttled=4)),
}
CLAIMS = [Claim.MINE, Claim.BUSY, Claim.SENT, Claim.DONE]


def arrange(w: World, claim: Claim) -> None:
    """The ledger as the first claim finds it."""
    if claim is Claim.BUSY:
        w.ledger.take(KEY, 1, "other")  # its lease is live; it gives the key up as we wait
    elif claim is Claim.SENT:
        w.ledger.rows[KEY] = Row("sent", "other", None, 1, "<earlier@x>")
    elif claim is Claim.DONE:
        w.ledger.rows[KEY] = Row("released", "other", None, 1, None, done_attempt=1)
    w.clock.on_sleep = lambda: other_gives_up(w.ledger)


def lose_the_claim_while_waiting(w: World) -> None:
    """As the send's turn comes, it has waited past RENEW_AFTER_S and another sender has taken
    the key meanwhile: the renewal finds it gone."""
    def taken() -> None:
        w.clock.advance(RENEW_AFTER_S + 1)
        w.ledger.take(KEY, 1, "other")

    w.line.on_acquire.append(taken)


@pytest.mark.parametrize(("claim", "lost", "reply"),
                         list(itertools.product(CLAIMS, [False, True], REPLIES)))
def test_one_event_through_every_claim_state(claim: Claim, lost: bool, reply: str) -> None:
    replies, otherwise, send_s, expected = REPLIES[reply]
    w = world(replies, otherwise=otherwise, send_s=send_s)
    arrange(w, claim)
    if lost:
        lose_the_claim_while_waiting(w)

    w.deliver(Admitted(event()))

    if claim is Claim.SENT:
        # Never sent again; the earlier delivery's result is published once more, no release.
        assert (len(w.transport.sent), w.calls("release")) == (0, [])
        assert [(r.status.value, r.message_id) for r in w.outcomes.results] == [
            ("sent", "<earlier@x>")]
        assert w.count("duplicates_suppressed_total") == 1
    elif claim is Claim.DONE:
        # A copy of an attempt whose outcome went out: nothing again.
        assert (len(w.transport.sent), w.outcomes.results, w.calls("release")) == (0, [], [])
        assert w.count("repeated_attempts_suppressed_total") == 1
    else:
        assert len(w.transport.sent) == expected.sends
        assert tuple(r.status.value for r in w.outcomes.results) == expected.results
        assert tuple((f.topic, f.event.attempt) for _, f in w.outcomes.forwards) == (
            expected.forwards)
        row = w.ledger.rows[KEY]
        assert (row.state, row.done_attempt) == expected.row
        assert row.owner == "me"
        assert w.count("throttled_total") == expected.throttled
        assert w.count("attempts_total", verdict=expected.verdict) == 1
        assert w.count("outcomes_total", status=expected.results[0]) == 1
        assert w.count("claims_renewed_total", result="lost") == (1 if lost else 0)
        # Each wait for another sender's answer is one sleep; the lost claim asks again.
        busy_waits = (claim is Claim.BUSY) + lost
        assert len(w.calls("sleep")) == busy_waits
        turns = [throttled for _, _, throttled in w.calls("turn over")]
        assert turns == [False] * lost + [True] * expected.throttled + [False] * (
            expected.sends - expected.throttled)
        if expected.results == ("sent",):
            assert w.calls("mark")[-1][1] == KEY  # marked as the 250 was read
        else:
            # The attempt's claim is given up (done) only once its outcome is out: a copy read
            # after a crash before then must find it not done, or the row is never finished.
            steps = [step[0] for step in w.trace if step[0] in ("result", "forward")
                     or (step[0] == "release" and step[2] is not None)]
            assert steps[-1] == "release" and sorted(steps[:-1]) == ["forward", "result"], steps
    # Whatever happened, the turn and the connection are given back and no claim of ours is
    # left held.
    assert (w.line.in_turn, w.line.queued, w.transport.held) == (0, 0, 0)
    assert not (w.ledger.rows[KEY].owner == "me" and w.ledger.rows[KEY].state == "sending")


# -- paths beside the table ----------------------------------------------------------------------

def _ledger_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    """The ledger's log lines: each level, and its text up to the reason or the colon."""
    return [(r.levelno, r.getMessage().split(" (")[0].split(":")[0]) for r in caplog.records
            if r.getMessage().startswith("ledger ")]


def test_a_ledger_that_does_not_answer_is_asked_again_sooner_then_every_few_seconds(
        caplog: pytest.LogCaptureFixture) -> None:
    w = world([TRANSIENT])
    w.ledger.unavailable = {"claim": 5, "release": 1}
    with caplog.at_level(logging.DEBUG, logger="postroom.sender.attempt"):
        w.deliver(Admitted(event()))
    # Each call's waits start again from the first: the claim's five, then the release's one.
    assert w.calls("sleep") == [("sleep", s) for s in (LEDGER_RETRY_FIRST_S, 0.5, 1.0,
                                                         LEDGER_RETRY_S, LEDGER_RETRY_S,
                                                         LEDGER_RETRY_FIRST_S)]
    # A warning at most every 2 s (at 0, 3.75 and 5.75 s of the fake clock); the rest at DEBUG.
    lines = [(r.levelno, r.getMessage()) for r in caplog.records
             if r.getMessage().startswith("ledger ")]
    assert [(level, message.split(" (")[0], message.partition("; ")[2])
            for level, message in lines] == [
        (logging.WARNING, "ledger claim failed on try 1", "retrying in 0.25s"),
        (logging.DEBUG, "ledger claim failed on try 2", "retrying in 0.5s"),
        (logging.DEBUG, "ledger claim failed on try 3", "retrying in 1s"),
        (logging.DEBUG, "ledger claim failed on try 4", "retrying in 2s"),
        (logging.WARNING, "ledger claim failed on try 5", "retrying in 2s"),
        (logging.INFO, "ledger claim answered on try 6: the ledger answers again", ""),
        (logging.WARNING, "ledger release failed on try 1", "retrying in 0.25s"),
        (logging.INFO, "ledger release answered on try 2: the ledger answers again", "")]
    assert [r.status.value for r in w.outcomes.results] == ["retrying"]
    assert w.ledger.rows[KEY].done_attempt == 1


def test_calls_that_fail_together_log_one_warning_between_them(
        caplog: pytest.LogCaptureFixture) -> None:
    w = world([OK, OK])
    w.ledger.unavailable = {"claim": 3}
    other = dataclasses.replace(event(), idempotency_key="k|cfo@example.com",
                                recipient="cfo@example.com")

    async def both() -> None:
        await asyncio.wait_for(asyncio.gather(w.attempts.deliver(ORIGIN, Admitted(event())),
                                              w.attempts.deliver(ORIGIN, Admitted(other))), 5)

    with caplog.at_level(logging.DEBUG, logger="postroom.sender.attempt"):
        asyncio.run(both())
    levels = [level for level, _ in _ledger_lines(caplog)]
    # One warning, and one line when the ledger answers again (the first call through says it).
    assert levels == [logging.WARNING, logging.DEBUG, logging.DEBUG, logging.INFO]
    assert sorted(r.status.value for r in w.outcomes.results) == ["sent", "sent"]


def test_different_calls_failing_in_one_outage_share_the_senders_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    w = world()
    failures = {"claim": 2, "mark": 2}

    def failing(what: str) -> Callable[[], Awaitable[str]]:
        async def call() -> str:
            if failures[what] > 0:
                failures[what] -= 1
                raise LedgerUnavailableError("connection refused")
            return what
        return call

    async def both() -> list[str]:
        return list(await asyncio.gather(w.attempts._calls.call("claim", failing("claim")),
                                         w.attempts._calls.call("mark", failing("mark"))))

    with caplog.at_level(logging.DEBUG, logger="postroom.sender.attempt"):
        assert asyncio.run(both()) == ["claim", "mark"]
    lines = _ledger_lines(caplog)
    # Within 2 s of the claim's warning, the mark's failures log at DEBUG: one warning a sender.
    assert lines == [(logging.WARNING, "ledger claim failed on try 1"),
                     (logging.DEBUG, "ledger mark failed on try 1"),
                     (logging.DEBUG, "ledger claim failed on try 2"),
                     (logging.DEBUG, "ledger mark failed on try 2"),
                     (logging.INFO, "ledger claim answered on try 3")]


def test_a_new_outage_after_the_ledger_answered_again_warns_at_once(
        caplog: pytest.LogCaptureFixture) -> None:
    w = world([TRANSIENT])
    w.ledger.unavailable = {"claim": 1, "release": 1}
    with caplog.at_level(logging.DEBUG, logger="postroom.sender.attempt"):
        w.deliver(Admitted(event()))
    lines = _ledger_lines(caplog)
    # The release fails 0.25 s after the claim's warning, but after the claim got through.
    assert lines == [(logging.WARNING, "ledger claim failed on try 1"),
                     (logging.INFO, "ledger claim answered on try 2"),
                     (logging.WARNING, "ledger release failed on try 1"),
                     (logging.INFO, "ledger release answered on try 2")]


def test_a_mark_that_failed_is_written_again_before_the_outcome_goes_out() -> None:
    w = world([OK])
    w.ledger.unavailable = {"mark": 1}
    w.deliver(Admitted(event()))
    assert [step[0] for step in w.trace if step[0] in ("mark", "sleep", "mark again", "result")
            ] == ["mark", "sleep", "mark again", "result"]
    assert w.calls("sleep") == [("sleep", LEDGER_RETRY_FIRST_S)]  # the mark goes again soon
    assert w.ledger.rows[KEY].state == "sent"


def test_a_claim_taken_on_an_ended_session_is_renewed_before_its_send() -> None:
    w = world([OK])
    w.line.on_acquire.append(lambda: setattr(w.ledger, "session", 2))  # reconnected meanwhile
    w.deliver(Admitted(event()))
    assert w.calls("renew") == [("renew", KEY, True)]
    assert w.count("claims_renewed_total", result="kept") == 1
    assert [r.status.value for r in w.outcomes.results] == ["sent"]


def test_an_attempt_our_configuration_kept_back_waits_with_its_number_and_is_not_done() -> None:
    """No POSTROOM_ATTACHMENTS_ROOT: attempt 2 goes back to tier 1 as attempt 2, and its claim
    is released without the attempt marked done, so the wait's next read is not a repeat."""
    waiting = SmtpReply(Stage.LOCAL, None, "attachments are off", Failure.CONFIG)
    w = world([waiting])
    w.deliver(Admitted(event(attempt=2, attachments=("/srv/q3.xlsx",))))
    assert [(f.topic, f.event.attempt) for _, f in w.outcomes.forwards] == [
        (retry_topic(PREFIX, 1), 2)]
    assert w.calls("release") == [("release", KEY, None)]
    assert w.count("attachments_waiting_total") == 1


def test_a_wait_is_no_attempt_in_the_result_the_metrics_or_the_retry_budget(
        caplog: pytest.LogCaptureFixture) -> None:
    """Issue 45 item 1: an email that waits for POSTROOM_ATTACHMENTS_ROOT before its first
    attempt goes to tier 1 still attempt 1, its result counts 0 attempts, no attempt or outcome
    is counted, and the transient failure of its real first attempt takes tier 1, not tier 2."""
    waiting = SmtpReply(Stage.LOCAL, None, "POSTROOM_ATTACHMENTS_ROOT is not set", Failure.CONFIG)
    w = world([waiting, waiting, TRANSIENT])
    first = event(attachments=("/srv/q3.xlsx",))
    with caplog.at_level(logging.DEBUG, logger="postroom.sender.attempt"):
        w.deliver(Admitted(first))
        [(_, waited)] = w.outcomes.forwards
        w.deliver(Admitted(waited.event), Origin(retry_topic(PREFIX, 1), 0, 1))
    assert [(f.topic, f.event.attempt) for _, f in w.outcomes.forwards] == [
        (retry_topic(PREFIX, 1), 1)] * 2
    assert [(r.status.value, r.attempt) for r in w.outcomes.results] == [("retrying", 0)] * 2
    assert w.count("attachments_waiting_total") == 2
    assert w.count("attempts_total", verdict="transient") == 0
    assert w.count("outcomes_total", status="retrying") == 0
    assert not [r for r in caplog.records if r.levelno >= logging.INFO
                and "waits" in r.getMessage()]  # said once at ERROR by the delivery
    w.deliver(Admitted(w.outcomes.forwards[-1][1].event), Origin(retry_topic(PREFIX, 1), 0, 2))
    assert (w.outcomes.forwards[-1][1].topic, w.outcomes.forwards[-1][1].event.attempt) == (
        retry_topic(PREFIX, 1), 2)
    assert w.count("attempts_total", verdict="transient") == 1
    assert w.count("outcomes_total", status="retrying") == 1


def test_a_redriven_email_counts_its_tiers_from_the_redrive() -> None:
    w = world([TRANSIENT])
    w.deliver(Admitted(event(attempt=4), attempt_base=3))  # the redrive's first attempt
    assert [(f.topic, f.event.attempt) for _, f in w.outcomes.forwards] == [
        (retry_topic(PREFIX, 1), 5)]


def test_a_send_that_raises_gives_its_turn_and_connection_back() -> None:
    w = world()
    w.transport.raises = RuntimeError("a bug in the transport")
    with pytest.raises(RuntimeError):
        w.deliver(Admitted(event()))
    assert (w.line.in_turn, w.line.queued, w.transport.held) == (0, 0, 0)
    assert w.calls("turn over") == [("turn over", "example.com", False)]


def test_the_core_runs_against_the_real_destination_gate() -> None:
    """The gate the sender wires in, with a 10 ms pause after the throttling reply."""
    gate = DestinationGate(ThrottleLimits(2, 0.0, 0.01))
    w = world([THROTTLING], line=gate)
    w.deliver(Admitted(event()))
    assert [r.status.value for r in w.outcomes.results] == ["sent"]
    assert len(w.transport.sent) == 2
    assert gate.waiting == 0


# -- trace context -------------------------------------------------------------------------------

PARENT = TraceContext("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", 1, "a=1")
TRACED = Origin("t.email.normal", 0, 41, PARENT.headers())


def test_without_tracing_the_records_carry_the_events_context_on_as_it_came() -> None:
    w = world([TRANSIENT])
    w.deliver(Admitted(event()), TRACED)
    assert w.outcomes.trace_headers == [("result", PARENT.headers()),
                                        (retry_topic(PREFIX, 1), PARENT.headers())]
    untraced = world([TRANSIENT])
    untraced.deliver(Admitted(event()))
    assert untraced.outcomes.trace_headers == [("result", ()), (retry_topic(PREFIX, 1), ())]


def test_with_tracing_the_attempt_the_send_and_the_retry_are_spans_of_the_events_trace() -> None:
    from support.tracing import memory_provider

    provider, memory = memory_provider()
    w = world([TRANSIENT], tracing=Tracing.from_provider(provider))
    w.deliver(Admitted(event()), TRACED)
    spans = {s.name: s for s in memory.get_finished_spans()}
    assert set(spans) == {"process t.email.normal", "smtp send", "send t.email.retry.1"}
    process, smtp, retry = (spans[n] for n in ("process t.email.normal", "smtp send",
                                               "send t.email.retry.1"))
    assert f"{process.parent.span_id:016x}" == PARENT.span_id
    assert smtp.parent.span_id == retry.parent.span_id == process.context.span_id
    assert smtp.attributes["postroom.smtp.reply_code"] == 451
    assert process.attributes["postroom.status"] == "retrying"
    (_, result_headers), (_, retry_headers) = w.outcomes.trace_headers
    assert from_headers(result_headers) == TraceContext(
        PARENT.trace_id, f"{process.context.span_id:016x}", 1, "a=1")
    assert from_headers(retry_headers) == TraceContext(
        PARENT.trace_id, f"{retry.context.span_id:016x}", 1, "a=1")


@pytest.mark.parametrize(("reply", "given_back"), [
    (OK, ["turn over", "send resumed"]),  # from the 250's read, before the send resumes
    (TRANSIENT, ["send resumed", "turn over"]),  # after the send, whatever came of it
])
def test_the_turn_is_given_back_once_and_from_the_250_when_accepted(
        reply: SmtpReply, given_back: list[str]) -> None:
    w = world([reply])
    w.transport.loop_turns_after_reply = 1
    w.deliver(Admitted(event()))
    assert [step[0] for step in w.trace if step[0] in ("turn over", "send resumed")] == given_back
    assert w.line.in_turn == 0


class _PausedLine(FakeLine):
    """A destination paused until the clock is past ``until_s``: every send's turn comes then."""

    def __init__(self, trace: Trace, clock: FakeClock, until_s: float) -> None:
        super().__init__(trace)
        self.clock, self.until_s = clock, until_s

    async def acquire(self, name: str) -> None:
        while self.clock.monotonic() <= self.until_s:
            await self.clock.sleep(1.0)
        await super().acquire(name)


def test_a_copy_of_an_event_in_hand_waits_for_it_and_is_not_sent_twice(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The ledger tells owners apart, not one task of a sender from another: a copy of the
    record read while the first delivery waits past its lease must not claim the key too."""
    real_send = FakeSlot.send

    async def round_trip(self: FakeSlot, *args: Any) -> Any:
        for _ in range(5):  # the copy's turn comes while the first send waits for its reply
            await asyncio.sleep(0)
        return await real_send(self, *args)

    monkeypatch.setattr(FakeSlot, "send", round_trip)
    w = world()
    # Paused past the first claim's lease, and past the time a copy waiting on a busy key
    # would take the lapsed claim as its own (the same owner).
    w.attempts._line = _PausedLine(w.trace, w.clock, w.ledger.lease_s * 2)

    async def main() -> None:
        first = asyncio.create_task(w.attempts.deliver(ORIGIN, Admitted(event())))
        await asyncio.sleep(0)
        copy = asyncio.create_task(w.attempts.deliver(ORIGIN, Admitted(event())))
        await asyncio.wait_for(asyncio.gather(first, copy), 5)

    asyncio.run(main())
    assert len(w.transport.sent) == 1
    # The same attempt, made by this sender just now: answered as the ledger would (sent, its
    # result again) without asking it, so copies do not wait on the ledger one after another.
    assert [r.status.value for r in w.outcomes.results] == ["sent", "sent"]
    assert w.count(DUPLICATES_SUPPRESSED_TOTAL) == 1
    assert len(w.calls("claim")) == 1
    assert w.attempts._in_hand == {}


def test_a_copy_of_another_attempt_waits_and_then_asks_the_ledger(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A record of a later attempt of a key in hand (a redrive's, say) is not taken for a copy:
    it waits for the delivery in hand, then the ledger says the key was sent."""
    w = world()
    w.attempts._line = _PausedLine(w.trace, w.clock, w.ledger.lease_s * 2)

    async def main() -> None:
        first = asyncio.create_task(w.attempts.deliver(ORIGIN, Admitted(event())))
        await asyncio.sleep(0)
        later = asyncio.create_task(w.attempts.deliver(ORIGIN, Admitted(event(attempt=2))))
        await asyncio.wait_for(asyncio.gather(first, later), 5)

    asyncio.run(main())
    assert len(w.transport.sent) == 1
    assert [r.status.value for r in w.outcomes.results] == ["sent", "sent"]
    assert w.count(DUPLICATES_SUPPRESSED_TOTAL) == 1


WAITING = SmtpReply(Stage.LOCAL, None, "attachments are off", Failure.CONFIG)


def test_a_wait_read_again_while_its_claim_is_still_being_released_is_not_dropped() -> None:
    """No POSTROOM_ATTACHMENTS_ROOT: the wait goes back to its tier with its attempt number, and
    its next read comes while releasing the claim is slow (a slow database). That read is not a
    copy of an attempt made: it is delivered (a wait again, put back once more), so a record of
    the email stays on its way and its row does not stay ``retrying`` for ever."""
    w = world([WAITING, WAITING])
    waiting = event(attempt=2, attachments=("/srv/q3.xlsx",))
    on_tier = Origin(retry_topic(PREFIX, 1), 0, 5)

    async def main() -> None:
        releasing, release_started = asyncio.Event(), asyncio.Event()
        real_release = w.ledger.release

        async def slow_release(key: str, done_attempt: int | None = None) -> None:
            release_started.set()
            await releasing.wait()
            await real_release(key, done_attempt)

        w.ledger.release = slow_release  # type: ignore[method-assign]
        first = asyncio.create_task(w.attempts.deliver(ORIGIN, Admitted(waiting)))
        await release_started.wait()  # its outcome is out, its claim not yet released
        # The tier's record is read before the first delivery has released its claim.
        next_read = asyncio.create_task(w.attempts.deliver(on_tier, Admitted(waiting)))
        await asyncio.sleep(0)
        releasing.set()
        await asyncio.wait_for(asyncio.gather(first, next_read), 5)

    asyncio.run(main())
    assert len(w.transport.sent) == 2
    assert [(f.topic, f.event.attempt) for _, f in w.outcomes.forwards] == [
        (retry_topic(PREFIX, 1), 2), (retry_topic(PREFIX, 1), 2)]
    assert w.count("repeated_attempts_suppressed_total") == 0
    assert w.attempts._in_hand == {}


def test_a_copy_of_an_attempt_made_and_done_here_is_answered_without_the_ledger() -> None:
    """The ten-kill tail's fix kept: a copy of a failed attempt this sender made and marked done
    just now is dropped without asking the ledger (its result and retry are out)."""
    w = world([TRANSIENT])

    async def main() -> None:
        releasing, release_started = asyncio.Event(), asyncio.Event()
        real_release = w.ledger.release

        async def slow_release(key: str, done_attempt: int | None = None) -> None:
            release_started.set()
            await releasing.wait()
            await real_release(key, done_attempt)

        w.ledger.release = slow_release  # type: ignore[method-assign]
        first = asyncio.create_task(w.attempts.deliver(ORIGIN, Admitted(event())))
        await release_started.wait()
        copy = asyncio.create_task(w.attempts.deliver(ORIGIN, Admitted(event())))
        await asyncio.sleep(0)
        releasing.set()
        await asyncio.wait_for(asyncio.gather(first, copy), 5)

    asyncio.run(main())
    assert len(w.transport.sent) == 1
    assert len(w.calls("claim")) == 1
    assert [r.status.value for r in w.outcomes.results] == ["retrying"]
    assert w.count("repeated_attempts_suppressed_total") == 1


# -- after the server's 250 ----------------------------------------------------------------------

class _BrokenMarks(InMemoryLedger):
    """A ledger whose sent mark fails with an error of ours (not the database being away):
    ``how`` 'future' fails the mark started from the read of the 250, 'call' raises as it is
    started (inside the connection's read), and every later mark_sent raises too."""

    def __init__(self, clock: FakeClock, how: str) -> None:
        super().__init__(clock)
        self.how = how

    def start_mark(self, key: str, message_id: str) -> asyncio.Future[float]:
        self.trace.append(("mark", key, message_id))
        if self.how == "call":
            raise RuntimeError("a bug in the marker")
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        future.set_exception(RuntimeError("a bug in the marker"))
        return future

    async def mark_sent(self, key: str, message_id: str) -> float:
        self.trace.append(("mark again", key, message_id))
        raise RuntimeError("a bug in the marker")


@pytest.mark.parametrize("how", ["future", "call"])
def test_after_the_250_an_error_of_ours_in_the_mark_still_ends_the_email_sent(how: str) -> None:
    w = world([OK])
    w.attempts._ledger = w.ledger = _BrokenMarks(w.clock, how)
    w.deliver(Admitted(event()))
    assert [(r.status.value, r.message_id) for r in w.outcomes.results] == [
        ("sent", "<0.7@fake>")]
    assert w.outcomes.forwards == []
    assert w.count("errors_after_accepted_total") >= 1
    # Nothing is sent twice, the turn and the connection are given back.
    assert len(w.transport.sent) == 1
    assert (w.line.in_turn, w.line.queued, w.transport.held) == (0, 0, 0)


def test_after_the_250_a_transport_that_raises_still_ends_the_email_sent(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The server's acceptance was read (the mark left from it), then our side of the send
    raised: the email is sent, not a transient failure to send again, nor poison."""
    real_send = FakeSlot.send

    async def accepted_then_raises(self: FakeSlot, *args: Any) -> Any:
        await real_send(self, *args)
        raise RuntimeError("a bug after the reply")

    monkeypatch.setattr(FakeSlot, "send", accepted_then_raises)
    w = world([OK])
    w.deliver(Admitted(event()))
    assert [r.status.value for r in w.outcomes.results] == ["sent"]
    assert w.ledger.rows[KEY].state == "sent"
    assert w.count("errors_after_accepted_total") == 1
    assert len(w.transport.sent) == 1


def test_after_the_250_a_bookkeeping_error_still_ends_the_email_sent() -> None:
    """Classifying, routing or counting raising after the acceptance (here the attempt's
    counter): the row still ends sent, and the ledger holds the mark."""
    w = world([OK])
    real_inc = w.metrics.inc

    def inc(spec: Any, *args: Any, **labels: Any) -> None:
        if spec.name == "attempts_total":
            raise RuntimeError("a bug in our bookkeeping")
        real_inc(spec, *args, **labels)

    w.metrics.inc = inc  # type: ignore[method-assign]
    w.deliver(Admitted(event()))
    assert [r.status.value for r in w.outcomes.results] == ["sent"]
    assert w.ledger.rows[KEY].state == "sent"
    assert w.count("errors_after_accepted_total") == 1


def test_an_error_before_the_server_accepted_is_still_raised() -> None:
    w = world()
    w.transport.raises = RuntimeError("a bug in the transport")
    with pytest.raises(RuntimeError):
        w.deliver(Admitted(event()))
    assert w.outcomes.results == []
    assert w.count("errors_after_accepted_total") == 0


def test_a_sent_result_that_cannot_be_published_is_raised_as_unrecorded() -> None:
    """Not poison: the intake lets it raise, and the record is read again later."""
    w = world([OK])

    async def refused(key: str, result: Any, trace: Any = ()) -> None:
        raise RuntimeError("the broker refused it")

    w.outcomes.result = refused  # type: ignore[method-assign]
    with pytest.raises(AcceptedUnrecordedError):
        w.deliver(Admitted(event()))
    assert w.ledger.rows[KEY].state == "sent"


# -- dead letters once per record ----------------------------------------------------------------

POISON_KEY = dead_letter_key("t.email.normal", 2, 41, 1_796_000_000_000)


def test_a_poison_record_read_again_after_a_restart_is_dead_lettered_once() -> None:
    """The first read dead-letters it; its offset was not committed (the sender died, or its
    partition moved), so another sender, or this one restarted, reads it again."""
    w = world()
    published: list[str] = []

    async def dead_letter() -> None:
        published.append("dead letter")

    async def main() -> None:
        await w.attempts.dead_letter_once(POISON_KEY, dead_letter)
        restarted = world()
        restarted.ledger.rows = w.ledger.rows  # the same database, another sender
        restarted.ledger.owner = "another"
        await restarted.attempts.dead_letter_once(POISON_KEY, dead_letter)
        assert restarted.count("poison_repeated_total") == 1

    asyncio.run(main())
    assert published == ["dead letter"]
    assert (w.ledger.rows[POISON_KEY].state, w.ledger.rows[POISON_KEY].done_attempt) == (
        "released", 1)


def test_two_reads_of_one_poison_record_at_once_dead_letter_it_once() -> None:
    """After a rebalance the new owner reads the record while the old one still publishes its
    dead letter: the second waits for the first's answer."""
    w = world()
    other = world()
    other.ledger.rows = w.ledger.rows
    other.ledger.owner = "new owner"
    other.ledger.clock = w.clock
    published: list[str] = []

    async def main() -> None:
        first_out = asyncio.Event()

        async def slow_dead_letter() -> None:
            await first_out.wait()
            published.append("first")

        async def dead_letter() -> None:
            published.append("second")

        first = asyncio.create_task(w.attempts.dead_letter_once(POISON_KEY, slow_dead_letter))
        await asyncio.sleep(0)
        # The new owner finds the key busy under a live lease and asks again; meanwhile the
        # first publishes and releases it done.
        other.clock.on_sleep = first_out.set
        second = asyncio.create_task(other.attempts.dead_letter_once(POISON_KEY, dead_letter))
        await asyncio.wait_for(asyncio.gather(first, second), 5)

    asyncio.run(main())
    assert published == ["first"]
    assert other.count("poison_repeated_total") == 1


def test_a_dead_letter_that_fails_is_left_for_the_next_read() -> None:
    w = world()

    async def refused() -> None:
        raise RuntimeError("the broker refused it")

    async def main() -> None:
        with pytest.raises(RuntimeError):
            await w.attempts.dead_letter_once(POISON_KEY, refused)
        again: list[str] = []

        async def dead_letter() -> None:
            again.append("dead letter")

        await w.attempts.dead_letter_once(POISON_KEY, dead_letter)
        assert again == ["dead letter"]

    asyncio.run(main())


def test_a_dead_letter_key_is_never_an_idempotency_key() -> None:
    assert "|" not in POISON_KEY
    assert POISON_KEY != dead_letter_key("t.email.normal", 2, 41, 1_796_000_000_001)
