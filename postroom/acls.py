"""The Kafka ACLs each postroom role needs, derived from the topic names and group ids it uses. Pure.

Least privilege: literal names where postroom knows the name, a prefixed resource only for the
retry tiers (their number is a setting) and for what the admin creates; never a wildcard.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
from collections.abc import Iterable, Mapping, Sequence

from postroom.topics import Priority, dead_letter_topic, priority_topic, results_topic

DEFAULT_PRINCIPAL_PREFIX = "User:postroom-"
CLUSTER_NAME = "kafka-cluster"


class Role(enum.StrEnum):
    RELAY = "relay"
    SENDER = "sender"
    RECORDER = "recorder"
    BOUNCES = "bounces"  # `postroom bounces`: publishes the reports it reads as results
    ADMIN = "admin"  # `postroom topics create`, `postroom lag` and `postroom check`


class Resource(enum.StrEnum):
    TOPIC = "topic"
    GROUP = "group"
    CLUSTER = "cluster"


class Pattern(enum.StrEnum):
    LITERAL = "literal"
    PREFIXED = "prefixed"


class Operation(enum.StrEnum):
    READ = "Read"
    WRITE = "Write"
    CREATE = "Create"
    DESCRIBE = "Describe"
    IDEMPOTENT_WRITE = "IdempotentWrite"
    DESCRIBE_CONFIGS = "DescribeConfigs"


@dataclasses.dataclass(frozen=True, order=True)
class Acl:
    """One ALLOW rule: ``principal`` may do ``operation`` on the resource, from any host."""

    role: Role
    principal: str
    operation: Operation
    resource: Resource
    name: str
    pattern: Pattern = Pattern.LITERAL

    def matches(self, resource: Resource, name: str) -> bool:
        """Whether this rule covers the resource ``name`` of kind ``resource``."""
        if resource is not self.resource:
            return False
        return name.startswith(self.name) if self.pattern is Pattern.PREFIXED else name == self.name


def parse_principal_prefix(text: str) -> str:
    """``User:postroom-`` as given; ValueError unless it is a principal type, a colon and a name."""
    if not re.fullmatch(r"[A-Za-z]+:[^\s*,]+", text):
        raise ValueError(f"expected a principal type, ':' and the start of a name, such as "
                         f"User:postroom- (no spaces, '*' or ','), got {text!r}")
    return text


def retry_topics_prefix(prefix: str) -> str:
    """The prefixed resource that covers every retry tier, however many there are."""
    return f"{prefix}email.retry."


def admin_topics_prefix(prefix: str) -> str:
    """The prefixed resource that covers every topic postroom makes (all are ``<prefix>email.*``)."""
    return f"{prefix}email."


def role_acls(prefix: str, *, sender_group: str, recorder_group: str,
              principal_prefix: str = DEFAULT_PRINCIPAL_PREFIX,
              idempotent_write: bool = False) -> list[Acl]:
    """Every ACL postroom's roles need, in a stable order.

    ``idempotent_write`` adds IDEMPOTENT_WRITE on the cluster for the producing roles:
    brokers before Kafka 3.0 need it for an idempotent producer; newer ones accept WRITE on a
    topic instead (KIP-679).
    """
    def acl(role: Role, op: Operation, resource: Resource, name: str,
            pattern: Pattern = Pattern.LITERAL) -> Acl:
        return Acl(role, principal_prefix + role.value, op, resource, name, pattern)

    priorities = [priority_topic(prefix, p) for p in Priority]
    retries = retry_topics_prefix(prefix)
    acls = [acl(Role.RELAY, Operation.WRITE, Resource.TOPIC, t) for t in priorities]
    acls += [acl(Role.SENDER, Operation.READ, Resource.TOPIC, t) for t in priorities]
    acls += [
        acl(Role.SENDER, Operation.READ, Resource.TOPIC, retries, Pattern.PREFIXED),
        acl(Role.SENDER, Operation.WRITE, Resource.TOPIC, retries, Pattern.PREFIXED),
        acl(Role.SENDER, Operation.WRITE, Resource.TOPIC, dead_letter_topic(prefix)),
        acl(Role.SENDER, Operation.WRITE, Resource.TOPIC, results_topic(prefix)),
        acl(Role.SENDER, Operation.READ, Resource.GROUP, sender_group),
        # Its group's KIP-848 session, read to choose the group protocol (kafka.group_protocol).
        acl(Role.SENDER, Operation.DESCRIBE_CONFIGS, Resource.GROUP, sender_group),
        acl(Role.RECORDER, Operation.READ, Resource.TOPIC, results_topic(prefix)),
        acl(Role.RECORDER, Operation.READ, Resource.GROUP, recorder_group),
        acl(Role.RECORDER, Operation.DESCRIBE_CONFIGS, Resource.GROUP, recorder_group),
        acl(Role.BOUNCES, Operation.WRITE, Resource.TOPIC, results_topic(prefix)),
        acl(Role.ADMIN, Operation.CREATE, Resource.TOPIC, admin_topics_prefix(prefix),
            Pattern.PREFIXED),
        acl(Role.ADMIN, Operation.DESCRIBE, Resource.TOPIC, admin_topics_prefix(prefix),
            Pattern.PREFIXED),
        # `postroom check` and `lag` read each topic's min.insync.replicas.
        acl(Role.ADMIN, Operation.DESCRIBE_CONFIGS, Resource.TOPIC, admin_topics_prefix(prefix),
            Pattern.PREFIXED),
        acl(Role.ADMIN, Operation.DESCRIBE, Resource.GROUP, sender_group),
        acl(Role.ADMIN, Operation.DESCRIBE, Resource.GROUP, recorder_group),
    ]
    if idempotent_write:
        acls += [acl(role, Operation.IDEMPOTENT_WRITE, Resource.CLUSTER, CLUSTER_NAME)
                 for role in (Role.RELAY, Role.SENDER, Role.BOUNCES)]
    return acls


# Operations a role's table has that it works without: the admin's DescribeConfigs came after the
# table was first applied; without it `check` and `lag` judge replication with
# min.insync.replicas unknown, so its absence is a warning, not a failure. Without theirs on their
# group, the sender and the recorder join with the classic protocol.
OPTIONAL_OPERATIONS = frozenset({Operation.DESCRIBE_CONFIGS})

# Operations a granted one implies, as Kafka's authorizer has it.
_IMPLIES_DESCRIBE = {Operation.READ, Operation.WRITE, Operation.DESCRIBE}


def allowed(acls: Iterable[Acl], principal: str, operation: Operation, resource: Resource,
            name: str) -> bool:
    """Whether ``acls`` let ``principal`` do ``operation`` on ``name`` (READ/WRITE imply DESCRIBE)."""
    for rule in acls:
        if rule.principal != principal or not rule.matches(resource, name):
            continue
        if rule.operation is operation or (operation is Operation.DESCRIBE
                                           and rule.operation in _IMPLIES_DESCRIBE):
            return True
    return False


def needed_on_topics(acls: Iterable[Acl], role: Role,
                     topics: Sequence[str]) -> dict[str, set[Operation]]:
    """For each of ``topics`` that ``role`` uses, the operations its ACLs give it there."""
    needed: dict[str, set[Operation]] = {}
    for rule in acls:
        if rule.role is not role or rule.resource is not Resource.TOPIC:
            continue
        for topic in topics:
            if rule.matches(Resource.TOPIC, topic):
                needed.setdefault(topic, set()).add(rule.operation)
    return {t: needed[t] for t in topics if t in needed}


@dataclasses.dataclass(frozen=True)
class TopicAccess:
    """What the broker says this client's principal may do with one topic."""

    topic: str
    exists: bool | None  # None: unknown, the broker would not describe it to us
    operations: frozenset[str] | None  # as Kafka spells them (READ, WRITE); None: not describable


