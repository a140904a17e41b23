"""Tables for the ACLs per role: what each role may do on every topic and group postroom uses."""

from __future__ import annotations

import json

import pytest

from postroom.acls import (
    Acl,
    Operation,
    Pattern,
    Resource,
    Role,
    TopicAccess,
    allowed,
    as_json_lines,
    as_kafka_acls,
    as_table,
    needed_on_topics,
    parse_principal_prefix,
    role_acls,
    topic_problems,
    topic_warnings,
)
from postroom.topics import all_topics

PREFIX = "acme.mail."
ACLS = role_acls(PREFIX, sender_group="senders", recorder_group="recorders")
P = "User:postroom-"
R, W, D, C = Operation.READ, Operation.WRITE, Operation.DESCRIBE, Operation.CREATE
T, G = Resource.TOPIC, Resource.GROUP

# (principal, operation, resource, name, allowed?)
DECISIONS = [
    # relay: writes the priority topics, nothing else
    (P + "relay", W, T, "acme.mail.email.high", True),
    (P + "relay", W, T, "acme.mail.email.normal", True),
    (P + "relay", W, T, "acme.mail.email.low", True),
    (P + "relay", D, T, "acme.mail.email.low", True),
    (P + "relay", R, T, "acme.mail.email.high", False),
    (P + "relay", W, T, "acme.mail.email.retry.1", False),
    (P + "relay", W, T, "acme.mail.email.results", False),
    (P + "relay", W, T, "other.email.high", False),
    # sender: reads priority and retry topics, writes retry, dead and results
    (P + "sender", R, T, "acme.mail.email.high", True),
    (P + "sender", W, T, "acme.mail.email.high", False),
    (P + "sender", R, T, "acme.mail.email.retry.1", True),
    (P + "sender", W, T, "acme.mail.email.retry.4", True),
    (P + "sender", W, T, "acme.mail.email.retry.12", True),
    (P + "sender", W, T, "acme.mail.email.dead", True),
    (P + "sender", R, T, "acme.mail.email.dead", False),
    (P + "sender", W, T, "acme.mail.email.results", True),
    (P + "sender", R, T, "acme.mail.email.results", False),
    (P + "sender", R, G, "senders", True),
    (P + "sender", R, G, "recorders", False),
    (P + "sender", R, T, "acme.mail.email.retryX", False),
    # recorder: reads results with its group
    (P + "recorder", R, T, "acme.mail.email.results", True),
    (P + "recorder", R, T, "acme.mail.email.high", False),
    (P + "recorder", D, T, "acme.mail.email.high", False),
    (P + "recorder", R, G, "recorders", True),
    (P + "recorder", R, G, "senders", False),
    # bounces: writes results (the reports it reads), nothing else
    (P + "bounces", W, T, "acme.mail.email.results", True),
    (P + "bounces", R, T, "acme.mail.email.results", False),
    (P + "bounces", W, T, "acme.mail.email.dead", False),
    (P + "bounces", W, T, "acme.mail.email.high", False),
    (P + "bounces", R, G, "recorders", False),
    # admin: creates and describes postroom's topics, describes the groups (lag); reads nothing
    (P + "admin", C, T, "acme.mail.email.retry.7", True),
    (P + "admin", D, T, "acme.mail.email.high", True),
    (P + "admin", C, T, "acme.mail.other", False),
    (P + "admin", R, T, "acme.mail.email.high", False),
    (P + "admin", W, T, "acme.mail.email.high", False),
    (P + "admin", D, G, "senders", True),
    (P + "admin", Operation.DESCRIBE_CONFIGS, T, "acme.mail.email.results", True),
    (P + "sender", Operation.DESCRIBE_CONFIGS, T, "acme.mail.email.results", False),
    (P + "admin", R, G, "senders", False),
    # a principal postroom does not know gets nothing
    ("User:mallory", R, T, "acme.mail.email.high", False),
]


@pytest.mark.parametrize(("principal", "operation", "resource", "name", "expected"), DECISIONS)
def test_what_each_role_may_do(principal: str, operation: Operation, resource: Resource,
                               name: str, expected: bool) -> None:
    assert allowed(ACLS, principal, operation, resource, name) is expected


def test_no_wildcard_and_prefixes_only_for_retry_tiers_and_what_the_admin_creates() -> None:
    assert all(a.name and "*" not in a.name for a in ACLS)
    prefixed = {(a.role, a.name) for a in ACLS if a.pattern is Pattern.PREFIXED}
    assert prefixed == {(Role.SENDER, "acme.mail.email.retry."),
                        (Role.ADMIN, "acme.mail.email.")}
    assert {a.resource for a in ACLS} == {T, G}  # nothing on the cluster by default


def test_idempotent_write_on_the_cluster_for_the_producing_roles_when_asked() -> None:
    extra = set(role_acls(PREFIX, sender_group="s", recorder_group="r",
                          idempotent_write=True)) - set(role_acls(
                              PREFIX, sender_group="s", recorder_group="r"))
    assert {(a.principal, a.operation, a.resource) for a in extra} == {
        (P + "relay", Operation.IDEMPOTENT_WRITE, Resource.CLUSTER),
        (P + "sender", Operation.IDEMPOTENT_WRITE, Resource.CLUSTER),
        (P + "bounces", Operation.IDEMPOTENT_WRITE, Resource.CLUSTER),
    }


def test_principal_prefix_names_every_role() -> None:
    acls = role_acls("", sender_group="s", recorder_group="r", principal_prefix="User:prod-")
    assert {a.principal for a in acls} == {f"User:prod-{r}" for r in Role}
    assert {a.name for a in acls if a.role is Role.RELAY} == {
        "email.high", "email.normal", "email.low"}


