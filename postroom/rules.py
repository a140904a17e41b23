"""What the parts of an email may hold: the one set of rules enqueue and the sender both apply.

Pure. Each ``check_*`` returns the value to use or raises :class:`~postroom.errors.InvalidContentError`
saying what is wrong with it; relay translates that into its EnqueueError, the sender into a poison
record.
"""

from __future__ import annotations

import base64
import binascii
import codecs
import dataclasses
import functools
import re
from pathlib import PurePosixPath

from postroom.errors import InvalidContentError

MAX_ADDRESS_LEN = 254  # RFC 5321 path limit less the angle brackets
MAX_LOCAL_LEN = 64
MAX_SUBJECT_LEN = 998  # RFC 5322 line limit
MAX_KEY_LEN = 1000
# The longest idempotency key enqueue writes: an escaped message key, the bar and an address.
IDEMPOTENCY_KEY_MAX_CHARS = 2 * MAX_KEY_LEN + 1 + MAX_ADDRESS_LEN
# The most UTF-8 bytes of a message or idempotency key: the outbox and the ledger index them,
# and a PostgreSQL btree entry holds at most 2,704 bytes (8 kB pages), its header and, in
# outbox_message_key, the row's id included. A longer key failed in the database: the job's
# transaction aborted, or the sender's claims retried for ever.
KEY_MAX_BYTES = 2_600
MAX_ATTACHMENTS = 100
DEFAULT_BODY_MAX_BYTES = 512 * 1024
DEFAULT_ATTACHMENT_MAX_BYTES = 25 * 1024 * 1024
# An encoded event must fit the broker's message.max.bytes (1 MiB by default) with room for the
# headers the retry tiers and the dead-letter topic add.
DEFAULT_EVENT_MAX_BYTES = 768 * 1024
EVENT_MAX_BYTES_CEILING = 900 * 1024
# File systems whose files are not data a job wrote: mailing them leaks the host.
PSEUDO_FILESYSTEM_ROOTS = ("/proc", "/sys", "/dev", "/run")



@dataclasses.dataclass(frozen=True)
class SizeLimits:
    """The largest body, attachment, attachments of one email, and encoded event accepted."""

    body_max_bytes: int = DEFAULT_BODY_MAX_BYTES
    attachment_max_bytes: int = DEFAULT_ATTACHMENT_MAX_BYTES
    attachments_total_max_bytes: int = DEFAULT_ATTACHMENT_MAX_BYTES
    event_max_bytes: int = DEFAULT_EVENT_MAX_BYTES


# C0 controls but tab, DEL, C1 controls (NEL among them) and the Unicode line and paragraph
# separators: everything str.splitlines() or a mail reader may take for a line break.
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")
_TAB = re.compile(r"\t")
# RFC 5322 atext, plus any non-ASCII character (RFC 6531 UTF8-non-ascii) for SMTPUTF8; not a
# lone surrogate, which is no character and which no charset can write.
_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~\-\u0080-\ud7ff\ue000-\U0010ffff]+"
_LOCAL = re.compile(rf"^{_ATEXT}(\.{_ATEXT})*$")
_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")
# A label that starts as an A-label does, in any case: decoded and checked by UTS-46.
_A_LABEL = re.compile(r"(?:^|\.)xn--", re.IGNORECASE)


def has_control(text: str, *, tab_allowed: bool = False) -> bool:
    """Whether ``text`` holds a character that could end a header line or hide in one."""
    return bool(_CONTROL.search(text) or (not tab_allowed and _TAB.search(text)))


def require_str(value: object, what: str) -> str:
    """``value`` when it is a string; InvalidContentError (never TypeError) for None or others."""
    if not isinstance(value, str):
        raise InvalidContentError(f"{what} must be a string, not {type(value).__name__}")
    return value


