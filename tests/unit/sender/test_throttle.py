"""Per-destination throttling decisions: which replies throttle, and how a destination's limit,
rate and pause move. Tables."""

from __future__ import annotations

import pytest

from postroom.sender.outcome import Failure, SmtpReply, Stage
from postroom.sender.throttle import (
    Destination,
    DestinationBy,
    ThrottleLimits,
    destination_of,
    finished,
    is_throttling,
    started,
    wait_s,
)

LIMITS = ThrottleLimits(concurrency=4, rate_per_s=0.0, pause_s=10.0)


@pytest.mark.parametrize(("code", "text", "expected"), [
    (421, "4.7.28 Our system has detected an unusual rate of unsolicited mail", True),  # Gmail
    (450, "4.2.1 The user you are trying to contact is receiving mail at a rate that prevents "
          "additional messages from being delivered", True),                            # Gmail
    (451, "4.7.500 Server busy. Please try again later", True),                         # Microsoft
    (454, "Throttling failure: Maximum sending rate exceeded.", True),                  # SES
    (452, "4.3.1 Too many messages from this sender, slow down", True),
    (421, "4.3.2 rate limit exceeded", True),
    (454, "4.7.0 TLS not available due to local problem", False),
    (451, "4.3.0 try again later", False),            # greylisting: an ordinary deferral
    (421, "4.4.2 connection timed out", False),
    (452, "4.2.2 Mailbox full", False),
    (550, "5.7.1 rate limit exceeded, blocked", False),  # a 5xx is never "slow down"
    (250, "2.0.0 Ok", False),
])
def test_is_throttling(code: int, text: str, expected: bool) -> None:
    assert is_throttling(SmtpReply(Stage.RCPT_TO, code, text)) is expected


def test_a_reply_that_never_came_is_not_throttling() -> None:
    assert not is_throttling(SmtpReply(Stage.CONNECT, None, "refused", Failure.REFUSED))


@pytest.mark.parametrize(("recipient", "by", "expected"), [
    ("Anna@Example.COM", DestinationBy.DOMAIN, "example.com"),
    ("anna@mail.example.org", DestinationBy.DOMAIN, "mail.example.org"),
    ("anna@example.com", DestinationBy.SMARTHOST, "relay.internal:587"),
])
def test_destination_of(recipient: str, by: DestinationBy, expected: str) -> None:
    assert destination_of(recipient, by, "relay.internal:587") == expected


def test_concurrency_fills_then_frees() -> None:
    dest = Destination.fresh(LIMITS)
    for _ in range(4):
        assert wait_s(dest, 0.0) == 0.0
        dest = started(dest, LIMITS, 0.0)
    assert wait_s(dest, 0.0) is None  # full: wait for a send to finish
    dest = finished(dest, LIMITS, 1.0, throttled=False)
    assert (dest.in_flight, wait_s(dest, 1.0)) == (3, 0.0)


def test_a_rate_spaces_the_starts() -> None:
    limits = ThrottleLimits(concurrency=10, rate_per_s=2.0, pause_s=10.0)
    dest = started(Destination.fresh(limits), limits, 100.0)
    assert wait_s(dest, 100.0) == pytest.approx(0.5)
    assert wait_s(dest, 100.5) == 0.0
    dest = started(dest, limits, 100.5)
    assert dest.next_start_s == pytest.approx(101.0)


@pytest.mark.parametrize(("replies", "limit", "paused_until", "next_pause"), [
    ([True], 2, 10.0, 20.0),                  # halved, paused 10 s, the next pause doubles
    ([True, True], 1, 30.0, 40.0),            # never below one
    ([True, True, True, True, True, True], 1, 470.0, 160.0),  # the pause stops at 16 x 10 s
    ([True, False], 3, 10.0, 10.0),           # a clean send adds one back, resets the pause
    ([False, False], 4, 0.0, 10.0),           # never above the configured limit
])
def test_throttling_halves_the_limit_and_pauses(
        replies: list[bool], limit: int, paused_until: float, next_pause: float) -> None:
    dest = Destination.fresh(LIMITS)
    now = 0.0
    for throttled in replies:
        dest = finished(started(dest, LIMITS, now), LIMITS, now, throttled)
        now = max(now, dest.paused_until_s) if throttled else now
    assert (dest.limit, dest.in_flight, dest.pause_s) == (limit, 0, next_pause)
    assert dest.paused_until_s == pytest.approx(paused_until)


def test_a_paused_destination_waits_out_its_pause() -> None:
    dest = finished(started(Destination.fresh(LIMITS), LIMITS, 5.0), LIMITS, 5.0, throttled=True)
    assert wait_s(dest, 6.0) == pytest.approx(9.0)
    assert wait_s(dest, 15.0) == 0.0


