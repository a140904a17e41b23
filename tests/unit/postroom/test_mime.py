"""No text from a job or an event ends up as anything but the value of its header: examples from
issue 10 and hypothesis properties over subjects, names, addresses and file names."""

from __future__ import annotations

import binascii
import contextlib
import datetime as dt
import email
import email.policy
import functools
from collections.abc import Iterator
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from postroom import mime
from postroom.errors import InvalidContentError, UnsafeHeaderError
from postroom.mime import check_composable, check_composable_by_building, check_serialized
from postroom.rules import check_address, check_attachment_path, check_subject
from postroom.schemas.codec import EmailRequested
from postroom.sender.errors import AttachmentError
from postroom.sender.message import build_message
from support.fuzz import examples

NOW = dt.datetime(2026, 10, 2, 7, 0, tzinfo=dt.UTC)
TOP_HEADERS = ["from", "to", "subject", "date", "message-id"]
PART_HEADERS = {"content-type", "content-transfer-encoding", "content-disposition",
                "mime-version"}
ENCODED_CRLF = "=?utf-8?q?=0D=0AReply-To:_attacker@evil.example?="
POLICIES = [email.policy.SMTP, email.policy.SMTPUTF8]


def event(**changes: Any) -> EmailRequested:
    values: dict[str, Any] = {
        "idempotency_key": "k|finance@example.com", "message_key": "k", "outbox_id": 1,
        "recipient": "finance@example.com", "sender": "reports@example.com",
        "subject": "Sales report", "body": "see attached\n", "attachments": (),
        "priority": "normal", "created_at": NOW}
    values.update(changes)
    return EmailRequested(**values)


class _ReceiverPolicy(email.policy.EmailPolicy):
    """email.policy.default, parsing a header's text once: the library parses it anew each time
    it is read (Content-Type some thirty times a message), and the parse of a header depends on
    its name and text alone. A third of the cost of the properties below was these parses."""

    def header_fetch_parse(self, name: str, value: str) -> Any:
        if hasattr(value, "name"):  # already a header object
            return super().header_fetch_parse(name, value)
        return _parsed_header(name, value)


@functools.lru_cache(maxsize=1024)
def _parsed_header(name: str, value: str) -> Any:
    return email.policy.default.header_fetch_parse(name, value)


RECEIVER = _ReceiverPolicy()


def received(message: EmailMessage, policy: email.policy.EmailPolicy) -> EmailMessage:
    parsed = email.message_from_bytes(message.as_bytes(policy=policy), policy=RECEIVER)
    assert isinstance(parsed, EmailMessage)
    return parsed


def assert_exactly_the_intended_headers(message: EmailMessage, attachments: int) -> None:
    """What a receiver parses: the five headers we set and MIME's own, nothing else."""
    for policy in POLICIES:
        parsed = received(message, policy)
        top = [name.lower() for name in parsed.keys()]
        assert top[:5] == TOP_HEADERS
        assert set(top[5:]) <= PART_HEADERS
        assert parsed.get_all("Reply-To") is None and parsed.get_all("Bcc") is None
        parts = list(parsed.iter_attachments())
        assert len(parts) == attachments
        for part in parts:
            assert {name.lower() for name in part.keys()} <= PART_HEADERS


# --- the examples of issue 10


@pytest.mark.parametrize("subject", [
    f"Invoice {ENCODED_CRLF}",
    "=?utf-8?b?SGkNClJlcGx5LVRvOiBldmVAZXZpbC5leGFtcGxl?=",  # the same, base64
    "x =?utf-8?q?=0A=0ABody_starts_here?=",                    # would end the header block
    "=?utf-8?q?=E2=80=A8?= U+2028 encoded",
])
def test_an_encoded_line_break_in_the_subject_is_refused(subject: str) -> None:
    with pytest.raises(UnsafeHeaderError, match="Subject"):
        build_message(event(subject=subject), attachments_root=None, now=NOW)
    with pytest.raises(UnsafeHeaderError):
        check_composable("reports@example.com", "finance@example.com", subject, [])


