"""The console's request fields: each read into a value or refused with one line (FormError),
whatever a request holds."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from postroom.web import forms
from postroom.web.forms import FormError, SearchFilter


@pytest.mark.parametrize("query, expected", [
    ({}, SearchFilter()),
    ({"key": "  report-1 ", "recipient": " A@Example.COM ", "state": "dead"},
     SearchFilter(message_key="report-1", recipient="a@example.com", status="dead")),
    ({"from": "2026-09-30", "until": "2026-10-01T08:30"},
     SearchFilter(created_from=dt.datetime(2026, 9, 30, tzinfo=dt.UTC),
                  created_until=dt.datetime(2026, 10, 1, 8, 30, tzinfo=dt.UTC))),
    ({"from": "2026-09-30T10:00+02:00"},
     SearchFilter(created_from=dt.datetime(2026, 9, 30, 8, tzinfo=dt.UTC))),
    ({"key": "", "state": ""}, SearchFilter()),
])
def test_search_filters(query: dict[str, str], expected: SearchFilter) -> None:
    assert forms.search_filter(query) == expected


@pytest.mark.parametrize("query, message", [
    ({"state": "lost"}, "state: one of pending, published"),
    ({"from": "yesterday"}, "from: not a date or time"),
    ({"from": "2026-10-02", "until": "2026-10-01"}, "from: must be before until"),
    ({"key": "k" * 1001}, "message key: longer than 1000 characters"),
    ({"key": "a\x00b"}, "message key: holds a NUL character"),
    ({"after": "12_x"}, "page: not a page of this search"),
    ({"after": "999999999999999999999999_1"}, "page: not a page of this search"),
])
def test_bad_filters_say_why(query: dict[str, str], message: str) -> None:
    with pytest.raises(FormError, match=message):
        forms.search_filter(query)


def test_a_cursor_reads_back_as_its_keyset() -> None:
    at = dt.datetime(2026, 9, 30, 12, 0, 0, 123456, tzinfo=dt.UTC)
    assert forms.keyset(forms.cursor(at, 42)) == (at, 42)


def test_a_filter_writes_the_params_it_reads() -> None:
    query = {"key": "k", "recipient": "a@example.com", "state": "sent",
             "from": "2026-09-30T10:00", "until": "2026-09-30T11:00"}
    assert forms.search_filter(query).as_params() == query


@given(st.dictionaries(st.sampled_from(["key", "recipient", "state", "from", "until", "after"]),
                       st.text(max_size=60)))
def test_no_query_breaks_the_search_form(query: dict[str, str]) -> None:
    try:
        wanted = forms.search_filter(query)
    except FormError as exc:
        assert "\n" not in str(exc)
    else:
        assert wanted.status in (None, *forms.STATES)


@pytest.mark.parametrize("fields, expected", [
    ({"address": "a@example.com"}, forms.SuppressionForm("a@example.com", None, None)),
    ({"address": "a@example.com", "reason": " moved ", "expires": "12h"},
     forms.SuppressionForm("a@example.com", "moved", 43200.0)),
])
def test_suppression_forms(fields: dict[str, str], expected: forms.SuppressionForm) -> None:
    assert forms.suppression_form(fields) == expected


@given(st.dictionaries(st.sampled_from(["address", "reason", "expires"]), st.text(max_size=40)))
def test_no_form_breaks_the_suppression_form(fields: dict[str, str]) -> None:
    try:
        forms.suppression_form(fields)
    except FormError as exc:
        assert "\n" not in str(exc)
