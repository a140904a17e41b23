"""Builds the MIME message for one EmailRequested: headers, a stable Message-ID, attachments.

Pure except for reading attachment files, which must lie inside the attachments root when one is set.
"""

from __future__ import annotations

import email.policy
import email.utils
import errno
import functools
import hashlib
import mimetypes
import os
import re
import stat
from collections.abc import Callable
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
    on_pseudo_filesystem,
    undecodable_encoded_word,
)
from postroom.schemas.codec import EmailRequested
from postroom.sender.errors import AttachmentError

DEFAULT_MIME_TYPE = "application/octet-stream"
# Extension -> MIME type, checked before the platform's mimetypes database, which varies by
# host and often lacks the office formats.
KNOWN_MIME_TYPES = {
    ".xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    ".xlsm": "application/vnd.ms-excel.sheet.macroEnabled.12",
    ".xls": "application/vnd.ms-excel",
    ".docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    ".doc": "application/msword",
    ".pptx": "application/vnd.openxmlformats-officedocument.presentationml.presentation",
    ".ppt": "application/vnd.ms-powerpoint",
    ".ods": "application/vnd.oasis.opendocument.spreadsheet",
    ".odt": "application/vnd.oasis.opendocument.text",
    ".csv": "text/csv",
    ".tsv": "text/tab-separated-values",
    ".pdf": "application/pdf",
    ".json": "application/json",
    ".zip": "application/zip",
}
# mimetypes reports "report.csv.gz" as text/csv with encoding gzip; the bytes are gzip.
_COMPRESSED_MIME_TYPES = {
    "gzip": "application/gzip",
    "bzip2": "application/x-bzip2",
    "xz": "application/x-xz",
    "compress": "application/x-compress",
    "br": "application/x-brotli",
}
_DOMAIN = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?$")
_NOFOLLOW = os.O_NOFOLLOW
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
# Non-blocking: opening a FIFO for reading would otherwise wait for a writer.
_OPEN_FLAGS = os.O_RDONLY | _NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
DEFAULT_LIMITS = SizeLimits()
READ_CHUNK_BYTES = 1024 * 1024


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


def attachments_refusal(event: EmailRequested, root: Path | None) -> str | None:
    """Why ``event``'s attachments may not be read at all, or None. Reading whatever path the
    process can read is not on: without a root chosen by the operator, no attachment is sent."""
    if (event.attachments or event.inline) and root is None:
        # The setting first: `postroom status` cuts a long error at its column's width.
        return "POSTROOM_ATTACHMENTS_ROOT is not set: attachments are off"
    return None


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


class FilesBudget:
    """What is left of POSTROOM_ATTACHMENTS_TOTAL_MAX_BYTES for an email's files still to read:
    its inline images and attachments count together, and a file that would pass it is refused
    by its size before it is read."""

    def __init__(self, total_max_bytes: int, what: str = "the attachments") -> None:
        self.total_max_bytes = total_max_bytes
        self.what = what
        self.used = 0

    @property
    def left(self) -> int:
        return max(0, self.total_max_bytes - self.used)

    def refusal(self, size: int) -> str | None:
        """Why a file of ``size`` more bytes does not fit, or None."""
        if self.used + size <= self.total_max_bytes:
            return None
        return (f"would take {self.what} to more than {self.total_max_bytes} bytes "
                "(POSTROOM_ATTACHMENTS_TOTAL_MAX_BYTES)")


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


def mime_type_for(filename: str) -> str:
    """The MIME type for an attachment named ``filename``."""
    known = KNOWN_MIME_TYPES.get(Path(filename).suffix.lower())
    if known:
        return known
    guessed, encoding = mimetypes.guess_type(filename, strict=False)
    if encoding is not None:
        return _COMPRESSED_MIME_TYPES.get(encoding, DEFAULT_MIME_TYPE)
    return guessed or DEFAULT_MIME_TYPE


