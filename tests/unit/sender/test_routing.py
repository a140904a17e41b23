"""Tables for routing: which result, which forwarded record and which headers each outcome gives."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging

import pytest

from schemas.codec import DeliveryStatus, EmailRequested
from sender.outcome import Outcome, Verdict
from sender.retry import Action, RetryDecision
from sender.routing import (
    DLQ_CLASS_HEADER,
    DLQ_OFFSET_HEADER,
    DLQ_PARTITION_HEADER,
    DLQ_REASON_HEADER,
    DLQ_TOPIC_HEADER,
    ERROR_HEADER,
    Origin,
    already_sent,
    dead_letter_headers,
    outcome_line,
    route,
)

NOW = dt.datetime(2026, 10, 2, 7, 5, tzinfo=dt.UTC)
LATER = NOW + dt.timedelta(minutes=10)
EVENT = EmailRequested(
    idempotency_key="k|ops@example.com", message_key="k", outbox_id=7, recipient="ops@example.com",
    sender="reports@example.com", subject="S", body="b", attachments=(), priority="normal",
    created_at=NOW, attempt=2, not_before=NOW)
EARLIER = (ERROR_HEADER, "attempt=1 at=2026-10-02T07:00:00+00:00 451 try later")
ORIGIN = Origin("p.email.retry.1", 2, 41, (("postroom.schema", b"abc"), EARLIER))
SENT = Outcome(Verdict.SENT, 250, "2.0.0", "250 2.0.0 Ok")
DEFERRED = Outcome(Verdict.TRANSIENT, 451, "4.3.0", "451 4.3.0 try later")
REJECTED = Outcome(Verdict.PERMANENT, 550, "5.1.1", "550 5.1.1 no such user")
THIS_ERROR = lambda reason: (ERROR_HEADER, f"attempt=2 at={NOW.isoformat()} {reason}")  # noqa: E731


def dlq(classification: str, reason: str) -> tuple[tuple[str, str], ...]:
    return ((DLQ_TOPIC_HEADER, "p.email.retry.1"), (DLQ_PARTITION_HEADER, "2"),
            (DLQ_OFFSET_HEADER, "41"), (DLQ_CLASS_HEADER, classification),
            (DLQ_REASON_HEADER, reason))


@pytest.mark.parametrize(("outcome", "decision", "status", "topic", "headers"), [
    (SENT, RetryDecision(Action.DONE_SENT), DeliveryStatus.SENT, None, None),
    (DEFERRED, RetryDecision(Action.RETRY, 2, LATER), DeliveryStatus.RETRYING, "p.email.retry.2",
     (EARLIER, THIS_ERROR(DEFERRED.reason))),
    (REJECTED, RetryDecision(Action.FAIL), DeliveryStatus.FAILED, "p.email.dead",
     (EARLIER, THIS_ERROR(REJECTED.reason), *dlq("permanent", REJECTED.reason))),
    (DEFERRED, RetryDecision(Action.DEAD), DeliveryStatus.DEAD, "p.email.dead",
     (EARLIER, THIS_ERROR(DEFERRED.reason), *dlq("transient-exhausted", DEFERRED.reason))),
])
def test_route(outcome: Outcome, decision: RetryDecision, status: DeliveryStatus,
               topic: str | None, headers: tuple[tuple[str, str], ...] | None) -> None:
    routing = route("p.", ORIGIN, EVENT, outcome, decision, "<id@example.com>", NOW)
    assert routing.status is status
    assert routing.result.status is status
    if topic is None:
        assert routing.forward is None
    else:
        assert routing.forward is not None
        assert (routing.forward.topic, routing.forward.headers) == (topic, headers)


def test_the_result_carries_the_reply_and_the_message_id_only_when_sent() -> None:
    sent = route("p.", ORIGIN, EVENT, SENT, RetryDecision(Action.DONE_SENT), "<m@x>", NOW).result
    assert (sent.smtp_code, sent.enhanced_code, sent.error, sent.message_id, sent.attempt,
            sent.outbox_id, sent.occurred_at) == (250, "2.0.0", None, "<m@x>", 2, 7, NOW)
    retry = route("p.", ORIGIN, EVENT, DEFERRED, RetryDecision(Action.RETRY, 2, LATER), "<m@x>",
                  NOW).result
    assert (retry.smtp_code, retry.error, retry.message_id, retry.next_attempt_at) == (
        451, DEFERRED.reason, None, LATER)


def test_a_retry_is_the_next_attempt_not_before_its_delay() -> None:
    routing = route("p.", ORIGIN, EVENT, DEFERRED, RetryDecision(Action.RETRY, 2, LATER), "", NOW)
    assert routing.forward is not None
    assert routing.forward.event == dataclasses.replace(EVENT, attempt=3, not_before=LATER)


def test_a_dead_letter_is_the_event_as_it_was_read() -> None:
    routing = route("p.", ORIGIN, EVENT, REJECTED, RetryDecision(Action.FAIL), "", NOW)
    assert routing.forward is not None and routing.forward.event == EVENT


def test_a_fresh_event_has_no_history_and_only_foreign_headers_are_dropped() -> None:
    fresh = Origin("p.email.normal", 0, 3, (("postroom.schema", b"abc"), ("other", b"x")))
    routing = route("p.", fresh, EVENT, DEFERRED, RetryDecision(Action.RETRY, 2, LATER), "", NOW)
    assert routing.forward is not None
    assert routing.forward.headers == (THIS_ERROR(DEFERRED.reason),)


def test_already_sent_is_a_sent_result_without_a_reply() -> None:
    result = already_sent(EVENT, "<m@x>", NOW)
    assert (result.status, result.message_id, result.smtp_code, result.error, result.attempt) == (
        DeliveryStatus.SENT, "<m@x>", None, None, 2)


def test_poison_headers_name_where_the_record_was() -> None:
    assert dead_letter_headers(ORIGIN, "poison", "bad magic") == dlq("poison", "bad magic")


@pytest.mark.parametrize(("decision", "reason", "level", "line"), [
    (RetryDecision(Action.DONE_SENT), "250 ok", logging.INFO, "key=k|ops@example.com attempt=2 sent: 250 ok"),
    (RetryDecision(Action.RETRY, 2, LATER), "451 later", logging.INFO,
     f"key=k|ops@example.com attempt=2 transient (451 later): retry tier 2 at {LATER}"),
    (RetryDecision(Action.FAIL), "550 no", logging.ERROR,
     "key=k|ops@example.com domain=example.com attempt=2 failed permanently: 550 no"),
    (RetryDecision(Action.DEAD), "451 later", logging.ERROR,
     "key=k|ops@example.com domain=example.com attempt=2 dead after the last retry tier: 451 later"),
])
def test_outcome_line(decision: RetryDecision, reason: str, level: int, line: str) -> None:
    assert outcome_line(EVENT, decision, reason) == (level, line)
