"""The bytes that go to the server for one email: serialised by the email package, or, for an
email without files, filled into a template that every recipient of one report shares.

Building and serialising a message with the email package costs about a millisecond of CPU, most
of it parsing and folding the same headers again for every recipient (docs/benchmarks.md, the
sender's profile). Every recipient of one message shares every byte but its To, Date and
Message-ID lines, so the rest is built by :func:`~sender.message.build_message`, serialised and
checked by :func:`~postroom.mime.check_serialized` once per sender, subject, bodies and server
capabilities, and kept in a bounded cache; per recipient, the three lines are written into their
places. Only lines the email package writes as plain ``Name: value`` are written here (a short
ASCII address, a short Message-ID): for anything else the caller builds the message in full, so
the bytes are the same either way (tests/unit/sender/test_render.py compares them).

Pure.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import email.policy
import email.utils
import functools
import re
from email.message import EmailMessage

from postroom.mime import check_serialized
from schemas.codec import EmailRequested
from sender.message import build_message, message_id_for, sender_domain

MAX_LINE = 78  # the email package folds a longer header line
TEMPLATE_CACHE_BYTES = 16 * 1024 * 1024
# One template may take at most this share of the cache; a larger one is rendered, not kept.
LARGEST_SHARE = 8
# The addresses whose To line is "To: " + the address: a dot-atom of letters, digits and ._+-
# (other atext characters, such as = and ?, the email package may quote or decode).
_PLAIN_ADDRESS = re.compile(r"[A-Za-z0-9_+-]+(?:\.[A-Za-z0-9_+-]+)*@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*")
_HOLES = (b"To: ", b"Date: ", b"Message-ID: ")
ADDRESS_HEADERS = ("From", "Sender", "Reply-To", "To", "Cc", "Bcc")
_PLACEHOLDER_RECIPIENT = "placeholder@example.invalid"
_PLACEHOLDER_NOW = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)


class TemplateError(ValueError):
    """The serialised message has no single, unfolded line for each of To, Date and Message-ID."""


def flatten(message: EmailMessage, *, utf8: bool, eight_bit: bool) -> bytes:
    """``message`` as the server gets it: SMTPUTF8 headers when ``utf8``, 8-bit parts
    re-encoded for a server without 8BITMIME."""
    policy = email.policy.SMTPUTF8 if utf8 else email.policy.SMTP
    if not eight_bit:
        policy = policy.clone(cte_type="7bit")
    return message.as_bytes(policy=policy)


def serialise(message: EmailMessage, *, utf8: bool, eight_bit: bool) -> bytes:
    """The bytes to send; UnsafeHeaderError unless they carry exactly the headers that were set
    (the last gate before the server)."""
    content = flatten(message, utf8=utf8, eight_bit=eight_bit)
    check_serialized(message, content)
    return content


@dataclasses.dataclass(frozen=True)
class Template:
    """A serialised message with its To, Date and Message-ID lines cut out."""

    pieces: tuple[bytes, bytes, bytes, bytes]

    @classmethod
    def cut(cls, content: bytes) -> Template:
        """The template of ``content``, whose header block must hold each of the three lines
        once, unfolded, in that order (:func:`build_message` writes them so)."""
        end = content.find(b"\r\n\r\n")
        if end < 0:
            raise TemplateError("no end of the header block")
        lines = content[:end].split(b"\r\n")
        holes = []
        for name in _HOLES:
            at = [i for i, line in enumerate(lines) if line.startswith(name)]
            if len(at) != 1:
                raise TemplateError(f"{len(at)} lines start with {name!r}")
            folded = at[0] + 1 < len(lines) and lines[at[0] + 1][:1] in (b" ", b"\t")
            if folded:
                raise TemplateError(f"the {name!r} line is folded")
            holes.append(at[0])
        if holes != sorted(holes):
            raise TemplateError("To, Date and Message-ID are out of order")
        pieces = []
        start = 0
        for hole in holes:
            pieces.append(b"".join(line + b"\r\n" for line in lines[start:hole]))
            start = hole + 1
        pieces.append(b"".join(line + b"\r\n" for line in lines[start:]) + content[end + 2:])
        return cls((pieces[0], pieces[1], pieces[2], pieces[3]))

    @property
    def size(self) -> int:
        return sum(map(len, self.pieces))

    def fill(self, to: bytes, date: bytes, message_id: bytes) -> bytes:
        first, second, third, rest = self.pieces
        return b"".join((first, to, b"\r\n", second, date, b"\r\n", third, message_id, b"\r\n",
                         rest))


_TemplateKey = tuple[str, str, str, str | None, bool, bool]


class TemplateCache:
    """Templates by sender, subject, bodies and flags, least recently used first out, within a
    budget of bytes (the key's text counted with the template)."""

    def __init__(self, max_bytes: int = TEMPLATE_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._entries: collections.OrderedDict[_TemplateKey, tuple[Template, int]] = (
            collections.OrderedDict())
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size(self) -> int:
        """The bytes the cache holds, by its own count."""
        return self._bytes

    def get(self, event: EmailRequested, *, utf8: bool, eight_bit: bool) -> Template:
        """The template of ``event``'s shared part; built (and checked) on a miss. Raises what
        :func:`build_message` and :func:`serialise` raise for the values."""
        key = (event.sender, event.subject, event.body, event.html, utf8, eight_bit)
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
            return found[0]
        template = build_template(event, utf8=utf8, eight_bit=eight_bit)
        cost = template.size + sum(len(text) for text in key[:4] if isinstance(text, str))
        if cost <= self.max_bytes // LARGEST_SHARE:
            self._entries[key] = (template, cost)
            self._bytes += cost
            while self._bytes > self.max_bytes:
                _, (_, dropped) = self._entries.popitem(last=False)
                self._bytes -= dropped
        return template


def build_template(event: EmailRequested, *, utf8: bool, eight_bit: bool) -> Template:
    """The template of ``event`` (which must have no files), from the full build of a stand-in
    for its recipient: checked as every sent message is."""
    stand_in = dataclasses.replace(event, recipient=_PLACEHOLDER_RECIPIENT)
    message = build_message(stand_in, attachments_root=None, now=_PLACEHOLDER_NOW)
    return Template.cut(serialise(message, utf8=utf8, eight_bit=eight_bit))


@dataclasses.dataclass(frozen=True)
class Lines:
    """One recipient's To, Date and Message-ID lines, as the email package would write them."""

    to: bytes
    date: bytes
    message_id: bytes


def is_plain_address(address: str) -> bool:
    """Whether ``address`` is a dot-atom of ASCII letters, digits and ``._+-`` at an ASCII
    domain: written as it is on a header line and on an SMTP command line."""
    return _PLAIN_ADDRESS.fullmatch(address) is not None


def plain_lines(event: EmailRequested, now: dt.datetime) -> Lines | None:
    """``event``'s own lines, when each is a short line of plain ASCII; None otherwise (the
    caller builds the message in full). ``event.sender`` is the sender that will be used."""
    recipient = event.recipient
    if len(recipient) > MAX_LINE - len(_HOLES[0]) or not is_plain_address(recipient):
        return None
    message_id = message_id_for(event.idempotency_key, sender_domain(event.sender))
    if len(message_id) > MAX_LINE - len(_HOLES[2]):
        return None
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    return Lines(b"To: " + recipient.encode("ascii"), date_line(now),
                 b"Message-ID: " + message_id.encode("ascii"))


@functools.lru_cache(maxsize=4)
def _date_line_of_second(second: dt.datetime) -> bytes:
    return b"Date: " + email.utils.format_datetime(second).encode("ascii")


def date_line(now: dt.datetime) -> bytes:
    """The Date line for ``now``: whole seconds, as the email package writes it; built once per
    second (every email of that second shares it)."""
    return _date_line_of_second(now.replace(microsecond=0))


@dataclasses.dataclass(frozen=True)
class Templated:
    """The bytes of one email without files: its recipient's lines in its report's template."""

    event: EmailRequested
    lines: Lines
    cache: TemplateCache
    heavy = False  # a few dict lookups and one join: no worker thread

    @property
    def message_id(self) -> str:
        return self.lines.message_id.removeprefix(b"Message-ID: ").decode("ascii")

    @property
    def header_addresses(self) -> tuple[str, ...]:
        """What its From and To headers were made of (build_message writes no other)."""
        return (self.event.sender, self.event.recipient)

    def serialise(self, *, utf8: bool, eight_bit: bool) -> bytes:
        template = self.cache.get(self.event, utf8=utf8, eight_bit=eight_bit)
        return template.fill(self.lines.to, self.lines.date, self.lines.message_id)


@dataclasses.dataclass(frozen=True)
class Built:
    """The bytes of a message built in full (files, or lines only the email package writes)."""

    message: EmailMessage

    @property
    def heavy(self) -> bool:
        """Whether serialising belongs in a worker thread: a message with parts (attachments)
        takes about 50 ms per MiB to serialise and as long again to check, too long for the
        loop; a single-part text message is a few KiB, where the thread hop would cost more."""
        return self.message.is_multipart()

    @property
    def message_id(self) -> str:
        return str(self.message["Message-ID"])

    @property
    def header_addresses(self) -> tuple[str, ...]:
        """The addresses of its address headers (a header of another policy's, as its text)."""
        found: list[str] = []
        for name in ADDRESS_HEADERS:
            for header in self.message.get_all(name) or ():
                addresses = getattr(header, "addresses", None)
                found.extend(str(header) if addresses is None else
                             (address.addr_spec for address in addresses))
        return tuple(found)

    def serialise(self, *, utf8: bool, eight_bit: bool) -> bytes:
        return serialise(self.message, utf8=utf8, eight_bit=eight_bit)


Payload = Templated | Built


def payload_of(message: EmailMessage | Payload) -> Payload:
    return Built(message) if isinstance(message, EmailMessage) else message
