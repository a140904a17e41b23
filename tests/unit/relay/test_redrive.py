"""What `dlq list` and `dlq replay` decide from the dead letters, without a broker: one letter per
key (the latest), its count, and a skip's words true to the row's state. Tables."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from postroom.headers import DLQ_REASON_HEADER
from postroom.relay.redrive import (
    LETTER_KEY_MAX_CHARS,
    LETTER_TEXT_MAX_CHARS,
    DeadLetter,
    RedrivePlan,
    latest_per_key,
    letter_of,
    render_count,
    render_page,
    render_plan,
    skip_reason,
)
from support.fuzz import examples

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)


def letter(key: str | None, minutes_ago: int, *, offset: int = 0, row: str | None = "dead",
           recipient: str | None = "a@example.com") -> DeadLetter:
    return DeadLetter(0, offset, key, NOW - dt.timedelta(minutes=minutes_ago), "permanent",
                      "550", "t", 1, recipient=recipient, message_key="m", subject="S",
                      row_status=row)


def test_one_letter_per_key_the_latest_in_the_order_of_the_latest() -> None:
    letters = [letter("a", 50, offset=1), letter("b", 40, offset=2), letter("a", 30, offset=3),
               letter(None, 20, offset=4, row=None, recipient=None), letter("c", 10, offset=5)]
    latest = latest_per_key(letters)
    assert [(x.name, x.offset, x.letters) for x in latest] == [
        ("b", 2, 1), ("a", 3, 2), ("0@4", 4, 1), ("c", 5, 1)]


def test_the_list_counts_each_replayable_key_once() -> None:
    lines, keys, replayable = render_page([letter("a", 50, offset=1), letter("a", 30, offset=2),
                                           letter("b", 20, offset=3, row="sent")])
    assert (len(lines), keys, replayable) == (2, 2, 1)
    assert lines[0].endswith("row=dead (replayable) | 2 dead letters, latest shown")
    assert render_count(3, keys, replayable) == ("3 dead letter(s) of 2 key(s), 1 replayable "
                                                 "with `postroom dlq replay`")
    assert render_count(2500, 2400, 2100, pages=3).startswith(
        "2500 dead letter(s) of 2400 key(s) in 3 pages, 2100 replayable with `postroom dlq "
        "replay` (a key is counted in each page it has letters in;")


@pytest.mark.parametrize(("row", "recipient", "says"), [
    ("dead", "a@example.com", None),
    ("failed", "a@example.com", None),
    ("failed", None, None),          # a poison record whose row ended failed: the row is the email
    ("published", "a@example.com", "row is published: no final state yet"),
    ("pending", "a@example.com", "row is pending: queued to be sent again"),
    ("retrying", "a@example.com", "row is retrying"),
    ("sent", "a@example.com", "row is sent: delivered since"),
    (None, "a@example.com", "no outbox row (purged?)"),
    (None, None, "unreadable record (550)"),
])
def test_a_skip_says_the_rows_state(row: str | None, recipient: str | None,
                                    says: str | None) -> None:
    why = skip_reason(letter("k", 1, row=row, recipient=recipient))
    if says is None:
        assert why is None
    else:
        assert why is not None and why.startswith(says)
        assert "replayed already" not in why


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.one_of(st.none(), st.sampled_from(["a", "b", "c", "d"])), max_size=30))
def test_latest_per_key_keeps_each_keys_last_letter_and_counts_all(keys: list[str | None]) -> None:
    letters = [letter(key, 100 - n, offset=n) for n, key in enumerate(keys)]
    latest = latest_per_key(letters)
    names = [x.name for x in latest]
    assert len(names) == len(set(names))
    assert sum(x.letters for x in latest) == len(letters)
    for x in latest:
        assert x.offset == max(y.offset for y in letters if y.name == x.name)
    assert [x.offset for x in latest] == sorted(x.offset for x in latest)  # still time-ordered


class _Record:
    """What confluent-kafka's Message gives `dlq list`, with any content a producer can write."""

    def __init__(self, key: bytes | None, value: bytes | None,
                 headers: list[tuple[str, bytes | None]], timestamp_ms: int) -> None:
        self._key, self._value, self._headers, self._ts = key, value, headers, timestamp_ms

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> list[tuple[str, bytes | None]]:
        return self._headers

    def timestamp(self) -> tuple[int, int]:
        return 1, self._ts


_HEADER_NAMES = st.sampled_from(["postroom.dlq.classification", "postroom.dlq.reason",
                                 "postroom.dlq.topic", "postroom.error", "postroom.schema", "x"])


@settings(max_examples=examples(300), deadline=None)
@given(key=st.one_of(st.none(), st.binary(max_size=64)),
       value=st.one_of(st.none(), st.binary(max_size=256)),
       headers=st.lists(st.tuples(_HEADER_NAMES, st.one_of(st.none(), st.binary(max_size=64))),
                        max_size=8),
       timestamp_ms=st.integers(min_value=-2**63, max_value=2**63 - 1))
def test_any_record_on_the_dead_letter_topic_is_listed_in_one_line(
        key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes | None]],
        timestamp_ms: int) -> None:
    found = letter_of(_Record(key, value, headers, timestamp_ms), 0, 7)
    [line], keys, replayable = render_page([found])
    assert "\n" not in line and "\r" not in line
    assert (keys, replayable) == (1, 0)
    why = skip_reason(found)
    assert why is not None and "\n" not in why
    plan = render_plan(RedrivePlan((), ((found.name, why),)), "replay")
    assert all("\n" not in text for text in plan)


def test_a_letter_keeps_at_most_so_much_of_each_text() -> None:
    """A page holds PAGE_LETTERS letters: each must be small whatever its record holds (a reason
    of a megabyte, a key as long)."""
    huge = "x" * 1_000_000
    found = letter_of(_Record(huge.encode(), b"\x07not avro",
                              [(DLQ_REASON_HEADER, huge.encode())], 0), 0, 7)
    assert found.key is not None and len(found.key) == LETTER_KEY_MAX_CHARS
    assert len(found.reason) == LETTER_TEXT_MAX_CHARS and found.reason.endswith("…")
