"""What the recorder makes of a decoded result before it meets the database: texts a row can
hold, keys that can name a row, and a result whose writer schema the registry cannot give yet."""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading

import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st

from postroom.kafka import Record
from postroom.relay.recorder import Recorder
from postroom.relay.results import (
    ENHANCED_CODE_MAX_CHARS,
    ERROR_MAX_CHARS,
    MESSAGE_ID_MAX_CHARS,
    REPORT_STATUSES,
    ReportPolicy,
    report_params,
    result_problem,
    storable,
    storable_result,
)
from postroom.schemas.codec import DeliveryStatus, EmailResult, Schema, encode, load_schema
from postroom.schemas.errors import SchemaUnavailableError
from postroom.schemas.framing import confluent_prefix, headers_for
from postroom.settings import LONGEST_PERIOD_S, Settings
from support.fuzz import examples
from support.metrics import counter

RESULT = EmailResult(idempotency_key="k|a@example.com", outbox_id=1, recipient="a@example.com",
                     status=DeliveryStatus.FAILED, attempt=1,
                     occurred_at=dt.datetime(2026, 10, 1, tzinfo=dt.UTC), smtp_code=550,
                     enhanced_code="5.1.1", error="550 5.1.1 no such user")
# Bounded in the normal run (support.fuzz.examples: more in `make fuzz`, fewer in `make test-unit`).
EXAMPLES = examples(300)


@pytest.mark.parametrize(("text", "max_chars", "stored"), [
    (None, 10, None),
    ("550 no such user", 100, "550 no such user"),
    ("a\x00b", 100, "a\\x00b"),
    ("\ud800x", 100, "\ufffdx"),
    ("x" * 20, 10, "xxxxxxx..."),
    ("\x00" * 5, 10, "\\x00\\x0..."),
])
def test_text_is_stored_as_a_row_can_hold_it(text: str | None, max_chars: int,
                                             stored: str | None) -> None:
    assert storable(text, max_chars) == stored


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.text(max_size=3000), st.integers(min_value=3, max_value=2500))
def test_stored_text_has_no_nul_no_surrogate_and_fits(text: str, max_chars: int) -> None:
    stored = storable(text, max_chars)
    assert stored is not None
    assert "\x00" not in stored
    stored.encode()  # no lone surrogate: psycopg can send it
    assert len(stored) <= max_chars
    if "\x00" not in text and len(text) <= max_chars:
        assert stored == text  # st.text() gives no lone surrogates: nothing to change


def test_a_result_keeps_what_fits_and_escapes_the_rest() -> None:
    assert storable_result(RESULT) is RESULT
    hostile = dataclasses.replace(RESULT, error="x\x00" * 5000, message_id="<\x00>",
                                  enhanced_code="5" * 100)
    stored = storable_result(hostile)
    assert stored.error is not None and len(stored.error) == ERROR_MAX_CHARS
    assert stored.message_id == "<\\x00>"
    assert stored.enhanced_code == "5" * (ENHANCED_CODE_MAX_CHARS - 3) + "..."
    assert MESSAGE_ID_MAX_CHARS >= 998


NOW = dt.datetime(2026, 12, 3, 7, 0, tzinfo=dt.UTC)


def test_a_wait_before_the_first_attempt_is_recorded_as_no_attempt() -> None:
    """The sender's result for an email that waits on its configuration (no attachments root)
    before any attempt: 'retrying' with attempt 0, so the row's TRIES stays 0."""
    waited = dataclasses.replace(RESULT, attempt=0, status=DeliveryStatus.RETRYING,
                                 next_attempt_at=NOW, message_id=None,
                                 error="POSTROOM_ATTACHMENTS_ROOT is not set")
    assert result_problem(waited, NOW) is None


@pytest.mark.parametrize(("changes", "problem"), [
    ({"idempotency_key": "k\x00|a@example.com"}, "its key holds a NUL"),
    ({"recipient": "a\x00@example.com"}, "its recipient holds a NUL"),
    ({"recipient": "\udc80@example.com"}, "lone surrogate"),
    ({"attempt": 0}, "attempt 0 is below 1"),
    ({"attempt": -1, "status": DeliveryStatus.RETRYING, "next_attempt_at": NOW},
     "attempt -1 is below 0"),
    ({"occurred_at": dt.datetime(9999, 12, 31, tzinfo=dt.UTC)}, "more than 24 h ahead"),
])
def test_a_result_that_can_name_no_row_is_refused(changes: dict[str, object],
                                                  problem: str) -> None:
    found = result_problem(dataclasses.replace(RESULT, **changes))  # type: ignore[arg-type]
    assert found is not None and problem in found


