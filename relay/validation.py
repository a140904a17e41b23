"""Checks what a job asks to enqueue before anything is written. Pure, except for stat() of attachments.

The rules themselves are postroom.rules and postroom.mime, which the sender applies again to
every event it reads; here they raise the EnqueueError the caller documents.
"""

from __future__ import annotations

import mimetypes
import os
import stat
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from postroom import rules
from postroom.errors import InvalidContentError
from postroom.mime import check_composable, check_recipient_composable
from postroom.relay.errors import EnqueueError, InvalidAttachmentError, InvalidEmailError
from postroom.settings_values import identifier
from postroom.topics import Priority

# Text and HTML travel inside the Kafka record, whose default limit (message.max.bytes) is 1 MB.
MAX_HTML_BYTES = 512 * 1024


class _as_enqueue_error:
    """postroom.rules' refusal, raised as the EnqueueError the caller documents, for the checks
    of attachments. The checks every email meets catch the refusal themselves: a try costs
    nothing until it raises, where entering this costs about 0.3 µs."""

    __slots__ = ("error",)

    def __init__(self, error: type[EnqueueError] = InvalidEmailError) -> None:
        self.error = error

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 traceback: object) -> None:
        if kind is not None and issubclass(kind, InvalidContentError):
            raise self.error(str(exc)) from None


def check_address(address: object, *, what: str = "recipient") -> str:
    """Return the address with surrounding blanks removed, or raise InvalidEmailError saying why."""
    try:
        return rules.check_address(address, what=what)
    except InvalidContentError as exc:
        raise InvalidEmailError(str(exc)) from None


def recipient_chunks(recipients: Iterable[str], size: int) -> Iterator[list[str]]:
    """The recipients, each checked (surrounding blanks removed), in their given order, in
    lists of up to ``size``; checked as the chunks are asked for, so an iterator of any length
    is never held whole. Each is the address a row holds (rules.mailbox_address: a non-ASCII
    domain in its one IDNA spelling). Duplicates stay: the insert skips a second row of one
    idempotency key (the mailbox compared by its identity, rules.mailbox_identity)."""
    if type(recipients) is list and 0 < len(recipients) <= size:
        # One chunk (a personalised email's one recipient, most often), checked at once as the
        # generator would check it when its first chunk is asked for, without the generator.
        return iter((_checked(recipients),))
    if isinstance(recipients, str):
        raise InvalidEmailError("recipients must be a list of addresses, not one string")
    if isinstance(recipients, bytes | bytearray) or not isinstance(recipients, Iterable):
        raise InvalidEmailError("recipients must be a list of addresses, not "
                                f"{type(recipients).__name__}")
    return _chunks(recipients, size)


def _recipient(raw: object) -> str:
    """One recipient checked whole: its form, as a row holds it, then its own To header (the
    sender builds one per row, not only the first's); InvalidContentError for a bad one."""
    address = rules.check_recipient(raw)
    check_recipient_composable(address)
    return address


def _checked(recipients: list[str]) -> list[str]:
    try:
        return [_recipient(raw) for raw in recipients]
    except InvalidContentError as exc:
        raise InvalidEmailError(str(exc)) from None


def _chunks(recipients: Iterable[str], size: int) -> Iterator[list[str]]:
    chunk: list[str] = []
    for raw in recipients:
        try:
            chunk.append(_recipient(raw))
        except InvalidContentError as exc:
            raise InvalidEmailError(str(exc)) from None
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def check_schema(schema: object) -> str | None:
    """``schema=`` as given when it names a schema the roles take (POSTROOM_DATABASE_SCHEMA's
    rule), or None or "" (the connection's search path). Any other name could hold no outbox the
    roles use, and the server would refuse it (a NUL), fail to encode it (a lone surrogate) or cut
    it to another schema's name (over 63 bytes)."""
    if schema is None or schema == "":
        return schema
    if not isinstance(schema, str):
        raise InvalidEmailError(f"schema must be a schema name, not {type(schema).__name__}")
    try:
        return identifier(schema)
    except ValueError as exc:
        raise InvalidEmailError(f"schema {schema!r} is not one the roles take "
                                f"(POSTROOM_DATABASE_SCHEMA): {exc}, at most 63") from None


def check_subject(subject: object) -> str:
    try:
        return rules.check_subject(subject)
    except InvalidContentError as exc:
        raise InvalidEmailError(str(exc)) from None


def check_key(key: object) -> str:
    try:
        return rules.check_key(key)
    except InvalidContentError as exc:
        raise InvalidEmailError(str(exc)) from None


def check_body(body: object, max_bytes: int = rules.DEFAULT_BODY_MAX_BYTES) -> str:
    try:
        return rules.check_body(body, max_bytes)
    except InvalidContentError as exc:
        raise InvalidEmailError(str(exc)) from None


def check_headers(sender: str, recipient: str, subject: str, attachments: Sequence[str]) -> None:
    """InvalidEmailError when the message would not carry exactly its intended headers (an
    encoded line break in the subject or a file name, say)."""
    try:
        check_composable(sender, recipient, subject, [Path(p).name for p in attachments])
    except InvalidContentError as exc:
        raise InvalidEmailError(str(exc)) from None


def check_html(html: object) -> str | None:
    """The HTML body as given: its size is checked, not its markup."""
    if html is None:
        return None
    if not isinstance(html, str):
        raise InvalidEmailError(f"html must be a string, not {type(html).__name__}")
    if "\x00" in html:
        raise InvalidEmailError("html contains a NUL character")
    size = len(html.encode("utf-8", errors="surrogatepass"))
    if size > MAX_HTML_BYTES:
        raise InvalidEmailError(f"html is {size} bytes, over the limit of {MAX_HTML_BYTES}")
    return html


