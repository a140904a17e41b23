"""No record may stop the sender: whatever value, key and headers a record holds, admit() returns
what the sender may deliver or raises PoisonRecordError, nothing else, and what either gives can
be acted on (a poison record's result and dead letter can be written; an admitted event can be
retried and waited for).

Bounded in the normal run (support.fuzz.examples: more in `make fuzz`, fewer in `make test-unit`).
"""

from __future__ import annotations

import datetime as dt
import io
import json
from typing import Any

import fastavro
import pytest
from hypothesis import HealthCheck, assume, event, example, given, settings
from hypothesis import strategies as st

from postroom.errors import InvalidContentError, printable
from postroom.headers import (
    ATTEMPT_BASE_HEADER,
    DLQ_CLASS_HEADER,
    DLQ_REASON_HEADER,
    ERROR_HEADER,
    ROW_ID_HEADER,
    read_headers,
)
from postroom.rules import SizeLimits
from postroom.schemas.codec import EmailRequested, Schema, encode, load_schema
from postroom.schemas.decoding import earlier_versions
from postroom.schemas.errors import SchemaError
from postroom.schemas.framing import SCHEMA_HEADER, confluent_prefix, headers_for
from postroom.sender.admission import Admission, Admitted, admit, readable_key
from postroom.sender.errors import PoisonRecordError
from postroom.sender.outcome import Outcome, Verdict
from postroom.sender.retry import RetryPolicy, due_in_s
from postroom.sender.routing import Origin, dead_letter_headers, poison_result
from support.fuzz import examples

