"""Whether a message's headers say exactly what was meant: the check enqueue and the sender share.

Pure. A value can carry a line break past a check of its raw text (an RFC 2047 encoded word such as
``=?utf-8?q?=0D=0A?=`` is decoded by the standard library and, on some Python releases, written out
raw), so the check looks at what the headers decode to and at the bytes that go to the server.
Plain values (most of them) are known to compose without building a message; others are built.
"""

from __future__ import annotations

import email.policy
import re
from collections.abc import Sequence
from email.errors import HeaderParseError
from email.message import EmailMessage, Message
from email.parser import BytesParser

from postroom.errors import UnsafeHeaderError
from postroom.rules import encoded_word_problem, has_control, undecodable_encoded_word

_SKELETON_POLICIES = (email.policy.SMTP, email.policy.SMTPUTF8)


def header_layout(message: Message) -> list[list[str]]:
    """The header names of every MIME part, in order, lower case."""
    return [[name.lower() for name in part.keys()] for part in message.walk()]


# What a header's name is to whoever wrote the value, for a refusal they can act on.
_WRITTEN_AS = {"subject": "the subject", "from": "the sender", "to": "the recipient",
               "content-type": "an attachment's file name",
               "content-disposition": "an attachment's file name"}


def check_decoded_headers(message: EmailMessage) -> None:
    """UnsafeHeaderError when a header of any part decodes to text with a line break, or holds
    bytes that are not text (an encoded word such as ``=?utf-8?b?00?=``, whose byte 0xD3 is no
    UTF-8) and that one of the two SMTP policies cannot write."""
    for part in message.walk():
        for name, value in part.items():
            text = str(value)
            if has_control(text, tab_allowed=True):
                raise UnsafeHeaderError(
                    f"the {name} header would hold a line break or control character (after "
                    f"RFC 2047 decoding): {text[:80]!r}; refusing the message")
            # The library shows bytes it could not decode as U+FFFD and keeps them as lone
            # surrogates, which folding for a 7-bit server (or, mixed with other text, for any)
            # fails on; only then is the header written out here to find out (rarely: a genuine
            # U+FFFD is text and writes).
            if "\ufffd" in text and not _writable(name, value):
                raise UnsafeHeaderError(_undecodable_problem(name, text))


def _writable(name: str, value: str) -> bool:
    for policy in _SKELETON_POLICIES:
        try:
            policy.fold_binary(name, value)
        except _LIBRARY_REFUSALS:
            return False
    return True


def _undecodable_problem(name: str, text: str) -> str:
    what = _WRITTEN_AS.get(name.lower(), f"the {name} header")
    return (f"the {name} header ({what}) would hold bytes that are not text, shown as U+FFFD "
            f"in {text[:80]!r}: an RFC 2047 encoded word (=?charset?b-or-q?...?=) whose bytes are "
            "not valid in its charset, or a lone surrogate; refusing the message")


def check_serialized(message: Message, content: bytes) -> None:
    """UnsafeHeaderError unless ``content``, parsed as a receiver parses it, has exactly the
    headers of ``message``, part by part: a line break not followed by whitespace in any header
    would start a header (or end the header block) that nobody set."""
    parsed = BytesParser(policy=email.policy.compat32).parsebytes(content)
    meant, sent = header_layout(message), header_layout(parsed)
    if meant == sent:
        return
    for number, (want, got) in enumerate(zip(meant, sent, strict=False)):
        if want != got:
            extra = [name for name in got if name not in want]
            raise UnsafeHeaderError(
                f"serialised, part {number} would carry headers {got} instead of {want}"
                + (f" (added: {', '.join(extra)})" if extra else "")
                + "; a value holds an encoded line break; refusing the message")
    raise UnsafeHeaderError(f"serialised, the message would have {len(sent)} MIME parts instead "
                            f"of {len(meant)}; refusing the message")


