"""One identity per mailbox (issue 46): every spelling of a domain (case, U-label or A-label,
full-width and other UTS-46-mapped forms) names one mailbox, stored, keyed and suppressed as
one; an ASCII address keeps its spelling and its key; a domain UTS-46 refuses is a clear
refusal."""

from __future__ import annotations

import re
import unicodedata

import idna
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from postroom import rules
from postroom.errors import InvalidContentError
from postroom.relay import validation
from support.fuzz import examples

IDENTITY = "gone@xn--bcher-kva.example"


def wide(text: str) -> str:
    """``text`` with its ASCII characters in their full-width forms (UTS-46 maps them back)."""
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in text)


@pytest.mark.parametrize("address", [
    "gone@bücher.example", "GONE@BÜCHER.EXAMPLE", "gone@xn--bcher-kva.example",
    "Gone@XN--BCHER-KVA.Example", "gone@" + wide("bücher.example"),
    "gone@bücher\u3002example",
    "gone@bu\u0308cher.example", "gone@ⓑücher.example", " gone@Bücher.example ",
])
def test_spellings_of_one_mailbox_have_one_identity(address: str) -> None:
    assert rules.mailbox_identity(rules.check_recipient(address)) == IDENTITY


@pytest.mark.parametrize(("address", "stored"), [
    ("GONE@BÜCHER.EXAMPLE", "GONE@xn--bcher-kva.example"),  # the local part as written
    ("josé@straße.de", "josé@xn--strae-oqa.de"),  # non-transitional: ß is not ss
    ("a@例え.テスト", "a@xn--r8jz45g.xn--zckzah"),
    ("Finance@Example.COM", "Finance@Example.COM"),  # ASCII: as written
    ("x@XN--BCHER-KVA.example", "x@XN--BCHER-KVA.example"),  # ASCII: checked, as written
])
def test_a_row_holds_the_local_part_as_written_and_a_non_ascii_domain_as_a_labels(
        address: str, stored: str) -> None:
    assert rules.check_recipient(address) == stored


@pytest.mark.parametrize(("address", "why"), [
    ("a@☃.example", "U+2603"),  # IDNA 2003 took symbols; IDNA 2008 does not
    ("a@xn--n3h.example", "U+2603"),  # the same, as an A-label
    ("a@xn--zz.example", "Invalid A-label"),
    ("a@ab--cd.bücher.example", "hyphens"),
    ("a@bücher..example", "Empty Label"),
])
def test_a_domain_uts46_refuses_is_a_clear_refusal(address: str, why: str) -> None:
    with pytest.raises(InvalidContentError, match=re.escape(why)) as refused:
        rules.check_recipient(address)
    message = str(refused.value)
    assert "\n" not in message and "invalid domain" in message and "UTS-46" in message
    with pytest.raises(InvalidContentError):
        rules.check_address(address)


def test_an_address_that_grows_too_long_in_idna_form_is_refused() -> None:
    label = "ü" * 50  # 50 characters, 56 as an A-label
    address = "a" * 30 + "@" + ".".join([label] * 4) + ".example"  # 244 characters, 266
    assert len(address) <= rules.MAX_ADDRESS_LEN
    with pytest.raises(InvalidContentError, match="IDNA form"):
        rules.check_recipient(address)


# -- properties over spellings of one mailbox

# Letters UTS-46 keeps as they are in lower case, and that have one upper-case letter which it
# maps back to them (not ß: upper() makes it SS, another domain).
DOMAIN_LETTERS = "abcdefghijklmnopqrstuvwxyz0123456789üéøñåçłżπжこテ例"
LABELS = st.text(st.sampled_from(DOMAIN_LETTERS), min_size=1, max_size=12)
DOMAINS = st.lists(LABELS, min_size=1, max_size=3).map(lambda labels: [*labels, "example"])
LOCALS = st.text(st.sampled_from("abcxyzABC019.+-_é"), min_size=1, max_size=20).filter(
    lambda local: rules._LOCAL.match(local) is not None)
DOTS = [".", "\uff0e", "\u3002", "\uff61"]  # full stop, full-width, ideographic, halfwidth


def _c_lower(text: str) -> str:
    """lower() as a PostgreSQL database with the C locale lowers (the local stack's)."""
    return "".join(c.lower() if c.isascii() else c for c in text)


@st.composite
def spelling(draw: st.DrawFn, local: str, labels: list[str]) -> str:
    """One way of writing ``local@labels``: its ASCII letters in either case, each label as a
    U-label (in either case, full-width, decomposed) or an A-label, any dot UTS-46 maps to '.'."""
    def cased(text: str) -> str:
        return "".join(c.upper() if c.isascii() and draw(st.booleans()) else c for c in text)

    written = []
    for label in labels:
        form = draw(st.sampled_from(["u", "upper", "full", "nfd", "a"]))
        if form == "a":
            text = cased(idna.encode(label).decode("ascii"))
        elif form == "upper":
            text = "".join(c.upper() if draw(st.booleans()) else c for c in label)
        elif form == "full":
            text = wide(cased(label))
        elif form == "nfd":
            text = unicodedata.normalize("NFD", cased(label))
        else:
            text = cased(label)
        written.append(text)
    dots = [draw(st.sampled_from(DOTS)) for _ in written[1:]]
    domain = written[0] + "".join(d + t for d, t in zip(dots, written[1:], strict=True))
    return f"{cased(local)}@{domain}"


