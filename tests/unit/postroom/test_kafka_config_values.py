"""A config value a broker or the settings give (min.insync.replicas, default.replication.factor,
a group's session) is read as a whole number only when it is a plain ASCII one: whatever the
text, reading it never raises."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from postroom.kafka.config import plain_number
from support.fuzz import examples


@pytest.mark.parametrize(("value", "number"), [
    ("2", 2), ("10000", 10_000), (3, 3), ("0", 0),
    ("²", None), ("٣", None), ("-1", None), (" 2", None), ("2 ", None), ("1e4", None),
    ("+6000", None), ("6_000", None), ("", None), (None, None), ("9" * 19, None),
])
def test_only_plain_ascii_numbers_are_numbers(value: object, number: int | None) -> None:
    assert plain_number(value) == number


@settings(max_examples=examples(300), deadline=None)
@given(st.one_of(st.text(), st.integers(min_value=0, max_value=10**18 - 1), st.none()))
def test_any_value_reads_as_none_or_as_its_plain_digits(value: object) -> None:
    number = plain_number(value)
    text = "" if value is None else str(value)
    if number is None:
        assert not (text.isascii() and text.isdigit() and len(text) <= 18)
    else:
        assert str(number) == text.lstrip("0") or (number == 0 and set(text) == {"0"})
