"""Decides what a batch of ledger claims answers, how long a claim lasts, when it must be renewed
before its send, and how long to wait when another sender holds one. Pure.

A claim's lease must outlast the longest send, so a live sender never loses a key it is sending;
a sender that finds a key leased elsewhere waits for that sender's answer, its death or the end
of its lease instead of sending it a second time.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
from collections.abc import Iterable, Mapping, Sequence

from postroom.sender.retry import due_in_s
from postroom.settings import Settings

LEASE_MARGIN_S = 15.0  # time after a send's deadline to record its outcome in the ledger
BUSY_WAIT_UNKNOWN_S = 1.0   # the holder's lease end is not known
BUSY_WAIT_MIN_S = 0.2
# Ask again at least this often, whatever the lease says: the holder may die at any moment,
# which frees its claim at once (sender/ledger.py), or answer.
BUSY_WAIT_MAX_S = 1.0


# A sender claims a key while the key waits for its destination's turn, so the claim's round trip
# overlaps the sends before it. A claim older than this when its send starts has its lease renewed
# first, so the lease still outlasts the send's deadline and the outcome's record.
RENEW_AFTER_S = LEASE_MARGIN_S / 3


def needs_renewal(age_s: float, same_session: bool) -> bool:
    """Whether a claim taken ``age_s`` ago must be renewed before its send: it is old, or the
    ledger session that took it has ended since (another sender may have taken the key while
    our owner's lock was free)."""
    return age_s > RENEW_AFTER_S or not same_session


def dead_letter_key(topic: str, partition: int, offset: int, timestamp_ms: int) -> str:
    """The ledger key that makes a record's dead letter once, whoever reads the record: its
    origin, with its timestamp (a topic deleted and made again reuses its offsets). Never an
    idempotency key, which always holds a ``|`` (a topic name cannot)."""
    return f"dead-letter {topic}[{partition}]@{offset} ts={timestamp_ms}"


def send_deadline_s(settings: Settings) -> float:
    """The longest one SMTP send may take before it is abandoned as timed out."""
    return settings.smtp_connect_timeout_s + 4 * settings.smtp_timeout_s


def lease_s(settings: Settings) -> float:
    """How long a ledger claim lasts: past the send's deadline, so a live sender keeps it."""
    return send_deadline_s(settings) + LEASE_MARGIN_S


def busy_wait_s(lease_until: dt.datetime | None, now: dt.datetime) -> float:
    """How long to wait before claiming a key again that another sender holds until
    ``lease_until``: just past the lease, within [BUSY_WAIT_MIN_S, BUSY_WAIT_MAX_S]."""
    if lease_until is None:
        return BUSY_WAIT_UNKNOWN_S
    return max(BUSY_WAIT_MIN_S, min(due_in_s(lease_until, now) + BUSY_WAIT_MIN_S, BUSY_WAIT_MAX_S))


class Claim(enum.StrEnum):
    MINE = "mine"          # go ahead and send
    SENT = "sent"          # a server accepted this key already: do not send again
    BUSY = "busy"          # another sender holds a live lease: wait for its answer
    DONE = "done"          # this attempt was made and its outcome published: not again


@dataclasses.dataclass(frozen=True)
class ClaimResult:
    claim: Claim
    attempt: int | None = None
    message_id: str | None = None
    lease_until: dt.datetime | None = None
    taken_from: str | None = None  # MINE by taking over the claim of this owner
    session: int = 0  # the claims session it was taken on (Ledger.session)


@dataclasses.dataclass(frozen=True, slots=True)
class KeyState:
    """A ``sender_ledger`` row as a claim that did not take it reads it."""

    key: str
    state: str  # 'sending', 'sent' or 'released'
    lease_until: dt.datetime | None = None
    attempt: int | None = None
    message_id: str | None = None
    done_attempt: int | None = None


def first_attempts(items: Sequence[tuple[str, int]]) -> dict[str, int]:
    """The keys one claim statement asks for, each with the attempt of its first request: the
    same key twice in one statement is an error in PostgreSQL."""
    first: dict[str, int] = {}
    for key, attempt in items:
        first.setdefault(key, attempt)
    return first


def decide_claims(items: Sequence[tuple[str, int]], taken: Mapping[str, str | None],
                  others: Iterable[KeyState], session: int) -> list[ClaimResult]:
    """The answer to each ``(key, attempt)`` of one batch, in order, once the claim statement
    (asked :func:`first_attempts`) took the keys of ``taken`` (each with the owner it took the
    key over from, or None) and the rows of the keys it did not take read as ``others``.

    A key's later copies in the batch wait (BUSY) for its first, as a second sender would. A
    DONE found for the key's first attempt answers only the attempts it covers: a later attempt
    (its next tier's record, read with a copy of the last) is not done and asks again, alone."""
    first = first_attempts(items)
    known: dict[str, ClaimResult] = {
        key: ClaimResult(Claim.MINE, taken_from=taken_from, session=session)
        for key, taken_from in taken.items()}
    dones: dict[str, int] = {}
    for row in others:
        if row.key in taken or row.key not in first:
            continue  # not a row this statement left to be read
        done = row.done_attempt
        claim = (Claim.SENT if row.state == "sent" else
                 Claim.DONE if done is not None and done >= first[row.key] else Claim.BUSY)
        known[row.key] = ClaimResult(claim, row.attempt, row.message_id, row.lease_until)
        if done is not None:
            dones[row.key] = done
    results: list[ClaimResult] = []
    handed: set[str] = set()
    for key, attempt in items:
        result = known.get(key, ClaimResult(Claim.BUSY))
        if result.claim is Claim.MINE and key in handed:
            result = ClaimResult(Claim.BUSY)
        elif result.claim is Claim.DONE and dones[key] < attempt:
            result = ClaimResult(Claim.BUSY)
        handed.add(key)
        results.append(result)
    return results