# What the standard library writes as given and reads back as given, whatever the line length:
# an ASCII dot-atom address, and text with no encoded-word opener ("=?", which the parser decodes
# even inside an address or a quoted file name), no character that may end a line (tab aside)
# and no lone surrogate (which no charset can write). A header made of such values cannot decode
# to a line break or fold into another header; anything else is composed to find out. The
# differential test in tests/unit/postroom/test_mime.py holds this against the full build.
_ATOM = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_PLAIN_ADDRESS = re.compile(rf"{_ATOM}(?:\.{_ATOM})*@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*")
_NOT_PLAIN_TEXT = re.compile(r"=\?|[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")
# The library's own failures on what it cannot write or parse (a lone surrogate, an encoded word
# in an address that its parser trips over): each is a refusal of the values, never a crash.
_LIBRARY_REFUSALS = (ValueError, TypeError, IndexError, AttributeError, HeaderParseError)


def _plain_address(address: str) -> bool:
    return _PLAIN_ADDRESS.fullmatch(address) is not None and "=?" not in address


def _plain_text(text: str) -> bool:
    return _NOT_PLAIN_TEXT.search(text) is None


def check_composable(sender: str, recipient: str, subject: str,
                     attachment_names: Sequence[str]) -> None:
    """UnsafeHeaderError when a message with these values (and these attachment file names)
    would not have exactly its intended headers: what enqueue runs before writing a row.

    Plain values (see ``_PLAIN_ADDRESS`` and ``_NOT_PLAIN_TEXT``) pass without a message being
    built; any other is decided, and refused, by :func:`check_composable_by_building`.
    """
    if (_plain_address(sender) and _plain_address(recipient) and _plain_text(subject)
            and all(_plain_text(name) for name in attachment_names)):
        return
    check_composable_by_building(sender, recipient, subject, attachment_names)


def check_recipient_composable(recipient: str) -> None:
    """UnsafeHeaderError when ``recipient`` would not make exactly its To header: what enqueue
    asks of every recipient past the first, whose message :func:`check_composable` checks whole.
    A plain address passes without a message being built."""
    if _plain_address(recipient):
        return
    check_composable_by_building("postroom@localhost", recipient, "s", ())


def check_composable_by_building(sender: str, recipient: str, subject: str,
                                 attachment_names: Sequence[str]) -> None:
    """:func:`check_composable` by building the message with the standard library under both
    SMTP policies and reading its bytes back: the reference, about a thousand times slower.
    Text with a control character, or an encoded word whose bytes are not text in its charset,
    is refused first, by postroom.rules' words, as the sender's builder refuses it."""
    for what, text in (("subject", subject), *(("an attachment's file name", name)
                                               for name in attachment_names)):
        # As the sender's builder refuses it, before the library decodes an encoded word
        # around the character out of sight (=?utf-8?b?<NUL>?= reads back as nothing).
        if has_control(text, tab_allowed=True):
            raise UnsafeHeaderError(f"the {what} {text[:80]!r} contains a line break or control "
                                    "character; refusing the message")
        word = undecodable_encoded_word(text)
        if word is not None:
            raise UnsafeHeaderError(encoded_word_problem(what, word))
    for policy in _SKELETON_POLICIES:
        message = EmailMessage(policy=policy)
        try:
            message["From"] = sender
            message["To"] = recipient
            message["Subject"] = subject
            message.set_content("", charset="utf-8")
            for name in attachment_names:
                message.add_attachment(b"", maintype="application", subtype="octet-stream",
                                       filename=name)
        except _LIBRARY_REFUSALS as exc:  # the library's own refusal (a line break, say)
            raise UnsafeHeaderError(f"cannot make headers of these values: {exc}") from None
        check_decoded_headers(message)  # first: it says what the bytes' failure would not
        try:
            content = message.as_bytes(policy=policy)
        except _LIBRARY_REFUSALS as exc:
            raise UnsafeHeaderError(f"cannot make headers of these values: {exc}") from None
        check_serialized(message, content)