@pytest.mark.parametrize(("role", "expected"), [
    (Role.RELAY, {"acme.mail.email.high": {W}, "acme.mail.email.normal": {W},
                  "acme.mail.email.low": {W}}),
    (Role.RECORDER, {"acme.mail.email.results": {R}}),
    (Role.BOUNCES, {"acme.mail.email.results": {W}}),
    (Role.SENDER, {**{f"acme.mail.email.{p}": {R} for p in ("high", "normal", "low")},
                   **{f"acme.mail.email.retry.{n}": {R, W} for n in (1, 2)},
                   "acme.mail.email.dead": {W}, "acme.mail.email.results": {W}}),
    (Role.ADMIN, {t: {C, D, Operation.DESCRIBE_CONFIGS} for t in all_topics(PREFIX, 2)}),
])
def test_needed_on_topics(role: Role, expected: dict[str, set[Operation]]) -> None:
    assert needed_on_topics(ACLS, role, all_topics(PREFIX, 2)) == expected


@pytest.mark.parametrize(("access", "needed", "expected"), [
    ([TopicAccess("a", True, frozenset({"READ", "DESCRIBE"}))], {"a": {R}}, []),
    ([TopicAccess("a", True, frozenset({"DESCRIBE", "READ"}))], {"a": {R, W}},
     ["a: not authorized to WRITE (authorized: DESCRIBE, READ)"]),
    ([TopicAccess("a", None, None)], {"a": {R}},
     ["a: not authorized (TOPIC_AUTHORIZATION_FAILED: this principal may not even describe it)"]),
    ([TopicAccess("a", False, frozenset())], None,
     ["a: missing (run `postroom topics create`)"]),
    ([TopicAccess("a", True, frozenset())], None,
     ["a: not authorized to DESCRIBE (authorized: nothing)"]),
    ([TopicAccess("a", True, frozenset({"DESCRIBE"})),
      TopicAccess("b", None, None)], None,
     ["b: not authorized (TOPIC_AUTHORIZATION_FAILED: this principal may not even describe it)"]),
])
def test_topic_problems_one_line_per_topic(access: list[TopicAccess],
                                           needed: dict[str, set[Operation]] | None,
                                           expected: list[str]) -> None:
    assert topic_problems(access, needed) == expected


def test_kafka_acls_commands() -> None:
    lines = as_kafka_acls(role_acls("p.", sender_group="s", recorder_group="r",
                                    idempotent_write=True)).splitlines()
    assert lines[0].startswith("#")
    assert ('kafka-acls.sh --bootstrap-server "$BOOTSTRAP" --command-config "$ADMIN_CONFIG" '
            "--add --allow-principal User:postroom-sender --operation Read "
            "--topic p.email.retry. --resource-pattern-type prefixed") in lines
    assert ('kafka-acls.sh --bootstrap-server "$BOOTSTRAP" --command-config "$ADMIN_CONFIG" '
            "--add --allow-principal User:postroom-relay --operation IdempotentWrite "
            "--cluster --resource-pattern-type literal") in lines
    assert "--group r --resource-pattern-type literal" in lines[-4]
    assert len(lines) == 1 + len(role_acls("p.", sender_group="s", recorder_group="r",
                                           idempotent_write=True))


def test_json_lines_round_trip() -> None:
    rows = [json.loads(line) for line in as_json_lines(ACLS).splitlines()]
    assert [Acl(Role(r["role"]), r["principal"], Operation(r["operation"]),
                Resource(r["resource_type"]), r["resource_name"], Pattern(r["pattern_type"]))
            for r in rows] == ACLS
    assert {(r["permission"], r["host"]) for r in rows} == {("ALLOW", "*")}


def test_table_has_a_header_and_one_line_per_acl() -> None:
    lines = as_table(ACLS).splitlines()
    assert lines[0].split() == ["role", "principal", "operation", "resource", "pattern", "name"]
    assert len(lines) == len(ACLS) + 1
    assert lines[1].split() == ["relay", "User:postroom-relay", "Write", "topic", "literal",
                                "acme.mail.email.high"]


@pytest.mark.parametrize("text", ["User:postroom-", "User:prod.mail.", "Group:x"])
def test_principal_prefix_accepted(text: str) -> None:
    assert parse_principal_prefix(text) == text


@pytest.mark.parametrize("text", ["postroom-", "User:", "User:*", "User:a b", "User:a,b", "",
                                  ":postroom-", "User postroom-"])
def test_principal_prefix_refused(text: str) -> None:
    with pytest.raises(ValueError, match="principal type"):
        parse_principal_prefix(text)


def test_an_admin_of_the_previous_acls_is_warned_not_failed() -> None:
    # Before DescribeConfigs joined the admin's table: Create and Describe on the topics.
    topics = all_topics(PREFIX, 2)
    needed = needed_on_topics(ACLS, Role.ADMIN, topics)
    before = [TopicAccess(t, True, frozenset({"CREATE", "DESCRIBE"})) for t in topics]
    assert topic_problems(before, needed) == []
    warnings = topic_warnings(before, needed)
    assert len(warnings) == len(topics)
    assert warnings[0] == (f"{topics[0]}: not authorized to DESCRIBE_CONFIGS, so "
                           "min.insync.replicas is unknown (re-run `postroom acls apply`)")
    now = [TopicAccess(t, True, frozenset({"CREATE", "DESCRIBE", "DESCRIBE_CONFIGS"}))
           for t in topics]
    assert topic_warnings(now, needed) == []
    # a required operation missing is still a failure
    assert topic_problems([TopicAccess(topics[0], True, frozenset({"DESCRIBE"}))], needed) == [
        f"{topics[0]}: not authorized to CREATE (authorized: DESCRIBE)"]
