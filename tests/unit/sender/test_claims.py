"""Tables for leases and for the wait on a key another sender holds."""

from __future__ import annotations

import datetime as dt

import pytest

from postroom.settings import Settings
from sender.claims import busy_wait_s, lease_s, send_deadline_s

NOW = dt.datetime(2026, 10, 2, 7, 0, tzinfo=dt.UTC)


def s(seconds: float) -> dt.datetime:
    return NOW + dt.timedelta(seconds=seconds)


@pytest.mark.parametrize(("lease_until", "wait"), [
    (None, 1.0),          # the holder is not known: ask again soon
    (s(5), 5.2),          # just past the holder's lease
    (s(0), 0.2),
    (s(-30), 0.2),        # already expired: try again at once, but not in a hot loop
    (s(600), 30.0),       # a long lease: ask again every 30 s (the holder may answer first)
    (s(29.8), 30.0),
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