def topic_problems(access: Iterable[TopicAccess],
                   needed: Mapping[str, set[Operation]] | None = None) -> list[str]:
    """One line per topic that is missing or lacks an operation; empty when all is well.

    ``needed`` maps a topic to the operations a role needs there (see :func:`needed_on_topics`);
    None asks only that every topic exists and can be described. OPTIONAL_OPERATIONS lacking are
    :func:`topic_warnings`, not problems.
    """
    problems = []
    for item in access:
        if item.exists is False:
            problems.append(f"{item.topic}: missing (run `postroom topics create`)")
        elif item.operations is None:
            problems.append(f"{item.topic}: not authorized (TOPIC_AUTHORIZATION_FAILED: this "
                            "principal may not even describe it)")
        else:
            wanted = needed.get(item.topic, set()) if needed is not None else {Operation.DESCRIBE}
            lacking = sorted(op.name for op in wanted - OPTIONAL_OPERATIONS
                             if op.name not in item.operations)
            if lacking:
                problems.append(f"{item.topic}: not authorized to {', '.join(lacking)} "
                                f"(authorized: {', '.join(sorted(item.operations)) or 'nothing'})")
    return problems


def topic_warnings(access: Iterable[TopicAccess],
                   needed: Mapping[str, set[Operation]] | None) -> list[str]:
    """One line per topic where the role lacks an operation of OPTIONAL_OPERATIONS its table has
    (an admin whose ACLs predate DescribeConfigs); empty when none is lacking."""
    warnings = []
    for item in access:
        if item.operations is None or needed is None:
            continue
        lacking = sorted(op.name for op in needed.get(item.topic, set()) & OPTIONAL_OPERATIONS
                         if op.name not in item.operations)
        if lacking:
            warnings.append(f"{item.topic}: not authorized to {', '.join(lacking)}, so "
                            "min.insync.replicas is unknown (re-run `postroom acls apply`)")
    return warnings


def as_kafka_acls(acls: Iterable[Acl]) -> str:
    """The ACLs as ``kafka-acls.sh`` commands, one per line, ready to run."""
    lines = ['# postroom acls: run with BOOTSTRAP and ADMIN_CONFIG (a principal allowed to alter ACLs)']
    for rule in acls:
        if rule.resource is Resource.CLUSTER:
            target = "--cluster"
        else:
            target = f"--{rule.resource.value} {rule.name}"
        lines.append(
            f'kafka-acls.sh --bootstrap-server "$BOOTSTRAP" --command-config "$ADMIN_CONFIG" '
            f"--add --allow-principal {rule.principal} --operation {rule.operation.value} "
            f"{target} --resource-pattern-type {rule.pattern.value}")
    return "\n".join(lines)


def as_json_lines(acls: Iterable[Acl]) -> str:
    """One JSON object per ACL."""
    return "\n".join(json.dumps({
        "role": rule.role.value, "principal": rule.principal, "permission": "ALLOW",
        "operation": rule.operation.value, "resource_type": rule.resource.value,
        "resource_name": rule.name, "pattern_type": rule.pattern.value, "host": "*",
    }) for rule in acls)


def as_table(acls: Sequence[Acl]) -> str:
    """A plain table, one ACL per line, for people."""
    rows = [("role", "principal", "operation", "resource", "pattern", "name")]
    rows += [(r.role.value, r.principal, r.operation.value, r.resource.value, r.pattern.value,
              r.name) for r in acls]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True))
        + "  " + row[-1] for row in rows)
