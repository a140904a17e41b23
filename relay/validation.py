"""Checks what a job asks to enqueue before anything is written. Pure, except for stat() of attachments."""

from __future__ import annotations

import mimetypes
import re
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path

from postroom.topics import Priority
from relay.errors import InvalidAttachmentError, InvalidEmailError

MAX_ADDRESS_LEN = 254  # RFC 5321 path limit less the angle brackets
MAX_LOCAL_LEN = 64
MAX_SUBJECT_LEN = 998  # RFC 5322 line limit
# Text and HTML travel inside the Kafka record, whose default limit (message.max.bytes) is 1 MB.
MAX_HTML_BYTES = 512 * 1024

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_LOCAL = re.compile(r"^[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*$")
_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


def check_address(address: str, *, what: str = "recipient") -> str:
    """Return the address with surrounding blanks removed, or raise InvalidEmailError saying why."""
    if _CONTROL.search(address):
        raise InvalidEmailError(f"{what} {address!r} contains a control character (CR, LF, ...)")
    value = address.strip()
    if not value:
        raise InvalidEmailError(f"{what} is empty")
    if len(value) > MAX_ADDRESS_LEN:
        raise InvalidEmailError(f"{what} {value!r} is longer than {MAX_ADDRESS_LEN} characters")
    local, at, domain = value.rpartition("@")
    if not at or not local or not domain:
        raise InvalidEmailError(f"{what} {value!r} is not of the form local@domain")
    if len(local) > MAX_LOCAL_LEN or not _LOCAL.match(local):
        raise InvalidEmailError(f"{what} {value!r} has an invalid local part")
    labels = domain.split(".")
    if not all(_LABEL.match(label) for label in labels):
        raise InvalidEmailError(f"{what} {value!r} has an invalid domain")
    return value


def check_recipients(recipients: Iterable[str]) -> list[str]:
    """Valid, de-duplicated (case-insensitively) recipients in their given order."""
    if isinstance(recipients, str):
        raise InvalidEmailError("recipients must be a list of addresses, not one string")
    seen: set[str] = set()
    result: list[str] = []
    for raw in recipients:
        address = check_address(raw)
        if address.lower() not in seen:
            seen.add(address.lower())
            result.append(address)
    if not result:
        raise InvalidEmailError("no recipients given")
    return result


def check_subject(subject: str) -> str:
    if _CONTROL.search(subject):
        raise InvalidEmailError("subject contains a control character (CR, LF, ...): "
                                "it would let text into the headers")
    if not subject.strip():
        raise InvalidEmailError("subject is empty")
    if len(subject) > MAX_SUBJECT_LEN:
        raise InvalidEmailError(f"subject is longer than {MAX_SUBJECT_LEN} characters")
    return subject


def check_key(key: str) -> str:
    if _CONTROL.search(key) or not key.strip():
        raise InvalidEmailError("message key must be non-empty and free of control characters")
    return key


def check_body(body: str) -> str:
    if "\x00" in body:
        raise InvalidEmailError("body contains a NUL character")
    return body


def check_html(html: str | None) -> str | None:
    """The HTML body as given: its size is checked, not its markup."""
    if html is None:
        return None
    if "\x00" in html:
        raise InvalidEmailError("html contains a NUL character")
    size = len(html.encode("utf-8", errors="surrogatepass"))
    if size > MAX_HTML_BYTES:
        raise InvalidEmailError(f"html is {size} bytes, over the limit of {MAX_HTML_BYTES}")
    return html


def check_inline(paths: Sequence[str | Path], html: str | None, max_bytes: int) -> list[str]:
    """Absolute paths of inline images, checked like attachments; each must be an image and
    have a file name of its own, which the HTML refers to as ``cid:<file name>``."""
    files = check_attachments(paths, max_bytes, what="inline image")
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
    try:
        return Priority.parse(str(priority))
    except ValueError as exc:
        raise InvalidEmailError(str(exc)) from None


def check_attachments(paths: Sequence[str | Path], max_bytes: int, *,
                      what: str = "attachment") -> list[str]:
    """Absolute paths of attachments (or inline images: ``what``) that exist, are regular files
    and are small enough."""
    if isinstance(paths, (str, Path)):
        raise InvalidEmailError(f"{what}s must be a list of paths, not one path")
    result: list[str] = []
    for raw in paths:
        path = Path(raw).expanduser().absolute()
        if _CONTROL.search(str(path)):
            raise InvalidAttachmentError(f"{what} path {str(raw)!r} has a control character")
        try:
            info = path.stat()
        except FileNotFoundError:
            raise InvalidAttachmentError(f"{what} {path} does not exist") from None
        except OSError as exc:
            raise InvalidAttachmentError(f"{what} {path} cannot be read: {exc}") from None
        if not stat.S_ISREG(info.st_mode):
            raise InvalidAttachmentError(f"{what} {path} is not a regular file")
        if info.st_size > max_bytes:
            raise InvalidAttachmentError(
                f"{what} {path} is {info.st_size} bytes, over the limit of {max_bytes}")
        result.append(str(path))
    return result


def idempotency_key(message_key: str, recipient: str) -> str:
    """The per-recipient key: the message key and the address, compared case-insensitively."""
    return f"{message_key}|{recipient.lower()}"
