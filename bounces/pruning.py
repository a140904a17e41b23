"""What the bounce intake keeps of a message while it arrives: the header blocks and the parts a
report is read from (delivery status, feedback report, text, the enclosed message's headers), each
up to a cap, and nothing else, so a session's memory does not grow with the message. Pure: the
DATA bytes in, in any pieces; the kept message out.

Hand-written, not the email package's FeedParser: the feed parser keeps every line of a part
until the part ends (a 25 MiB attachment is 25 MiB of lines, then their join), and no library
streams nested MIME while discarding bodies. What is kept is a well-formed message the email
package then parses as before (``tests/unit/bounces/test_pruning.py`` checks that a report reads
the same kept as whole).
"""

from __future__ import annotations

import dataclasses
import email
import email.message
import enum
import re

# Postfix's header_size_limit: the excess of a header block is discarded.
HEADER_BLOCK_MAX_BYTES = 102_400
# A report part: a delivery status of MAX_BLOCKS recipients is about 50 KB.
REPORT_PART_MAX_BYTES = 256 * 1024
# A text part: the heuristics and a person read the start (qmail appends the whole original).
TEXT_PART_MAX_BYTES = 64 * 1024
# All that is kept of one message: bounds a session's memory, whatever arrives.
KEPT_MAX_BYTES = 512 * 1024
MAX_PARTS = 100  # parts kept, at any depth; the rest of the message is read and dropped
MAX_DEPTH = 10  # nesting read; a deeper multipart's parts are dropped with its body
LINE_MAX_BYTES = 1000  # RFC 5322 2.1.1; a longer line is kept cut (a report's own lines fit)
# Lines looked at one by one (kept, or that may be a delimiter: a line starting with "-" in a
# body dropped), about 3 us each on the event loop: a message of "-" lines cost 1 s of the
# loop a MiB (40 s at the size limit, every session stalled). A genuine report's lines looked
# at are a few thousand (a delivery status of 100 recipients is about 1,500); past this the
# rest is read without looking, as past MAX_PARTS.
LINES_MAX = 20_000

REPORT_TYPES = frozenset({"message/delivery-status", "message/global-delivery-status",
                          "message/feedback-report", "text/rfc822-headers",
                          "message/global-headers"})
ENCLOSED_TYPES = frozenset({"message/rfc822", "message/global"})
# As the email package's feed parser tells a header line from the start of a body.
_HEADER_LINE = re.compile(rb"^(From |[\041-\071\073-\176]*:|[\t ])")


class _Body(enum.Enum):
    HEADERS = "headers"  # the entity's header block is still being read
    KEEP = "keep"  # its body is kept up to its cap
    DROP = "drop"  # its body is read and dropped
    MULTIPART = "multipart"  # its body is parts between its delimiters
    ENCLOSED = "enclosed"  # its body is an enclosed message (an entity of its own)


@dataclasses.dataclass
class _Entity:
    """A message or a part being read."""

    depth: int
    enclosed: bool = False  # the enclosed message of a message/rfc822 part: its body is dropped
    body: _Body = _Body.HEADERS
    header_start: int = 0  # where its header block starts in the output
    header_full: bool = False  # its header block reached its cap: the rest of it is dropped
    left: int = 0  # what its body may still keep (KEEP); -1 once cut
    delimiter: bytes = b""  # "--" and its boundary (MULTIPART)
    closed: bool = False  # its close delimiter came: the rest is its epilogue (MULTIPART)


@dataclasses.dataclass(frozen=True)
class Kept:
    """The kept message, the bytes of DATA ``received`` (dot-stuffed), and whether anything a
    report is read from was cut for a cap (``pruned``)."""

    message: bytes
    received: int
    pruned: bool


