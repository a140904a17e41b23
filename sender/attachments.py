"""Reads an email's attachment and inline files for the sender: below the attachments root only,
never following a symbolic link, a regular file within the size caps, none read past them; and
the MIME type a file's name gives it."""

from __future__ import annotations

import errno
import mimetypes
import os
import stat
from collections.abc import Callable
from pathlib import Path

from postroom.rules import SizeLimits, has_control, on_pseudo_filesystem
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
_NOFOLLOW = os.O_NOFOLLOW
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
# Non-blocking: opening a FIFO for reading would otherwise wait for a writer.
_OPEN_FLAGS = os.O_RDONLY | _NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
DEFAULT_LIMITS = SizeLimits()
READ_CHUNK_BYTES = 1024 * 1024


def attachments_refusal(event: EmailRequested, root: Path | None) -> str | None:
    """Why ``event``'s attachments may not be read at all, or None. Reading whatever path the
    process can read is not on: without a root chosen by the operator, no attachment is sent."""
    if (event.attachments or event.inline) and root is None:
        # The setting first: `postroom status` cuts a long error at its column's width.
        return "POSTROOM_ATTACHMENTS_ROOT is not set: attachments are off"
    return None


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