def canonical_domain(domain: str) -> str:
    """The one spelling of ``domain``: lower case, each label an IDNA 2008 A-label as UTS-46
    processing (non-transitional) gives it, so ``BÜCHER.example``, its full-width form and
    ``XN--BCHER-KVA.example`` are all ``xn--bcher-kva.example``. An ASCII domain without an
    ``xn--`` label is only lowered (UTS-46 maps nothing else in it). InvalidContentError, with
    the reason, for a domain UTS-46 refuses (a symbol, a bad A-label, ``--`` in a label's 3rd
    and 4th places beside a non-ASCII label, an empty label)."""
    if domain.isascii() and _A_LABEL.search(domain) is None:
        return domain.lower()
    # Imported here: a job's `from postroom import enqueue` loads the standard library only, and
    # most domains never need it.
    import idna  # pure: UTS-46 and IDNA 2008 tables, no I/O

    try:
        return idna.encode(domain, uts46=True).decode("ascii")
    except UnicodeError as exc:  # idna.IDNAError and its kinds are UnicodeErrors
        raise InvalidContentError(f"{domain!r} is not a valid internationalised domain name "
                                  f"(UTS-46: {exc})") from None


def ascii_domain_address(address: str) -> str:
    """``local@domain`` (or a From's ``Name <local@domain>``) with a non-ASCII domain spelled by
    :func:`canonical_domain`: an ASCII address needs no SMTPUTF8 for its domain alone. Anything
    else is returned as it came (a text that is no address, or whose domain UTS-46 refuses, is
    refused where it is checked)."""
    if address.isascii():
        return address
    local, at, domain = address.rpartition("@")
    if not at or domain.isascii():
        return address
    bracket = ">" if domain.endswith(">") else ""
    try:
        return f"{local}@{canonical_domain(domain[:len(domain) - len(bracket)])}{bracket}"
    except InvalidContentError:
        return address


def mailbox_address(address: str) -> str:
    """A checked address (:func:`check_address`) as postroom stores, sends and compares it: the
    local part as written, a non-ASCII domain as :func:`canonical_domain` spells it (an ASCII
    one as written). Its lower case is the mailbox's identity (:func:`mailbox_identity`).
    InvalidContentError when the domain is refused or the address grows past
    MAX_ADDRESS_LEN in IDNA form."""
    if address.isascii():
        return address
    local, _, domain = address.rpartition("@")
    if domain.isascii():
        return address
    mailbox = f"{local}@{canonical_domain(domain)}"
    if len(mailbox) > MAX_ADDRESS_LEN:
        raise InvalidContentError(f"{address!r} is longer than {MAX_ADDRESS_LEN} characters "
                                  "with its domain in IDNA form")
    return mailbox


def respelled_key(idempotency_key: str, recipient: str) -> str:
    """The key enqueue writes now for a key written for ``recipient`` as given (before migration
    0015): its ending, the recipient in lower case, becomes the mailbox's identity. The key as
    it is when it does not end so, or the recipient is spelled as a row now holds it."""
    mailbox = ascii_domain_address(recipient)
    lowered = recipient.lower()
    if mailbox == recipient or not idempotency_key.endswith(lowered):
        return idempotency_key
    return idempotency_key[:len(idempotency_key) - len(lowered)] + mailbox.lower()


def mailbox_identity(address: str) -> str:
    """The one identity of the mailbox a checked address names: :func:`mailbox_address` in
    lower case, every spelling of the domain (case, U-label or A-label, full-width or other
    UTS-46-mapped forms) one; the local part lowered too, a sub-address (``a+tag@``) still an
    address of its own. For an ASCII address, its lower case, as it always was."""
    return mailbox_address(address).lower()


def check_recipient(address: object, *, what: str = "recipient") -> str:
    """:func:`check_address`, then :func:`mailbox_address`: the address as a row or a
    suppression entry holds it; InvalidContentError for either's refusal."""
    checked = check_address(address, what=what)
    return checked if checked.isascii() else mailbox_address(checked)


