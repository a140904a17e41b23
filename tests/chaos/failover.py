"""The failover scenarios: faults of a three-broker cluster's nodes (scripts/services.sh with
POSTROOM_DEV_BROKERS=3: three brokers, three controllers) while mail flows, run by
``scenarios.run_scenario`` with the suite's checks, and the longest pause in deliveries each left.

Each scenario keeps the senders fed while its faults last (at FEED_PER_S, steady), so a pause in
the mail server's 250s is the pipeline's, not an empty outbox; and ends once every partition is back in
sync, so the next one meets a healthy cluster. ``PROTOCOLS`` are the consumer group settings
the pauses are measured under (docs/operations.md).
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable
from typing import Any

from chaos.checks import Outcome, read_topic
from chaos.harness import Run
from chaos.scenarios import BUSY_SHARE, SENDERS, Inject, Scenario, kill_senders
from postroom.topics import dead_letter_topic

BROKERS = 3
FEED_PER_S = 60.0
LEADER_DOWN_S = 30.0
BROKER_DOWN_S = 120.0
TWO_DOWN_S = 60.0
CONTROLLER_DOWN_S = 10.0
# The single-broker suite's takeover bound for a killed sender's keys (scenarios.FULL).
TAKEOVER_LIMIT_S = 60.0


@dataclasses.dataclass(frozen=True)
class Protocol:
    """Consumer group settings for every role: librdkafka's (env) and, for KIP-848, the groups'
    own configs on the broker (consumer.session.timeout.ms ...), set before the roles start."""

    name: str
    env: tuple[tuple[str, str], ...] = ()
    group_config: tuple[tuple[str, str], ...] = ()


KIP848_GROUP_CONFIG = (("consumer.session.timeout.ms", "10000"),
                       ("consumer.heartbeat.interval.ms", "2000"))
PROTOCOLS = {p.name: p for p in (
    # postroom's defaults where the groups' KIP-848 session is Kafka's 45 s: the classic protocol,
    # session.timeout.ms 10 s, heartbeats every 2 s.
    Protocol("classic"),
    # Sessions longer than the coordinator's move (fencing 9 s, then the offsets partition's
    # election and load) with heartbeats at the same tenth: the shortest classic session a
    # coordinator kill does not expire.
    Protocol("classic-15s", (("POSTROOM_KAFKA_CONSUMER_CONFIG",
                              "session.timeout.ms=15000;heartbeat.interval.ms=1500"),)),
    # A session 2 s longer than the default with heartbeats twice as often: the last heartbeat
    # answered at most 1 s before a coordinator's broker dies leaves the session 11 s for the move.
    Protocol("classic-12s", (("POSTROOM_KAFKA_CONSUMER_CONFIG",
                              "session.timeout.ms=12000;heartbeat.interval.ms=1000"),)),
    Protocol("classic-30s", (("POSTROOM_KAFKA_CONSUMER_CONFIG",
                              "session.timeout.ms=30000;heartbeat.interval.ms=3000"),)),
    Protocol("kip848", (("POSTROOM_KAFKA_CONSUMER_CONFIG", "group.protocol=consumer"),),
             KIP848_GROUP_CONFIG),
    # postroom's default on a platform that set the groups' KIP-848 session to 10 s: no
    # group.protocol named, the roles choose KIP-848 themselves (postroom.kafka.group_protocol).
    Protocol("auto", (), KIP848_GROUP_CONFIG),
)}


def _down_then_up(run: Run, nodes: list[int], down_s: float, *, kind: str = "broker",
                  how: str = "kill", while_down: Callable[[Run], None] | None = None) -> None:
    if kind == "broker":
        coordinators = run.coordinators()
        run.notes.append(f"{how} {kind} {','.join(map(str, nodes))} (group coordinators: "
                         + ", ".join(f"{g.split('-')[1]} on {b}" for g, b in coordinators.items())
                         + ")")
    else:
        run.notes.append(f"{how} {kind} {','.join(map(str, nodes))}")
    for n in nodes:
        run.node(f"{how}-{kind}", n)
    began = time.monotonic()
    if while_down is not None:
        while_down(run)
    time.sleep(max(0.0, down_s - (time.monotonic() - began)))
    for n in nodes:
        run.node(f"start-{kind}", n)
    run.wait_in_sync()


def leader_kill(run: Run, rng: random.Random) -> None:
    _down_then_up(run, [run.busiest_leader()], LEADER_DOWN_S)


def coordinator_kill(run: Run, rng: random.Random) -> None:
    """The broker coordinating the sender group SIGKILLed: its heartbeats and commits have no
    coordinator until the group's __consumer_offsets partition has a new leader."""
    _down_then_up(run, [run.coordinators()[run.settings.sender_group]], LEADER_DOWN_S)


def broker_down(run: Run, rng: random.Random) -> None:
    _down_then_up(run, [run.busiest_leader()], BROKER_DOWN_S)


def two_brokers_down(run: Run, rng: random.Random) -> None:
    """Two of three down: one replica in sync, below min.insync.replicas (2), so every write
    (the relay's events, the senders' results and retries, offset commits) is refused with
    NOT_ENOUGH_REPLICAS until one is back."""
    busiest = run.busiest_leader()
    other = rng.choice([n for n in range(1, BROKERS + 1) if n != busiest])
    _down_then_up(run, [busiest, other], TWO_DOWN_S, while_down=_probe_write)