def read_attachment(raw_path: str, root: Path | None, *,
                    max_bytes: int = DEFAULT_LIMITS.attachment_max_bytes,
                    budget: FilesBudget | None = None) -> tuple[str, bytes]:
    """The file name and bytes of one attachment; a relative path is taken from ``root``.

    With a root, the path must lie lexically inside it; it is then opened one component at a
    time from a descriptor of the root, never following a symbolic link at any level, so no
    swap of a directory for a link can lead outside. Without a root, only the last component
    must not be a link. The file is opened non-blocking (a FIFO cannot stall the caller) and
    the opened descriptor must be a regular file of at most ``max_bytes``, and of at most what
    is left of ``budget`` (which it is then counted in); both are checked by its size before
    it is read, and no more than they allow is read. Errors name the path as given, never
    where it lies on disk.
    """
    if has_control(raw_path) or not raw_path:
        raise _refused(raw_path, "is empty or contains a control character")
    given = Path(raw_path)
    path = root / given if root is not None and not given.is_absolute() else given
    if given.name in ("", ".", ".."):
        raise _refused(raw_path, "does not name a file")
    if root is not None:
        parts = _parts_below(path, root)
        if parts is None:
            # Refused before touching the file system: not even whether it exists is revealed.
            raise _refused(raw_path, f"is outside the attachments root {root}; refusing to read it")
        fd = _open_beneath(raw_path, root, parts)
    else:
        if on_pseudo_filesystem(os.path.normpath(path.absolute())):
            raise _refused(raw_path, "is on a pseudo file system; refusing to read it")
        fd = _open_file(raw_path, lambda flags: os.open(path, flags))
    try:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode):
            raise _refused(raw_path, "is not a regular file")
        if opened.st_size > max_bytes:
            raise _refused(raw_path, f"is {opened.st_size} bytes, over the limit of {max_bytes} "
                                     "(POSTROOM_ATTACHMENT_MAX_BYTES)")
        over_total = budget.refusal(opened.st_size) if budget is not None else None
        if over_total is not None:
            raise _refused(raw_path, f"is {opened.st_size} bytes, which {over_total}")
        # One byte past what may be read: the file may have grown since fstat.
        readable = max_bytes if budget is None else min(max_bytes, budget.left)
        data = _read_at_most(raw_path, fd, readable + 1)
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise _refused(raw_path, f"is over the limit of {max_bytes} bytes "
                                 "(POSTROOM_ATTACHMENT_MAX_BYTES)")
    if budget is not None:
        over_total = budget.refusal(len(data))
        if over_total is not None:
            raise _refused(raw_path, f"grew as it was read, and {over_total}")
        budget.used += len(data)
    return given.name, data


def _read_at_most(raw_path: str, fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        try:
            chunk = os.read(fd, min(READ_CHUNK_BYTES, limit - size))
        except OSError as exc:
            raise _refused(raw_path, f"cannot be read: {exc.strerror}") from None
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _parts_below(path: Path, root: Path) -> list[str] | None:
    """The components of ``path`` below ``root``, lexically; None when it is not below it."""
    normal = Path(os.path.normpath(path.absolute()))
    for base in (root.absolute(), root.resolve()):
        if normal.is_relative_to(base) and normal != base:
            return list(normal.relative_to(base).parts)
    return None


def _open_beneath(raw_path: str, root: Path, parts: list[str]) -> int:
    """A descriptor of ``root/parts...`` reached without following any symbolic link."""
    try:
        dir_fd = os.open(root, _DIR_FLAGS)
    except OSError as exc:
        raise _refused(raw_path, f"cannot be read: the attachments root: {exc.strerror}") from None
    try:
        for name in parts[:-1]:
            try:
                next_fd = os.open(name, _DIR_FLAGS | _NOFOLLOW, dir_fd=dir_fd)
            except FileNotFoundError:
                raise _refused(raw_path, "does not exist") from None
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _refused(raw_path, "passes through a symbolic link or a non-directory; "
                                             "refusing to follow it") from None
                raise _refused(raw_path, f"cannot be read: {exc.strerror}") from None
            os.close(dir_fd)
            dir_fd = next_fd
        return _open_file(raw_path, lambda flags: os.open(parts[-1], flags, dir_fd=dir_fd))
    finally:
        os.close(dir_fd)


def _open_file(raw_path: str, opener: Callable[[int], int]) -> int:
    try:
        return opener(_OPEN_FLAGS)
    except FileNotFoundError:
        raise _refused(raw_path, "does not exist") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refused(raw_path, "is a symbolic link; refusing to follow it") from None
        raise _refused(raw_path, f"cannot be read: {exc.strerror}") from None


def _refused(raw_path: str, problem: str) -> AttachmentError:
    return AttachmentError(f"attachment {raw_path!r} {problem}", path=raw_path)


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
