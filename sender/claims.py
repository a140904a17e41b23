"""Decides how long a ledger claim lasts, when it must be renewed before its send, and how long to
wait when another sender holds one. Pure.

A claim's lease must outlast the longest send, so a live sender never loses a key it is sending;
a sender that finds a key leased elsewhere waits for that sender's answer, its death or the end
of its lease instead of sending it a second time.
"""

from __future__ import annotations

import datetime as dt

from postroom.settings import Settings
from sender.retry import due_in_s

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
