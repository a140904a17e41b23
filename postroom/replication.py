"""Decides whether postroom's partitions are safely replicated: offline (no leader), below
``min.insync.replicas`` (acks=all writes refused), under-replicated, and the replication factor a
topic may be created with. Pure: the cluster's metadata and configs are arguments.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping, Sequence


class Severity(enum.StrEnum):
    """How ``postroom check`` words a finding: FAIL exits 1, WARN is said and exits 0."""

    WARN = "WARN"  # degraded, yet every record is still written and read
    FAIL = "FAIL"  # some records can be neither written nor read until it is fixed


@dataclasses.dataclass(frozen=True)
class PartitionReplicas:
    """One partition as the cluster's metadata describes it (broker node ids)."""

    topic: str
    partition: int
    leader: int  # -1: none
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Finding:
    severity: Severity
    topic: str
    partition: int | None  # None: the whole topic (its replication factor)
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    problem: str
    # False when the topic's min.insync.replicas is not known: a WARN may then hide a refusal.
    min_insync_known: bool = True

    def line(self) -> str:
        where = self.topic if self.partition is None else f"{self.topic}[{self.partition}]"
        return (f"{self.severity.value} {where}: {self.problem} "
                f"(replicas {_nodes(self.replicas)}, ISR {_nodes(self.isr)})")


@dataclasses.dataclass(frozen=True)
class TopicHealth:
    """Partitions of one topic by state, as the lag exporter's gauges count them."""

    partitions: int = 0
    offline: int = 0
    under_replicated: int = 0
    below_min_isr: int = 0


def _nodes(nodes: Sequence[int]) -> str:
    return "[" + ",".join(str(n) for n in nodes) + "]"


def replication_findings(partitions: Iterable[PartitionReplicas],
                         min_insync: Mapping[str, int | None]) -> list[Finding]:
    """What is wrong with the replication of ``partitions``, worst first, then by topic and
    partition; empty when every partition has a leader and all its replicas in sync.

    ``min_insync`` is each topic's effective ``min.insync.replicas`` (None: unknown, e.g. not
    readable by this principal): a replication factor below it refuses every acks=all write
    (FAIL, said once per topic); an ISR below it refuses writes until a replica catches up
    (FAIL); an ISR smaller than the replicas with writes still taken is WARN; no leader is FAIL.
    With ``min.insync.replicas`` unknown, an ISR of one replica (of several) is FAIL and a larger
    short ISR WARN, saying writes may be refused.
    """
    findings: list[Finding] = []
    short_topics: set[str] = set()
    for p in sorted(partitions, key=lambda p: (p.topic, p.partition)):
        need = min_insync.get(p.topic)
        factor = len(p.replicas)
        if need is not None and factor < need and p.topic not in short_topics:
            short_topics.add(p.topic)
            findings.append(Finding(
                Severity.FAIL, p.topic, None, p.replicas, p.isr,
                f"replication factor {factor} is below min.insync.replicas={need}: every "
                "write is refused (NOT_ENOUGH_REPLICAS); recreate it with more replicas or "
                "lower the topic's min.insync.replicas"))
        if p.leader < 0:
            findings.append(Finding(Severity.FAIL, p.topic, p.partition, p.replicas, p.isr,
                                    "offline, no leader: nothing in it is written or read "
                                    "until one of its replicas is back"))
        elif len(p.isr) < factor:
            if need is not None and len(p.isr) < need and p.topic not in short_topics:
                findings.append(Finding(
                    Severity.FAIL, p.topic, p.partition, p.replicas, p.isr,
                    f"under-replicated below min.insync.replicas={need}: writes are refused "
                    "(NOT_ENOUGH_REPLICAS) until a replica is back in sync"))
            elif p.topic in short_topics:
                pass
            elif need is None and len(p.isr) <= 1:
                # Unknown min.insync.replicas: one replica in sync refuses acks=all writes under
                # any value but 1, which a platform replicating for safety does not run (2 is
                # usual with factor 3), and one more broker lost takes the partition offline.
                # A deploy step should stop there rather than pass on a guess; an admin with
                # DescribeConfigs gets the exact verdict.
                findings.append(Finding(
                    Severity.FAIL, p.topic, p.partition, p.replicas, p.isr,
                    "under-replicated to one replica in sync: writes are refused unless "
                    "min.insync.replicas is 1 (unknown to this principal: the admin's "
                    "DescribeConfigs), and the partition goes offline with that broker",
                    min_insync_known=False))
            elif need is None:
                findings.append(Finding(
                    Severity.WARN, p.topic, p.partition, p.replicas, p.isr,
                    "under-replicated, writes may be refused (min.insync.replicas unknown; "
                    f"refused if it is above {len(p.isr)})", min_insync_known=False))
            else:
                findings.append(Finding(
                    Severity.WARN, p.topic, p.partition, p.replicas, p.isr,
                    f"under-replicated, writes still taken (min.insync.replicas={need} still "
                    "met)"))
    order = {Severity.FAIL: 0, Severity.WARN: 1}
    return sorted(findings, key=lambda f: order[f.severity])  # stable: topic order kept


def topic_health(partitions: Iterable[PartitionReplicas],
                 min_insync: Mapping[str, int | None]) -> dict[str, TopicHealth]:
    """Per topic, how many partitions are offline, under-replicated (ISR smaller than the
    replicas, offline ones included) and below ``min.insync.replicas`` (unknown counts none)."""
    counts: dict[str, list[int]] = {}
    for p in partitions:
        row = counts.setdefault(p.topic, [0, 0, 0, 0])
        need = min_insync.get(p.topic)
        row[0] += 1
        row[1] += p.leader < 0
        row[2] += len(p.isr) < len(p.replicas)
        row[3] += need is not None and len(p.isr) < need
    return {topic: TopicHealth(*row) for topic, row in sorted(counts.items())}


def replication_refusal(factor: int, brokers: int, min_insync: int | None,
                        setting: str = "POSTROOM_TOPIC_REPLICATION_FACTOR") -> str | None:
    """Why topics may not be created with ``factor`` replicas on a cluster of ``brokers``
    answering brokers whose ``min.insync.replicas`` is ``min_insync`` (None: unknown); None
    when they may. ``factor`` -1 (the broker's default) is judged by the broker itself."""
    if factor < 0:
        return None
    if factor > brokers:
        return (f"{setting}={factor} is more than the {brokers} broker(s) that answer: "
                f"Kafka cannot place {factor} replicas of a partition; set it to at most "
                f"{brokers}, or start the missing brokers")
    if min_insync is not None and factor < min_insync:
        return (f"{setting}={factor} is below the cluster's min.insync.replicas={min_insync}: "
                "every write to those topics would be refused (NOT_ENOUGH_REPLICAS); set it "
                f"to at least {min_insync}")
    return None


def summary(findings: Sequence[Finding], partitions: int) -> str:
    """The first line of ``postroom check``'s replication verdict."""
    failing = sum(f.severity is Severity.FAIL for f in findings)
    if failing:
        return f"{failing} replication problem(s) that stop writes or reads"
    if any(not f.min_insync_known for f in findings):
        return (f"{len(findings)} of {partitions} partitions under-replicated, writes may be "
                "refused (min.insync.replicas unknown)")
    if findings:
        return (f"{len(findings)} of {partitions} partitions under-replicated, writes still "
                "taken")
    return f"all {partitions} partitions have a leader and every replica in sync"
