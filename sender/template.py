"""A serialised message with holes cut out where each recipient's lines (and an email's own
subject and bodies) go, filled per recipient; and the cache, bounded in bytes, that keeps
templates and encoded bodies (sender/render.py decides what goes into them).

Pure.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import threading
from collections.abc import Hashable
from typing import Generic, TypeVar

# One value may take at most this share of a cache; a larger one is made, not kept.
LARGEST_SHARE = 8
# The lines every template cuts out, in the order build_message writes them.
LINE_HOLES = (b"To: ", b"Date: ", b"Message-ID: ")

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class TemplateError(ValueError):
    """The serialised message has no single, unfolded line for each of To, Date and Message-ID."""


@dataclasses.dataclass(frozen=True)
class Template:
    """A serialised message with its To, Date and Message-ID lines cut out, and for a template
    of emails of their own its Subject line or its text and HTML bodies too."""

    pieces: tuple[bytes, ...]  # one more than the lines and bodies cut out
    lines: int = 3  # how many lines it takes; after them, bodies
    boundary: bytes | None = None  # a multipart template's: no body it takes may hold it

    @classmethod
    def cut(cls, content: bytes, holes: tuple[bytes, ...] = LINE_HOLES, *,
            bodies: tuple[bytes, ...] = (), boundary: bytes | None = None) -> Template:
        """The template of ``content``, whose header block must hold the line of each of
        ``holes`` once, unfolded, in that order (:func:`build_message` writes them so), and
        ``bodies`` after it as they are: a single part's whole body, or each body of a multipart
        (``boundary``) right after its part's header block."""
        end = content.find(b"\r\n\r\n")
        if end < 0:
            raise TemplateError("no end of the header block")
        lines = content[:end].split(b"\r\n")
        at_holes = []
        for name in holes:
            at = [i for i, line in enumerate(lines) if line.startswith(name)]
            if len(at) != 1:
                raise TemplateError(f"{len(at)} lines start with {name!r}")
            folded = at[0] + 1 < len(lines) and lines[at[0] + 1][:1] in (b" ", b"\t")
            if folded:
                raise TemplateError(f"the {name!r} line is folded")
            at_holes.append(at[0])
        if at_holes != sorted(at_holes):
            raise TemplateError(b", ".join(name.rstrip(b": ") for name in holes).decode()
                                + " are out of order")
        pieces = []
        start = 0
        for hole in at_holes:
            pieces.append(b"".join(line + b"\r\n" for line in lines[start:hole]))
            start = hole + 1
        last = b"".join(line + b"\r\n" for line in lines[start:])
        section, offset = content[end + 4:], 0
        if not bodies:
            pieces.append(last + content[end + 2:])
            return cls(tuple(pieces), len(holes), boundary)
        before = last + b"\r\n"
        for body in bodies:
            if boundary is None:
                if len(bodies) != 1:
                    raise TemplateError("more than one body needs a multipart template")
                begins = 0
            else:
                part_end = section.find(b"\r\n\r\n", offset)
                if part_end < 0:
                    raise TemplateError("a part has no end of its header block")
                begins = part_end + 4
            if not section.startswith(body, begins):
                raise TemplateError("a body is not where its part begins")
            pieces.append(before + section[offset:begins])
            before, offset = b"", begins + len(body)
        pieces.append(section[offset:])
        return cls(tuple(pieces), len(holes), boundary)

    @property
    def size(self) -> int:
        return sum(map(len, self.pieces))

    def fill(self, *lines: bytes, bodies: tuple[bytes, ...] = ()) -> bytes:
        """The message with ``lines`` in the line holes and ``bodies`` in the body holes, in
        order."""
        if len(lines) != self.lines or len(lines) + len(bodies) != len(self.pieces) - 1:
            raise ValueError(f"this template takes {self.lines} lines and "
                             f"{len(self.pieces) - 1 - self.lines} bodies, not {len(lines)} and "
                             f"{len(bodies)}")
        parts = [self.pieces[0]]
        for line, piece in zip(lines, self.pieces[1:], strict=False):
            parts += (line, b"\r\n", piece)
        parts += itertools.chain.from_iterable(zip(bodies, self.pieces[1 + self.lines:],
                                                   strict=True))
        return b"".join(parts)


class BudgetedCache(Generic[K, V]):
    """Values by key, least recently used first out, within ``max_bytes`` as their costs count
    them; a value over its share (an eighth) is not kept. A lock makes it safe to share between
    threads (the work that makes a value is done outside it)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: collections.OrderedDict[K, tuple[V, int]] = collections.OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: K) -> bool:
        return key in self._entries

    @property
    def size(self) -> int:
        """The bytes the cache holds, by its own count."""
        return self._bytes

    @property
    def share(self) -> int:
        """The most one value may cost and be kept."""
        return self.max_bytes // LARGEST_SHARE

    def find(self, key: K) -> tuple[V] | None:
        """The value of ``key`` in a 1-tuple (so a kept None is found), or None."""
        with self._lock:
            found = self._entries.get(key)
            if found is None:
                return None
            self._entries.move_to_end(key)
            return (found[0],)

    def keep(self, key: K, value: V, cost: int) -> None:
        if cost > self.share:
            return
        with self._lock:
            if key in self._entries:
                return
            self._entries[key] = (value, cost)
            self._bytes += cost
            while self._bytes > self.max_bytes:
                _, (_, dropped) = self._entries.popitem(last=False)
                self._bytes -= dropped