# An address most lists are made of, accepted whole by one match: an ASCII dot-atom local part
# of at most MAX_LOCAL_LEN characters, ASCII labels of 1-63 characters without an edge hyphen,
# nothing around it, and no ``--`` anywhere (so no A-label, which is decoded to be checked; one
# test of the string, not a look-ahead at every label). check_address_by_parts decides every
# other text (and the differential test in tests/unit/postroom/test_rules_address.py holds the
# two equal): 0.5 µs an address
# against the parts' 2.3 µs, 0.2 s of a call with 100,000 recipients.
_PLAIN_LOCAL = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*"
_PLAIN_LABEL = r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)"
_PLAIN_ADDRESS = re.compile(
    rf"(?=[^@]{{1,{MAX_LOCAL_LEN}}}@){_PLAIN_LOCAL}@{_PLAIN_LABEL}(?:\.{_PLAIN_LABEL})*")


def check_address(address: object, *, what: str = "recipient") -> str:
    """The address with surrounding blanks removed: one bare ``local@domain``, nothing else.

    A display name, a list, a comment or angle brackets are refused: the envelope and the To
    header must name the same single mailbox. A non-ASCII domain, or one with an ``xn--`` label,
    is checked as :func:`canonical_domain` spells it; a non-ASCII local part is accepted (it
    needs a server with SMTPUTF8 at delivery time).
    A plain ASCII address is accepted by one match (``_PLAIN_ADDRESS``); any other text is
    decided by :func:`check_address_by_parts`, the reference.
    """
    if (type(address) is str and len(address) <= MAX_ADDRESS_LEN and "--" not in address
            and _PLAIN_ADDRESS.fullmatch(address) is not None):
        return address
    return check_address_by_parts(address, what=what)


def check_address_by_parts(address: object, *, what: str = "recipient") -> str:
    """:func:`check_address` part by part: the reference its one-match fast path must agree
    with, and the decision (and refusal message) for every address that is not plain."""
    text = require_str(address, what)
    if has_control(text):
        raise InvalidContentError(f"{what} {text!r} contains a control character (CR, LF, ...)")
    value = text.strip()
    if not value:
        raise InvalidContentError(f"{what} is empty")
    if len(value) > MAX_ADDRESS_LEN:
        raise InvalidContentError(f"{what} {value!r} is longer than {MAX_ADDRESS_LEN} characters")
    local, at, domain = value.rpartition("@")
    if not at or not local or not domain:
        raise InvalidContentError(f"{what} {value!r} is not of the form local@domain")
    if not _LOCAL.match(local) or len(local.encode()) > MAX_LOCAL_LEN:
        raise InvalidContentError(f"{what} {value!r} has an invalid local part (one bare "
                                  "address only: no name, list, comment or <...>)")
    try:
        labels = canonical_domain(domain).split(".")
    except InvalidContentError as exc:
        raise InvalidContentError(f"{what} {value!r} has an invalid domain: {exc}") from None
    if not all(_LABEL.match(label) for label in labels):
        raise InvalidContentError(f"{what} {value!r} has an invalid domain")
    return value


def check_mailbox(mailbox: object, *, what: str = "sender") -> str:
    """A From mailbox: a bare address as :func:`check_address` wants it, or one
    ``Display Name <local@domain>``; never a list."""
    text = require_str(mailbox, what)
    if "<" not in text and ">" not in text:
        return check_address(text, what=what)
    if has_control(text):
        raise InvalidContentError(f"{what} {text!r} contains a control character (CR, LF, ...)")
    name, _, rest = text.strip().rpartition("<")
    if not rest.endswith(">") or any(c in name for c in '<>",;:@\\'):
        raise InvalidContentError(f"{what} {text!r} is not one address or one 'Name <address>'")
    check_address(rest[:-1], what=what)
    return text.strip()


