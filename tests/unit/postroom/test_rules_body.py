"""check_body measures the body in UTF-8 bytes: an ASCII str by its length (issue 26), anything
else by encoding it, so its limit holds whatever the text."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from postroom import rules
from postroom.errors import InvalidContentError
from support.fuzz import examples

LIMIT = 64


def _outcome(body: str) -> str:
    try:
        return rules.check_body(body, LIMIT)
    except InvalidContentError as exc:
        return f"refused: {exc}"


@settings(max_examples=examples(300), deadline=None)
@given(body=st.text(st.characters(exclude_categories=(), exclude_characters="\x00"),
                    max_size=LIMIT + 8))
def test_the_limit_is_in_utf8_bytes(body: str) -> None:
    size = len(body.encode("utf-8", "surrogatepass"))
    if size <= LIMIT:
        assert _outcome(body) == body
    else:
        assert _outcome(body) == (f"refused: body is {size} bytes, over the limit of {LIMIT} "
                                  "(POSTROOM_BODY_MAX_BYTES); attach large content as a file")


def test_a_str_subclass_is_measured_by_its_bytes_not_by_what_it_says_of_itself() -> None:
    class Lying(str):
        def isascii(self) -> bool:
            return True

    with pytest.raises(InvalidContentError, match=f"body is {2 * LIMIT} bytes"):
        rules.check_body(Lying("é" * LIMIT), LIMIT)
