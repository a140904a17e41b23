"""Tables for the replication verdicts: offline, below min.insync.replicas, under-replicated, a
replication factor below min.insync.replicas, and which factors topics may be created with."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from postroom.replication import (
    Finding,
    PartitionReplicas,
    Severity,
    TopicHealth,
    replication_findings,
    replication_refusal,
    summary,
    topic_health,
)
from support.fuzz import examples

T = "postroom.email.high"
ALL = (1, 2, 3)


def part(partition: int, leader: int, replicas: tuple[int, ...], isr: tuple[int, ...],
         topic: str = T) -> PartitionReplicas:
    return PartitionReplicas(topic, partition, leader, replicas, isr)


@pytest.mark.parametrize(("partitions", "min_insync", "expected"), [
    # healthy: nothing to say, whatever min.insync.replicas is or whether it is known
    ([part(0, 1, ALL, ALL), part(1, 2, ALL, (2, 3, 1))], 2, []),
    ([part(0, 1, (1,), (1,))], 1, []),
    ([part(0, 1, ALL, ALL)], None, []),
    # one broker gone: under-replicated, writes still taken
    ([part(0, 1, ALL, (1, 3))], 2,
     [f"WARN {T}[0]: under-replicated, writes still taken (min.insync.replicas=2 still met) "
      "(replicas [1,2,3], ISR [1,3])"]),
    # min.insync.replicas unknown (no DescribeConfigs): writes may already be refused
    ([part(0, 1, ALL, (1, 3))], None,
     [f"WARN {T}[0]: under-replicated, writes may be refused (min.insync.replicas unknown; "
      "refused if it is above 2) (replicas [1,2,3], ISR [1,3])"]),
    # ... and with one replica left in sync, refused under any min.insync.replicas but 1, and
    # one broker from offline: FAIL
    ([part(0, 3, ALL, (3,))], None,
     [f"FAIL {T}[0]: under-replicated to one replica in sync: writes are refused unless "
      "min.insync.replicas is 1 (unknown to this principal: the admin's DescribeConfigs), and "
      "the partition goes offline with that broker (replicas [1,2,3], ISR [3])"]),
    ([part(0, 3, (1, 3), (3,))], None,
     [f"FAIL {T}[0]: under-replicated to one replica in sync: writes are refused unless "
      "min.insync.replicas is 1 (unknown to this principal: the admin's DescribeConfigs), and "
      "the partition goes offline with that broker (replicas [1,3], ISR [3])"]),
    # two gone: below min.insync.replicas, writes refused
    ([part(0, 3, ALL, (3,))], 2,
     [f"FAIL {T}[0]: under-replicated below min.insync.replicas=2: writes are refused "
      "(NOT_ENOUGH_REPLICAS) until a replica is back in sync (replicas [1,2,3], ISR [3])"]),
    # no leader
    ([part(4, -1, (2,), ())], 1,
     [f"FAIL {T}[4]: offline, no leader: nothing in it is written or read until one of its "
      "replicas is back (replicas [2], ISR [])"]),
    # a replication factor below min.insync.replicas: said once for the topic
    ([part(0, 1, (1,), (1,)), part(1, 2, (2,), (2,))], 2,
     [f"FAIL {T}: replication factor 1 is below min.insync.replicas=2: every write is refused "
      "(NOT_ENOUGH_REPLICAS); recreate it with more replicas or lower the topic's "
      "min.insync.replicas (replicas [1], ISR [1])"]),
])
def test_findings(partitions: list[PartitionReplicas], min_insync: int | None,
                  expected: list[str]) -> None:
    found = replication_findings(partitions, {T: min_insync})
    assert [f.line() for f in found] == expected


def test_failures_come_first_then_topic_and_partition_order() -> None:
    a, b = "p.email.a", "p.email.b"
    found = replication_findings([
        part(1, 1, ALL, (1, 2), topic=b), part(0, 1, ALL, (1, 2), topic=b),
        part(2, -1, ALL, (), topic=b), part(0, 2, ALL, (2,), topic=a),
    ], {a: 2, b: 2})
    assert [(f.severity, f.topic, f.partition) for f in found] == [
        (Severity.FAIL, a, 0), (Severity.FAIL, b, 2), (Severity.WARN, b, 0),
        (Severity.WARN, b, 1)]


def test_an_offline_partition_of_a_short_topic_is_said_besides_the_topic() -> None:
    found = replication_findings([part(0, -1, (1,), ()), part(1, 2, (2,), (2,))], {T: 2})
    assert [(f.severity, f.partition) for f in found] == [(Severity.FAIL, None),
                                                         (Severity.FAIL, 0)]


@pytest.mark.parametrize(("findings", "partitions", "expected"), [
    ([], 27, "all 27 partitions have a leader and every replica in sync"),
    ([Finding(Severity.WARN, T, 0, ALL, (1, 2), "x")] * 2, 27,
     "2 of 27 partitions under-replicated, writes still taken"),
    ([Finding(Severity.WARN, T, 0, ALL, (1, 2), "x"),
      Finding(Severity.WARN, T, 1, ALL, (1, 2), "x", min_insync_known=False)], 27,
     "2 of 27 partitions under-replicated, writes may be refused (min.insync.replicas unknown)"),
    ([Finding(Severity.WARN, T, 0, ALL, (1, 2), "x"), Finding(Severity.FAIL, T, 1, ALL, (), "y")],
     27, "1 replication problem(s) that stop writes or reads"),
])
def test_summary(findings: list[Finding], partitions: int, expected: str) -> None:
    assert summary(findings, partitions) == expected


def test_topic_health_counts_each_state() -> None:
    health = topic_health([
        part(0, 1, ALL, ALL), part(1, 1, ALL, (1, 2)), part(2, 3, ALL, (3,)),
        part(3, -1, ALL, ()), part(0, 1, ALL, ALL, topic="other"),
    ], {T: 2})
    assert health == {"other": TopicHealth(1, 0, 0, 0), T: TopicHealth(4, 1, 3, 2)}


@pytest.mark.parametrize(("factor", "brokers", "min_insync", "refused"), [
    (3, 3, 2, None),
    (-1, 1, 2, None),  # the broker's default: the broker judges it
    (1, 1, None, None),
    (2, 3, 2, None),
    (3, 1, 1, "POSTROOM_TOPIC_REPLICATION_FACTOR=3 is more than the 1 broker(s) that answer"),
    (3, 2, 2, "POSTROOM_TOPIC_REPLICATION_FACTOR=3 is more than the 2 broker(s) that answer"),
    (1, 3, 2, "POSTROOM_TOPIC_REPLICATION_FACTOR=1 is below the cluster's "
              "min.insync.replicas=2: every write to those topics would be refused"),
])
def test_replication_refusal(factor: int, brokers: int, min_insync: int | None,
                             refused: str | None) -> None:
    said = replication_refusal(factor, brokers, min_insync)
    if refused is None:
        assert said is None
    else:
        assert said is not None
        assert said.startswith(refused), said


NODES = st.integers(min_value=1, max_value=5)


@st.composite
def partitions(draw: st.DrawFn) -> PartitionReplicas:
    replicas = tuple(draw(st.lists(NODES, min_size=1, max_size=5, unique=True)))
    isr = tuple(draw(st.lists(st.sampled_from(replicas), max_size=len(replicas), unique=True)))
    leader = draw(st.sampled_from(isr)) if isr and draw(st.booleans()) else -1
    return PartitionReplicas(draw(st.sampled_from(["a", "b"])), draw(st.integers(0, 9)), leader,
                             replicas, isr)


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(partitions(), max_size=12),
       st.dictionaries(st.sampled_from(["a", "b"]), st.none() | st.integers(1, 4)))
def test_every_partition_that_cannot_take_writes_is_a_failure(
        parts: list[PartitionReplicas], min_insync: dict[str, int | None]) -> None:
    found = replication_findings(parts, min_insync)
    failing_topics = {f.topic for f in found if f.severity is Severity.FAIL}
    named = {(f.topic, f.partition) for f in found}
    health = topic_health(parts, min_insync)
    for p in parts:
        need = min_insync.get(p.topic)
        refuses = p.leader < 0 or (need is not None and len(p.isr) < need)
        if refuses:
            assert p.topic in failing_topics
            assert health[p.topic].offline + health[p.topic].below_min_isr > 0
        if p.leader < 0:
            assert (p.topic, p.partition) in named
        if len(p.isr) < len(p.replicas):
            # said one way or another: its own line, or the topic's
            assert (p.topic, p.partition) in named or (p.topic, None) in named
    healthy = all(p.leader >= 0 and len(p.isr) == len(p.replicas)
                  and (min_insync.get(p.topic) or 0) <= len(p.replicas) for p in parts)
    assert (found == []) is healthy