class Pruner:
    """Reads the DATA of one message (dot-stuffed lines, without the final ``.`` line) piece by
    piece, keeping at most KEPT_MAX_BYTES of it. Bodies that are dropped are skipped with
    ``bytes.find`` between lines that may be delimiters, not line by line."""

    def __init__(self) -> None:
        self._out = bytearray()
        self._stack = [_Entity(depth=0)]
        self._line = bytearray()  # the current line, up to LINE_MAX_BYTES
        self._line_len = 0  # its length as received
        self._line_skipped = False  # its start was skipped: it is no delimiter, and dropped
        self._received = 0
        self._parts = 0  # parts begun
        self._lines = 0  # lines looked at
        self._pruned = False
        self._full = False
        self._draining = False

    def feed(self, data: bytes) -> None:
        """Read the next ``data`` of the message, split anywhere."""
        self._received += len(data)
        pos, end = 0, len(data)
        while pos < end and not self._draining:
            if self._line_len == 0 and self._dropping() and not self._may_matter(data, pos):
                # A dropped line: skip to the next line that may be a delimiter (or a header
                # block's end).
                found = self._next_line_that_may_matter(data, pos)
                if found < 0:
                    newline = data.rfind(b"\n", pos)
                    if newline != end - 1:  # a line goes on in the next piece: dropped too
                        self._line_len = end - (newline + 1 if newline >= 0 else pos)
                        self._line_skipped = True
                    return
                pos = found
                continue
            newline = data.find(b"\n", pos)
            stop = end if newline < 0 else newline + 1
            if not self._line_skipped and len(self._line) < LINE_MAX_BYTES:
                self._line += data[pos:min(stop, pos + LINE_MAX_BYTES - len(self._line))]
            self._line_len += stop - pos
            pos = stop
            if newline >= 0:
                self._end_line()

    def close(self) -> Kept:
        """What was kept, once the message has ended."""
        if self._line_len and not self._draining:
            self._end_line()
        return Kept(bytes(self._out), self._received, self._pruned)

    def _dropping(self) -> bool:
        entity = self._stack[-1]
        if entity.body is _Body.HEADERS:
            return entity.header_full
        return (entity.body in (_Body.DROP, _Body.MULTIPART)
                or (entity.body is _Body.KEEP and (entity.left < 0 or self._full)))

    def _in_headers(self) -> bool:
        return self._stack[-1].body is _Body.HEADERS

    def _may_matter(self, data: bytes, pos: int) -> bool:
        """Whether the line at ``pos`` may be a delimiter, or the blank line that ends a header
        block being dropped (``-``, ``\\r``, ``\\n``: one byte decides, and the line is read)."""
        first = data[pos:pos + 1]
        return first == b"-" or (self._in_headers() and first in (b"\r", b"\n"))

    def _next_line_that_may_matter(self, data: bytes, pos: int) -> int:
        found = data.find(b"\n-", pos)
        if self._in_headers():
            blank = min((at for at in (data.find(b"\n\r", pos), data.find(b"\n\n", pos))
                         if at >= 0), default=-1)
            if blank >= 0 and (found < 0 or blank < found):
                found = blank
        return found + 1 if found >= 0 else -1

    def _end_line(self) -> None:
        line = bytes(self._line)
        skipped, cut = self._line_skipped, self._line_len > len(self._line)
        self._line.clear()
        self._line_len, self._line_skipped = 0, False
        if skipped:
            return
        self._lines += 1
        if self._lines > LINES_MAX:
            self._drain()
            return
        if cut:
            line = line.rstrip(b"\r\n") + b"\r\n"
        if line.startswith(b"."):  # RFC 5321 4.5.2: the sender doubled a leading dot
            line = line[1:]
        if line.startswith(b"--") and self._delimiter(line):
            return
        self._take(line)

    def _take(self, line: bytes) -> None:
        entity = self._stack[-1]
        blank = not line.strip(b"\r\n")
        if entity.body is _Body.HEADERS:
            if not blank and _HEADER_LINE.match(line):
                self._header_line(entity, line)
                return
            # The block ends at its blank line, or at a line that cannot be a header (the email
            # package reads it so too): the kept message gets its blank line either way.
            self._emit(line if blank else b"\r\n")
            self._end_headers(entity)
            if not blank:
                self._take(line)  # the body's first line, or the enclosed message's
            return
        if entity.body is _Body.KEEP and entity.left >= 0:
            if len(line) <= entity.left and self._emit(line):
                entity.left -= len(line)
            else:
                entity.left = -1  # cut here: the rest of the part is dropped
                self._pruned = True

    def _header_line(self, entity: _Entity, line: bytes) -> None:
        if entity.header_full:
            return
        if len(self._out) - entity.header_start + len(line) > HEADER_BLOCK_MAX_BYTES:
            entity.header_full = True
            self._pruned = True
            return
        if not self._emit(line):
            entity.header_full = True

    def _end_headers(self, entity: _Entity) -> None:
        headers = email.message_from_bytes(bytes(self._out[entity.header_start:]))
        content_type = headers.get_content_type()
        if entity.enclosed:
            entity.body = _Body.DROP
        elif content_type.startswith("multipart/") and entity.depth < MAX_DEPTH:
            entity.body = _Body.DROP
            delimiter = _boundary(headers)
            if delimiter is not None:
                entity.body, entity.delimiter = _Body.MULTIPART, b"--" + delimiter
        elif content_type in ENCLOSED_TYPES and entity.depth < MAX_DEPTH:
            entity.body = _Body.ENCLOSED
            self._stack.append(_Entity(depth=entity.depth + 1, enclosed=True,
                                       header_start=len(self._out)))
        elif content_type in REPORT_TYPES or content_type.startswith("text/"):
            entity.body = _Body.KEEP
            entity.left = (REPORT_PART_MAX_BYTES if content_type in REPORT_TYPES
                           else TEXT_PART_MAX_BYTES)
        else:
            entity.body = _Body.DROP

    def _delimiter(self, line: bytes) -> bool:
        """Whether ``line`` is the delimiter of an open multipart (the innermost that matches:
        the parts inside it end there)."""
        for level in range(len(self._stack) - 1, -1, -1):
            entity = self._stack[level]
            if entity.body is not _Body.MULTIPART or entity.closed:
                continue
            if not line.startswith(entity.delimiter):
                continue
            rest = line[len(entity.delimiter):]
            close = rest.startswith(b"--")
            if rest[2 if close else 0:].strip(b" \t\r\n"):
                continue  # another boundary that starts with this one
            del self._stack[level + 1:]
            if close:
                entity.closed = True
                self._emit(entity.delimiter + b"--\r\n")
                return True
            self._parts += 1
            if self._parts > MAX_PARTS:
                self._drain()
                return True
            self._emit(entity.delimiter + b"\r\n")
            self._stack.append(_Entity(depth=entity.depth + 1, header_start=len(self._out)))
            return True
        return False

    def _drain(self) -> None:
        """Past MAX_PARTS or LINES_MAX nothing more is kept: close the open multiparts in what
        is kept, and read the rest without looking at it (a flood of empty parts or of lines
        that may be delimiters costs no line work)."""
        self._pruned = self._draining = True
        for entity in reversed(self._stack):
            if entity.body is _Body.MULTIPART and not entity.closed:
                self._emit(entity.delimiter + b"--\r\n")

    def _emit(self, line: bytes) -> bool:
        if self._full or len(self._out) + len(line) > KEPT_MAX_BYTES:
            # Nothing after the first cut: a message cut once stays well-formed up to there.
            self._full = self._pruned = True
            return False
        self._out += line
        return True


def _boundary(headers: email.message.Message) -> bytes | None:
    boundary = headers.get_boundary()
    if not boundary:
        return None
    try:
        return boundary.encode("ascii", "surrogateescape")
    except UnicodeEncodeError:
        return None
