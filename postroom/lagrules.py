"""Decides what lag means: seconds behind from a record's timestamp, the overdue part of a retry
tier, and a Burrow-style verdict over a window of commits. Pure: times are arguments.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import itertools
from collections.abc import Callable, Iterable, Sequence

# Burrow's default window: 10 commits (its storage `intervals`).
WINDOW_COMMITS = 10


class Verdict(enum.IntEnum):
    """Burrow's partition states, worst last; the value is the metric's."""

    OK = 0
    WARN = 1   # committing, but the lag did not shrink once in the window
    STALL = 2  # alive, committing the same offset with lag for the whole window
    STOP = 3   # no commit for longer than the window spans, with lag


@dataclasses.dataclass(frozen=True)
class Observation:
    """One commit as the lag watcher saw it: the offset, the lag then, and when (epoch s)."""

    offset: int
    lag: int
    at_s: float


def lag_seconds(lag: int, first_unconsumed_ms: int | None, now_s: float) -> float | None:
    """How far behind a partition is: the age of its first unconsumed record; None (unknown)
    when there is lag and that record could not be read.

    Read from that record's timestamp, not interpolated from offsets: a burst after a quiet
    hour has a large offset lag and a small age, and interpolation gets it wrong both ways.
    """
    if lag <= 0:
        return 0.0
    if first_unconsumed_ms is None:
        return None
    return max(0.0, now_s - first_unconsumed_ms / 1000)


def first_not_due(low: int, high: int, is_due: Callable[[int], bool]) -> int:
    """The first offset in [low, high) whose record is not due yet (``high`` if all are).

    A retry tier's records all wait the same delay, so they are due in offset order: a binary
    search over offsets reads log2(n) records, not the whole waiting backlog.
    """
    while low < high:
        middle = (low + high) // 2
        if is_due(middle):
            low = middle + 1
        else:
            high = middle
    return low


def partition_verdict(window: Sequence[Observation], current_lag: int, now_s: float) -> Verdict:
    """Burrow's rules (Consumer Lag Evaluation Rules) for one partition, worst first.

    No lag now is OK. A window whose last commit is older than the window is long is STOP. Lag
    of zero anywhere in the window is OK. One offset all through the window is STALL. A lag
    that never went down from one commit to the next is WARN. Anything else is OK.
    """
    if current_lag <= 0 or not window:
        return Verdict.OK
    first, last = window[0], window[-1]
    if now_s - last.at_s > last.at_s - first.at_s:
        return Verdict.STOP
    if any(o.lag == 0 for o in window):
        return Verdict.OK
    if len(window) < 2:
        return Verdict.OK  # one commit says nothing about progress yet
    pairs = list(itertools.pairwise(window))
    if all(b.offset == a.offset for a, b in pairs):
        return Verdict.STALL
    if all(b.lag >= a.lag for a, b in pairs):
        return Verdict.WARN
    return Verdict.OK


def group_verdict(verdicts: Iterable[Verdict]) -> Verdict:
    """A group is as bad as its worst partition."""
    return max(verdicts, default=Verdict.OK)


class CommitWindows:
    """The last WINDOW_COMMITS observations per partition, fed by successive lag samples.

    librdkafka does not commit an unchanged offset again, so the broker cannot say whether a
    consumer still commits. A group with members is taken as committing its offsets at every
    sample (as a Java consumer would, every auto-commit interval); a group without members adds
    an observation only when an offset moves, so the time rule finds it stopped.
    """

    def __init__(self, size: int = WINDOW_COMMITS) -> None:
        self._size = size
        self._windows: dict[tuple[str, str, int], collections.deque[Observation]] = {}

    def add(self, key: tuple[str, str, int], offset: int, lag: int, at_s: float,
            alive: bool) -> Sequence[Observation]:
        window = self._windows.setdefault(key, collections.deque(maxlen=self._size))
        if alive or not window or window[-1].offset != offset:
            window.append(Observation(offset, lag, at_s))
        return tuple(window)

    def seen(self, key: tuple[str, str, int]) -> Sequence[Observation]:
        """The window as it is, for a sample that could not judge the partition."""
        return tuple(self._windows.get(key, ()))


def standing_by(state: str, owned: Sequence[int]) -> list[int]:
    """Which members of a group (by index; ``owned``: the partitions each owns) own none while
    the group is settled (``stable``): more members than its topics have partitions, idle until
    one leaves. While a group rebalances every member may own none for a moment."""
    return [n for n, count in enumerate(owned) if count == 0] if state == "stable" else []