EXAMPLES = examples(150)
# A long run takes its time: about 200 examples a second on the shared machine.
pytestmark = pytest.mark.timeout(60 + EXAMPLES // 25)
BOUNDED = settings(max_examples=EXAMPLES, deadline=dt.timedelta(seconds=5), database=None,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

NOW = dt.datetime(2026, 12, 2, 19, 0, tzinfo=dt.UTC)
DELAYS_S = (60.0, 300.0)
ADMISSION = Admission.for_tiers(SizeLimits(body_max_bytes=2000, event_max_bytes=8000), DELAYS_S)
CURRENT = load_schema("email_requested")
FINGERPRINTS = [CURRENT.fingerprint, *(s.fingerprint for s in earlier_versions("email_requested"))]
REGISTERED = {1: CURRENT, 2: earlier_versions("email_requested")[0]}


def schema_by_id(schema_id: int) -> Schema:
    """A registry that knows two ids and says it has no other (never unavailable: that is not a
    refusal, and tests/unit/sender/test_admission.py covers it)."""
    try:
        return REGISTERED[schema_id]
    except KeyError:
        raise SchemaError(f"the schema registry has no schema id {schema_id}") from None


def raw_schema() -> Any:
    """Today's schema with the same bytes on the wire and none of its checks: every string as
    bytes (invalid UTF-8 goes through), timestamps as plain longs, the enum as its index."""
    raw = json.loads(CURRENT.text)

    def loosen(kind: Any) -> Any:
        if kind == "string":
            return "bytes"
        if isinstance(kind, list):
            return [loosen(k) for k in kind]
        if isinstance(kind, dict):
            if kind.get("logicalType") == "timestamp-millis":
                return "long"
            if kind.get("type") == "enum":
                return "int"
            if kind.get("type") == "array":
                return {"type": "array", "items": loosen(kind["items"])}
        return kind
    for field in raw["fields"]:
        field["type"] = loosen(field["type"])
        field.pop("default", None)
    return fastavro.parse_schema(raw)


RAW = raw_schema()
LONGS = st.integers(-(1 << 63), (1 << 63) - 1)
INTS = st.integers(-(1 << 31), (1 << 31) - 1)
TEXT_BYTES = st.binary(max_size=64) | st.text(max_size=64).map(str.encode)


@st.composite
def hostile_avro(draw: st.DrawFn) -> bytes:
    """Avro bytes in today's layout with any field values: invalid UTF-8, control characters,
    timestamps past year 9999, attempts and priorities out of range."""
    record = {
        "idempotency_key": draw(TEXT_BYTES), "message_key": draw(TEXT_BYTES),
        "outbox_id": draw(LONGS), "recipient": draw(TEXT_BYTES), "sender": draw(TEXT_BYTES),
        "subject": draw(TEXT_BYTES), "body": draw(TEXT_BYTES),
        "attachments": draw(st.lists(TEXT_BYTES, max_size=3)),
        "priority": draw(st.integers(-3, 5)), "created_at": draw(LONGS),
        "attempt": draw(INTS), "not_before": draw(st.none() | LONGS),
        "html": draw(st.none() | TEXT_BYTES), "inline": draw(st.lists(TEXT_BYTES, max_size=3)),
    }
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, RAW, record)
    return buf.getvalue()


# naive bounds, as st.datetimes() wants them; the values drawn are aware
MOMENTS = st.datetimes(min_value=dt.datetime(1, 1, 2),  # noqa: DTZ001
                       max_value=dt.datetime(9999, 12, 30),  # noqa: DTZ001
                       timezones=st.just(dt.UTC))
ADDRESSES = st.emails().map(lambda a: a[:254]) | st.text(max_size=40)


@st.composite
def plausible_events(draw: st.DrawFn) -> EmailRequested:
    """Events our codec writes, with values near and beyond the rules."""
    return EmailRequested(
        idempotency_key=draw(st.text(max_size=40)), message_key=draw(st.text(max_size=20)),
        outbox_id=draw(LONGS), recipient=draw(ADDRESSES), sender=draw(st.just("") | ADDRESSES),
        subject=draw(st.text(max_size=40)), body=draw(st.text(max_size=300)),
        attachments=tuple(draw(st.lists(st.text(max_size=20), max_size=3))),
        priority=draw(st.sampled_from(["high", "normal", "low"])), created_at=draw(MOMENTS),
        attempt=draw(INTS | st.integers(-2, 8)), not_before=draw(st.none() | MOMENTS),
        html=draw(st.none() | st.text(max_size=40)),
        inline=tuple(draw(st.lists(st.text(max_size=20), max_size=2))))


WORDS = st.text(st.characters(categories=["L", "N"]), min_size=1, max_size=20)


@st.composite
def valid_events(draw: st.DrawFn) -> EmailRequested:
    """Events enqueue could have written, on any tier: most get through, to what follows."""
    recipient = draw(st.sampled_from(["a@example.com", "Jörg@bücher.example", "x.y+z@sub.example"]))
    key = draw(WORDS)
    return EmailRequested(
        idempotency_key=f"{key}|{recipient.lower()}", message_key=key, outbox_id=draw(LONGS),
        recipient=recipient, sender=draw(st.sampled_from(["", "reports@example.com"])),
        subject=draw(WORDS), body=draw(st.text(max_size=300)),
        attachments=tuple(draw(st.lists(WORDS.map(lambda w: w + ".csv"), max_size=2))),
        priority=draw(st.sampled_from(["high", "normal", "low"])), created_at=draw(MOMENTS),
        attempt=draw(st.integers(1, 8)),
        not_before=draw(st.none() | st.builds(lambda s: NOW + dt.timedelta(seconds=s),
                                              st.integers(-10**9, 10**9))),
        html=draw(st.none() | st.text(max_size=40)))


def truncated(value: bytes, cut: int) -> bytes:
    return value[:cut % (len(value) + 1)]


BODIES = (st.builds(encode, valid_events())
          | st.builds(encode, plausible_events())
          | hostile_avro()
          | st.builds(truncated, st.builds(encode, plausible_events()), st.integers(0, 400)))
VALUES = (st.none() | st.binary(max_size=300)
          | BODIES
          | st.builds(lambda schema_id, body: confluent_prefix(schema_id) + body,
                      st.sampled_from([0, 1, 2, 3, (1 << 32) - 1]), BODIES))
HEADER_NAMES = st.sampled_from([SCHEMA_HEADER, ATTEMPT_BASE_HEADER, ROW_ID_HEADER, ERROR_HEADER,
                                DLQ_CLASS_HEADER, DLQ_REASON_HEADER]) | st.text(max_size=20)
HEADER_VALUES = (st.none() | st.binary(max_size=40)
                 | st.sampled_from([f.encode() for f in FINGERPRINTS])
                 | st.sampled_from(["²", "٣", "9" * 5000, "\x00", "3", "0", "-1", "1e3", " 2"])
                 | st.text(st.characters(exclude_categories=()), max_size=20)
                 | st.integers(0, 1 << 70).map(lambda n: str(n).encode()))
HEADERS = st.lists(st.tuples(HEADER_NAMES, HEADER_VALUES), max_size=6)
KEYS = (st.none() | st.binary(max_size=60) | st.text(max_size=60).map(str.encode)
        | st.just(b"k|a@example.com") | st.just(b"\xff" * 20_000) | st.just(b"x" * 10_000))


def with_schema_header(headers: list[tuple[str, Any]], value: bytes | None,
                       schemaless: bool) -> list[tuple[str, Any]]:
    """Most records that decode name today's writer: without it few would get past framing."""
    if schemaless and value and value[:1] != b"\x00":
        return [*headers_for(EmailRequested), *headers]
    return headers


def check_admit(value: bytes | None, headers: list[tuple[str, Any]], key: bytes | None,
                tier: int | None) -> None:
    """admit() returns an event the sender can act on, or raises poison it can write out."""
    try:
        admitted = admit(value, headers, key=key, tier=tier, now=NOW, admission=ADMISSION,
                         schema_by_id=schema_by_id)
    except PoisonRecordError as poison:
        event("poison: " + " ".join(poison.reason.split()[:3]))
        # What the sender writes of it: a dead letter saying why, a result when a key is readable.
        assert poison.reason == printable(poison.reason)
        reason = dict(dead_letter_headers(Origin("t", 0, 0), "poison", poison.reason))
        written = reason[DLQ_REASON_HEADER]
        assert isinstance(written, str)
        written.encode()
        result = poison_result(poison, NOW)
        if result is not None:
            encode(result)  # it can be published
            assert result.attempt >= 1
            assert readable_key(result.idempotency_key) == result.idempotency_key
        return
    assert isinstance(admitted, Admitted)
    event("admitted")
    # What the sender does next with it must not raise either.
    email = admitted.event
    assert email.attempt - admitted.attempt_base >= 1
    RetryPolicy(DELAYS_S).decide(Outcome(Verdict.TRANSIENT, 451, None, "451"),
                                 email.attempt - admitted.attempt_base, NOW)
    assert due_in_s(email.not_before, NOW) <= ADMISSION.max_delay_s + 300


@BOUNDED
@given(value=VALUES, headers=HEADERS, key=KEYS, schemaless=st.sampled_from([True, True, False]),
       tier=st.none() | st.integers(1, 6))
@example(value=encode(EmailRequested(
    idempotency_key="k|a@example.com", message_key="k", outbox_id=1, recipient="a@example.com",
    sender="", subject="S", body="b", attachments=(), priority="normal", created_at=NOW,
    attempt=2)), headers=[(ATTEMPT_BASE_HEADER, "²")], key=b"k|a@example.com", schemaless=True,
    tier=1)
def test_admit_returns_a_deliverable_event_or_raises_poison_and_nothing_else(
        value: bytes | None, headers: list[tuple[str, Any]], key: bytes | None, schemaless: bool,
        tier: int | None) -> None:
    check_admit(value, with_schema_header(headers, value, schemaless), key, tier)


@BOUNDED
@given(email=valid_events(), headers=st.lists(st.tuples(st.text(max_size=20), HEADER_VALUES),
                                              max_size=4),
       key=KEYS, registry=st.booleans(), tier=st.none() | st.integers(1, 6))
def test_an_event_enqueue_could_write_is_delivered_or_refused_whatever_beside_it(
        email: EmailRequested, headers: list[tuple[str, Any]], key: bytes | None,
        registry: bool, tier: int | None) -> None:
    """The same property where most records get through: every key, any other headers, both
    framings, every tier."""
    value = encode(email)
    if registry:
        value = confluent_prefix(1) + value
    else:
        headers = [*headers_for(EmailRequested), *headers]
    check_admit(value, headers, key, tier)


@BOUNDED
@given(HEADERS)
def test_read_headers_returns_a_value_or_raises_invalid_content(
        headers: list[tuple[str, Any]]) -> None:
    try:
        found = read_headers(headers)
    except InvalidContentError:
        assume(False)  # refused as it may be; what is read is what needs checking
    assert 0 <= found.attempt_base <= 1_000_000
    assert found.row_id is None or found.row_id >= 1


@BOUNDED
@given(KEYS | st.text(st.characters(exclude_categories=()), max_size=40))
def test_readable_key_is_text_fit_for_a_result_or_none(key: bytes | str | None) -> None:
    text = readable_key(key)
    if text is not None:
        text.encode()  # no lone surrogate
        assert text == printable(text)
