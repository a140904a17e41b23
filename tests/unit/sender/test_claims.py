"""Tables for leases, their renewal, and the wait on a key another sender holds."""

from __future__ import annotations

import datetime as dt

import pytest

from postroom.settings import Settings
from sender.claims import RENEW_AFTER_S, busy_wait_s, lease_s, needs_renewal, send_deadline_s

NOW = dt.datetime(2026, 10, 2, 7, 0, tzinfo=dt.UTC)


def s(seconds: float) -> dt.datetime:
    return NOW + dt.timedelta(seconds=seconds)


@pytest.mark.parametrize(("lease_until", "wait"), [
    (None, 1.0),          # the holder is not known: ask again soon
    (s(0.5), 0.7),        # just past the holder's lease
    (s(0), 0.2),
    (s(-30), 0.2),        # already expired: try again at once, but not in a hot loop
    (s(600), 1.0),        # a long lease: ask again every second (the holder may die or answer)
    (s(5), 1.0),
])
def test_busy_wait(lease_until: dt.datetime | None, wait: float) -> None:
    assert busy_wait_s(lease_until, NOW) == pytest.approx(wait)


@pytest.mark.parametrize(("connect_s", "reply_s", "deadline", "lease"), [
    (30.0, 60.0, 270.0, 285.0),   # the defaults
    (1.0, 2.0, 9.0, 24.0),
])
def test_the_lease_outlasts_the_send_deadline(connect_s: float, reply_s: float, deadline: float,
                                               lease: float) -> None:
    settings = Settings(smtp_connect_timeout_s=connect_s, smtp_timeout_s=reply_s)
    assert (send_deadline_s(settings), lease_s(settings)) == (deadline, lease)


@pytest.mark.parametrize(("age_s", "same_session", "renew"), [
    (0.0, True, False),                  # claimed as the send before it ended: the usual case
    (RENEW_AFTER_S, True, False),
    (RENEW_AFTER_S + 0.001, True, True),  # waited long (a paused destination)
    (0.0, False, True),                  # the session that took it ended: someone may have it now
])
def test_a_claim_is_renewed_when_old_or_taken_on_an_ended_session(
        age_s: float, same_session: bool, renew: bool) -> None:
    assert needs_renewal(age_s, same_session) is renew


def test_a_claim_not_renewed_still_outlasts_its_send_and_record() -> None:
    settings = Settings()
    assert lease_s(settings) - RENEW_AFTER_S > send_deadline_s(settings) + RENEW_AFTER_S
