"""Builds the MIME message for one EmailRequested: headers, a stable Message-ID, attachments, and
the envelope's DSN parameters.

Pure except for reading attachment files (sender/attachments.py), which must lie inside the
attachments root when one is set.
"""

from __future__ import annotations

import email.policy
import email.utils
import functools
import hashlib
import re
from datetime import datetime
from email.errors import HeaderParseError
from email.headerregistry import BaseHeader, HeaderRegistry
from email.message import EmailMessage
from pathlib import Path

from postroom.errors import InvalidContentError, UnsafeHeaderError
from postroom.mime import check_decoded_headers
from postroom.rules import (
    SizeLimits,
    ascii_domain_address,
    check_address,
    check_mailbox,
    encoded_word_problem,
    has_control,
    undecodable_encoded_word,
)
from postroom.schemas.codec import EmailRequested
from postroom.sender.attachments import DEFAULT_LIMITS, FilesBudget, mime_type_for, read_attachment

_DOMAIN = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?$")


def message_id_for(idempotency_key: str, domain: str) -> str:
    """The Message-ID of the email with ``idempotency_key``: the same on every attempt.

    ``<`` + the first 32 hex digits of SHA-256(key) + ``@domain>``.
    """
    domain = domain.strip().strip("<>").lower()
    if not domain.isascii():
        try:
            domain = domain.encode("idna").decode("ascii")
        except UnicodeError as exc:
            raise UnsafeHeaderError(f"not a domain for a Message-ID: {domain!r}") from exc
    if not _DOMAIN.match(domain):
        raise UnsafeHeaderError(f"not a domain for a Message-ID: {domain!r}")
    digest = hashlib.sha256(idempotency_key.encode("utf-8")).hexdigest()[:32]
    return f"<{digest}@{domain}>"


HEADER_CACHE_SIZE = 4096  # distinct (name, value) pairs kept parsed


class _CachedHeaderRegistry(HeaderRegistry):
    """The standard registry, with two caches: each header class is built once (the stock one
    makes a new class with ``type()`` on every lookup), and each header is parsed once per name
    and value, since every recipient of one message shares most of them. Headers are immutable."""

    @functools.cache  # noqa: B019 - one registry lives as long as the module
    def __getitem__(self, name: str) -> type[BaseHeader]:
        return super().__getitem__(name)

    @functools.lru_cache(maxsize=HEADER_CACHE_SIZE)  # noqa: B019 - as above
    def __call__(self, name: str, value: str) -> BaseHeader:
        return super().__call__(name, value)


MESSAGE_POLICY = email.policy.SMTP.clone(header_factory=_CachedHeaderRegistry())


def build_message(
    event: EmailRequested, *, attachments_root: Path | None, now: datetime,
    limits: SizeLimits = DEFAULT_LIMITS,
) -> EmailMessage:
    """The message for ``event``, dated ``now``, with its attachments (and inline images) read
    from disk: text alone, or text and HTML as multipart/alternative, inside multipart/mixed
    when there are attachments.

    Raises UnsafeHeaderError for a line break in the recipient, sender, subject or an
    attachment's file name, also one an RFC 2047 encoded word would decode to, for an encoded
    word there whose bytes are not text in its charset (enqueue's rule), and
    AttachmentError for an attachment that is missing, unreadable, not a regular file, too
    large, or outside ``attachments_root`` (such a file is never opened). Blocking file I/O:
    call it off the event loop.
    """
    check_header_values(event)
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    message = EmailMessage(policy=MESSAGE_POLICY)
    try:
        # An IDNA domain, not an encoded word (invalid in an address) nor raw UTF-8 (SMTPUTF8).
        message["From"] = ascii_domain_address(event.sender)
        message["To"] = ascii_domain_address(event.recipient)
        message["Subject"] = event.subject
    except (ValueError, IndexError, HeaderParseError) as exc:  # the library's parser gave up
        raise UnsafeHeaderError(f"cannot make headers of these values: {exc!r}") from None
    message["Date"] = email.utils.format_datetime(now)
    message["Message-ID"] = message_id_for(event.idempotency_key, sender_domain(event.sender))
    message.set_content(event.body, charset="utf-8")
    budget = FilesBudget(limits.attachments_total_max_bytes,
                         "the attachments and inline images" if event.inline and event.attachments
                         else "the inline images" if event.inline else "the attachments")
    if event.html is not None:
        add_html(message, event, attachments_root, limits, budget)
    for raw_path in event.attachments:
        name, data = read_attachment(raw_path, attachments_root,
                                     max_bytes=limits.attachment_max_bytes, budget=budget)
        _refuse_undecodable(f"attachment {raw_path!r}: its file name", name)
        maintype, _, subtype = mime_type_for(name).partition("/")
        try:
            message.add_attachment(data, maintype=maintype, subtype=subtype, filename=name)
        except ValueError as exc:  # the library's own refusal of a line break
            raise UnsafeHeaderError(f"attachment file name {name!r}: {exc}") from None
    check_decoded_headers(message)
    return message


