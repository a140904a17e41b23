"""admit and refuse_event: what the sender will not deliver, as tables; what a refused record
carries for the result that ends its row."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest

from postroom.headers import ATTEMPT_BASE_HEADER, ROW_ID_HEADER, UNREADABLE_HEADERS
from postroom.rules import SizeLimits
from postroom.schemas.codec import EmailRequested, encode
from postroom.schemas.errors import SchemaUnavailableError
from postroom.schemas.framing import headers_for
from postroom.sender.admission import (
    HEADERS_ALLOWANCE_BYTES,
    Admission,
    Admitted,
    admit,
    readable_key,
    record_size,
    refuse_event,
)
from postroom.sender.errors import PoisonRecordError

NOW = dt.datetime(2026, 10, 2, 7, 0, tzinfo=dt.UTC)
ADMISSION = Admission.for_tiers(SizeLimits(body_max_bytes=1000, event_max_bytes=5000),
                                (60.0, 120.0))


def event(**changes: Any) -> EmailRequested:
    values: dict[str, Any] = {
        "idempotency_key": "k|a@example.com", "message_key": "k", "outbox_id": 1,
        "recipient": "a@example.com", "sender": "", "subject": "S", "body": "b",
        "attachments": (), "priority": "normal", "created_at": NOW}
    return EmailRequested(**{**values, **changes})


def refused(value: bytes | None, headers: list[tuple[str, str | bytes | None]], *,
            key: bytes | None = b"k|a@example.com", tier: int | None = None) -> PoisonRecordError:
    with pytest.raises(PoisonRecordError) as caught:
        admit(value, headers, key=key, tier=tier, now=NOW, admission=ADMISSION)
    return caught.value


@pytest.mark.parametrize(("changes", "on_retry", "reason"), [
    ({}, False, None),
    ({"attempt": 2, "not_before": NOW + dt.timedelta(seconds=120)}, True, None),
    ({"attempt": 3}, True, None),
    ({"sender": "Reports <reports@example.com>"}, False, None),
    ({"recipient": "josé@bücher.example"}, False, None),
    ({"attempt": 0}, False, "attempt 0 is outside 1..3"),
    ({"attempt": -1}, False, "attempt -1 is outside 1..3"),
    ({"attempt": 4}, True, "attempt 4 is outside 1..3"),
    ({"attempt": 1}, True, None),  # a first attempt that waited on our configuration, on tier 1
    ({"recipient": "a@b.com, eve@evil.example"}, False, "invalid local part"),
    ({"recipient": "ceo@corp.example <eve@evil.example>"}, False, "invalid local part"),
    ({"recipient": "a@example.com\r\nBcc: eve@evil.example"}, False, "control character"),
    ({"sender": "a@b.com, eve@evil.example"}, False, "sender"),
    ({"subject": "x\u2028Bcc: y"}, False, "line break"),
    ({"subject": "x\x85y"}, False, "line break"),
    ({"body": "b" * 1001}, False, "over the limit of 1000"),
    ({"message_key": "k\nforged log line"}, False, "message key"),
    ({"idempotency_key": "k\r\n"}, False, "idempotency key"),
    # Keys no ledger index can hold: refused here, or the claim fails in the database each try.
    ({"idempotency_key": "k" * 2256}, False, "longer than 2255 characters or 2600 bytes"),
    ({"idempotency_key": "\u65e5" * 867 + "|a@example.com"}, False, "2600 bytes"),
    ({"idempotency_key": "k" * 2255}, False, None),
    ({"message_key": "\u65e5" * 867}, False, "message key is 2601 bytes"),
    ({"attachments": ("/proc/self/environ",)}, False, "pseudo file system"),
    ({"attachments": ("a\nb.csv",)}, False, "control character"),
    ({"attachments": tuple(f"{n}.csv" for n in range(101))}, False, "101 attachments"),
])
def test_refuse_event(changes: dict[str, Any], on_retry: bool, reason: str | None) -> None:
    # on a retry topic: the tier of its attempt, or the last tier there is
    tier = max(1, min(changes.get("attempt", 1) - 1, 2)) if on_retry else None
    refusal = refuse_event(event(**changes), tier=tier, now=NOW, admission=ADMISSION)
    if reason is None:
        assert refusal is None
    else:
        assert refusal is not None
        assert reason in refusal


@pytest.mark.parametrize("changes", [{"sender": "a@b.com, eve@evil.example"},
                                     {"subject": "x\u2028Bcc: y"}, {"message_key": "k\nlog"}])
def test_a_report_refused_once_is_refused_every_time(changes: dict[str, Any]) -> None:
    # What every recipient of a report shares is checked once per report that passes; a
    # refusal is never remembered as a pass, and a good report's next recipient is checked.
    for _ in range(2):
        assert refuse_event(event(**changes), tier=None, now=NOW,
                            admission=ADMISSION) is not None
    assert refuse_event(event(), tier=None, now=NOW, admission=ADMISSION) is None
    assert refuse_event(event(recipient="a@b.com, eve@evil.example"), tier=None,
                        now=NOW, admission=ADMISSION) is not None


def test_a_record_over_the_cap_is_refused_and_not_copied() -> None:
    most = 5000 + HEADERS_ALLOWANCE_BYTES
    good = event()
    value = encode(good)
    schema = headers_for(good)
    padding = [("pad", b"x" * (most - record_size(value, schema) - 3))]
    at_cap = [*schema, *padding]
    assert record_size(value, at_cap) == most
    assert admit(value, at_cap, now=NOW, admission=ADMISSION).event == good
    poison = refused(value, [*at_cap, ("x", b"")], key=b"k|a@example.com")
    assert not poison.copy_record
    assert f"over the limit of {most}" in poison.reason
    assert poison.key == "k|a@example.com"


def test_record_size_counts_value_and_headers() -> None:
    assert record_size(b"abc", [("h", b"12"), ("k", None)]) == 3 + 3 + 1
    assert record_size(None, []) == 0


@pytest.mark.parametrize(("attempt", "base", "on_retry", "reason"), [
    (6, 5, False, None),          # a redriven row's first attempt of its new round
    (8, 5, True, None),           # its last retry tier (3 attempts a round with 2 tiers)
    (9, 5, True, "attempt 9 is outside 6..8"),
    (5, 5, False, "attempt 5 is outside 6..8"),
    (6, 5, True, None),           # its first attempt, kept back by our configuration: tier 1
    (7, 6, True, "attempt 7 on retry tier 2, where attempts start at 8"),
    (4, 0, True, "attempt 4 is outside 1..3"),
])
def test_a_redriven_events_attempts_count_from_its_base(
        attempt: int, base: int, on_retry: bool, reason: str | None) -> None:
    tier = (2 if base == 6 else max(1, min(attempt - base - 1, 2))) if on_retry else None
    refusal = refuse_event(event(attempt=attempt), tier=tier, now=NOW, admission=ADMISSION,
                           attempt_base=base)
    assert refusal == reason


def test_admit_returns_the_event_or_raises_why_it_is_poison() -> None:
    good = event(attempt=2, not_before=NOW)
    value = encode(good)
    assert admit(value, headers_for(good), tier=1, now=NOW,
                 admission=ADMISSION) == Admitted(good, 0)
    first = event()
    # Tier 1 holds a first attempt that waited on our configuration; tier 2 holds none.
    assert admit(encode(first), headers_for(first), tier=1, now=NOW,
                 admission=ADMISSION) == Admitted(first, 0)
    assert "on retry tier 2, where attempts start at 2" in refused(
        encode(first), headers_for(first), tier=2).reason
    redriven = refused(value, [*headers_for(good), (ATTEMPT_BASE_HEADER, b"3")], tier=1)
    assert "outside 4..6" in redriven.reason
    assert redriven.event == good and redriven.attempt_base == 3
    unreadable = refused(b"\x00garbage", [*headers_for(good), (ROW_ID_HEADER, b"42")])
    assert unreadable.copy_record and unreadable.event is None
    assert (unreadable.key, unreadable.row_id) == ("k|a@example.com", 42)
    size = ADMISSION.limits.event_max_bytes + HEADERS_ALLOWANCE_BYTES + 1
    assert not refused(b"x" * size, []).copy_record


@pytest.mark.parametrize("base", [
    "\u00b2", b"\xc2\xb2", "9" * 5000, b"9" * 5000, "\x00", b"\x00", b"\xff\xfe", "-1", "+1",
    " 1", "1 ", "", "\u0661", "1000001", "\ud800", b"1" * 20])
def test_an_attempt_base_int_refuses_is_poison_not_a_crash(base: str | bytes) -> None:
    """Issue 23: '\u00b2' passed str.isdigit() and raised ValueError in int(), outside
    admission's refusals; the sender died before storing the offset, and so did the next."""
    good = event(attempt=2, not_before=NOW)
    poison = refused(encode(good), [*headers_for(good), (ATTEMPT_BASE_HEADER, base)], tier=1)
    assert ATTEMPT_BASE_HEADER in poison.reason
    assert poison.attempt_base is None  # unknown: the result counts from the record's event
    assert poison.key == "k|a@example.com"


