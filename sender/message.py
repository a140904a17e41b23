"""Builds the MIME message for one EmailRequested: headers, a stable Message-ID, attachments.

Pure except for reading attachment files, which must lie inside the attachments root when one is set.
"""

from __future__ import annotations

import email.policy
import email.utils
import functools
import hashlib
import mimetypes
import os
import re
import stat
from datetime import datetime
from email.headerregistry import BaseHeader, HeaderRegistry
from email.message import EmailMessage
from pathlib import Path

from postroom.errors import PostroomError
from schemas.codec import EmailRequested
from sender.errors import AttachmentError

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
# Control characters, plus the ones str.splitlines() treats as line breaks; tab is allowed.
_UNSAFE_IN_HEADER = re.compile(r"[\x00-\x08\x0a-\x1f\x7f\x85\u2028\u2029]")
_DOMAIN = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?$")
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


class UnsafeHeaderError(PostroomError, ValueError):
    """A header value holds a line break or control character and would corrupt the message."""


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
        return "attachments are off: POSTROOM_ATTACHMENTS_ROOT is not set"
    return None


def build_message(
    event: EmailRequested, *, attachments_root: Path | None, now: datetime,
) -> EmailMessage:
    """The message for ``event``, dated ``now``, with its attachments (and inline images) read
    from disk: text alone, or text and HTML as multipart/alternative, inside multipart/mixed
    when there are attachments.

    Raises UnsafeHeaderError for a line break in the recipient, sender or subject, and
    AttachmentError for an attachment that is missing, unreadable, not a regular file, or
    outside ``attachments_root`` (such a file is never opened).
    """
    for what, value in (("recipient", event.recipient), ("sender", event.sender),
                        ("subject", event.subject)):
        _refuse_unsafe(what, value)
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    message = EmailMessage(policy=MESSAGE_POLICY)
    message["From"] = event.sender
    message["To"] = event.recipient
    message["Subject"] = event.subject
    message["Date"] = email.utils.format_datetime(now)
    message["Message-ID"] = message_id_for(event.idempotency_key, _domain_of(event.sender))
    message.set_content(event.body, charset="utf-8")
    if event.html is not None:
        add_html(message, event, attachments_root)
    for raw_path in event.attachments:
        name, data = read_attachment(raw_path, attachments_root)
        maintype, _, subtype = mime_type_for(name).partition("/")
        message.add_attachment(data, maintype=maintype, subtype=subtype, filename=name)
    return message


def add_html(message: EmailMessage, event: EmailRequested, attachments_root: Path | None) -> None:
    """The HTML body after the text one (multipart/alternative), with its inline images as
    multipart/related parts whose Content-ID is ``<file name>``, so ``cid:<file name>`` in
    the HTML shows them. Inline files are read like attachments: below the root only."""
    message.add_alternative(event.html, subtype="html", charset="utf-8")
    *_, html_part = message.iter_parts()  # add_alternative made the message text, then html
    for raw_path in event.inline:
        name, data = read_attachment(raw_path, attachments_root)
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


def read_attachment(raw_path: str, root: Path | None) -> tuple[str, bytes]:
    """The file name and bytes of one attachment; a relative path is taken from ``root``.

    With a root, the path is resolved through every symlink first and must land inside the
    root; only then is it opened (without following a symlink swapped in since) and checked to
    be the same regular file.
    """
    if _UNSAFE_IN_HEADER.search(raw_path):
        raise _refused(raw_path, "contains a control character")
    given = Path(raw_path)
    path = root / given if root is not None and not given.is_absolute() else given
    if root is not None and not _lexically_inside(path, root):
        # Refused before touching the file system: not even whether it exists is revealed.
        raise _refused(raw_path, f"is outside the attachments root {root}; refusing to read it")
    try:
        resolved = path.resolve(strict=True)
    except FileNotFoundError:
        raise _refused(raw_path, "does not exist") from None
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop
        raise _refused(raw_path, f"cannot be resolved: {exc}") from None
    if root is not None and not resolved.is_relative_to(root.resolve()):
        raise _refused(raw_path, f"resolves to {resolved}, outside the attachments root "
                                 f"{root.resolve()}; refusing to read it")
    try:
        expected = resolved.stat()
    except OSError as exc:
        raise _refused(raw_path, f"cannot be read: {exc}") from None
    if not stat.S_ISREG(expected.st_mode):
        raise _refused(raw_path, "is not a regular file")
    try:
        fd = os.open(resolved, _OPEN_FLAGS)
    except OSError as exc:
        raise _refused(raw_path, f"cannot be read: {exc}") from None
    with os.fdopen(fd, "rb") as file:
        opened = os.fstat(file.fileno())
        if (opened.st_dev, opened.st_ino) != (expected.st_dev, expected.st_ino):
            raise _refused(raw_path, "changed while it was being opened")
        try:
            data = file.read()
        except OSError as exc:
            raise _refused(raw_path, f"cannot be read: {exc}") from None
    return given.name, data


def _refused(raw_path: str, problem: str) -> AttachmentError:
    return AttachmentError(f"attachment {raw_path!r} {problem}", path=raw_path)


def _lexically_inside(path: Path, root: Path) -> bool:
    normal = Path(os.path.normpath(path.absolute()))
    return any(normal.is_relative_to(r) for r in (root.absolute(), root.resolve()))


def _refuse_unsafe(what: str, value: str) -> None:
    if _UNSAFE_IN_HEADER.search(value):
        raise UnsafeHeaderError(
            f"{what} {value!r} contains a line break or control character")


def _domain_of(address: str) -> str:
    _, addr_spec = email.utils.parseaddr(address)
    return (addr_spec or address).rpartition("@")[2] or "localhost"
