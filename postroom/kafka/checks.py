"""What ``postroom check`` and a role's readiness say of Kafka: topics usable, partitions
replicated."""

from __future__ import annotations

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from postroom.acls import Operation, Role, needed_on_topics, role_acls, topic_problems, topic_warnings
from postroom.errors import KafkaClientError
from postroom.kafka.clients import make_admin
from postroom.kafka.group_protocol import group_protocol
from postroom.kafka.probe import check_reachable
from postroom.kafka.topics import min_insync_replicas, topic_access, topic_replicas
from postroom.lagrules import standing_by
from postroom.replication import Severity, replication_findings, summary
from postroom.settings import Settings
from postroom.topics import all_topics


def _checked_topics(settings: Settings, role: Role | None,
                    ) -> tuple[list[str], dict[str, set[Operation]] | None]:
    """The topics ``postroom check`` looks at (a role's only, with what it needs on each)."""
    topics = all_topics(settings.topic_prefix, len(settings.retry_delays_s))
    if role is None:
        return topics, None
    acls = role_acls(settings.topic_prefix, sender_group=settings.sender_group,
                     recorder_group=settings.recorder_group)
    needed = needed_on_topics(acls, role, topics)
    return list(needed), needed


def check_topics(settings: Settings, role: Role | None = None, timeout_s: float = 10.0) -> str:
    """What a role's readiness says of Kafka: the broker answers and every topic exists; for a
    role, that this client's principal may do on each of the role's topics what the role needs.

    A failure lists one line per topic that is missing or not authorized.
    """
    return _topic_verdict(settings, role, timeout_s)[0]


def _topic_verdict(settings: Settings, role: Role | None, timeout_s: float,
                   ) -> tuple[str, list[str]]:
    """:func:`check_topics`'s line, and a line per topic where the role lacks only an optional
    operation (the admin's DescribeConfigs): ``postroom check`` WARNs with them."""
    check_reachable(settings, timeout_s)
    topics, needed = _checked_topics(settings, role)
    access = topic_access(settings, topics, timeout_s)
    problems = topic_problems(access, needed)
    if problems:
        by = f" by the {role.value}" if role is not None else ""
        raise KafkaClientError("\n".join([f"{len(problems)} of {len(topics)} topics not usable{by}",
                                          *(f"      {p}" for p in problems)]))
    if role is not None:
        its = "its one topic" if len(topics) == 1 else f"all {len(topics)} of its topics"
        return (f"broker answers; the {role.value} role may use {its}",
                topic_warnings(access, needed))
    return f"broker answers; all {len(topics)} topics exist", []


class KafkaDegraded(KafkaClientError):
    """postroom's topics are under-replicated; every record is still written and read."""


def check_kafka(settings: Settings, role: Role | None = None, timeout_s: float = 10.0) -> str:
    """What ``postroom check`` says of Kafka: :func:`check_topics`, then the replication of
    those topics' partitions, one line per finding naming topic, partition, replicas and ISR.

    Raises KafkaClientError when a partition is offline or refuses writes (below
    ``min.insync.replicas``), KafkaDegraded when some are only under-replicated or the role
    lacks only an optional operation on some topics (an admin without DescribeConfigs).
    """
    said, warnings = _topic_verdict(settings, role, timeout_s)
    topics, _ = _checked_topics(settings, role)
    partitions, _brokers = topic_replicas(settings, topics, timeout_s)
    min_insync = min_insync_replicas(settings, topics, timeout_s)
    findings = replication_findings(partitions, min_insync)
    text = "\n".join([f"{said}; {summary(findings, len(partitions))}",
                      *(f"      {f.line()}" for f in findings),
                      *(f"      WARN {w}" for w in warnings)])
    if any(f.severity is Severity.FAIL for f in findings):
        raise KafkaClientError(text)
    if findings or warnings:
        raise KafkaDegraded(text)
    return text


def role_groups(settings: Settings, role: Role | None) -> list[str]:
    """The consumer groups a role joins (the sender's, the recorder's; both for no role)."""
    return {Role.SENDER: [settings.sender_group], Role.RECORDER: [settings.recorder_group],
            None: [settings.sender_group, settings.recorder_group]}.get(role, [])


def check_groups(settings: Settings, role: Role | None = None) -> str:
    """What ``postroom check`` says of the role's consumer groups: the protocol each joins with,
    and why (postroom.kafka.group_protocol), a line each. A group whose config cannot be read
    joins with the classic protocol, and its line says so; only an admin client that cannot be
    made fails it."""
    admin = make_admin(settings)
    lines, idle = [], []
    for group in role_groups(settings, role):
        choice = group_protocol(settings, group, admin)
        lines.append(f"{group} joins with the {choice.protocol} protocol ({choice.reason})")
        idle.extend(_standing_by(admin, group))
    if idle:
        raise KafkaDegraded("\n      ".join([*lines, *idle]))
    return "\n      ".join(lines)


def _standing_by(admin: AdminClient, group: str, timeout_s: float = 10.0) -> list[str]:
    """A line per member of ``group`` that owns no partition of the settled group (more
    members than partitions); none when the group cannot be described (said by `lag`)."""
    try:
        description = admin.describe_consumer_groups(
            [group], request_timeout=timeout_s)[group].result()
    except KafkaException:
        return []
    state = getattr(description.state, "name", str(description.state)).lower()
    members = list(description.members)
    return [f"WARN {members[n].client_id}@{members[n].host.lstrip('/')} in {group} owns no "
            f"partition and stands by: {len(members)} members, more than the partitions of "
            "its topics (POSTROOM_TOPIC_PARTITIONS)"
            for n in standing_by(state, [len(m.assignment.topic_partitions) for m in members])]