@pytest.mark.parametrize("limits", [
    dict(concurrency=0), dict(rate_per_s=-1.0), dict(pause_s=0.0), dict(rate_per_s=float("inf"))])
def test_bad_limits_are_refused(limits: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ThrottleLimits(**limits)  # type: ignore[arg-type]


@pytest.mark.parametrize(("env", "field", "expected"), [
    ({"POSTROOM_DESTINATION_RATE": "2/s"}, "destination_rate_per_s", 2.0),
    ({"POSTROOM_DESTINATION_RATE": "30/m"}, "destination_rate_per_s", 0.5),
    ({"POSTROOM_DESTINATION_RATE": "0"}, "destination_rate_per_s", 0.0),
    ({"POSTROOM_DESTINATION_BY": "SmartHost"}, "destination_by", "smarthost"),
    ({"POSTROOM_DESTINATION_CONCURRENCY": "5"}, "destination_concurrency", 5),
    ({"POSTROOM_THROTTLE_PAUSE": "30s"}, "throttle_pause_s", 30.0),
    ({"POSTROOM_THROTTLE_MAX_WAIT": "1h"}, "throttle_max_wait_s", 3600.0),
])
def test_throttle_settings(env: dict[str, str], field: str, expected: object) -> None:
    from postroom.settings import Settings

    assert getattr(Settings.from_env(env), field) == expected


@pytest.mark.parametrize(("name", "value"), [
    ("POSTROOM_DESTINATION_RATE", "fast"), ("POSTROOM_DESTINATION_RATE", "2/d"),
    ("POSTROOM_DESTINATION_RATE", "-1"), ("POSTROOM_DESTINATION_BY", "mx"),
    ("POSTROOM_DESTINATION_CONCURRENCY", "0")])
def test_bad_throttle_settings_name_their_variable(name: str, value: str) -> None:
    from postroom.errors import ConfigError
    from postroom.settings import Settings

    with pytest.raises(ConfigError, match=f"^{name}: "):
        Settings.from_env({name: value})


# Each row: sends started at once, then (time, throttled) of each send's end, in order; the limit,
# the pause's end and the next pause's length after them. LIMITS pause 10 s, 4 at once.
@pytest.mark.parametrize(("in_flight", "ends", "limit", "paused_until", "next_pause"), [
    # Issue 26: four in flight throttled at one moment: paused once for the pause, not 2^4 times.
    (4, [(0.0, True)] * 4, 2, 10.0, 20.0),
    (4, [(0.0, True), (1.0, True), (2.0, True), (9.9, True)], 2, 10.0, 20.0),  # all in the pause
    (4, [(0.0, True), (3.0, False), (4.0, False), (5.0, False)], 2, 10.0, 20.0),  # clean, paused
    # A send of the burst that answers once the pause is over still belongs to it (review: it
    # doubled the pause; slow replies at 1, 6.5, 17 and 38 s kept a 5 s pause going to 78 s).
    (2, [(0.0, True), (10.0, True)], 2, 10.0, 20.0),
    (4, [(1.0, True), (6.5, True), (17.0, True), (38.0, True)], 2, 11.0, 20.0),
    (2, [(0.0, False), (0.0, True)], 2, 10.0, 20.0),  # a clean one first, then the burst
])
def test_one_burst_of_throttling_pauses_once(in_flight: int, ends: list[tuple[float, bool]],
                                             limit: int, paused_until: float,
                                             next_pause: float) -> None:
    dest = Destination.fresh(LIMITS)
    for _ in range(in_flight):
        dest = started(dest, LIMITS, 0.0)
    for now, throttled in ends:
        dest = finished(dest, LIMITS, now, throttled)
    assert (dest.limit, dest.in_flight, dest.pause_s) == (limit, 0, next_pause)
    assert dest.paused_until_s == pytest.approx(paused_until)


def test_after_the_pause_sends_start_and_a_throttled_one_doubles_the_pause() -> None:
    dest = Destination.fresh(LIMITS)
    for _ in range(4):
        dest = started(dest, LIMITS, 0.0)
    for _ in range(4):
        dest = finished(dest, LIMITS, 0.0, throttled=True)
    assert wait_s(dest, 5.0) == pytest.approx(5.0)  # paused 10 s, once
    dest = finished(started(dest, LIMITS, 10.0), LIMITS, 10.5, throttled=True)
    assert dest.paused_until_s == pytest.approx(30.5)  # the next round: 20 s