@pytest.mark.parametrize(("ahead", "refused"), [(dt.timedelta(hours=23), False),
                                                 (dt.timedelta(hours=24), False),
                                                 (dt.timedelta(hours=24, seconds=1), True),
                                                 (dt.timedelta(days=365), True)])
def test_a_result_dated_more_than_a_day_ahead_is_refused(ahead: dt.timedelta,
                                                         refused: bool) -> None:
    found = result_problem(dataclasses.replace(RESULT, occurred_at=NOW + ahead), NOW)
    assert (found is not None) is refused


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.datetimes(timezones=st.just(dt.UTC)), st.sampled_from(sorted(REPORT_STATUSES)),
       st.floats(min_value=0.001, max_value=LONGEST_PERIOD_S))
def test_a_report_the_recorder_takes_has_an_expiry_it_can_compute(
        occurred_at: dt.datetime, status: DeliveryStatus, expiry_s: float) -> None:
    """A forged report dated 9999-12-31 raised OverflowError out of run(), the batch
    uncommitted: a crash loop (issue 24's review)."""
    report = dataclasses.replace(RESULT, status=status, occurred_at=occurred_at)
    if result_problem(report, NOW) is None:
        assert report_params(report, ReportPolicy(expiry_s, 0))["expires_at"] > occurred_at


def test_a_far_future_report_is_refused_counted_and_never_applied() -> None:
    role = recorder(Registry(outages=0))
    forged = dataclasses.replace(RESULT, status=DeliveryStatus.BOUNCED, error="x",
                                 occurred_at=dt.datetime(9999, 12, 31, tzinfo=dt.UTC))
    record = Record("p.email.results", 0, 7, b"k", encode(forged), headers_for(forged))
    assert role._decode(record) is None
    assert role.stats.refused == 1
    assert counter(role.metrics, "recorder_refused_total") == 1


class Registry:
    """A registry that cannot answer ``outages`` times, then gives today's schema."""

    def __init__(self, outages: int) -> None:
        self.outages, self.asked = outages, 0

    def __call__(self, schema_id: int) -> Schema:
        self.asked += 1
        if self.asked <= self.outages:
            raise SchemaUnavailableError("the schema registry does not answer")
        return load_schema("email_result")


def recorder(registry: Registry) -> Recorder:
    return Recorder(Settings(database_url="postgresql+psycopg://unused/unused"),
                    sa.create_engine("postgresql+psycopg://unused/unused"),
                    schema_by_id=registry)


def framed_record() -> Record:
    return Record("p.email.results", 0, 7, b"k", confluent_prefix(3) + encode(RESULT), [])


def test_a_result_waits_while_the_registry_cannot_give_its_schema(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("postroom.relay.recorder.RETRY_BACKOFF_S", 0.01)
    registry = Registry(outages=3)
    found = recorder(registry)._decode(framed_record())
    assert found == RESULT
    assert registry.asked == 4


def test_a_result_waiting_for_the_registry_is_left_unrecorded_on_stop(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("postroom.relay.recorder.RETRY_BACKOFF_S", 0.01)
    role = recorder(Registry(outages=10**9))
    threading.Timer(0.1, role.stop).start()

    class Consumer:
        committed = False

        def commit(self, **kwargs: object) -> None:
            self.committed = True

    class Message:
        def error(self) -> None:
            return None

        topic = staticmethod(lambda: "p.email.results")
        partition = staticmethod(lambda: 0)
        offset = staticmethod(lambda: 7)
        key = staticmethod(lambda: b"k")
        value = staticmethod(lambda: confluent_prefix(3) + encode(RESULT))
        headers = staticmethod(lambda: [])
        timestamp = staticmethod(lambda: (1, 1_796_000_000_000))  # (create time, ms)

    consumer = Consumer()
    role._apply_until_done(consumer, [Message()])  # type: ignore[arg-type, list-item]
    assert not consumer.committed
    assert role.stats.unreadable == 0


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.one_of(st.binary(max_size=300),
                 st.builds(lambda head, tail: encode(RESULT)[:head] + tail,
                           st.integers(min_value=0, max_value=60), st.binary(max_size=40))),
       st.sampled_from(["schemaless", "confluent", "none"]))
def test_any_result_record_is_a_result_or_skipped_and_nothing_else(value: bytes,
                                                                    framing: str) -> None:
    role = recorder(Registry(outages=0))
    if framing == "confluent":
        record = Record("p.email.results", 0, 7, b"k", confluent_prefix(3) + value, [])
    else:
        headers = [] if framing == "none" else headers_for(EmailResult)
        record = Record("p.email.results", 0, 7, b"k", value, headers)
    found = role._decode(record)
    if found is None:
        assert role.stats.unreadable + role.stats.refused == 1
    else:
        assert storable_result(found) is found  # what it returns is what a row can hold