@pytest.mark.parametrize("row_id", [b"0", b"x", b"9" * 30, "\u00b2", b"\x00"])
def test_a_row_id_header_that_is_not_one_is_poison(row_id: str | bytes) -> None:
    good = event()
    poison = refused(encode(good), [*headers_for(good), (ROW_ID_HEADER, row_id)])
    assert ROW_ID_HEADER in poison.reason and poison.row_id is None


def test_headers_the_kafka_client_could_not_decode_are_poison() -> None:
    good = event()
    poison = refused(encode(good), [(UNREADABLE_HEADERS, None)])
    assert "not UTF-8" in poison.reason and poison.key == "k|a@example.com"


def test_headers_repeated_or_of_other_names_are_read_the_last_one_counting() -> None:
    good = event(attempt=5, not_before=NOW)
    headers = [*headers_for(good), (ATTEMPT_BASE_HEADER, b"1"), ("anything", b"\xff"),
               (ATTEMPT_BASE_HEADER, b"3"), (ROW_ID_HEADER, None), ("postroom.error", b"\x00")]
    assert admit(encode(good), headers, tier=1, now=NOW, admission=ADMISSION) == Admitted(good, 3)


def test_a_not_before_beyond_todays_longest_delay_is_due_now_not_poison() -> None:
    """POSTROOM_RETRY_DELAYS shortened while retries wait: their not_before, set by the longer
    delay, is further ahead than any tier waits now. Attempted at once, not dead-lettered."""
    late = event(attempt=2, not_before=NOW + dt.timedelta(days=30))
    admitted = admit(encode(late), headers_for(late), tier=1, now=NOW, admission=ADMISSION)
    assert admitted.event == dataclasses.replace(late, not_before=NOW)
    within = event(attempt=2, not_before=NOW + dt.timedelta(seconds=120 + 300))
    assert admit(encode(within), headers_for(within), tier=1, now=NOW,
                 admission=ADMISSION).event == within  # the longest delay and the skew: waits


