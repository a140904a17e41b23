"""refuse_event and refuse_record: what the sender will not deliver, as a table."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from postroom.rules import SizeLimits
from schemas.codec import EmailRequested, encode, headers_for
from sender.admission import (
    HEADERS_ALLOWANCE_BYTES,
    Admission,
    Refusal,
    admit,
    record_size,
    refuse_event,
    refuse_record,
)

NOW = dt.datetime(2026, 10, 2, 7, 0, tzinfo=dt.UTC)
ADMISSION = Admission.for_tiers(SizeLimits(body_max_bytes=1000, event_max_bytes=5000),
                                (60.0, 120.0))


def event(**changes: Any) -> EmailRequested:
    values: dict[str, Any] = {
        "idempotency_key": "k|a@example.com", "message_key": "k", "outbox_id": 1,
        "recipient": "a@example.com", "sender": "", "subject": "S", "body": "b",
        "attachments": (), "priority": "normal", "created_at": NOW}
    return EmailRequested(**{**values, **changes})


@pytest.mark.parametrize(("changes", "on_retry", "reason"), [
    ({}, False, None),
    ({"attempt": 2, "not_before": NOW + dt.timedelta(seconds=120)}, True, None),
    ({"attempt": 3}, True, None),
    ({"sender": "Reports <reports@example.com>"}, False, None),
    ({"recipient": "josé@bücher.example"}, False, None),
    ({"attempt": 0}, False, "attempt 0 is outside 1..3"),
    ({"attempt": -1}, False, "attempt -1 is outside 1..3"),
    ({"attempt": 4}, True, "attempt 4 is outside 1..3"),
    ({"attempt": 1}, True, "attempt 1 on a retry topic"),
    ({"attempt": 2, "not_before": NOW + dt.timedelta(days=30)}, True, "further ahead"),
    ({"recipient": "a@b.com, eve@evil.example"}, False, "invalid local part"),
    ({"recipient": "ceo@corp.example <eve@evil.example>"}, False, "invalid local part"),
    ({"recipient": "a@example.com\r\nBcc: eve@evil.example"}, False, "control character"),
    ({"sender": "a@b.com, eve@evil.example"}, False, "sender"),
    ({"subject": "x\u2028Bcc: y"}, False, "line break"),
    ({"subject": "x\x85y"}, False, "line break"),
    ({"body": "b" * 1001}, False, "over the limit of 1000"),
    ({"message_key": "k\nforged log line"}, False, "message key"),
    ({"idempotency_key": "k\r\n"}, False, "idempotency key"),
    ({"attachments": ("/proc/self/environ",)}, False, "pseudo file system"),
    ({"attachments": ("a\nb.csv",)}, False, "control character"),
    ({"attachments": tuple(f"{n}.csv" for n in range(101))}, False, "101 attachments"),
])
def test_refuse_event(changes: dict[str, Any], on_retry: bool, reason: str | None) -> None:
    refusal = refuse_event(event(**changes), on_retry_topic=on_retry, now=NOW,
                           admission=ADMISSION)
    if reason is None:
        assert refusal is None
    else:
        assert refusal is not None
        assert reason in refusal.reason
        assert refusal.copy_record


@pytest.mark.parametrize("changes", [{"sender": "a@b.com, eve@evil.example"},
                                     {"subject": "x\u2028Bcc: y"}, {"message_key": "k\nlog"}])
def test_a_report_refused_once_is_refused_every_time(changes: dict[str, Any]) -> None:
    # What every recipient of a report shares is checked once per report that passes; a
    # refusal is never remembered as a pass, and a good report's next recipient is checked.
    for _ in range(2):
        assert refuse_event(event(**changes), on_retry_topic=False, now=NOW,
                            admission=ADMISSION) is not None
    assert refuse_event(event(), on_retry_topic=False, now=NOW, admission=ADMISSION) is None
    assert refuse_event(event(recipient="a@b.com, eve@evil.example"), on_retry_topic=False,
                        now=NOW, admission=ADMISSION) is not None


def test_a_record_over_the_cap_is_refused_and_not_copied() -> None:
    most = 5000 + HEADERS_ALLOWANCE_BYTES
    assert refuse_record(most, ADMISSION) is None
    refusal = refuse_record(most + 1, ADMISSION)
    assert refusal is not None
    assert not refusal.copy_record
    assert f"over the limit of {most}" in refusal.reason


def test_record_size_counts_value_and_headers() -> None:
    assert record_size(b"abc", [("h", b"12"), ("k", None)]) == 3 + 3 + 1
    assert record_size(None, []) == 0


@pytest.mark.parametrize(("attempt", "base", "on_retry", "reason"), [
    (6, 5, False, None),          # a redriven row's first attempt of its new round
    (8, 5, True, None),           # its last retry tier (3 attempts a round with 2 tiers)
    (9, 5, True, "attempt 9 is outside 6..8"),
    (5, 5, False, "attempt 5 is outside 6..8"),
    (6, 5, True, "attempt 6 on a retry topic, where attempts start at 7"),
    (4, 0, True, "attempt 4 is outside 1..3"),
])
def test_a_redriven_events_attempts_count_from_its_base(
        attempt: int, base: int, on_retry: bool, reason: str | None) -> None:
    refusal = refuse_event(event(attempt=attempt), on_retry_topic=on_retry, now=NOW,
                           admission=ADMISSION, attempt_base=base)
    assert (refusal.reason if refusal else None) == reason


def test_admit_returns_the_event_or_why_it_is_poison() -> None:
    good = event(attempt=2, not_before=NOW)
    value = encode(good)
    assert admit(value, headers_for(good), on_retry_topic=True, now=NOW,
                 admission=ADMISSION) == good
    first = event()
    refused = admit(encode(first), headers_for(first), on_retry_topic=True, now=NOW,
                    admission=ADMISSION)
    assert isinstance(refused, Refusal) and "on a retry topic" in refused.reason
    redriven = admit(value, [*headers_for(good), ("postroom.attempt_base", b"3")],
                     on_retry_topic=True, now=NOW, admission=ADMISSION)
    assert isinstance(redriven, Refusal) and "outside 4..6" in redriven.reason
    unreadable = admit(b"\x00garbage", headers_for(good), on_retry_topic=False, now=NOW,
                       admission=ADMISSION)
    assert isinstance(unreadable, Refusal) and unreadable.copy_record
    size = ADMISSION.limits.event_max_bytes + HEADERS_ALLOWANCE_BYTES + 1
    too_large = admit(b"x" * size, [], on_retry_topic=False, now=NOW, admission=ADMISSION)
    assert isinstance(too_large, Refusal) and not too_large.copy_record
