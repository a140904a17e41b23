"""Decides how fast mail may go to one destination (a recipient domain, or the smarthost): how many
sends at once, how many per second, and how a throttling reply slows that destination down. Pure:
the clock is an argument.

In the spirit of Postfix's ``default_destination_concurrency_limit`` (20) and
``default_destination_rate_delay`` (off): a throttling reply halves the destination's concurrency
and pauses it once per burst of such replies, the pause doubling when sends after it are throttled
again; each clean send adds one back.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import re

from postroom.sender.outcome import SmtpReply

# What the big providers answer when a sender goes too fast (their documented codes), and the words
# the rest use. A throttled send is deferred without counting as an attempt.
THROTTLING_CODES = {(421, "4.7.28"), (450, "4.2.1"), (451, "4.7.500"), (454, "4.7.0")}
THROTTLING_TEXT = re.compile(r"throttl|rate.?limit|too many (messages|connections|emails)|"
                             r"sending rate|try again later.*rate", re.IGNORECASE)
# Of a reply's text, only this much is searched for those words: a reply may be kilobytes long
# (32 KiB passes the SMTP adapter), and the search, on the event loop, grows with its square.
THROTTLING_TEXT_CHARS = 1024
PAUSE_GROWTH = 2.0
MAX_PAUSE_FACTOR = 16.0  # the pause grows to at most 16 times the first one


class DestinationBy(enum.StrEnum):
    DOMAIN = "domain"        # one destination per recipient domain
    SMARTHOST = "smarthost"  # everything goes to one relay: it is the one destination


def is_throttling(reply: SmtpReply) -> bool:
    """A 4xx that says "too fast" rather than "not now": Gmail 421 4.7.28 and 450 4.2.1,
    Microsoft 451 4.7.500, SES 454 Throttling, or any 4xx whose text says throttling."""
    code = reply.code
    if code is None or not 400 <= code < 500:
        return False
    if THROTTLING_TEXT.search(reply.text, 0, THROTTLING_TEXT_CHARS):
        return True
    # 454 4.7.0 is also "TLS not available": it counts only with SES's words, matched above.
    return code != 454 and (code, _enhanced(reply.text)) in THROTTLING_CODES


def _enhanced(text: str) -> str | None:
    match = re.match(r"\s*([245]\.\d{1,3}\.\d{1,3})\b", text, re.ASCII)
    return match.group(1) if match else None


def destination_of(recipient: str, by: DestinationBy, smarthost: str) -> str:
    """The destination a recipient's mail counts against."""
    if by is DestinationBy.SMARTHOST:
        return smarthost
    return recipient.rpartition("@")[2].strip().lower()


@dataclasses.dataclass(frozen=True)
class ThrottleLimits:
    concurrency: int = 20         # sends at once per destination
    rate_per_s: float = 0.0       # sends started per second per destination; 0: no limit
    pause_s: float = 60.0         # the first pause after a throttling reply

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {self.concurrency}")
        if not (math.isfinite(self.rate_per_s) and self.rate_per_s >= 0):
            raise ValueError(f"rate must be 0 or more per second, got {self.rate_per_s}")
        if not (math.isfinite(self.pause_s) and self.pause_s > 0):
            raise ValueError(f"pause must be positive, got {self.pause_s}")


@dataclasses.dataclass(frozen=True)
class Destination:
    """Where one destination stands: its current concurrency limit, sends in flight, the earliest
    next start (rate), a pause after throttling, and the length of the next pause."""

    limit: int
    in_flight: int = 0
    next_start_s: float = 0.0
    paused_until_s: float = 0.0
    pause_s: float = 0.0
    burst: int = 0  # sends in flight when the last pause began, not yet ended

    @classmethod
    def fresh(cls, limits: ThrottleLimits) -> Destination:
        return cls(limit=limits.concurrency, pause_s=limits.pause_s)


def wait_s(dest: Destination, now_s: float) -> float | None:
    """0 when a send may start now; seconds to wait for the rate or a pause; None when the
    destination's sends in flight fill its limit (wait for one to finish)."""
    if dest.in_flight >= dest.limit:
        return None
    return max(0.0, dest.next_start_s - now_s, dest.paused_until_s - now_s)


def started(dest: Destination, limits: ThrottleLimits, now_s: float) -> Destination:
    gap = 1.0 / limits.rate_per_s if limits.rate_per_s else 0.0
    # Built whole rather than by dataclasses.replace, which lists the fields each time: this and
    # finished() run for every email.
    return Destination(dest.limit, dest.in_flight + 1, max(now_s, dest.next_start_s) + gap,
                       dest.paused_until_s, dest.pause_s, dest.burst)


def finished(dest: Destination, limits: ThrottleLimits, now_s: float,
             throttled: bool) -> Destination:
    """A send ended: a throttling reply halves the limit and pauses the destination (the pause
    doubling up to MAX_PAUSE_FACTOR times the first); a clean one adds one back to the limit and
    resets the pause.

    The sends in flight when a pause begins are its burst: they started before it, and each of
    their replies, whenever it comes (during the pause or long after), changes nothing but the
    sends in flight. A burst of throttling replies, however many sends were in flight and however
    slowly they answer, pauses the destination once; the pause doubles only when a send started
    after it is throttled again. Which send ends is not known here, only how many of the burst
    are left: a send after the pause that ends before the burst's last is counted for it, which
    keeps the number of rounds right."""
    in_flight = max(0, dest.in_flight - 1)
    if dest.burst > 0 or now_s < dest.paused_until_s:
        return Destination(dest.limit, in_flight, dest.next_start_s, dest.paused_until_s,
                           dest.pause_s, max(0, dest.burst - 1))
    if throttled:
        return Destination(max(1, dest.limit // 2), in_flight, dest.next_start_s,
                           now_s + dest.pause_s,
                           min(dest.pause_s * PAUSE_GROWTH, limits.pause_s * MAX_PAUSE_FACTOR),
                           in_flight)
    return Destination(min(limits.concurrency, dest.limit + 1), in_flight, dest.next_start_s,
                       dest.paused_until_s, limits.pause_s)
