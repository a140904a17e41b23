"""What a lag sample says: per partition, per group, the outbox backlog and the topics'
replication, as values the reader builds and the renderers and the exporter read."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from typing import Any

from postroom.lagrules import (
    Verdict,
    standing_by,
)
from postroom.replication import TopicHealth


@dataclasses.dataclass(frozen=True)
class Member:
    client_id: str
    host: str
    partitions: int
    member_id: str = ""  # the broker's name for this member: unique when client ids are alike


@dataclasses.dataclass(frozen=True)
class PartitionReport:
    group: str
    topic: str
    partition: int
    committed: int | None  # None: the group has committed nothing here
    end: int
    lag: int
    lag_seconds: float | None  # None: its first unconsumed record was not read in time
    verdict: Verdict
    tier: int | None = None         # retry tier number; None for other topics
    # Retry tiers: records past their not_before, unconsumed, and how late the first of them
    # is; None on a tier whose first record was not read in time (unknown).
    overdue: int | None = None
    overdue_seconds: float | None = None
    # Why this partition's offsets could not be read (its leader down, the group's coordinator
    # not answering); its lag is unknown, not 0, and counts in no total or verdict.
    unavailable: str | None = None

    def as_json(self) -> dict[str, Any]:
        row: dict[str, Any] = {
            "group": self.group, "topic": self.topic, "partition": self.partition,
            "committed": self.committed, "end": self.end, "lag": self.lag,
            "lag_seconds": _rounded(self.lag_seconds), "verdict": self.verdict.name}
        if self.unavailable is not None:
            row.update(end=None, lag=None, lag_seconds=None, verdict="UNKNOWN",
                       unavailable=self.unavailable)
            return row
        if self.tier is not None:
            row.update(waiting=self.lag, overdue=self.overdue,
                       overdue_seconds=_rounded(self.overdue_seconds))
        return row


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 3)


@dataclasses.dataclass(frozen=True)
class GroupReport:
    group: str
    state: str
    members: tuple[Member, ...]
    partitions: tuple[PartitionReport, ...]
    verdict: Verdict
    # False when the group could not be described (its coordinator moving): ``members`` is
    # then empty for want of an answer, not because no consumer runs.
    members_known: bool = True

    @property
    def idle(self) -> tuple[Member, ...]:
        """Members that own no partition of a settled group: standing by."""
        return tuple(self.members[n] for n in standing_by(
            self.state, [m.partitions for m in self.members]))

    @property
    def known(self) -> tuple[PartitionReport, ...]:
        """The partitions whose lag was read."""
        return tuple(p for p in self.partitions if p.unavailable is None)

    @property
    def unavailable(self) -> int:
        return len(self.partitions) - len(self.known)

    @property
    def sum_lag(self) -> int:
        return sum(p.lag for p in self.known)

    @property
    def max_lag(self) -> int:
        return max((p.lag for p in self.known), default=0)

    @property
    def max_lag_seconds(self) -> float:
        return max((p.lag_seconds for p in self.known if p.lag_seconds is not None),
                   default=0.0)


@dataclasses.dataclass(frozen=True)
class OutboxBacklog:
    """Rows committed and due, not yet published, and the age of the oldest (None: no rows)."""

    rows: int
    oldest_age_s: float | None


@dataclasses.dataclass(frozen=True)
class LagReport:
    at: dt.datetime
    groups: tuple[GroupReport, ...]
    outbox: OutboxBacklog | None
    # Partitions of each of postroom's topics by replication state; None: not read.
    replication: Mapping[str, TopicHealth] | None = None