def check_inline(paths: Sequence[str | Path], html: str | None, max_bytes: int,
                 total_max_bytes: int | None = None, attached_bytes: int = 0) -> list[str]:
    """Absolute paths of inline images, checked like attachments; each must be an image and
    have a file name of its own, which the HTML refers to as ``cid:<file name>``. They count
    in the attachments' total (``total_max_bytes``), after the ``attached_bytes`` of the
    attachments."""
    files, _ = check_files(paths, max_bytes, total_max_bytes, what="inline image",
                           counted_bytes=attached_bytes)
    if files and html is None:
        raise InvalidEmailError("inline images need an html body that shows them")
    names: set[str] = set()
    for path in files:
        name = Path(path).name
        guessed, _ = mimetypes.guess_type(name, strict=False)
        if not (guessed or "").startswith("image/"):
            raise InvalidAttachmentError(f"inline image {path} is not an image file "
                                         "(.png, .jpg, .gif, .svg, ...)")
        if name in names:
            raise InvalidAttachmentError(f"two inline images are named {name}: the HTML "
                                         f"could not tell cid:{name} apart")
        names.add(name)
    return files


def check_priority(priority: str | Priority) -> Priority:
    if type(priority) is Priority:
        return priority
    try:
        return Priority.parse(str(priority))
    except ValueError as exc:
        raise InvalidEmailError(str(exc)) from None


def check_attachments(paths: Sequence[str | Path], max_bytes: int,
                      total_max_bytes: int | None = None, *, what: str = "attachment") -> list[str]:
    """Absolute paths of attachments (or inline images: ``what``) that exist, are regular files
    and are small enough, one by one (``max_bytes``) and together (``total_max_bytes``)."""
    return check_files(paths, max_bytes, total_max_bytes, what=what)[0]


def check_files(paths: Sequence[str | Path], max_bytes: int, total_max_bytes: int | None = None,
                *, what: str = "attachment", counted_bytes: int = 0) -> tuple[list[str], int]:
    """:func:`check_attachments`, and the bytes of the files with the ``counted_bytes`` of
    files checked before them (inline images count after the attachments)."""
    if type(paths) in (tuple, list) and not paths:  # most emails have none
        return [], counted_bytes
    if isinstance(paths, (str, Path)):
        raise InvalidEmailError(f"{what}s must be a list of paths, not one path")
    if isinstance(paths, bytes | bytearray) or not isinstance(paths, Iterable):
        raise InvalidEmailError(f"{what}s must be a list of paths, not {type(paths).__name__}")
    paths = list(paths)
    if not paths:
        return [], counted_bytes
    with _as_enqueue_error():
        rules.check_attachment_count(len(paths))
    result: list[str] = []
    total = counted_bytes
    for raw in paths:
        if not isinstance(raw, (str, Path)):
            raise InvalidAttachmentError(
                f"an attachment must be a path, not {type(raw).__name__}")
        shown = str(raw)  # errors show the path as given
        if not shown.isascii():
            try:
                shown.encode("utf-8")
            except UnicodeEncodeError:  # a name in another encoding, read with surrogates
                raise InvalidAttachmentError(
                    f"{what} path {shown!r} is not UTF-8 text (a file name in another "
                    "encoding): rename the file") from None
        with _as_enqueue_error(InvalidAttachmentError):
            rules.check_attachment_path(shown)
        try:
            path = Path(raw).expanduser().absolute()
        except RuntimeError:  # "~name" of a user this host does not know
            raise InvalidAttachmentError(
                f"{what} {shown} names the home of an unknown user") from None
        with _as_enqueue_error(InvalidAttachmentError):
            rules.check_attachment_path(os.path.normpath(path))
            rules.check_attachment_path(str(path.resolve()))
        try:
            info = path.stat()
        except FileNotFoundError:
            raise InvalidAttachmentError(f"{what} {shown} does not exist") from None
        except OSError as exc:
            raise InvalidAttachmentError(f"{what} {shown} cannot be read: {exc.strerror}") \
                from None
        if not stat.S_ISREG(info.st_mode):
            raise InvalidAttachmentError(f"{what} {shown} is not a regular file")
        if info.st_size > max_bytes:
            raise InvalidAttachmentError(
                f"{what} {shown} is {info.st_size} bytes, over the limit of {max_bytes}")
        total += info.st_size
        if total_max_bytes is not None and total > total_max_bytes:
            together = "attachments" if what == "attachment" and not counted_bytes \
                else "attachments and inline images"
            raise InvalidAttachmentError(
                f"the {together} come to {total} bytes or more, over the limit of "
                f"{total_max_bytes} (POSTROOM_ATTACHMENTS_TOTAL_MAX_BYTES)")
        result.append(str(path))
    return result, total


def idempotency_key(message_key: str, recipient: str) -> str:
    """The per-recipient key: the message key and the mailbox's identity
    (rules.mailbox_identity: for an ASCII address, its lower case).

    ``message_key|recipient``, with ``\\`` and ``|`` in the message key escaped by a ``\\``:
    the first unescaped ``|`` ends the message key, so no two pairs share a key. A message key
    without either character keeps the key it always had (migration 0005 rewrote the others).
    """
    return idempotency_key_prefix(message_key) + rules.mailbox_identity(recipient)


def idempotency_key_prefix(message_key: str) -> str:
    """What every idempotency key of ``message_key`` starts with: the escaped key and ``|``
    (computed once for a message's recipients, not once per row)."""
    return message_key.replace("\\", "\\\\").replace("|", "\\|") + "|"
