"""Tables for the retry policy: which tier, when, and when to give up."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import pytest

from postroom.sender.outcome import Outcome, SmtpReply, Stage, Verdict, classify_reply
from postroom.sender.retry import (
    Action,
    RetryDecision,
    RetryPolicy,
    due_in_s,
    lateness_s,
)
from postroom.settings import Settings

T0 = dt.datetime(2026, 10, 2, 7, 0, tzinfo=dt.UTC)
SENT = Outcome(Verdict.SENT, 250, "2.0.0", "250 2.0.0 Ok")
TRANSIENT = Outcome(Verdict.TRANSIENT, 451, None, "451 try again later")
PERMANENT = Outcome(Verdict.PERMANENT, 550, "5.1.1", "550 5.1.1 User unknown")
SERVER_FAULT = Outcome(Verdict.TRANSIENT, None, None, "connection refused (connect)", True)


# The default policy is the one the default settings build.
DEFAULT = RetryPolicy(Settings().retry_delays_s)


def minutes(n: float) -> dt.datetime:
    return T0 + dt.timedelta(minutes=n)


@pytest.mark.parametrize(("attempt", "outcome", "expected"), [
    (1, SENT, RetryDecision(Action.DONE_SENT)),
    (3, SENT, RetryDecision(Action.DONE_SENT)),
    (5, SENT, RetryDecision(Action.DONE_SENT)),
    (1, PERMANENT, RetryDecision(Action.FAIL)),
    (4, PERMANENT, RetryDecision(Action.FAIL)),
    (5, PERMANENT, RetryDecision(Action.FAIL)),
    (1, TRANSIENT, RetryDecision(Action.RETRY, 1, minutes(5))),
    (2, TRANSIENT, RetryDecision(Action.RETRY, 2, minutes(10))),
    (3, TRANSIENT, RetryDecision(Action.RETRY, 3, minutes(20))),
    (4, TRANSIENT, RetryDecision(Action.RETRY, 4, minutes(40))),
    (5, TRANSIENT, RetryDecision(Action.DEAD)),
    (6, TRANSIENT, RetryDecision(Action.DEAD)),   # tiers shrank under a message in flight
    (99, TRANSIENT, RetryDecision(Action.DEAD)),
    (1, SERVER_FAULT, RetryDecision(Action.RETRY, 1, minutes(5))),
    (5, SERVER_FAULT, RetryDecision(Action.DEAD)),
])
def test_default_policy_decides(attempt: int, outcome: Outcome, expected: RetryDecision) -> None:
    assert DEFAULT.decide(outcome, attempt, T0) == expected


@pytest.mark.parametrize(("delays_s", "attempt", "expected"), [
    ((), 1, RetryDecision(Action.DEAD)),
    ((0.0,), 1, RetryDecision(Action.RETRY, 1, T0)),
    ((0.5,), 1, RetryDecision(Action.RETRY, 1, T0 + dt.timedelta(milliseconds=500))),
    ((0.5,), 2, RetryDecision(Action.DEAD)),
    ((60.0, 10.0), 2, RetryDecision(Action.RETRY, 2, T0 + dt.timedelta(seconds=10))),
    ((60.0, 10.0), 3, RetryDecision(Action.DEAD)),
])
def test_custom_tiers(delays_s: tuple[float, ...], attempt: int, expected: RetryDecision) -> None:
    assert RetryPolicy(delays_s).decide(TRANSIENT, attempt, T0) == expected


def test_seed_timeline_retries_for_75_minutes_over_5_attempts() -> None:
    """Attempt at 07:00, then 07:05, 07:15, 07:35, 08:15, then dead (seed: "about 75 minutes")."""
    policy = DEFAULT
    now, attempt, started = T0, 1, []
    while True:
        started.append(now)
        decision = policy.decide(TRANSIENT, attempt, now)
        if decision.action is not Action.RETRY:
            break
        assert decision.tier == attempt
        assert decision.not_before is not None
        now, attempt = decision.not_before, attempt + 1
    assert decision.action is Action.DEAD
    assert started == [minutes(0), minutes(5), minutes(15), minutes(35), minutes(75)]


def test_seed_ops_recipient_sent_on_third_attempt() -> None:
    """451 twice, then accepted: 07:00 retry, 07:05 retry with doubled delay, 07:15 sent."""
    policy = DEFAULT
    replies = [SmtpReply(Stage.RCPT_TO, 451, "try again later")] * 2
    replies.append(SmtpReply(Stage.DATA, 250, "2.0.0 Ok"))
    now, actions = T0, []
    for attempt, reply in enumerate(replies, start=1):
        decision = policy.decide(classify_reply(reply), attempt, now)
        actions.append((decision.action, decision.tier))
        now = decision.not_before or now
    assert actions == [(Action.RETRY, 1), (Action.RETRY, 2), (Action.DONE_SENT, None)]
    assert now == minutes(15)


@pytest.mark.parametrize("delays_s", [(-1.0,), (300.0, float("nan")), (float("inf"),)])
def test_policy_rejects_bad_delays(delays_s: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match="retry tier"):
        RetryPolicy(delays_s)


def test_policy_counts_its_tiers() -> None:
    assert RetryPolicy((1.0, 2.0, 4.0)).tiers == 3
    assert RetryPolicy(()).tiers == 0


def test_policy_holds_floats_in_a_tuple() -> None:
    policy = RetryPolicy([300, 600])  # type: ignore[arg-type]
    assert policy.delays_s == (300.0, 600.0)
    assert all(type(d) is float for d in policy.delays_s)


@pytest.mark.parametrize("attempt", [0, -1])
def test_decide_rejects_attempt_below_one(attempt: int) -> None:
    with pytest.raises(ValueError, match="1-based"):
        DEFAULT.decide(TRANSIENT, attempt, T0)


def test_decide_rejects_naive_now() -> None:
    with pytest.raises(ValueError, match="now must be timezone-aware"):
        DEFAULT.decide(TRANSIENT, 1, dt.datetime(2026, 10, 2, 7, 0))  # noqa: DTZ001


def test_not_before_keeps_the_callers_timezone() -> None:
    cest = dt.timezone(dt.timedelta(hours=2))
    decision = DEFAULT.decide(TRANSIENT, 1, T0.astimezone(cest))
    assert decision.not_before == minutes(5)
    assert decision.not_before is not None and decision.not_before.tzinfo is cest


@pytest.mark.parametrize(("not_before", "now", "expected"), [
    (None, T0, 0.0),
    (minutes(5), T0, 300.0),
    (T0, T0, 0.0),
    (T0, minutes(1), -60.0),
    (T0 + dt.timedelta(milliseconds=250), T0, 0.25),
])
def test_due_in_s(not_before: dt.datetime | None, now: dt.datetime, expected: float) -> None:
    assert due_in_s(not_before, now) == expected


@pytest.mark.parametrize(("not_before", "fired_at", "expected"), [
    (T0, T0, 0.0),
    (T0, minutes(1), 60.0),
    (minutes(1), T0, -60.0),
    (T0, T0 + dt.timedelta(milliseconds=1500), 1.5),
])
def test_lateness_s(not_before: dt.datetime, fired_at: dt.datetime, expected: float) -> None:
    assert lateness_s(not_before, fired_at) == expected


NAIVE = dt.datetime(2026, 10, 2, 7, 0)  # noqa: DTZ001


@pytest.mark.parametrize(("call", "name"), [
    (lambda: due_in_s(None, NAIVE), "now"),
    (lambda: due_in_s(NAIVE, T0), "not_before"),
    (lambda: lateness_s(NAIVE, T0), "not_before"),
    (lambda: lateness_s(T0, NAIVE), "fired_at"),
])
def test_times_must_be_timezone_aware(call: Callable[[], float], name: str) -> None:
    with pytest.raises(ValueError, match=f"^{name} must be timezone-aware"):
        call()
