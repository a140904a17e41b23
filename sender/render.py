"""The bytes that go to the server for one email: serialised by the email package, or, for an
email without files, filled into a template that every recipient of one report shares.

Building and serialising a message with the email package costs about a millisecond of CPU, most
of it parsing and folding the same headers again for every recipient (docs/benchmarks.md, the
sender's profile). Every recipient of one message shares every byte but its To, Date and
Message-ID lines, so the rest is built by :func:`~sender.message.build_message`, serialised and
checked by :func:`~postroom.mime.check_serialized` once per template and server capabilities,
and kept in a bounded cache; per recipient, the three lines are written into their places.

An email of its own (an invoice run: a subject and bodies per recipient) would miss a cache
keyed by subject and bodies every time, at 0.35 ms of CPU a build (0.86 with HTML). So a subject
the email package writes as it is (short plain ASCII) is a hole of the template too, and so are
the text body and the HTML when it writes each 7bit, quoted-printable or base64: each is encoded
by the email package's own encoder, only its line breaks written here, and a multipart
template's boundary must not occur in them (else the email is built in full). Such holes are
never built nor checked as a whole message: :func:`~sender.message.check_header_values` and the
subject's pattern keep them to what the email package writes unchanged. Only what the email
package writes as it is goes into a hole (``Name: value`` of a short ASCII address, Message-ID
or subject; a body as set_content encodes it); for anything else the caller builds the message
in full, so the bytes are the same either way (tests/unit/sender/test_render.py compares them).
The template's cut and fill and the cache bounded in bytes are sender/template.py's.

Pure.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import email.contentmanager
import email.policy
import email.utils
import functools
import re
from collections.abc import Callable
from email.message import EmailMessage

from postroom.mime import check_serialized
from postroom.schemas.codec import EmailRequested
from postroom.sender.message import MESSAGE_POLICY, build_message, message_id_for, sender_domain
from postroom.sender.template import LARGEST_SHARE, LINE_HOLES, BudgetedCache, Template, TemplateError

MAX_LINE = 78  # the email package folds a longer header line
TEMPLATE_CACHE_BYTES = 16 * 1024 * 1024
# The addresses whose To line is "To: " + the address: a dot-atom of letters, digits and ._+-
# (other atext characters, such as = and ?, the email package may quote or decode).
_PLAIN_ADDRESS = re.compile(r"[A-Za-z0-9_+-]+(?:\.[A-Za-z0-9_+-]+)*@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*")
# A subject the email package writes as "Subject: " + the subject, on one line: printable ASCII
# words without "=" (no encoded-word lookalike to decode), one space between them, the line at
# most MAX_LINE long.
_PLAIN_SUBJECT = re.compile(r"[!-<>-~]+(?: [!-<>-~]+)*")
_SUBJECT = b"Subject: "
_LINE_BREAK = re.compile(r"\r\n|\r|\n")  # what the email package's generator writes as CRLF
# The body transfer encodings whose text the generator writes as it is (8bit it may re-encode).
_BODY_HOLE_ENCODINGS = frozenset({"7bit", "quoted-printable", "base64"})
# Bodies kept encoded, within this budget of bytes (every recipient of one report shares its
# body; encoding takes 13-20 µs a KiB): least recently used first out, one body at most an
# eighth of it. A longer body, or one whose encoding would take more than that eighth, is no
# hole: it stays in a template keyed by it, encoded once (the latter remembered as such).
ENCODED_BODIES_BYTES = 8 * 1024 * 1024
ENCODED_BODY_MAX_CHARS = ENCODED_BODIES_BYTES // LARGEST_SHARE // 8
ADDRESS_HEADERS = ("From", "Sender", "Reply-To", "To", "Cc", "Bcc")
_PLACEHOLDER_RECIPIENT = "placeholder@example.invalid"
_PLACEHOLDER_SUBJECT = "placeholder"
_PLACEHOLDER_NOW = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)


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


# Sender, subject (None: a hole), text body and HTML (None: holes), the bodies' transfer
# encodings (the holes', else empty) and the flags.
_TemplateKey = tuple[str, str | None, str | None, str | None, tuple[str, ...], bool, bool]


class TemplateCache:
    """Templates by sender, subject, bodies and flags, least recently used first out, within a
    budget of bytes (the key's text counted with the template); a subject or bodies that are
    holes (:class:`Own`) are not part of the key, so every email of its own from one sender
    shares a template."""

    def __init__(self, max_bytes: int = TEMPLATE_CACHE_BYTES) -> None:
        self._cache: BudgetedCache[_TemplateKey, Template] = BudgetedCache(max_bytes)

    def __len__(self) -> int:
        return len(self._cache)

    @property
    def size(self) -> int:
        """The bytes the cache holds, by its own count."""
        return self._cache.size

    def get(self, event: EmailRequested, *, utf8: bool, eight_bit: bool,
            own: Own | None = None) -> Template:
        """The template of ``event``'s shared part, with holes for what ``own`` has; built (and
        checked) on a miss. Raises what :func:`build_message` and :func:`serialise` raise for
        the values."""
        subject_hole = own is not None and own.subject is not None
        bodies = own.bodies if own is not None else ()
        key: _TemplateKey = (event.sender, None if subject_hole else event.subject,
                             None if bodies else event.body, None if bodies else event.html,
                             own.encodings if own is not None else (), utf8, eight_bit)
        found = self._cache.find(key)
        if found is not None:
            return found[0]
        template = build_template(event, utf8=utf8, eight_bit=eight_bit,
                                  subject_hole=subject_hole, bodies=bodies)
        self._cache.keep(key, template, template.size
                         + sum(len(text) for text in key[:4] if isinstance(text, str)))
        return template


def build_template(event: EmailRequested, *, utf8: bool, eight_bit: bool,
                   subject_hole: bool = False, bodies: tuple[bytes, ...] = ()) -> Template:
    """The template of ``event`` (which must have no files), from the full build of a stand-in
    for its recipient (and with ``subject_hole`` for its subject): checked as every sent message
    is. ``bodies``: its bodies as :func:`own_of` encodes them, cut out of the template, whose
    parts' headers then name their transfer encodings."""
    stand_in = dataclasses.replace(event, recipient=_PLACEHOLDER_RECIPIENT,
                                   subject=_PLACEHOLDER_SUBJECT if subject_hole else event.subject)
    message = build_message(stand_in, attachments_root=None, now=_PLACEHOLDER_NOW)
    holes = (LINE_HOLES[0], _SUBJECT, *LINE_HOLES[1:]) if subject_hole else LINE_HOLES
    content = serialise(message, utf8=utf8, eight_bit=eight_bit)
    boundary = message.get_boundary()  # set by the serialising, for a multipart
    return Template.cut(content, holes, bodies=bodies,
                        boundary=None if boundary is None else boundary.encode("ascii"))