def test_a_tier_removed_while_its_records_waited_still_takes_them() -> None:
    """Tiers 3 and 4 removed (ADMISSION has 2): a record read from tier 4 holds attempt 5."""
    waiting = event(attempt=5, not_before=NOW)
    assert admit(encode(waiting), headers_for(waiting), tier=4, now=NOW,
                 admission=ADMISSION).event == waiting
    assert "outside 1..5" in refused(encode(event(attempt=6)), headers_for(waiting),
                                     tier=4).reason


def test_a_registry_that_cannot_answer_is_not_poison() -> None:
    def unavailable(schema_id: int) -> Any:
        raise SchemaUnavailableError(f"no answer for {schema_id}")

    with pytest.raises(SchemaUnavailableError):
        admit(b"\x00\x00\x00\x00\x07rest", [], now=NOW, admission=ADMISSION,
              schema_by_id=unavailable)


@pytest.mark.parametrize(("key", "expected"), [
    (None, None), (b"k|a@example.com", "k|a@example.com"), ("k|a@example.com", "k|a@example.com"),
    (b"\xff\xfe", None), (b"k\x00|a@b", None), (b"", None), (b"   ", None),
    (b"k|" + b"a" * 3000, None), (b"x" * 100_000, None), ("k\u2028|a@b".encode(), None),
    ("m\u00fcller|j\u00f6rg@example.com".encode(), "m\u00fcller|j\u00f6rg@example.com"),
])
def test_readable_key(key: bytes | str | None, expected: str | None) -> None:
    assert readable_key(key) == expected