def _probe_write(run: Run) -> None:
    # The controller shrinks the in-sync replicas once it has fenced the dead brokers
    # (broker.session.timeout.ms, 9 s): from then on a write is refused.
    run.write_refusal = run.write_refused(timeout_s=TWO_DOWN_S / 2)
    run.notes.append(f"a write while two were down: {run.write_refusal or 'taken'}")


def writes_were_refused(run: Run) -> list[str]:
    if run.write_refusal == "NOT_ENOUGH_REPLICAS":
        return dead_letters_explained(run)
    return [f"a write while two brokers were down was answered {run.write_refusal or 'ok'}, "
            "not NOT_ENOUGH_REPLICAS", *dead_letters_explained(run)]


def dead_letters_explained(run: Run) -> list[str]:
    """Only the recipients refused (550) or deferred on every attempt are dead-lettered: a
    broker fault never ends an email there."""
    found = []
    for msg in read_topic(run, dead_letter_topic(run.settings.topic_prefix)):
        key = (msg.key() or b"").decode(errors="replace")
        if run.expected.get(key.split("|", 1)[-1]) not in ("failed", "dead"):
            found.append(f"dead letter {key!r}")
    return found


def rolling_restart(run: Run, rng: random.Random) -> None:
    """As an upgrade does it: each broker stopped cleanly and started, the next one once every
    partition is back in sync."""
    for n in range(1, BROKERS + 1):
        _down_then_up(run, [n], 0.0, how="stop")


def controller_kill(run: Run, rng: random.Random) -> None:
    _down_then_up(run, [run.active_controller()], CONTROLLER_DOWN_S, kind="controller")


def broker_and_sender_kill(run: Run, rng: random.Random) -> None:
    """The busiest leader and a sender at full load SIGKILLed together (the sender is started
    again at once, the broker after LEADER_DOWN_S)."""
    broker = run.busiest_leader()
    sender = rng.choice(run.busy_senders(BUSY_SHARE, 5.0) or SENDERS)
    run.node_fault_began_at = time.time()
    run.kill(sender)
    _down_then_up(run, [broker], LEADER_DOWN_S)


def scenario(name: str, inject: Inject, proves: str, **more: Any) -> Scenario:
    return Scenario(name, 3000, inject, proves, feed_per_s=FEED_PER_S, steady_feed=True,
                    start_faults_at=0.05, drain_timeout_s=300,
                    **{"before_stop": dead_letters_explained, **more})


FAILOVER = [
    scenario("leader of the busiest partitions SIGKILL, back after 30 s", leader_kill,
             "partition leaders move; no email lost or sent twice; deliveries resume"),
    scenario("sender group's coordinator SIGKILL, back after 30 s", coordinator_kill,
             "the group finds its new coordinator without a rebalance's pause"),
    scenario("one broker down 120 s", broker_down,
             "two replicas in sync go on taking every write; the broker catches up when back"),
    scenario("two brokers down 60 s (NOT_ENOUGH_REPLICAS)", two_brokers_down,
             "writes refused: the sender holds what it sent and has not published, fails and "
             "dead-letters nothing for it, and resumes", before_stop=writes_were_refused),
    scenario("rolling restart of the three brokers", rolling_restart,
             "each broker's clean shutdown moves its leaders first: deliveries barely pause"),
    scenario("active controller SIGKILL, back after 10 s", controller_kill,
             "a controller election moves no partition leader"),
    scenario("busiest leader + a sender SIGKILL together", broker_and_sender_kill,
             "the killed sender's keys are taken over while leaders move",
             takeover_limit_s=TAKEOVER_LIMIT_S),
    # As the single-broker suite's "sender SIGKILL x1 at full load": fed fast, so the sender
    # killed has keys in doubt, whose takeover the group's session timeout bounds.
    Scenario("sender SIGKILL at full load (cluster)", 5000,
             kill_senders(1, (3.0, 5.0), at_full_load=True),
             "the group's session timeout bounds the takeover of a killed sender's keys",
             feed_per_s=1000.0, start_faults_at=0.02, backlog=3000, kills_at_full_load=True,
             takeover_limit_s=TAKEOVER_LIMIT_S, before_stop=dead_letters_explained),
]


def with_protocol(scenarios: list[Scenario], protocol: Protocol) -> list[Scenario]:
    """The scenarios with every role on ``protocol``, named by it."""
    return [dataclasses.replace(s, name=f"{s.name} [{protocol.name}]",
                                env=(*s.env, *protocol.env),
                                group_config=protocol.group_config) for s in scenarios]


def failover_table(outcomes: list[Outcome]) -> str:
    """One line per scenario, as docs/reliability.md's failover table shows it."""
    lines = ["| scenario | emails | lost | duplicates (explained by a sender kill / a late "
             "reply / unexplained) | longest pause in deliveries s | killed sender's keys "
             "resent within s | drain after last fault s |",
             "|---|---:|---:|---|---:|---:|---:|"]
    for o in outcomes:
        pause = "-" if o.pause_s is None else f"{o.pause_s:.1f}"
        takeover = "-" if o.takeover_s is None else f"{o.takeover_s:.1f}"
        lines.append(f"| {o.scenario} | {o.emails} | {len(o.lost)} | {o.duplicates} "
                     f"({o.in_window} / {o.late_reply} / {len(o.unexplained)}) | {pause} "
                     f"| {takeover} | {o.drain_s:.1f} |")
    return "\n".join(lines)