@dataclasses.dataclass(frozen=True)
class Own:
    """What of an email is its own and goes into its template's holes, as the email package
    writes it: its Subject line (None: the subject is part of the template), and its text body
    and HTML with their transfer encodings (empty: they are part of the template)."""

    subject: bytes | None
    bodies: tuple[bytes, ...] = ()
    encodings: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Lines:
    """One recipient's To, Date and Message-ID lines, as the email package would write them, and
    what else of the email goes into holes of its template."""

    to: bytes
    date: bytes
    message_id: bytes
    now: dt.datetime  # the Date line's time, for a build in full
    own: Own | None = None

    def fill(self, template: Template) -> bytes | None:
        """The email: these lines and what is its own in ``template``'s holes; None when a body
        holds the template's multipart boundary (the caller builds that email in full)."""
        own = self.own
        if own is None:
            return template.fill(self.to, self.date, self.message_id)
        if template.boundary is not None and any(template.boundary in body
                                                 for body in own.bodies):
            return None
        subject = () if own.subject is None else (own.subject,)
        return template.fill(self.to, *subject, self.date, self.message_id, bodies=own.bodies)


def own_of(event: EmailRequested) -> Own | None:
    """What of ``event`` the email package writes as it is, so its template can leave it out:
    a subject of plain ASCII short enough for one line, and a text body (and HTML, if it has
    one) it sends 7bit, quoted-printable or base64; None when neither."""
    subject = event.subject
    subject_line = (_SUBJECT + subject.encode("ascii")
                    if len(subject) <= MAX_LINE - len(_SUBJECT)
                    and _PLAIN_SUBJECT.fullmatch(subject) is not None else None)
    texts = (event.body,) if event.html is None else (event.body, event.html)
    encoded = [encoded_body(text) for text in texts]
    if any(one is None for one in encoded):
        return None if subject_line is None else Own(subject_line)
    bodies = tuple(one[0] for one in encoded if one is not None)
    encodings = tuple(one[1] for one in encoded if one is not None)
    return Own(subject_line, bodies, encodings)


