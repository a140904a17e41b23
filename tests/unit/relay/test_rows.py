"""The relay's one boundary for outbox rows: a claimed row becomes an event's bytes, or
PoisonRowError and nothing else, whatever its columns hold (rows written by SQL included)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from postroom.relay.errors import PoisonRowError
from postroom.relay.rows import FIELDS, event_value
from postroom.schemas.codec import EmailRequested, load_schema
from postroom.schemas.decoding import decode
from postroom.schemas.framing import SCHEMALESS
from support.fuzz import examples

SCHEMA = load_schema("email_requested")
GOOD: dict[str, Any] = {
    "idempotency_key": "report|a@example.com", "message_key": "report", "outbox_id": 7,
    "recipient": "a@example.com", "sender": "", "subject": "Report", "body": "hello",
    "attachments": ["/data/r.pdf"], "priority": "normal", "created_at": 1_790_000_000_000,
    "attempt": 1, "not_before": None, "html": None, "inline": [],
}
# Bounded in the normal run (support.fuzz.examples: more in `make fuzz`, fewer in `make test-unit`).
EXAMPLES = examples(400)


def row(**changes: Any) -> tuple[Any, ...]:
    values = {**GOOD, **changes}
    return tuple(values[name] for name in FIELDS)


def test_the_fields_are_the_contracts() -> None:
    assert SCHEMA.field_names == FIELDS


def test_a_good_row_is_its_event() -> None:
    value = event_value(SCHEMA, row(html="<p>hi</p>", inline=["/data/logo.png"]))
    event = decode(EmailRequested, value, SCHEMALESS.headers(SCHEMA))
    assert (event.idempotency_key, event.outbox_id, event.attachments, event.inline,
            event.html) == ("report|a@example.com", 7, ("/data/r.pdf",), ("/data/logo.png",),
                            "<p>hi</p>")
    assert event.created_at == dt.datetime(2026, 9, 21, 14, 13, 20, tzinfo=dt.UTC)


@pytest.mark.parametrize(("changes", "reason"), [
    ({"attachments": [None]}, "attachments holds None"),
    ({"attachments": ["/a", None]}, "attachments holds None"),
    ({"inline": [None]}, "inline holds None"),
    ({"inline": ["/data/logo.png"]}, "inline images need an html body"),
    ({"attachments": [["/a", "/b"], ["/c", "/d"]]}, "not a path"),  # a two-dimensional array
    ({"attachments": None}, "is not an array"),
    ({"attachments": ["/proc/self/environ"]}, "pseudo file system"),
    ({"attachments": ["/a"] * 101}, "over the limit of 100"),
    ({"priority": "urgent"}, "priority 'urgent'"),
    ({"priority": None}, "priority None"),
    ({"created_at": None}, "not a time a reader can read"),  # infinity, as the claim gives it
    ({"created_at": 253_402_300_800_000}, "years 1 to 9999"),
    ({"created_at": -62_135_596_800_001}, "years 1 to 9999"),
    ({"attempt": 0}, "attempt 0 (the row's attempts + 1 when it was queued) is out of range"),
    ({"attempt": -4}, "out of range"),
    ({"attempt": 2**31}, "out of range"),  # attempts 2147483647, plus one
    ({"attempt": None}, "out of range"),
    ({"recipient": "not an address"}, "recipient"),
    ({"recipient": "x" * 100_000 + "@example.com"}, "100012 characters, longer than 254"),
    ({"recipient": ""}, "recipient is empty"),
    ({"recipient": None}, "recipient must be a string"),
    ({"recipient": "a@exa\nmple.com"}, "control character"),
    ({"sender": "Boss <boss@example.com>, x@y.z"}, "sender"),
    ({"sender": None}, "sender must be a string"),
    ({"subject": "hi\r\nBcc: x@y.z"}, "line break"),
    ({"subject": " "}, "subject is empty"),
    ({"message_key": ""}, "message key"),
    ({"idempotency_key": ""}, "idempotency key is empty"),
    ({"idempotency_key": "k" * 5000}, "idempotency key"),
    ({"body": None}, "body must be a string"),
    ({"body": "a\x00b"}, "NUL"),
    ({"html": "a\x00b"}, "NUL"),
    ({"html": 5}, "html must be a string"),
    ({"outbox_id": 2**63}, "not a 64-bit integer"),
    ({"outbox_id": True}, "not a 64-bit integer"),
    ({"not_before": 5}, "not_before"),
])
def test_a_row_no_event_can_carry_is_poison_saying_why(changes: dict[str, Any],
                                                       reason: str) -> None:
    with pytest.raises(PoisonRowError, match=None) as refused:
        event_value(SCHEMA, row(**changes))
    assert reason in str(refused.value)


@pytest.mark.parametrize("created_at", [253_402_300_799_999, -62_135_596_800_000, 0, -1])
def test_created_at_at_the_limits_a_reader_reads_is_fine(created_at: int) -> None:
    value = event_value(SCHEMA, row(created_at=created_at))
    event = decode(EmailRequested, value, SCHEMALESS.headers(SCHEMA))
    assert event.created_at.year in (1, 1969, 1970, 9999)


def test_a_body_over_the_senders_cap_is_the_senders_to_refuse() -> None:
    # The relay publishes it (the event's cap is what it applies); a sender with a smaller
    # POSTROOM_BODY_MAX_BYTES refuses it, which ends the row failed all the same.
    value = event_value(SCHEMA, row(body="x" * 600_000))
    assert decode(EmailRequested, value, SCHEMALESS.headers(SCHEMA)).body == "x" * 600_000


def test_a_reason_is_one_printable_line_of_bounded_length() -> None:
    with pytest.raises(PoisonRowError) as refused:
        event_value(SCHEMA, row(priority="\x00\n\u2028" + "p" * 5000))
    text = str(refused.value)
    assert len(text) <= 1000
    assert text.isprintable()


# Anything a column could hold, and things it could not (a row is a boundary).
ODD = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=300),
    st.binary(max_size=50), st.lists(st.one_of(st.none(), st.text(max_size=40)), max_size=5),
    st.lists(st.lists(st.text(max_size=5), max_size=3), max_size=3),
    st.datetimes(timezones=st.none() | st.just(dt.UTC)), st.dictionaries(st.text(), st.text()),
    st.sampled_from(["high", "normal", "low", "a@example.com", "/data/x.pdf", "", " ",
                     "x" * 3000]),
)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(FIELDS), ODD, min_size=1))
def test_any_row_is_an_event_or_poison_and_nothing_else(changes: dict[str, Any]) -> None:
    try:
        value = event_value(SCHEMA, row(**changes))
    except PoisonRowError as exc:
        assert str(exc).isprintable()
        assert 0 < len(str(exc)) <= 1000
    else:
        # What passes is an event the contract reads back.
        event = decode(EmailRequested, value, SCHEMALESS.headers(SCHEMA))
        assert event.outbox_id == row(**changes)[FIELDS.index("outbox_id")]


@settings(max_examples=examples(100), deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "c"]), max_size=3).map(tuple) | st.just(()),
       st.integers(min_value=0, max_value=20))
def test_a_row_of_the_wrong_width_is_poison(prefix: tuple[str, ...], extra: int) -> None:
    width = len(prefix) + extra
    if width == len(FIELDS):
        width += 1
    with pytest.raises(PoisonRowError):
        event_value(SCHEMA, (None,) * width)
