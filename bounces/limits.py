"""The bounce intake's bounds on what anyone may send it: sessions at once, in all and per client
address (Postfix's process limit and anvil's smtpd_client_connection_count_limit), and the size of
a report (what encloses the largest email postroom sends). Pure: counts and sizes, no sockets."""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Callable

from postroom.rules import SizeLimits

# Recipients of one message: a report goes to the one return path of the email it is about
# (Postfix's smtpd_recipient_limit is 1000 for any mail); 452 past it (RFC 5321 4.5.3.1.10).
RECIPIENTS_MAX = 100
# Replies of 4xx and 5xx in one session before 421 and the connection closed (Postfix's
# smtpd_hard_error_limit): each refused RCPT is a log line, and nothing else bounded them.
ERRORS_MAX = 20
# Commands that change nothing, each resetting the idle timeout (Postfix's
# smtpd_junk_command_limit), and each other command, per session: 421 past them (aiosmtpd
# counts each command apart).
JUNK_COMMANDS = ("NOOP", "RSET", "VRFY", "HELP", "EHLO", "HELO")
JUNK_COMMANDS_MAX = 100
COMMANDS_MAX = 10_000

# Room for what a report adds around the email it encloses: its own headers, the human-readable
# and status parts (a delivery status of 100 recipients is about 50 KB), a provider's wrapping.
REPORT_OVERHEAD_BYTES = 1024 * 1024
# An IPv6 client is counted by its /64, the block one subscriber is given (RFC 6177): one host
# picks any of 2**64 source addresses, each a client of its own if counted by address.
IPV6_CLIENT_PREFIX = 64
_BASE64_LINE = 76  # characters per base64 line (RFC 2045 6.8), then CRLF


class Admission(enum.StrEnum):
    """A new session's fate: the metric's label."""

    ADMITTED = "admitted"
    TOO_MANY = "too_many"  # POSTROOM_BOUNCE_MAX_SESSIONS open
    TOO_MANY_FROM_CLIENT = "too_many_from_client"  # POSTROOM_BOUNCE_MAX_SESSIONS_PER_CLIENT


class LogBudget:
    """At most ``lines`` log lines each ``interval_s`` (a fixed window on ``clock``, seconds);
    a line past them is left out and counted, and the next line let through says how many.
    Not thread-safe: its user holds a lock."""

    def __init__(self, lines: int, interval_s: float, clock: Callable[[], float]) -> None:
        self._lines = lines
        self._interval_s = interval_s
        self._clock = clock
        self._window_start = clock()
        self._used = 0
        self._left_out = 0

    def take(self) -> int | None:
        """None when this line is to be left out; otherwise the lines left out before it."""
        now = self._clock()
        if now - self._window_start >= self._interval_s:
            self._window_start, self._used = now, 0
        if self._used >= self._lines:
            self._left_out += 1
            return None
        self._used += 1
        left_out, self._left_out = self._left_out, 0
        return left_out


def client_of(address: str) -> str:
    """The client a peer ``address`` counts as: an IPv4 address (also when IPv4-mapped, as a
    dual-stack socket gives it), an IPv6 address's /64 (its zone dropped), anything else as
    is."""
    try:
        ip = ipaddress.ip_address(address.partition("%")[0])
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, IPV6_CLIENT_PREFIX), strict=False))
    return str(ip)


class SessionLimits:
    """The sessions open now, in all and per client (client_of the peer's address). Not
    thread-safe: one event loop admits and releases."""

    def __init__(self, max_sessions: int, max_per_client: int) -> None:
        self.max_sessions = max_sessions
        self.max_per_client = max_per_client
        self._open: dict[str, int] = {}
        self._total = 0
        self.refused_in_a_row = 0  # refusals since the last admission (the log's first only)

    @property
    def open(self) -> int:
        """Sessions admitted and not yet released."""
        return self._total

    def admit(self, client: str) -> Admission:
        """Take a session for ``client`` (its address) if both caps allow; release() it once
        it ends, and only if ADMITTED."""
        client = client_of(client)
        if self._total >= self.max_sessions:
            self.refused_in_a_row += 1
            return Admission.TOO_MANY
        if self._open.get(client, 0) >= self.max_per_client:
            self.refused_in_a_row += 1
            return Admission.TOO_MANY_FROM_CLIENT
        self._open[client] = self._open.get(client, 0) + 1
        self._total += 1
        self.refused_in_a_row = 0
        return Admission.ADMITTED

    def release(self, client: str) -> None:
        """An admitted session of ``client`` ended."""
        client = client_of(client)
        left = self._open.get(client, 0) - 1
        if left < 0:
            raise ValueError(f"no session of {client!r} is open")
        if left:
            self._open[client] = left
        else:
            del self._open[client]
        self._total -= 1


def base64_bytes(size: int) -> int:
    """``size`` bytes as a base64 body: 4 characters per 3 bytes, lines of 76 and CRLF."""
    characters = -(-size // 3) * 4
    return characters + -(-characters // _BASE64_LINE) * 2


def report_max_bytes(limits: SizeLimits) -> int:
    """The largest report taken (SIZE, and 552 past it): one that encloses the largest email
    postroom sends whole. Its attachments are base64 (the sender's encoding of a file); its
    text and HTML bodies at most three bytes a byte (quoted-printable's worst)."""
    return (base64_bytes(limits.attachments_total_max_bytes) + 2 * 3 * limits.body_max_bytes
            + REPORT_OVERHEAD_BYTES)