@pytest.mark.parametrize("name", [
    "=?utf-8?q?a=0D=0AX-Evil:_1?=.pdf",
    "=?utf-8?q?a=0A=0A?=.pdf",
])
def test_an_encoded_line_break_in_a_file_name_is_refused(tmp_path: Path, name: str) -> None:
    (tmp_path / name).write_bytes(b"%PDF")
    with pytest.raises(UnsafeHeaderError):
        build_message(event(attachments=(name,)), attachments_root=tmp_path, now=NOW)
    with pytest.raises(UnsafeHeaderError):
        check_composable("reports@example.com", "finance@example.com", "s", [name])


def test_serialised_bytes_with_an_added_header_are_refused() -> None:
    message = build_message(event(), attachments_root=None, now=NOW)
    content = message.as_bytes().replace(b"Subject: Sales report\r\n",
                                         b"Subject: Sales report\r\nReply-To: eve@evil.example\r\n")
    with pytest.raises(UnsafeHeaderError, match="added: reply-to"):
        check_serialized(message, content)
    check_serialized(message, message.as_bytes())  # the genuine bytes pass


def test_serialised_bytes_whose_header_block_ends_early_are_refused() -> None:
    message = build_message(event(), attachments_root=None, now=NOW)
    content = message.as_bytes().replace(b"Subject: Sales report\r\n",
                                         b"Subject: Sales\r\n\r\nreport\r\n")
    with pytest.raises(UnsafeHeaderError):
        check_serialized(message, content)


# --- properties

# Text that likes to break headers: line breaks raw and encoded, encoded-word syntax, quotes.
_BREAKS = ["\r", "\n", "\r\n", "\x85", "\u2028", "\u2029", "\x00"]
_UNBROKEN = ["\t", " ", "=?", "?=", "=?utf-8?q?", "=?utf-8?b?", "=0D", "=0A", "_", '"', ";", "\\", ":",
             "<", ">", ",", "@", "Bcc: x@y.z", "é", "ß", "€", "日本"]
_TRICKY = st.sampled_from([*_BREAKS, *_UNBROKEN])
TEXT = st.lists(st.one_of(_TRICKY, st.text(max_size=5)), max_size=12).map("".join)
# The same tricks without the line breaks and control characters that are refused wherever they
# are: most of it is taken, so the properties see headers built, not only refusals.
_UNBROKEN_TEXT = st.lists(st.one_of(st.sampled_from(_UNBROKEN), st.text(
    st.characters(exclude_categories=("Cc", "Cs", "Zl", "Zp")), max_size=5)), max_size=12).map("".join)
FILE_NAME = TEXT.filter(lambda n: "/" not in n and "\x00" not in n and n not in ("", ".", "..")
                        and len(n.encode("utf-8", "surrogatepass")) < 200)
_LOCAL = st.text(st.characters(codec="utf-8", exclude_characters="@"), min_size=1, max_size=12)
ADDRESS = st.one_of(
    st.builds(lambda local, dom: f"{local}@{dom}", _LOCAL,
              st.sampled_from(["example.com", "bücher.example", "exa mple.com", "x"])),
    TEXT)
# Dot-atoms, some of them not ASCII: addresses the rules take, most of them.
_ATOMS = st.lists(st.text(st.sampled_from("abcXYZ019!#$%&'*+/=?^_`{|}~-éß日"), min_size=1,
                          max_size=10), min_size=1, max_size=3).map(".".join)
WELL_FORMED = st.builds(lambda local, dom: f"{local}@{dom}", _ATOMS,
                        st.sampled_from(["example.com", "bücher.example", "mail.example.org"]))


def mostly(taken: st.SearchStrategy[Any], hostile: st.SearchStrategy[Any],
           one_in: int = 4) -> st.SearchStrategy[Any]:
    """``hostile`` one time in ``one_in``, else ``taken``: a property over several values each
    mostly refused would be given few inputs that get through, and fail the health check."""
    return st.integers(1, one_in).flatmap(lambda n: hostile if n == 1 else taken)


_UNBROKEN_FILE_NAME = _UNBROKEN_TEXT.filter(
    lambda n: "/" not in n and n.strip() not in ("", ".", "..") and len(n.encode("utf-8")) < 200)