def check_subject(subject: object) -> str:
    text = require_str(subject, "subject")
    if has_control(text, tab_allowed=True):
        raise InvalidContentError("subject contains a line break or control character (CR, LF, "
                                  "NEL, U+2028, ...): it would let text into the headers")
    if _SURROGATE.search(text):
        raise InvalidContentError("subject holds a lone surrogate (U+D800 to U+DFFF), which is "
                                  "no character: the text was decoded wrongly before it came")
    word = undecodable_encoded_word(text)
    if word is not None:
        raise InvalidContentError(encoded_word_problem("subject", word))
    if not text.strip():
        raise InvalidContentError("subject is empty")
    if len(text) > MAX_SUBJECT_LEN:
        raise InvalidContentError(f"subject is longer than {MAX_SUBJECT_LEN} characters")
    return text


# An RFC 2047 encoded word as the standard library's header parser finds one (it decodes them
# even inside a word, not only between blanks as the RFC says): "=?", a charset (with an
# optional "*language"), "b" or "q", the payload, "?="; no blank and no other "?" inside.
_ENCODED_WORD = re.compile(r"=\?([^?\s]+)\?([bBqQ])\?([^?\s]*)\?=")
_QUOTED_BYTE = re.compile(rb"=([0-9A-Fa-f]{2})")
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def undecodable_encoded_word(text: str) -> str | None:
    """The first encoded word in ``text`` whose bytes are not text in its charset (ASCII when
    Python knows no such charset), or None. A mail reader, and the standard library building
    the header, decodes ``=?utf-8?b?00?=`` to the byte 0xD3, which is no UTF-8: the library
    keeps it as an undecodable byte, which a header for a 7-bit server cannot be written with.
    Its payload is read as leniently as the library reads it (missing base64 padding added,
    characters outside the alphabet skipped)."""
    if "=?" not in text:
        return None
    for found in _ENCODED_WORD.finditer(text):
        charset, encoding, payload = found.groups()
        raw = _encoded_word_bytes(encoding.lower(), payload)
        if raw is None:
            continue
        name = charset.partition("*")[0].lower()
        try:
            codecs.lookup(name)
        except LookupError:
            name = "ascii"  # the library's reading of a charset it does not know
        try:
            raw.decode(name)
        except (UnicodeDecodeError, LookupError):
            return found.group(0)
    return None


def _encoded_word_bytes(encoding: str, payload: str) -> bytes | None:
    """The bytes of an encoded word's payload; None when it is not ASCII (the library does not
    take it for an encoded word) or is base64 it cannot decode (then it keeps the text)."""
    if not payload.isascii():
        return None
    data = payload.encode("ascii")
    if encoding == "q":
        return _QUOTED_BYTE.sub(lambda m: bytes([int(m.group(1), 16)]), data.replace(b"_", b" "))
    try:
        return base64.b64decode(data + b"=" * (-len(data) % 4), validate=False)
    except binascii.Error:
        return None


def encoded_word_problem(what: str, word: str) -> str:
    """The refusal of ``what`` (the subject, an attachment's file name) for holding ``word``,
    in words for whoever wrote it."""
    shown = word if len(word) <= 60 else word[:57] + "..."
    return (f"{what} holds {shown!r}, which mail programs read as an RFC 2047 encoded word "
            "(=?charset?b-or-q?...?=), and its bytes are not valid text in that charset, so the "
            "email could not be written; write the text itself, not an encoded word")


def check_key(key: object) -> str:
    text = require_str(key, "message key")
    if has_control(text) or not text.strip():
        raise InvalidContentError("message key must be non-empty and free of control characters")
    if len(text) > MAX_KEY_LEN:
        raise InvalidContentError(f"message key is longer than {MAX_KEY_LEN} characters")
    size = key_bytes_over(text)
    if size is not None:
        raise InvalidContentError(f"message key is {size} bytes in UTF-8, longer than "
                                  f"{KEY_MAX_BYTES}")
    return text