def check_header_values(event: EmailRequested) -> None:
    """UnsafeHeaderError for a line break or control character in the recipient, sender or
    subject, or a recipient or sender that is not one address."""
    _refuse_unsafe("recipient", event.recipient)
    try:
        check_address(event.recipient)
    except InvalidContentError as exc:
        raise UnsafeHeaderError(str(exc)) from None
    _check_shared_values(event.sender, event.subject)


@functools.lru_cache(maxsize=1024)
def _check_shared_values(sender: str, subject: str) -> None:
    """The sender and subject checks of :func:`check_header_values`, once per pair that passes
    (every recipient of a report shares them; a failure is not kept and raises every time)."""
    _refuse_unsafe("sender", sender)
    _refuse_unsafe("subject", subject)
    _refuse_undecodable("subject", subject)
    try:
        check_mailbox(sender)
    except InvalidContentError as exc:
        raise UnsafeHeaderError(str(exc)) from None


def add_html(message: EmailMessage, event: EmailRequested, attachments_root: Path | None,
             limits: SizeLimits = DEFAULT_LIMITS, budget: FilesBudget | None = None) -> None:
    """The HTML body after the text one (multipart/alternative), with its inline images as
    multipart/related parts whose Content-ID is ``<file name>``, so ``cid:<file name>`` in
    the HTML shows them. Inline files are read like attachments: below the root only, and
    within the ``budget`` they share with the attachments."""
    if budget is None:
        budget = FilesBudget(limits.attachments_total_max_bytes, "the inline images")
    message.add_alternative(event.html, subtype="html", charset="utf-8")
    *_, html_part = message.iter_parts()  # add_alternative made the message text, then html
    for raw_path in event.inline:
        name, data = read_attachment(raw_path, attachments_root,
                                     max_bytes=limits.attachment_max_bytes, budget=budget)
        _refuse_undecodable(f"inline image {raw_path!r}: its file name", name)
        maintype, _, subtype = mime_type_for(name).partition("/")
        html_part.add_related(data, maintype=maintype, subtype=subtype, cid=f"<{name}>",
                              filename=name, disposition="inline")


def _refuse_undecodable(what: str, value: str) -> None:
    """enqueue's rule for text that looks like an encoded word (postroom.rules): its bytes must
    be text in its charset."""
    word = undecodable_encoded_word(value)
    if word is not None:
        raise UnsafeHeaderError(encoded_word_problem(what, word))


def _refuse_unsafe(what: str, value: str) -> None:
    if has_control(value, tab_allowed=True):
        raise UnsafeHeaderError(
            f"{what} {value!r} contains a line break or control character")


@functools.lru_cache(maxsize=1024)
def sender_domain(address: str) -> str:
    """The domain of the sender's address: the Message-ID's right-hand side."""
    _, addr_spec = email.utils.parseaddr(address)
    return (addr_spec or address).rpartition("@")[2] or "localhost"


# -- the envelope's DSN parameters (RFC 3461) -----------------------------------------------------

# What a bounce should carry: the headers only (RET=HDRS), never the report's body and files
# again; and a notice on failure or delay, none on success.
DSN_RET = "HDRS"
DSN_NOTIFY = "FAILURE,DELAY"


def xtext(text: str) -> str:
    """``text`` as RFC 3461 section 4 xtext: printable ASCII but ``+`` and ``=`` kept, every other
    octet of its UTF-8 form written ``+HH``."""
    return "".join(chr(b) if 33 <= b <= 126 and b not in (43, 61) else f"+{b:02X}"
                   for b in text.encode("utf-8"))


def dsn_mail_parameters(envid: str) -> tuple[str, ...]:
    """The MAIL FROM parameters that ask a DSN-offering server to return the headers and
    ``envid`` in any notice."""
    return (f"RET={DSN_RET}", f"ENVID={xtext(envid)}")


def dsn_rcpt_parameters(recipient: str) -> tuple[str, ...]:
    """The RCPT TO parameters asking for a notice on failure or delay, naming ``recipient`` as
    the original recipient: ORCPT's rfc822 type holds only an ASCII address, so a non-ASCII one
    goes without it (the notice names the recipient in Final-Recipient still)."""
    if not recipient.isascii():
        return (f"NOTIFY={DSN_NOTIFY}",)
    return (f"NOTIFY={DSN_NOTIFY}", f"ORCPT=rfc822;{xtext(recipient)}")