# A refused input is discarded (assume), and filter_too_much is not suppressed: a property whose
# inputs are mostly refused checks little, so it fails the health check instead of passing.
PROPERTY = settings(max_examples=examples(300), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def _accepted(check: Any, value: str) -> bool:
    try:
        check(value)
    except InvalidContentError:
        return False
    return True


@PROPERTY
@given(subject=mostly(_UNBROKEN_TEXT, TEXT), recipient=mostly(WELL_FORMED, ADDRESS),
       sender=mostly(WELL_FORMED, ADDRESS))
@example(subject="é=?utf-8?b?00?=", recipient="0@example.com", sender="0@example.com")  # issue 49
def test_any_subject_and_addresses_make_exactly_the_intended_headers(
        subject: str, recipient: str, sender: str) -> None:
    try:
        message = build_message(event(subject=subject, recipient=recipient, sender=sender),
                                attachments_root=None, now=NOW)
    except ValueError:  # UnsafeHeaderError among them: refused, nothing to send
        assume(False)
    assert_exactly_the_intended_headers(message, attachments=0)


@pytest.fixture(scope="module")
def attachments_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One directory for every example's files, emptied after each (by :func:`files_named`)."""
    return tmp_path_factory.mktemp("attachments")


@contextlib.contextmanager
def files_named(root: Path, names: list[str]) -> Iterator[None]:
    """A file of each name in ``root`` (empty before) while the block runs; a name this file
    system cannot hold never reaches the sender, so the example is discarded."""
    try:
        for name in names:
            try:
                (root / name).write_bytes(b"data")
            except (OSError, UnicodeError):
                assume(False)
        yield
    finally:
        for path in root.iterdir():
            path.unlink()


@PROPERTY
@given(names=st.lists(mostly(_UNBROKEN_FILE_NAME, FILE_NAME), min_size=1, max_size=3, unique=True))
def test_any_file_names_make_exactly_the_intended_headers(
        attachments_root: Path, names: list[str]) -> None:
    with files_named(attachments_root, names):
        try:
            message = build_message(event(attachments=tuple(names)),
                                    attachments_root=attachments_root, now=NOW)
        except (ValueError, AttachmentError):
            assume(False)
    assert_exactly_the_intended_headers(message, attachments=len(names))


@PROPERTY
@given(subject=mostly(_UNBROKEN_TEXT, TEXT), recipient=mostly(WELL_FORMED, ADDRESS),
       names=st.lists(mostly(_UNBROKEN_FILE_NAME, FILE_NAME), max_size=2))
def test_what_enqueue_accepts_the_sender_can_send(
        attachments_root: Path, subject: str, recipient: str, names: list[str]) -> None:
    """enqueue's rules and its header check, then the sender's: one may not pass what the other
    refuses on the sender's side (the row would be written and then fail)."""
    assume(_accepted(check_subject, subject) and _accepted(check_address, recipient)
           and all(_accepted(check_attachment_path, n) for n in names))
    try:
        check_composable("reports@example.com", recipient.strip(), subject, names)
    except UnsafeHeaderError:
        assume(False)
    with files_named(attachments_root, names):
        message = build_message(event(subject=subject, recipient=recipient.strip(),
                                      attachments=tuple(names)),
                                attachments_root=attachments_root, now=NOW)
    assert_exactly_the_intended_headers(message, attachments=len(names))
    for policy in POLICIES:
        check_serialized(message, message.as_bytes(policy=policy))


# --- issue 49: encoded words whose bytes are not text in their charset

UNDECODABLE_WORDS = [
    ("é=?utf-8?b?00?=", "=?utf-8?b?00?="),           # 0xD3: no UTF-8; the SMTP policy failed
    ("=?utf-8?q?=E9?= report", "=?utf-8?q?=E9?="),
    ("=?x-no-such-charset?q?=E9?=", "=?x-no-such-charset?q?=E9?="),  # read as ASCII
    ("=?unknown-8bit?q?=E9?=", "=?unknown-8bit?q?=E9?="),
    ("Bericht =?UTF-8*de?B?/w==?=", "=?UTF-8*de?B?/w==?="),
]


@pytest.mark.parametrize(("subject", "word"), UNDECODABLE_WORDS)
def test_an_encoded_word_of_bytes_that_are_not_text_is_refused_by_one_rule(
        subject: str, word: str) -> None:
    """enqueue's rule, its header check and the sender's builder refuse it alike, naming the
    word and saying what is wrong with it (enqueue said "'ascii' codec can't encode ...")."""
    with pytest.raises(InvalidContentError) as rule:
        check_subject(subject)
    with pytest.raises(UnsafeHeaderError) as composed:
        check_composable("reports@example.com", "finance@example.com", subject, [])
    with pytest.raises(UnsafeHeaderError) as built:
        build_message(event(subject=subject), attachments_root=None, now=NOW)
    for refusal in (rule.value, composed.value, built.value):
        assert "subject holds" in str(refusal) and repr(word) in str(refusal)
        assert "not valid text in that charset" in str(refusal)
        assert "codec" not in str(refusal)


@pytest.mark.parametrize("subject", [
    "Rechnung =?utf-8?q?f=C3=BCr?= M=?iso-8859-1?q?=E4?=rz",  # text in its charset: decoded
    "=?utf-8?b?QQ?= padding missing", "=?x-no-such-charset?q?abc?=", "?= =? =?utf-8?q?", "\ufffd",
])
def test_an_encoded_word_of_text_is_taken_and_written_under_both_policies(subject: str) -> None:
    check_subject(subject)
    check_composable("reports@example.com", "finance@example.com", subject, [])
    message = build_message(event(subject=subject), attachments_root=None, now=NOW)
    assert_exactly_the_intended_headers(message, attachments=0)


def test_a_file_name_with_an_encoded_word_of_bytes_that_are_not_text_is_refused(
        tmp_path: Path) -> None:
    name = "=?utf-8?b?00?=.pdf"
    (tmp_path / name).write_bytes(b"%PDF")
    with pytest.raises(InvalidContentError, match="file name holds '=\\?utf-8"):
        check_attachment_path(name)
    with pytest.raises(UnsafeHeaderError, match="file name holds '=\\?utf-8"):
        check_composable("reports@example.com", "finance@example.com", "s", [name])
    with pytest.raises(UnsafeHeaderError, match="file name holds '=\\?utf-8"):
        build_message(event(attachments=(name,)), attachments_root=tmp_path, now=NOW)


def test_a_header_of_undecodable_bytes_is_refused_whatever_put_it_there() -> None:
    """The last check of every built message, behind the rule: a header the library keeps
    undecodable bytes in, and that one of the two policies cannot write, is refused."""
    message = EmailMessage(policy=email.policy.SMTP)
    message["Subject"] = "é=?utf-8?b?00?="
    with pytest.raises(UnicodeEncodeError):
        message.as_bytes(policy=email.policy.SMTP)
    with pytest.raises(UnsafeHeaderError, match="Subject header \\(the subject\\) would hold "
                                                "bytes that are not text"):
        mime.check_decoded_headers(message)


# Encoded words of any bytes in charsets known, unknown and 8-bit, among the usual pieces.
_ANY_BYTES_WORD = st.builds(
    lambda charset, b64, raw: (
        f"=?{charset}?{'b' if b64 else 'q'}?"
        + (binascii.b2a_base64(raw, newline=False).decode() if b64
           else "".join(f"={byte:02X}" for byte in raw)) + "?="),
    st.sampled_from(["utf-8", "UTF-8", "iso-8859-1", "us-ascii", "shift_jis", "unknown-8bit",
                     "x-unknown", "utf-8*en"]),
    st.booleans(), st.binary(max_size=6))
_WORDS_AND_TEXT = st.lists(st.one_of(_ANY_BYTES_WORD, _TRICKY, st.text(max_size=4)),
                           max_size=6).map("".join)


@PROPERTY
@given(subject=_WORDS_AND_TEXT)
# A NUL inside an encoded word: the library decodes the word to nothing, and only a check of the
# raw text sees the character (make test found it).
@example(subject="=?utf-8?b?\x00?=")
def test_the_builder_never_returns_a_message_a_policy_cannot_write(subject: str) -> None:
    """Refused (and by enqueue's header check alike), or written under both policies."""
    try:
        message = build_message(event(subject=subject), attachments_root=None, now=NOW)
    except UnsafeHeaderError:
        assert not _composable(subject)
        return
    for policy in POLICIES:
        check_serialized(message, message.as_bytes(policy=policy))
    assert _composable(subject)


def _composable(subject: str) -> bool:
    try:
        check_composable("reports@example.com", "finance@example.com", subject, [])
    except UnsafeHeaderError:
        return False
    return True


# --- the quick check against the full build (issue 26): the build is the reference

# Pieces near every edge of what the quick check calls plain: "=" and "?" apart and together,
# the characters quoting and RFC 2231 use, Unicode blanks and marks, long words; then what is not
# plain (line breaks raw and encoded, lone surrogates).
_PLAIN_PIECE = st.sampled_from(["=", "?", "?=", "= ?", "=\t?", "_", '"', "\\", ";", "'", "''", "*",
                                "*0*", "%", "%0D%0A", "=0D=0A", "utf-8''", "filename=", "(", ")",
                                "<", ">", ",", ":", "@", "[", "]", " ", "  ", "\t", "\xa0",
                                "\u3000", "\u2000", "\u200b", "\ufeff", "\u0301", "\xad", "é",
                                "ß", "日本", "\U0001f600", "x" * 80, "é" * 60, "日" * 120,
                                "Bcc: x@y.z"])
_UNPLAIN_PIECE = st.sampled_from(["=?", "\r\n", "\n", "\x85", "\u2028", "\x00", "\x7f",
                                  "\udc80", "\ud800"])


def _encoded_word(charset: str, base64: bool, text: str) -> str:
    raw = text.encode(charset, "replace")
    payload = (binascii.b2a_base64(raw, newline=False).decode() if base64
               else "".join(f"={byte:02X}" for byte in raw))
    return f"=?{charset}?{'b' if base64 else 'q'}?{payload}?="


ENCODED_WORD = st.builds(_encoded_word, st.sampled_from(["utf-8", "iso-8859-1", "us-ascii"]),
                         st.booleans(),
                         st.lists(st.sampled_from(["\r\n", "\n", "\r", "\x00", "\x85", " ",
                                                   "Bcc: x@y.z", "a", "é"]),
                                  max_size=4).map("".join))
PLAIN_TEXT = st.lists(st.one_of(_PLAIN_PIECE, st.text(max_size=4)), max_size=10).map("".join)
EDGE_TEXT = st.lists(st.one_of(_PLAIN_PIECE, _UNPLAIN_PIECE, ENCODED_WORD, st.text(max_size=4)),
                     max_size=10).map("".join)
_ATEXT_ASCII = "abcXYZ019!#$%&'*+/=?^_`{|}~-"
_ASCII_LOCAL = st.lists(st.text(st.sampled_from(_ATEXT_ASCII), min_size=1, max_size=30),
                        min_size=1, max_size=3).map(lambda atoms: ".".join(atoms)[:64])
_EDGE_LOCAL = st.one_of(
    _ASCII_LOCAL, ENCODED_WORD,
    st.lists(st.text(st.sampled_from([*_ATEXT_ASCII, "é", "\ufeff", "\xa0", "日"]), min_size=1,
                     max_size=25), min_size=1, max_size=3).map(".".join))
_ASCII_DOMAIN = st.lists(st.text(st.sampled_from("abz09-"), min_size=1, max_size=63),
                         min_size=1, max_size=4).map(".".join)
# Internationalised domains: the library writes them as encoded words, which fold when long.
_EDGE_DOMAIN = st.one_of(_ASCII_DOMAIN, st.lists(st.text(st.sampled_from("abz09-üß日本é"),
                                                         min_size=1, max_size=30),
                                                 min_size=1, max_size=3).map(".".join))
PLAIN_ADDRESS = st.builds(lambda local, domain: f"{local}@{domain}"[:254], _ASCII_LOCAL,
                          _ASCII_DOMAIN)
EDGE_ADDRESS = st.builds(lambda local, domain: f"{local}@{domain}"[:254], _EDGE_LOCAL,
                         _EDGE_DOMAIN)


def _outcome(check: Any, *values: Any) -> str:
    try:
        check(*values)
    except UnsafeHeaderError as exc:
        return f"refused: {exc}"
    return "composable"


DIFFERENTIAL = settings(PROPERTY, max_examples=examples(150))


@DIFFERENTIAL
@given(sender=st.one_of(PLAIN_ADDRESS, EDGE_ADDRESS, ADDRESS),
       recipient=st.one_of(PLAIN_ADDRESS, EDGE_ADDRESS, ADDRESS),
       subject=st.one_of(PLAIN_TEXT, EDGE_TEXT, TEXT),
       names=st.lists(st.one_of(PLAIN_TEXT, EDGE_TEXT, FILE_NAME), max_size=2))
def test_the_quick_check_refuses_exactly_what_the_build_refuses(
        sender: str, recipient: str, subject: str, names: list[str]) -> None:
    """Any values at all, hostile ones among them: the same verdict, refusals with the same
    reason, and never an error of the library's own (IndexError, UnicodeEncodeError, ...)."""
    values = (sender.strip(), recipient.strip(), subject, names)
    assert _outcome(check_composable, *values) == _outcome(check_composable_by_building, *values)


@settings(PROPERTY, max_examples=examples(80))
@given(sender=mostly(PLAIN_ADDRESS, EDGE_ADDRESS, 8),
       recipient=mostly(PLAIN_ADDRESS, EDGE_ADDRESS, 8), subject=mostly(PLAIN_TEXT, EDGE_TEXT, 8),
       names=st.lists(mostly(PLAIN_TEXT, EDGE_TEXT, 8), max_size=3))
def test_values_the_quick_check_passes_are_composable(
        sender: str, recipient: str, subject: str, names: list[str]) -> None:
    """The quick check's claim itself, on values it decides without building (the ones it
    sends to the build are covered above): the full build accepts every one."""
    monkeypatch = pytest.MonkeyPatch()
    built: list[str] = []
    with monkeypatch.context() as patched:
        patched.setattr(mime, "check_composable_by_building",
                        lambda *values: built.append("built"))
        check_composable(sender, recipient, subject, names)
    assume(not built)
    check_composable_by_building(sender, recipient, subject, names)


@pytest.mark.parametrize(("recipient", "subject", "names"), [
    ("finance@example.com", "Invoice 2026-0917 for ACME Ltd. (due 30 Oct)", ["invoice.pdf"]),
    ("o'neil+reports@sub.example.co.uk", "Rechnung für März — 1.234,56 €", ["Rechnung März.pdf"]),
    ("x@example.com", "日本語の件名 " + "y" * 900, ["報告書 2026年9月.xlsx", 'a "quoted"; name.csv']),
    ("x@example.com", "? = ?= _ % 100% done\ttabbed", ["=.pdf", "?.pdf"]),
])
def test_ordinary_values_pass_without_a_message_built(
        monkeypatch: pytest.MonkeyPatch, recipient: str, subject: str, names: list[str]) -> None:
    def build(*values: object) -> None:
        raise AssertionError(f"built a message for {values!r}")

    monkeypatch.setattr(mime, "check_composable_by_building", build)
    check_composable("reports@example.com", recipient, subject, names)


@pytest.mark.parametrize(("sender", "recipient", "subject", "names"), [
    ("reports@example.com", "finance@example.com", "Invoice é\udc80", []),  # UnicodeEncodeError
    ("reports@example.com", "finance@example.com", "Invoice \ud800", []),
    ("reports@example.com", "finance@example.com", "Invoice", ["a\ud800.pdf"]),
    ("=?utf-8?q??=@example.com", "finance@example.com", "Invoice", []),  # IndexError
    ("reports@example.com", "=?utf-8?q??=@example.com", "Invoice", []),
])
def test_what_the_library_cannot_write_is_refused_not_raised(
        sender: str, recipient: str, subject: str, names: list[str]) -> None:
    """A value that passes postroom.rules but that the library fails on (with an error of its
    own) is refused like any other: enqueue raised UnicodeEncodeError for such a subject."""
    with pytest.raises(UnsafeHeaderError, match=r"cannot make headers|bytes that are not text"):
        check_composable(sender, recipient, subject, names)


@pytest.mark.parametrize(("recipient", "subject", "names"), [
    ("a" * 47 + "@bücher.example", "S", []),  # an encoded domain that folds
    ("=?utf-8?q?a=0D=0A?=@example.com", "S", []),  # an encoded line break in the local part
    ("finance@example.com", "=?utf-8?b?DQpCY2M6IHhAeS56?=", []),
    ("finance@example.com", "S", ['=?utf-8?q?a=0D=0AX-Evil:_1?=.pdf']),
])
def test_what_the_build_refuses_the_quick_check_refuses(
        recipient: str, subject: str, names: list[str]) -> None:
    with pytest.raises(UnsafeHeaderError) as quick:
        check_composable("reports@example.com", recipient, subject, names)
    with pytest.raises(UnsafeHeaderError) as built:
        check_composable_by_building("reports@example.com", recipient, subject, names)
    assert str(quick.value) == str(built.value)
