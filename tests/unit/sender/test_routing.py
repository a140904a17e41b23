"""Tables for routing: which result, which forwarded record and which headers each outcome gives."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging

import pytest

from postroom.schemas.codec import DeliveryStatus, EmailRequested, EmailResult
from postroom.sender.errors import PoisonRecordError
from postroom.sender.outcome import Outcome, Verdict
from postroom.sender.retry import Action, RetryDecision
from postroom.sender.routing import (
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
    poison_result,
    recipient_of_key,
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


def failed(key: str, outbox_id: int, recipient: str, attempt: int, reason: str) -> EmailResult:
    return EmailResult(idempotency_key=key, outbox_id=outbox_id, recipient=recipient,
                       status=DeliveryStatus.FAILED, attempt=attempt, occurred_at=NOW,
                       error=f"poison: {reason}")


@pytest.mark.parametrize(("poison", "expected"), [
    # decoded, its own key readable: named by the event, at its attempt
    (PoisonRecordError("body over", key="other|x@y", event=EVENT, row_id=99, attempt_base=0),
     failed("k|ops@example.com", 7, "ops@example.com", 2, "body over")),
    # an attempt no row can have: counted from the base
    (PoisonRecordError("attempt 0", event=dataclasses.replace(EVENT, attempt=0), attempt_base=4),
     failed("k|ops@example.com", 7, "ops@example.com", 5, "attempt 0")),
    # the event's key breaks the rules: the record's key, its row id header and the key's address
    (PoisonRecordError("key", key="k|ops@example.com", row_id=7, attempt_base=None,
                       event=dataclasses.replace(EVENT, idempotency_key="k\x00|ops@example.com")),
     failed("k|ops@example.com", 7, "ops@example.com", 1, "key")),
    # unreadable value: the record's key
    (PoisonRecordError("not avro", key="a\\|b|c@example.com", row_id=3, attempt_base=2),
     failed("a\\|b|c@example.com", 3, "c@example.com", 3, "not avro")),
    (PoisonRecordError("not avro", key="nobar"), failed("nobar", 0, "", 1, "not avro")),
    # nothing readable names a row
    (PoisonRecordError("not avro"), None),
])
def test_poison_result(poison: PoisonRecordError, expected: EmailResult | None) -> None:
    assert poison_result(poison, NOW) == expected


def test_a_poison_reason_is_one_printable_line_of_bounded_length() -> None:
    poison = PoisonRecordError("fingerprint \x00\r\nBcc: x\u2028\ud800" + "y" * 5000, key="k|a@b")
    result = poison_result(poison, NOW)
    assert result is not None and result.error is not None
    assert result.error.startswith("poison: fingerprint ???Bcc: x??yyy")
    assert len(poison.reason) == 1000 and poison.reason.endswith("...")


@pytest.mark.parametrize(("key", "recipient"), [
    ("k|a@example.com", "a@example.com"), ("a\\|b|c@d", "c@d"), ("a\\\\|c@d", "c@d"),
    ("a\\\\\\|b|c@d", "c@d"), ("nobar", ""), ("k|", ""), ("|x@y", "x@y"), ("k|a|b", "a|b"),
])
def test_recipient_of_key(key: str, recipient: str) -> None:
    assert recipient_of_key(key) == recipient


def test_a_wait_keeps_one_line_for_its_attempt_however_many_rounds_it_waits() -> None:
    """Waits (no attachments root) keep the attempt's number: each round's line replaces the
    last round's, so a record waiting for days does not grow until it is refused as poison."""
    wait = RetryDecision(Action.RETRY, 1, LATER, counted=False)
    headers: tuple[tuple[str, str | bytes | None], ...] = (
        ("postroom.schema", b"abc"), EARLIER)
    for round_ in range(50):
        origin = Origin("p.email.retry.1", 2, 41 + round_, headers)
        routing = route("p.", origin, EVENT, DEFERRED, wait, "", NOW)
        assert routing.forward is not None
        # as Kafka gives them back: bytes
        headers = tuple((k, v.encode() if isinstance(v, str) else v)
                        for k, v in routing.forward.headers)
    assert [v for k, v in headers if k == ERROR_HEADER] == [
        EARLIER[1].encode(), THIS_ERROR(DEFERRED.reason)[1].encode()]
