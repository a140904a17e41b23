"""The suppression list's pure parts: which addresses it takes (or refuses), what a reason
and a report's last error become, whatever text they are given."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from postroom.errors import InvalidContentError, printable
from postroom.relay.results import ERROR_MAX_CHARS, ReportPolicy, report_error, report_params
from postroom.relay.suppression import REASON_MAX_CHARS, checked, reason_of
from postroom.schemas.codec import DeliveryStatus, EmailResult
from support.fuzz import examples

NOW = dt.datetime(2026, 10, 1, 7, 0, tzinfo=dt.UTC)
REPORT = EmailResult(idempotency_key="k|a@example.com", outbox_id=7, recipient="a@example.com",
                     status=DeliveryStatus.BOUNCED, attempt=1, occurred_at=NOW, smtp_code=550,
                     enhanced_code="5.1.1", error="smtp; 550 5.1.1 user unknown")


@pytest.mark.parametrize(("address", "held"), [
    ("Old.Manager@Example.COM", "Old.Manager@Example.COM"),  # the database lowers it
    ("  jane+reports@example.com ", "jane+reports@example.com"),
    ("JÜRGEN@bücher.example", "JÜRGEN@xn--bcher-kva.example"),  # the domain's one spelling
    ("x@BÜCHER\uff0eexample", "x@xn--bcher-kva.example")  # a full-width dot,
])
def test_an_address_is_taken_as_one_bare_address(address: str, held: str) -> None:
    assert checked(address) == held


@pytest.mark.parametrize("address", ["", "jane", "Jane <jane@example.com>", "a@b@", "a@-x.com",
                                     "a,b@example.com", "a@example.com\nBcc: x@y.z", None, 7,
                                     "a@☃.example", "a@xn--zz.example"])
def test_anything_but_one_bare_address_is_refused(address: object) -> None:
    with pytest.raises(InvalidContentError):
        checked(address)


@settings(max_examples=examples(300), deadline=None)
@given(st.one_of(st.text(max_size=80), st.emails().map(str)))
def test_any_text_is_an_address_or_refused(text: str) -> None:
    try:
        held: str | None = checked(text)
    except InvalidContentError:
        held = None  # refused: the one other outcome
    if held is not None:
        assert held == checked(held)
        assert "@" in held and held == held.strip()


@pytest.mark.parametrize(("text", "reason"), [
    (None, "added by an operator"),
    ("   ", "added by an operator"),
    ("left\nthe company", "left the company"),
])
def test_a_reason(text: str | None, reason: str) -> None:
    assert reason_of(text) == reason


@settings(max_examples=examples(300), deadline=None)
@given(st.text(max_size=2000))
def test_any_reason_is_one_printable_line_within_the_cap(text: str) -> None:
    reason = reason_of(text)
    assert 0 < len(reason) <= REASON_MAX_CHARS and reason == printable(reason)
    assert "\n" not in reason


@pytest.mark.parametrize(("changes", "error"), [
    ({}, "bounced 5.1.1: smtp; 550 5.1.1 user unknown"),
    ({"error": None}, "bounced 5.1.1: SMTP 550"),
    ({"error": None, "smtp_code": None, "enhanced_code": None}, "bounced: no diagnostic"),
    ({"status": DeliveryStatus.DELAYED, "enhanced_code": "4.4.1", "error": "451 later"},
     "delayed 4.4.1: 451 later"),
])
def test_a_reports_last_error(changes: dict[str, object], error: str) -> None:
    assert report_error(dataclasses.replace(REPORT, **changes)) == error  # type: ignore[arg-type]


@settings(max_examples=examples(300), deadline=None)
@given(st.text(max_size=5000), st.one_of(st.none(), st.text(max_size=40)))
def test_any_diagnostic_becomes_a_storable_error_and_reason(error: str,
                                                            code: str | None) -> None:
    report = dataclasses.replace(REPORT, error=error, enhanced_code=code)
    params = report_params(report, ReportPolicy(86400, 3))
    assert len(params["error"]) <= ERROR_MAX_CHARS and "\x00" not in params["error"]
    assert len(params["reason"]) <= 500 and "\n" not in params["reason"]
    assert params["expires_at"] == NOW + dt.timedelta(days=1)
    assert params["source"] == "bounce"