def key_bytes_over(text: str) -> int | None:
    """The UTF-8 bytes of ``text`` when more than KEY_MAX_BYTES (a lone surrogate counted as
    three, as it is refused later), else None; encoded only when its length allows it."""
    if len(text) * 4 <= KEY_MAX_BYTES:
        return None
    size = len(text.encode("utf-8", "surrogatepass"))
    return size if size > KEY_MAX_BYTES else None


def check_idempotency_key(key: object) -> str:
    """An idempotency key as a row or record may hold it: non-empty, one line, no longer than
    enqueue writes, and within what the database can index."""
    text = require_str(key, "idempotency key")
    if not text.strip() or has_control(text):
        raise InvalidContentError("idempotency key is empty or holds a control character")
    if len(text) > IDEMPOTENCY_KEY_MAX_CHARS or key_bytes_over(text) is not None:
        raise InvalidContentError(f"idempotency key is longer than {IDEMPOTENCY_KEY_MAX_CHARS} "
                                  f"characters or {KEY_MAX_BYTES} bytes in UTF-8")
    return text


@functools.lru_cache(maxsize=1024)
def check_shared(sender: str, subject: str, message_key: str) -> None:
    """What every recipient of one message shares (its sender, subject and key), checked once
    per message that passes: the relay and the sender check each row and record, and a report
    has thousands. A failure is not kept: it raises every time."""
    if sender:  # empty: the sender's POSTROOM_MAIL_FROM
        check_mailbox(sender)
    check_subject(subject)
    check_key(message_key)


def check_body(body: object, max_bytes: int = DEFAULT_BODY_MAX_BYTES) -> str:
    text = require_str(body, "body")
    if "\x00" in text:
        raise InvalidContentError("body contains a NUL character")
    # ASCII text (isascii() reads a flag of the string) is as many bytes as characters
    size = (len(text) if type(text) is str and text.isascii()
            else len(text.encode("utf-8", "surrogatepass")))
    if size > max_bytes:
        raise InvalidContentError(f"body is {size} bytes, over the limit of {max_bytes} "
                                  "(POSTROOM_BODY_MAX_BYTES); attach large content as a file")
    return text


def check_attachment_path(path: object) -> str:
    """An attachment path as written: a string, no control character, at most one per name,
    nowhere under a pseudo file system; its file name must make a safe header parameter."""
    text = require_str(path, "attachment path")
    if has_control(text):
        raise InvalidContentError(f"attachment path {text!r} has a control character")
    if not text.strip() or PurePosixPath(text).name in ("", ".", ".."):
        raise InvalidContentError(f"attachment path {text!r} does not name a file")
    if on_pseudo_filesystem(text):
        raise InvalidContentError(f"attachment path {text!r} is on a pseudo file system "
                                  f"({', '.join(PSEUDO_FILESYSTEM_ROOTS)}); refusing it")
    word = undecodable_encoded_word(PurePosixPath(text).name)
    if word is not None:
        raise InvalidContentError(encoded_word_problem(f"attachment path {text!r}: its file name",
                                                       word))
    return text


def check_attachment_count(count: int) -> None:
    if count > MAX_ATTACHMENTS:
        raise InvalidContentError(f"{count} attachments, over the limit of {MAX_ATTACHMENTS}")


def on_pseudo_filesystem(path: str) -> bool:
    """Whether ``path`` (absolute, normalised by the caller) is ``/`` itself or lies under one
    of the kernel's pseudo file systems."""
    normal = PurePosixPath(path)
    if str(normal) == "/":
        return True
    return any(normal.is_relative_to(root) for root in PSEUDO_FILESYSTEM_ROOTS)


def check_root(path: str) -> str:
    """An attachments root: not ``/``, not a pseudo file system."""
    if on_pseudo_filesystem(path):
        raise InvalidContentError(f"{path} cannot be the attachments root: it is / or a pseudo "
                                  f"file system ({', '.join(PSEUDO_FILESYSTEM_ROOTS)})")
    return path