def encoded_body(body: str) -> tuple[bytes, str] | None:
    """``body`` as the email package writes the text part set_content makes of it (a text body
    or the HTML), and its transfer encoding; None for one it sends 8bit (or cannot encode), or
    too long to keep encoded, which the template keeps."""
    if len(body) > ENCODED_BODY_MAX_CHARS:
        return None
    return _ENCODED_BODIES.get(body)


class EncodedBodies:
    """:func:`encoded_body`'s bodies, least recently used first out within ``max_bytes`` (the
    text and its encoding counted); safe to share between threads."""

    def __init__(self, max_bytes: int = ENCODED_BODIES_BYTES) -> None:
        self._cache: BudgetedCache[str, tuple[bytes, str] | None] = BudgetedCache(max_bytes)

    def get(self, body: str) -> tuple[bytes, str] | None:
        found = self._cache.find(body)
        if found is not None:
            return found[0]
        encoded = _encoded(body)
        # The text's memory (a non-ASCII str takes up to 4 bytes a character) and the encoding.
        held = len(body) * (1 if body.isascii() else 4)
        cost = held + (0 if encoded is None else len(encoded[0]))
        if cost > self._cache.share:
            # Too big to keep encoded, and too costly to encode for every recipient of a
            # report: kept as no hole, so it is encoded once and stays in its template.
            encoded, cost = None, held
        self._cache.keep(body, encoded, cost)
        return encoded


def _encoded(body: str) -> tuple[bytes, str] | None:
    try:
        # set_content's own choice of encoding and its text (email.contentmanager), so the bytes
        # are the ones a full build writes; private, so every Python's is tested against a
        # full build (tests/unit/sender/test_render.py).
        encoding, text = _encode_text(body, "utf-8", None, MESSAGE_POLICY)
    except (UnicodeError, ValueError):
        return None
    if encoding not in _BODY_HOLE_ENCODINGS:
        return None
    return _LINE_BREAK.sub("\r\n", text).encode("ascii"), encoding


_encode_text: Callable[[str, str, str | None, email.policy.Policy], tuple[str, str]] = (
    email.contentmanager._encode_text)  # type: ignore[attr-defined]  # no stub: private
_ENCODED_BODIES = EncodedBodies()


def is_plain_address(address: str) -> bool:
    """Whether ``address`` is a dot-atom of ASCII letters, digits and ``._+-`` at an ASCII
    domain: written as it is on a header line and on an SMTP command line."""
    return _PLAIN_ADDRESS.fullmatch(address) is not None


def plain_lines(event: EmailRequested, now: dt.datetime) -> Lines | None:
    """``event``'s own lines, when each is a short line of plain ASCII; None otherwise (the
    caller builds the message in full). ``event.sender`` is the sender that will be used."""
    recipient = event.recipient
    if len(recipient) > MAX_LINE - len(LINE_HOLES[0]) or not is_plain_address(recipient):
        return None
    message_id = message_id_for(event.idempotency_key, sender_domain(event.sender))
    if len(message_id) > MAX_LINE - len(LINE_HOLES[2]):
        return None
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    return Lines(b"To: " + recipient.encode("ascii"), date_line(now),
                 b"Message-ID: " + message_id.encode("ascii"), now, own_of(event))


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
        """Its bytes: filled into its template, or built in full when a body holds the
        template's boundary (the email package picks another) or a template of these holes
        cannot be cut for this server's variant."""
        try:
            template = self.cache.get(self.event, utf8=utf8, eight_bit=eight_bit,
                                      own=self.lines.own)
        except TemplateError:
            content = None
        else:
            content = self.lines.fill(template)
        if content is None:
            message = build_message(self.event, attachments_root=None, now=self.lines.now)
            return serialise(message, utf8=utf8, eight_bit=eight_bit)
        return content


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
