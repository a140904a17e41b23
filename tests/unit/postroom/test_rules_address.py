"""check_address's one-match fast path decides exactly as the part-by-part reference does: the
same address back, or the same refusal with the same message (issue 26)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from postroom import rules
from postroom.errors import InvalidContentError
from support.fuzz import examples


def _outcome(check: object, address: object) -> tuple[str, object]:
    try:
        return "ok", check(address)  # type: ignore[operator]
    except InvalidContentError as exc:
        return "refused", str(exc)


ATEXT = "abcXYZ019!#$%&'*+/=?^_`{|}~-"
# Near the edges of the plain pattern: dots, hyphens, @, blanks, controls, non-ASCII, lengths.
ADDRESS_CHARS = st.sampled_from([*ATEXT, ".", "@", "-", " ", "\t", "\n", "\x00", "é", "ß",
                                 "\u2028", "<", ">", '"', "(", ",", "\ud800"])
ADDRESSES = st.one_of(
    st.text(ADDRESS_CHARS, max_size=80),
    st.builds(lambda local, labels: f"{local}@{'.'.join(labels)}",
              st.text(ADDRESS_CHARS, min_size=0, max_size=70),
              st.lists(st.text(st.sampled_from("abZ9-é"), max_size=66), min_size=0, max_size=4)),
    st.builds(lambda n, m: "a" * n + "@" + "b" * m + ".example", st.integers(0, 70),
              st.integers(0, 260)),
)


@settings(max_examples=examples(2000))
@given(ADDRESSES)
def test_fast_path_decides_as_the_reference(address: str) -> None:
    assert _outcome(rules.check_address, address) == \
        _outcome(rules.check_address_by_parts, address)


@pytest.mark.parametrize("address", [
    "finance@example.com", "a.b-c+tag@sub.example.co", "x@" + "a" * 63 + ".com",
    "a" * 64 + "@example.com", "a@" + ".".join(["b" * 63] * 3) + "." + "c" * 55,
])
def test_plain_addresses_pass_as_given(address: str) -> None:
    assert rules._PLAIN_ADDRESS.fullmatch(address) is not None or len(address) > 254
    assert rules.check_address(address) == address == rules.check_address_by_parts(address)


@pytest.mark.parametrize("address", [
    "a" * 65 + "@example.com", "x@" + "a" * 64 + ".com", "x@-a.com", "x@a-.com", "x@a..com",
    "x@a.com.", ".x@a.com", "x.@a.com", "x..y@a.com", "x@@a.com", " x@a.com", "x@a.com\n",
    "Name <x@a.com>", "x@a.com, y@a.com", "", "x@" + "a" * 250 + ".com", None, b"x@a.com",
    "x@xn--bcher-kva.example", "x@XN--zz.example", "x@a.xn--n3h",  # A-labels: UTS-46 checks
])
def test_not_plain_addresses_go_to_the_reference(address: object) -> None:
    assert _outcome(rules.check_address, address) == \
        _outcome(rules.check_address_by_parts, address)
