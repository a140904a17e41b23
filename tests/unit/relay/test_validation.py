"""enqueue's checks, fuzzed: whatever a job passes, the answer is a value or an EnqueueError."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from postroom import Batch, enqueue, enqueue_many
from postroom.relay import validation
from postroom.relay.errors import EnqueueError, InvalidAttachmentError, InvalidEmailError
from support.fuzz import examples

# Text of any code point, lone surrogates too (st.text leaves them out unless asked).
ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=40)
ANYTHING = st.one_of(st.none(), st.integers(), st.floats(), st.binary(max_size=8),
                     st.text(max_size=40), ANY_TEXT, st.lists(st.text(max_size=8), max_size=3),
                     st.lists(ANY_TEXT, max_size=3),
                     st.from_regex(r"[a-z\ud800-\udfff]{1,4}@example\.com", fullmatch=True))
CHECKS: list[Callable[[Any], Any]] = [
    validation.check_subject, validation.check_key, validation.check_body,
    validation.check_address, validation.check_priority,
    lambda recipients: list(validation.recipient_chunks(recipients, 2)),
    lambda paths: validation.check_attachments(paths, 1024),
]


@pytest.mark.parametrize("check", CHECKS)
@settings(max_examples=examples(80), deadline=None)
@given(value=ANYTHING)
@example(value="a\udc80@example.com")  # a lone surrogate: UnicodeEncodeError before
@example(value=["ok@example.com", "\ud800@example.com"])
def test_any_input_gets_a_value_or_an_enqueue_error(check: Callable[[Any], Any],
                                                    value: object) -> None:
    try:
        check(value)
    except EnqueueError:
        pass  # the documented refusal; a TypeError or any other error fails the test


@settings(max_examples=examples(300), deadline=None)
@given(key=st.text(max_size=12), other=st.text(max_size=12),
       a=st.from_regex(r"[a-z|\\]{1,6}@example\.com", fullmatch=True),
       b=st.from_regex(r"[a-z|\\]{1,6}@example\.com", fullmatch=True))
def test_two_different_pairs_never_share_an_idempotency_key(
        key: str, other: str, a: str, b: str) -> None:
    if (key, a) != (other, b):
        assert validation.idempotency_key(key, a) != validation.idempotency_key(other, b)


def test_recipients_are_checked_chunk_by_chunk_as_they_are_asked_for() -> None:
    import itertools

    endless = (f"user{n}@example.com" for n in itertools.count())
    chunks = validation.recipient_chunks(endless, 3)
    assert next(chunks) == ["user0@example.com", "user1@example.com", "user2@example.com"]
    assert next(chunks)[0] == "user3@example.com"
    bad = validation.recipient_chunks(iter(["a@example.com", "b@example.com", "nope"]), 2)
    assert next(bad) == ["a@example.com", "b@example.com"]
    with pytest.raises(EnqueueError, match="'nope' is not of the form local@domain"):
        next(bad)


def test_every_recipients_header_is_checked_not_only_the_firsts() -> None:
    """An encoded line break in the second recipient's local part: the sender's build refuses
    it, so enqueue must too (it checked the first recipient's headers only)."""
    with pytest.raises(EnqueueError, match=r"cannot|header"):
        list(validation.recipient_chunks(
            ["ok@example.com", "=?utf-8?q?a=0D=0A?=@example.com"], 10))
    assert list(validation.recipient_chunks(["ok@example.com", "José@example.com"], 10)) == [
        ["ok@example.com", "José@example.com"]]


def _chunks_or_refusal(recipients: object, size: int) -> object:
    try:
        return list(validation.recipient_chunks(recipients, size))
    except EnqueueError as exc:
        return type(exc).__name__, str(exc)


RECIPIENT = st.one_of(
    st.from_regex(r"[a-z]{1,4}@example\.com", fullmatch=True), ANYTHING,
    st.sampled_from(["=?utf-8?q?a=0D=0A?=@example.com", "nope", " pad@example.com ", "José@b.c"]))


@settings(max_examples=examples(300), deadline=None)
@given(recipients=st.lists(RECIPIENT, max_size=5), size=st.integers(1, 6))
@example(recipients=["=?utf-8?q?a=0D=0A?=@example.com", "nope"], size=10)
def test_a_list_of_one_chunk_is_checked_as_the_generator_checks_any_iterable(
        recipients: list[object], size: int) -> None:
    """A list of at most one chunk is checked at once, without the generator (issue 26): the
    same chunks, or the same refusal naming the same recipient, as an iterator of it gets."""
    assert _chunks_or_refusal(recipients, size) == _chunks_or_refusal(iter(recipients), size)


@pytest.mark.parametrize(("subject", "said"), [
    # issue 49: enqueue said "cannot make headers of these values: 'ascii' codec can't encode ..."
    ("é=?utf-8?b?00?=", "subject holds '=?utf-8?b?00?=', which mail programs read as an RFC 2047 "
                        "encoded word"),
    ("Invoice \ud800", "subject holds a lone surrogate"),
])
def test_enqueue_says_what_is_wrong_with_the_subject(subject: str, said: str) -> None:
    with pytest.raises(EnqueueError) as refused:
        validation.check_subject(subject)
    assert str(refused.value).startswith(said)
    assert "codec" not in str(refused.value)


@pytest.mark.parametrize("schema", [None, "", "reports", "t_0123456789", "_x", "a" * 63])
def test_a_schema_the_roles_take_is_kept(schema: str | None) -> None:
    assert validation.check_schema(schema) == schema


@pytest.mark.parametrize(("schema", "says"), [
    (5, "schema must be a schema name, not int"),
    ('we"ird', "schema 'we\"ird' is not one the roles take"),
    ("Reports", "schema 'Reports' is not one the roles take"),
    ("a" * 64, "is not one the roles take"),  # the server would cut it to another name
    ("reports\x00x", r"schema 'reports\\x00x' is not one the roles take"),
    ("\ud800", r"schema '\\ud800' is not one the roles take"),
    ("public; DROP TABLE outbox", "is not one the roles take"),
])
def test_a_schema_the_roles_cannot_take_is_refused_before_any_statement(
        schema: object, says: str) -> None:
    with pytest.raises(InvalidEmailError, match=says):
        validation.check_schema(schema)
    conn = object()  # the refusal comes before the connection is looked at
    for call in (lambda: enqueue(conn, recipients=["a@example.com"], subject="s", body="b",  # type: ignore[arg-type]
                                 schema=schema),  # type: ignore[arg-type]
                 lambda: enqueue_many(conn, [], schema=schema),  # type: ignore[arg-type]
                 lambda: Batch(conn, schema=schema)):  # type: ignore[arg-type]
        with pytest.raises(InvalidEmailError, match=says):
            call()


@given(ANYTHING)
@settings(max_examples=examples(200))
def test_check_schema_answers_a_name_or_an_enqueue_error(value: Any) -> None:
    try:
        validation.check_schema(value)
    except EnqueueError as exc:
        assert "\n" not in str(exc)


@pytest.mark.parametrize("what", ["attachment", "inline image"])
@pytest.mark.parametrize("exists", [True, False])
def test_a_file_name_in_another_encoding_is_refused_in_a_line_that_prints(
        what: str, exists: bool, tmp_path: Path) -> None:
    """A Latin-1 file name reads on Linux as text with lone surrogates: no header and no event
    can carry it, and a message holding it could not be printed or logged as UTF-8."""
    path = os.fsdecode(bytes(tmp_path) + b"/r\xe9sum\xe9.png")
    if exists:
        Path(path).write_bytes(b"\x89PNG")
    with pytest.raises(InvalidAttachmentError) as caught:
        if what == "attachment":
            validation.check_files([path], 1024)
        else:
            validation.check_inline([path], "<img src='cid:x'>", 1024)
    line = str(caught.value)
    line.encode("utf-8")  # printable and loggable as UTF-8
    assert line == (f"{what} path {path!r} is not UTF-8 text (a file name in another encoding): "
                    "rename the file")
