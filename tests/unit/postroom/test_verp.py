"""The VERP token: tables of what it reads and refuses, and hypothesis properties (every token
reads back to its id; no other text ever reads as a row, and nothing but a TokenError is raised)."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from postroom.settings import BOUNCE_LOCAL_MAX_CHARS
from postroom.verp import (
    LOCAL_PART_MAX_CHARS,
    OUTBOX_ID_MAX,
    ExpiredTokenError,
    ForgedTokenError,
    MalformedTokenError,
    TokenError,
    make_token,
    read_token,
    return_path,
)
from support.fuzz import examples

NOW = dt.datetime(2026, 12, 2, 22, 0, tzinfo=dt.UTC)
SECRET = b"s3cret-of-the-bounce-domain"
OLD_SECRET = b"last-years-secret"
BOUNCE = "bounces@bounce.example.com"
MAX_AGE = dt.timedelta(days=60)


def read(text: str, *, now: dt.datetime = NOW, secrets: tuple[bytes, ...] = (SECRET,)) -> int:
    return read_token(text, BOUNCE, secrets, now, MAX_AGE)


def test_a_token_reads_back_bare_and_in_its_return_path() -> None:
    token = make_token(4711, SECRET, NOW)
    path = return_path(BOUNCE, token)
    assert path == f"bounces+{token}@bounce.example.com"
    assert read(token) == 4711
    assert read(path) == 4711
    assert read(f"<{path.upper()}>") == 4711  # an MTA may change the case or keep the brackets


def test_the_token_is_lowercase_and_fits_a_local_part_for_the_largest_id() -> None:
    token = make_token(OUTBOX_ID_MAX, SECRET, dt.datetime(6568, 8, 18, tzinfo=dt.UTC))
    assert token == token.lower()
    assert len(token) == 35  # settings.BOUNCE_LOCAL_MAX_CHARS leaves room for it and "+"
    assert len(f"{'b' * BOUNCE_LOCAL_MAX_CHARS}+{token}") <= LOCAL_PART_MAX_CHARS
    with pytest.raises(ValueError, match="range"):
        make_token(1, SECRET, dt.datetime(6568, 8, 19, tzinfo=dt.UTC))


def test_any_of_the_secrets_verifies_the_first_signs() -> None:
    token = make_token(9, OLD_SECRET, NOW)
    assert read(token, secrets=(SECRET, OLD_SECRET)) == 9
    with pytest.raises(ForgedTokenError):
        read(token, secrets=(SECRET,))


@pytest.mark.parametrize(("made", "now", "refused"), [
    (NOW, NOW, False),
    (NOW, NOW + dt.timedelta(days=60), False),  # counted from the end of its day
    (NOW, NOW + dt.timedelta(days=61), True),
    (NOW, NOW - dt.timedelta(days=1), False),  # a day's clock skew between hosts
    (NOW, NOW - dt.timedelta(days=2), True),   # dated ahead of the clock
])
def test_age(made: dt.datetime, now: dt.datetime, refused: bool) -> None:
    token = make_token(5, SECRET, made)
    if refused:
        with pytest.raises(ExpiredTokenError):
            read(token, now=now)
    else:
        assert read(token, now=now) == 5


def test_a_changed_id_or_day_is_forged() -> None:
    id_part, day_part, mac = make_token(5, SECRET, NOW).split("-")
    with pytest.raises(ForgedTokenError):
        read(f"6-{day_part}-{mac}")
    with pytest.raises(ForgedTokenError):
        read(f"{id_part}-{make_token(5, SECRET, NOW - dt.timedelta(days=1)).split('-')[1]}-{mac}")
    with pytest.raises(ForgedTokenError):
        read(f"0{id_part}-{day_part}-{mac}")  # the same id spelt otherwise is not what was signed


@pytest.mark.parametrize("text", [
    "", "bounces@bounce.example.com", "bounces+@bounce.example.com", "postmaster@bounce.example.com",
    "bounces+1-a-aaaaaaaaaaaaaaaa@other.example.com", "other+1-a-aaaaaaaaaaaaaaaa@bounce.example.com",
    "1-a-aaaaaaaaaaaaaaa", "1-a-aaaaaaaaaaaaaaaa1", "1--aaaaaaaaaaaaaaaa", "@", "a@", "@b",
    "1-a-aaaaaaaaaaaaaaa\u00e9", "1-a-aaaaaaaaaaaaaaaa\n",
])
def test_malformed(text: str) -> None:
    with pytest.raises(MalformedTokenError):
        read(text)


def test_an_id_out_of_range_is_refused_even_when_signed() -> None:
    with pytest.raises(ValueError, match="out of range"):
        make_token(0, SECRET, NOW)
    with pytest.raises(ValueError, match="out of range"):
        make_token(OUTBOX_ID_MAX + 1, SECRET, NOW)


def test_a_bounce_address_too_long_for_a_token_is_refused() -> None:
    with pytest.raises(ValueError, match="no room"):
        return_path(f"{'b' * 40}@bounce.example.com", make_token(OUTBOX_ID_MAX, SECRET, NOW))


def test_an_empty_secret_neither_signs_nor_verifies() -> None:
    with pytest.raises(ValueError, match="empty"):
        make_token(1, b"", NOW)
    with pytest.raises(ForgedTokenError):
        read(make_token(1, SECRET, NOW), secrets=(b"",))


@settings(max_examples=examples(300), deadline=None)
@given(outbox_id=st.integers(1, OUTBOX_ID_MAX),
       # hypothesis bounds are naive; the values it draws carry UTC
       made=st.datetimes(min_value=dt.datetime(1970, 1, 2), max_value=dt.datetime(6568, 1, 1),  # noqa: DTZ001
                         timezones=st.just(dt.UTC)),
       age=st.timedeltas(min_value=dt.timedelta(0), max_value=MAX_AGE),
       secret=st.binary(min_size=1, max_size=64))
def test_every_token_reads_back_within_its_age(outbox_id: int, made: dt.datetime, age: dt.timedelta,
                                               secret: bytes) -> None:
    token = make_token(outbox_id, secret, made)
    assert len(f"bounces+{token}") <= LOCAL_PART_MAX_CHARS
    assert read_token(return_path(BOUNCE, token), BOUNCE, (secret,), made + age, MAX_AGE) == outbox_id


@settings(max_examples=examples(500), deadline=None)
@given(text=st.one_of(
    st.text(max_size=120),
    st.builds(lambda t: f"bounces+{t}@bounce.example.com", st.text(max_size=60)),
    st.from_regex(r"[0-9a-z]{1,13}-[0-9a-z]{1,4}-[a-z2-7]{16}", fullmatch=True),
))
def test_no_other_text_reads_as_a_row(text: str) -> None:
    """Only a TokenError, never another exception; and a forger without the secret never wins."""
    assume(text != make_token(1, SECRET, NOW))
    with pytest.raises(TokenError):
        read(text)


@settings(max_examples=examples(200), deadline=None)
@given(outbox_id=st.integers(1, OUTBOX_ID_MAX), position=st.integers(0, 34), char=st.sampled_from(
    "0123456789abcdefghijklmnopqrstuvwxyz-"))
def test_one_changed_character_is_refused(outbox_id: int, position: int, char: str) -> None:
    token = make_token(outbox_id, SECRET, NOW)
    assume(position < len(token) and token[position] != char)
    changed = token[:position] + char + token[position + 1:]
    with pytest.raises(TokenError):
        read(changed)
