"""Decides what happens after a delivery attempt: done, retry on which tier and when, fail or dead.

Pure: the clock is an argument; the consumer applies the decision (publish to a retry tier,
the dead-letter topic or the results topic).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import math

from postroom.sender.outcome import Outcome, Verdict


class Action(enum.StrEnum):
    DONE_SENT = "done_sent"  # accepted by the server: record it, never send again
    RETRY = "retry"          # transient failure: publish to retry tier ``tier``
    FAIL = "fail"            # permanent failure: record it, never send again
    DEAD = "dead"            # transient failures used up every tier: dead-letter and alert


@dataclasses.dataclass(frozen=True)
class RetryDecision:
    """What to do with a message after one attempt."""

    action: Action
    tier: int | None = None                # retry tier to publish to, with RETRY only
    not_before: dt.datetime | None = None  # earliest start of the next attempt, with RETRY only
    counted: bool = True  # False: the attempt waited (a configuration fault); its number stays


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """Retry tier n (1-based) holds attempt n + 1 and waits ``delays_s[n - 1]`` seconds.

    Built from ``Settings.retry_delays_s``, where the default lives. With no tiers every transient
    failure is dead.
    """

    delays_s: tuple[float, ...]

    def __post_init__(self) -> None:
        delays = tuple(float(d) for d in self.delays_s)
        for tier, delay in enumerate(delays, start=1):
            if not (math.isfinite(delay) and delay >= 0):
                raise ValueError(f"retry tier {tier}: delay must be >= 0 seconds, got {delay!r}")
        object.__setattr__(self, "delays_s", delays)

    @property
    def tiers(self) -> int:
        return len(self.delays_s)

    def decide(self, outcome: Outcome, attempt: int, now: dt.datetime) -> RetryDecision:
        """What to do after attempt number ``attempt`` (1-based) ended with ``outcome`` at ``now``.

        A transient failure of attempt n goes to tier n while there is one. An attempt beyond
        the last tier (tiers were removed while messages sat in them) is dead, not an
        error, so shrinking the configuration cannot wedge a consumer.
        """
        if attempt < 1:
            raise ValueError(f"attempt is 1-based, got {attempt}")
        _require_aware(now, "now")
        if outcome.verdict is Verdict.SENT:
            return RetryDecision(Action.DONE_SENT)
        if outcome.verdict is Verdict.PERMANENT:
            return RetryDecision(Action.FAIL)
        if attempt > self.tiers:
            return RetryDecision(Action.DEAD)
        return RetryDecision(
            Action.RETRY,
            tier=attempt,
            not_before=now + dt.timedelta(seconds=self.delays_s[attempt - 1]),
        )

    def wait(self, attempt: int, now: dt.datetime) -> RetryDecision:
        """Where attempt ``attempt`` waits when our configuration kept it from being made (no
        POSTROOM_ATTACHMENTS_ROOT): back on the tier it was read from with its number kept (the
        first attempt, read from a priority topic, on tier 1), waiting that tier's delay (the
        last tier's, for a tier removed since). A wait is no attempt: it never uses up a tier,
        so it never walks the tiers to dead. With no tiers there is nowhere to wait: dead."""
        if attempt < 1:
            raise ValueError(f"attempt is 1-based, got {attempt}")
        _require_aware(now, "now")
        if not self.tiers:
            return RetryDecision(Action.DEAD)
        tier = max(attempt - 1, 1)
        delay_s = self.delays_s[min(tier, self.tiers) - 1]
        return RetryDecision(Action.RETRY, tier=tier, counted=False,
                             not_before=now + dt.timedelta(seconds=delay_s))


def due_in_s(not_before: dt.datetime | None, now: dt.datetime) -> float:
    """Seconds until ``not_before``; zero or less when due. No ``not_before`` is due now."""
    _require_aware(now, "now")
    if not_before is None:
        return 0.0
    _require_aware(not_before, "not_before")
    return (not_before - now).total_seconds()


def lateness_s(not_before: dt.datetime, fired_at: dt.datetime) -> float:
    """How many seconds after ``not_before`` a retry ran; negative means it ran too early."""
    _require_aware(not_before, "not_before")
    _require_aware(fired_at, "fired_at")
    return (fired_at - not_before).total_seconds()


def _require_aware(moment: dt.datetime, name: str) -> None:
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware, got {moment.isoformat()}")
