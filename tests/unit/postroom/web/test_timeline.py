"""One email's events from its row, ledger entry and suppression entry; its trace link."""

from __future__ import annotations

import datetime as dt

import pytest

from postroom.web import timeline
from support.console import NOW, outbox_row

DELAYS = (300.0, 600.0)


def whats(events: list[timeline.Event]) -> list[str]:
    return [e.what for e in events]


def test_a_sent_email() -> None:
    events = timeline.events(outbox_row(1), None, None, DELAYS)
    assert whats(events) == ["enqueued", "published", "attempt 1", "sent"]
    assert "Message-ID <1@postroom>" in events[-1].detail


def test_a_dead_email_with_its_reply_and_suppressed_address() -> None:
    row = outbox_row(2, status="dead", attempts=3, sent_at=None, smtp_code=550,
                     enhanced_code="5.1.1", last_error="no such user")
    entry = {"source": "bounce", "reason": "5.1.1 gone", "created_at": NOW + dt.timedelta(1),
             "expires_at": NOW + dt.timedelta(30), "active": True}
    events = timeline.events(row, None, entry, DELAYS)
    assert whats(events) == ["enqueued", "published", "attempts 1 to 2", "attempt 3",
                             "dead-lettered", "address suppressed"]
    assert events[3].detail == "550 5.1.1 no such user"


@pytest.mark.parametrize("attempts, expected", [
    (1, "waiting in retry tier 1 (300s)"), (2, "waiting in retry tier 2 (600s)"), (3, "next")])
def test_a_retrying_email_names_its_tier(attempts: int, expected: str) -> None:
    row = outbox_row(3, status="retrying", attempts=attempts, sent_at=None,
                     last_error="451 greylisted", next_attempt_at=NOW)
    [attempt] = [e for e in timeline.events(row, None, None, DELAYS)
                 if e.what == f"attempt {attempts}"]
    assert expected in attempt.detail


def test_events_are_in_time_order() -> None:
    row = outbox_row(4, created_at=NOW, published_at=NOW + dt.timedelta(seconds=1),
                     sent_at=NOW + dt.timedelta(seconds=3), updated_at=NOW + dt.timedelta(2))
    ledger = {"state": "sent", "owner": "host-1", "attempt": 1, "message_id": None,
              "updated_at": NOW + dt.timedelta(seconds=2)}
    assert whats(timeline.events(row, ledger, None, DELAYS)) == [
        "enqueued", "published", "sender ledger", "sent", "attempt 1"]


@pytest.mark.parametrize("traceparent, template, expected", [
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "https://t.example/{trace_id}",
     ("4bf92f3577b34da6a3ce929d0e0e4736", "https://t.example/4bf92f3577b34da6a3ce929d0e0e4736")),
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", None,
     ("4bf92f3577b34da6a3ce929d0e0e4736", None)),
    ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", "https://t.example/{trace_id}",
     None),
    ("javascript:alert(1)", "https://t.example/{trace_id}", None),
    (None, None, None),
])
def test_the_trace_link(traceparent: object, template: str | None,
                        expected: tuple[str, str | None] | None) -> None:
    assert timeline.trace_link(traceparent, template) == expected
