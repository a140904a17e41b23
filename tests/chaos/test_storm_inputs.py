"""The poison storm's hostile inputs against the boundaries that read them, without the stack: a
record of the sender's topics is refused at admission, a hostile row by the relay's boundary or
the sender's, a result by the recorder's decoding or its checks. Milliseconds, where the storm
takes a minute: a finding of the storm shows here first, named by its kind."""

from __future__ import annotations

import datetime as dt
import random

import pytest

from chaos import storm
from postroom.errors import InvalidContentError
from postroom.headers import ATTEMPT_BASE_HEADER, read_headers
from postroom.relay.results import result_problem
from postroom.relay.rows import check_row
from postroom.rules import SizeLimits
from postroom.schemas.codec import EmailResult
from postroom.schemas.decoding import decode
from postroom.schemas.errors import SchemaError
from postroom.sender.admission import Admission, admit
from postroom.sender.errors import PoisonRecordError

DELAYS_S = (0.5, 1.0, 2.0, 4.0)  # the chaos suite's tiers
ADMISSION = Admission.for_tiers(SizeLimits(), DELAYS_S)
SEEDS = range(40)
PREFIX = "storm."


def sender_records(seed: int) -> list[storm.HostileRecord]:
    rng = random.Random(seed)
    return storm.sender_records(rng, "t", 0, 60, storm.sender_topics_of(PREFIX, len(DELAYS_S)))


def tier_of(topic: str) -> int | None:
    head = f"{PREFIX}email.retry."
    return int(topic[len(head):]) if topic.startswith(head) else None


@pytest.mark.parametrize("seed", SEEDS)
def test_every_hostile_record_is_refused_at_admission(seed: int) -> None:
    now = dt.datetime.now(dt.UTC)
    admitted = []
    for record in sender_records(seed):
        try:
            admit(record.value, record.headers, key=record.key, tier=tier_of(record.topic),
                  now=now, admission=ADMISSION)
        except PoisonRecordError:
            continue
        admitted.append(f"{record.kind} on {record.topic}")
    assert not admitted, f"admitted: {admitted}"


@pytest.mark.parametrize("seed", SEEDS)
def test_every_hostile_result_is_unreadable_or_matches_no_row(seed: int) -> None:
    """A readable result is either refused by the recorder's checks or names a key no row has
    (the storm's keys are ``<tag>-noone-<n>``): none can move a genuine row."""
    rng = random.Random(seed)
    for record in storm.result_records(rng, "t", 0, 30, f"{PREFIX}email.results"):
        try:
            result = decode(EmailResult, record.value, record.headers)
        except SchemaError:
            continue
        assert result_problem(result) is not None or "-noone-" in result.idempotency_key, \
            record.kind


def test_the_storm_draws_every_kind() -> None:
    """40 seeds of 60 records draw each kind of value and header the storm has."""
    kinds = {r.kind.split(", key")[0] for seed in SEEDS for r in sender_records(seed)}
    assert {"random bytes", "truncated avro", "avro + trailing bytes", "oversize",
            "confluent framing, unknown id", "attempt below its attempt base"} <= kinds
    assert any(k.startswith("postroom.attempt_base=") for k in kinds)
    assert any(k.startswith("postroom.row_id=") for k in kinds)


@pytest.mark.parametrize("attempts", [1, 999_999, 1_000_000, 1_000_001, (1 << 31) - 2])
def test_a_row_the_relay_publishes_has_an_attempt_base_the_sender_reads(attempts: int) -> None:
    """The storm's row with attempts 2147483646 (SQL): the relay published it with
    postroom.attempt_base 2147483646, which the sender's header reader refuses (its bound is
    1,000,000), so its poison result named attempt 1 and the row stayed `published`. What the
    relay's boundary takes, the sender's reader must read."""
    row = ("k|a@example.com", "k", 1, "a@example.com", "b@example.com", "s", "body", [],
           "normal", dt.datetime.now(dt.UTC), attempts + 1, None, None, [])
    try:
        check_row(row)
    except InvalidContentError:
        return  # refused by the relay: the row ends failed, poison
    # Published: the relay writes the header (from a second attempt on), the sender reads it.
    assert read_headers([(ATTEMPT_BASE_HEADER, str(attempts).encode())]).attempt_base == attempts