@settings(max_examples=examples(400))
@given(st.data(), LOCALS, DOMAINS)
def test_every_spelling_of_a_mailbox_has_its_one_identity(
        data: st.DataObject, local: str, labels: list[str]) -> None:
    first = data.draw(spelling(local, labels))
    second = data.draw(spelling(local, labels))
    identity = rules.mailbox_identity(rules.check_recipient(f"{local}@{'.'.join(labels)}"))
    stored = [rules.check_recipient(first), rules.check_recipient(second)]
    assert [rules.mailbox_identity(s) for s in stored] == [identity, identity]
    # The idempotency key is the key's prefix and the identity: one row per mailbox.
    assert validation.idempotency_key("k", stored[0]) == validation.idempotency_key("k", stored[1])
    # A suppression entry of one spelling (suppression.add: check_recipient, then the database's
    # lower()) is what the relay compares for a row of the other, whether enqueue wrote the row
    # (check_recipient) or an earlier release wrote it as given (the relay spells it anew).
    entry = _c_lower(stored[0])
    assert _c_lower(rules.ascii_domain_address(stored[1])) == entry
    assert _c_lower(rules.ascii_domain_address(second.strip())) == entry


@settings(max_examples=examples(400))
@given(LOCALS, DOMAINS)
def test_a_stored_address_is_one_the_sender_takes_and_stores_as_itself(
        local: str, labels: list[str]) -> None:
    stored = rules.check_recipient(f"{local}@{'.'.join(labels)}")
    assert rules.check_address(stored) == stored
    assert rules.check_recipient(stored) == stored
    assert rules.ascii_domain_address(stored) == stored


PLAIN = st.builds(lambda local, labels: f"{local}@{'.'.join(labels)}",
                  st.text(st.sampled_from("aZ9.+-_'"), min_size=1, max_size=64),
                  st.lists(st.text(st.sampled_from("aZ9-xn"), min_size=1, max_size=63),
                           min_size=1, max_size=4),
                  ).filter(lambda address: rules._PLAIN_ADDRESS.fullmatch(address) is not None
                           and len(address) <= rules.MAX_ADDRESS_LEN
                           and rules._A_LABEL.search(address.partition("@")[2]) is None)


@settings(max_examples=examples(400))
@given(PLAIN)
def test_an_ascii_address_keeps_its_spelling_and_its_key(address: str) -> None:
    """Without an A-label (one is decoded and checked, and kept as written when valid)."""
    assert rules.check_recipient(address) == address
    assert validation.idempotency_key("k|1", address) == "k\\|1|" + address.lower()


ANY_CHARS = st.sampled_from(["a", "Z", "9", "-", ".", "@", "ü", "Ü", "ß", "\uff0e", "\u3002",
                             "x", "n", "xn--", "XN--", "☃", "\u0308", "\u200d", "\ud800", " ",
                             "\u00ad", "\uff42", "İ", "\u0000"])


@settings(max_examples=examples(2000))
@given(st.one_of(st.lists(ANY_CHARS, max_size=30).map("".join), st.text(max_size=40)))
def test_any_text_is_an_address_or_a_refusal(text: str) -> None:
    try:
        stored = rules.check_recipient(text)
    except InvalidContentError as exc:
        assert str(exc)
    else:
        assert rules.check_recipient(stored) == stored
    # The relay spells any row's text, whatever SQL wrote there, without raising.
    assert isinstance(rules.ascii_domain_address(text), str)


@pytest.mark.parametrize(("key", "recipient", "respelled"), [
    ("k|gone@bücher.example", "GONE@BÜCHER.EXAMPLE", "k|gone@xn--bcher-kva.example"),
    ("a\\|b|x@straße.de", "x@straße.de", "a\\|b|x@xn--strae-oqa.de"),
    ("k|plain@example.com", "Plain@Example.com", "k|plain@example.com"),  # ASCII: as it is
    ("k|gone@xn--bcher-kva.example", "gone@xn--bcher-kva.example",
     "k|gone@xn--bcher-kva.example"),
    ("other", "gone@bücher.example", "other"),  # not enqueue's key: as it is
    ("k|x@☃.example", "x@☃.example", "k|x@☃.example"),  # refused domain: as it is
])
def test_a_key_written_before_0015_is_respelled_as_enqueue_writes_it_now(
        key: str, recipient: str, respelled: str) -> None:
    assert rules.respelled_key(key, recipient) == respelled


@pytest.mark.parametrize(("written", "sent"), [
    ("José Núñez <reports@bücher.example>", "José Núñez <reports@xn--bcher-kva.example>"),
    ("reports@straße.de", "reports@xn--strae-oqa.de"),
    ("Name <x@☃.example>", "Name <x@☃.example>"),  # refused where it is checked
])
def test_the_sender_writes_a_from_or_to_with_its_domain_as_a_labels(written: str,
                                                                      sent: str) -> None:
    assert rules.ascii_domain_address(written) == sent
