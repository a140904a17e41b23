"""postroom on a secured cluster: the dev broker's SASL_SSL listener, a SCRAM user and ACLs per role.

Each test gets a topic prefix and groups of its own; its ACLs are applied and its topics created
by postroom-admin over SASL_SSL, and both are removed afterwards over the PLAINTEXT listener.
The role env files come from scripts/services.sh up (.dev/secure/<role>.env).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import os
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)

from postroom import enqueue
from postroom.acls import Acl, Role, role_acls
from postroom.bounces.adapters import KafkaResults
from postroom.devkit.story import make_workbook
from postroom.devkit.wait import wait_until
from postroom.errors import KafkaClientError
from postroom.kafka import (
    acl_binding,
    apply_acls,
    check_reachable,
    consumer_config,
    create_topics,
    make_admin,
    producer_config,
)
from postroom.metrics import Metrics
from postroom.relay.publisher import Relay
from postroom.schemas.codec import DeliveryStatus, EmailResult
from postroom.schemas.framing import SCHEMALESS
from postroom.settings import Settings, TlsMode
from postroom.topics import (
    Priority,
    all_topics,
    dead_letter_topic,
    priority_topic,
    results_topic,
)
from support.commands import run_all
from support.pipeline import Pipeline
from support.seed import check_september, enqueue_september, seed_server
from support.stack import dev_dir

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DEV_DIR = dev_dir()
SECURE_DIR = DEV_DIR / "secure"
SERVICE_ROLES = ["relay", "sender", "recorder"]


def role_env(role: str) -> dict[str, str]:
    """The POSTROOM_* variables .dev/secure/<role>.env sets, read by the shell that would source it."""
    path = SECURE_DIR / f"{role}.env"
    if not path.is_file():
        pytest.fail(f"{path} is missing: run `make services` (scripts/services.sh up writes it)")
    out = subprocess.run(["bash", "-c", '. "$1" && env -0', "_", str(path)], env={},
                         capture_output=True, check=True).stdout.decode()
    pairs = (item.partition("=") for item in out.split("\0") if item)
    return {k: v for k, _, v in pairs if k.startswith("POSTROOM_")}


@dataclasses.dataclass(frozen=True)
class Secured:
    roles: dict[str, Settings]  # relay, sender, recorder, bounces, admin: each with its own credentials
    acls: list[Acl]
    env: dict[str, str]  # the stack's environment with this test's schema, prefix and groups

    def secrets(self) -> list[str]:
        return [s.kafka_config["sasl.password"] for s in self.roles.values()]


@pytest.fixture
def secured(db_settings: Settings, stack_settings: Settings) -> Iterator[Secured]:
    tag = f"t{uuid.uuid4().hex[:10]}"
    base = dataclasses.replace(db_settings, topic_prefix=f"{tag}.",
                               sender_group=f"{tag}-sender", recorder_group=f"{tag}-recorder",
                               retry_delays_s=(1.0, 2.0, 4.0, 8.0))
    roles = {}
    for role in Role:
        own = Settings.from_env(role_env(role.value))
        roles[role.value] = dataclasses.replace(
            base, kafka_bootstrap_servers=own.kafka_bootstrap_servers,
            kafka_config=own.kafka_config)
    acls = role_acls(base.topic_prefix, sender_group=base.sender_group,
                     recorder_group=base.recorder_group)
    env = {**os.environ, "POSTROOM_DATABASE_SCHEMA": base.database_schema or "",
           "POSTROOM_TOPIC_PREFIX": base.topic_prefix, "POSTROOM_SENDER_GROUP": base.sender_group,
           "POSTROOM_RECORDER_GROUP": base.recorder_group, "POSTROOM_RETRY_DELAYS": "1s,2s,4s,8s"}
    for name in ("POSTROOM_KAFKA_CONFIG", "POSTROOM_KAFKA_CONFIG_FILE"):
        env.pop(name, None)
    try:
        assert {state for _, state in apply_acls(roles["admin"], acls)} == {"created"}
        # Applied again, nothing is new; the broker shows new ACLs a moment after it took them.
        wait_until(lambda: apply_acls(roles["admin"], acls) == [(a, "exists") for a in acls], 30,
                 "the broker to show the ACLs it created")
        assert set(create_topics(roles["admin"]).values()) == {"created"}
        yield Secured(roles, acls, env)
    finally:
        plain = dataclasses.replace(stack_settings, topic_prefix=base.topic_prefix)
        admin = make_admin(plain)  # the PLAINTEXT listener's principal is a super user
        for future in admin.delete_acls([acl_binding(a, as_filter=True) for a in acls]).values():
            future.result()
        names = all_topics(base.topic_prefix, len(base.retry_delays_s))
        for future in admin.delete_topics(names, operation_timeout=10).values():
            try:
                future.result()
            except KafkaException as exc:  # a topic the test never got to create is fine
                if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise


def test_the_seed_scenario_with_each_role_on_its_own_credentials(
        secured: Secured, engine: sa.Engine, tmp_path: Path, stack_settings: Settings,
        consume: Callable[..., list[Any]], caplog: pytest.LogCaptureFixture,
        capfd: pytest.CaptureFixture[str]) -> None:
    caplog.set_level(logging.DEBUG)  # the client configs are logged (masked) at DEBUG
    report = make_workbook(tmp_path)
    server = seed_server()
    server.start()
    roles = {role: dataclasses.replace(
        secured.roles[role], smtp_host="127.0.0.1", smtp_port=server.port,
        smtp_tls=TlsMode.AUTO, smtp_connect_timeout_s=2.0, smtp_timeout_s=5.0,
        smtp_concurrency=4, attachments_root=tmp_path, mail_from="reports@example.com")
        for role in SERVICE_ROLES}
    metrics = Metrics()
    pipeline = Pipeline(roles["sender"], engine, role_settings=roles, metrics=metrics).start()
    try:
        assert enqueue_september(engine, report) == [4, 0]
        check_september(engine, server, mail_from="reports@example.com")
    finally:
        pipeline.stop()
        server.stop()

    # The idempotent relay needed no IDEMPOTENT_WRITE on the cluster (Kafka 3.0+, KIP-679).
    plain = make_admin(stack_settings)  # held: a collected client cancels its own futures
    cluster_rules = plain.describe_acls(AclBindingFilter(
        ResourceType.BROKER, None, ResourcePatternType.ANY, "User:postroom-relay",  # type: ignore[arg-type]
        None, AclOperation.ANY, AclPermissionType.ANY)).result()  # type: ignore[arg-type]
    assert cluster_rules == []

    prefix = secured.roles["admin"].topic_prefix
    records = consume(dataclasses.replace(stack_settings, topic_prefix=prefix),
                              all_topics(prefix, 4), expected=11, timeout_s=20)
    assert len(records) >= 11  # 4 events, 2 retries, 5 results
    written = [caplog.text, capfd.readouterr().err, metrics.render(),
               *(repr(r.headers) + repr(r.value) for r in records)]
    for log_file in (DEV_DIR / "kafka" / "broker.log", DEV_DIR / "kafka" / "kafka.out"):
        written.append(log_file.read_text(errors="replace"))
    assert "producer config" in caplog.text  # the configs were logged, so the grep means something
    for secret in secured.secrets():
        assert not [i for i, text in enumerate(written) if secret in text], "a secret leaked"


def test_the_sender_cannot_write_a_priority_topic(secured: Secured) -> None:
    sender = secured.roles["sender"]
    errors: list[KafkaError] = []
    producer = Producer(producer_config(sender, on_delivery=lambda err, _msg: errors.append(err)))
    producer.produce(priority_topic(sender.topic_prefix, "high"), b"forged")
    producer.flush(20)
    assert [e.code() for e in errors] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]


def test_the_recorder_cannot_read_a_priority_topic(secured: Secured) -> None:
    recorder = secured.roles["recorder"]
    consumer = Consumer(consumer_config(recorder, recorder.recorder_group))
    try:
        consumer.subscribe([priority_topic(recorder.topic_prefix, "normal")])
        codes = []
        for _ in range(100):
            msg = consumer.poll(0.2)
            if msg is not None and msg.error():
                codes.append(msg.error().code())
                break
    finally:
        consumer.close()
    assert codes == [KafkaError.TOPIC_AUTHORIZATION_FAILED]


def test_the_bounce_intake_publishes_results_on_its_own_credentials_and_nothing_else(
        secured: Secured, stack_settings: Settings,
        consume: Callable[..., list[Any]]) -> None:
    bounces = secured.roles["bounces"]
    result = EmailResult(idempotency_key="secured-bounce|gone@example.com", outbox_id=1,
                         recipient="gone@example.com", status=DeliveryStatus.BOUNCED,
                         attempt=1, occurred_at=dt.datetime.now(dt.UTC), smtp_code=550,
                         enhanced_code="5.1.1", error="550 5.1.1 mailbox unknown")
    KafkaResults(bounces, SCHEMALESS, timeout_s=20).publish([result])
    records = consume(dataclasses.replace(stack_settings, topic_prefix=bounces.topic_prefix),
                      [results_topic(bounces.topic_prefix)], expected=1, timeout_s=20)
    assert result.idempotency_key.encode() in [r.key for r in records]

    errors: list[KafkaError] = []
    producer = Producer(producer_config(bounces, on_delivery=lambda err, _msg: errors.append(err)))
    producer.produce(dead_letter_topic(bounces.topic_prefix), b"forged")
    producer.flush(20)
    assert [e.code() for e in errors] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]

    env = {**secured.env, **role_env("bounces")}
    as_bounces, as_recorder = postroom((env, ["check", "--role", "bounces"]),
                                       (env, ["check", "--role", "recorder"]))
    assert any(line.startswith("ok    kafka: broker answers; the bounces role may use its one "
                               "topic") for line in as_bounces.stdout.splitlines()), (
        as_bounces.stdout)
    assert as_recorder.returncode == 1
    assert (f"      {bounces.topic_prefix}email.results: not authorized to READ (authorized: "
            "DESCRIBE, WRITE)") in as_recorder.stdout.splitlines(), as_recorder.stdout


def postroom(*runs: tuple[dict[str, str], list[str]]) -> list[subprocess.CompletedProcess[str]]:
    """``postroom ARGS`` once per (env, args), all at once; their results in order."""
    return [done for done, _seconds in run_all([(args, env) for env, args in runs], 90)]


def untrusted_ca(folder: Path) -> Path:
    """A CA certificate of its own, which never signed the broker's."""
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=not the dev CA", "-keyout", str(folder / "other.key"),
                    "-out", str(folder / "other.crt")], capture_output=True, check=True)
    return folder / "other.crt"


@pytest.mark.parametrize("role", SERVICE_ROLES)
def test_a_wrong_password_or_an_untrusted_ca_stops_a_role_at_start(
        secured: Secured, role: str, tmp_path: Path) -> None:
    own = role_env(role)
    wrong = uuid.uuid4().hex
    (tmp_path / "wrong.properties").write_text(f"sasl.password={wrong}\n")
    ca = str(SECURE_DIR / "ca.crt")
    cases = {
        "sasl.password": {**own, "POSTROOM_KAFKA_CONFIG_FILE": str(tmp_path / "wrong.properties")},
        "ssl.ca.location": {**own, "POSTROOM_KAFKA_CONFIG": own["POSTROOM_KAFKA_CONFIG"].replace(
            ca, str(untrusted_ca(tmp_path)))},
    }
    results = postroom(*(({**secured.env, **env}, [role]) for env in cases.values()))
    for setting, proc in zip(cases, results, strict=True):
        said = proc.stdout + proc.stderr
        assert proc.returncode == 1, said
        # librdkafka may still log a line of its own after ours
        last = next(line for line in said.splitlines() if line.startswith(f"postroom {role}:"))
        assert last.startswith(f"postroom {role}: error: cannot use the Kafka broker"), said
        assert setting in last and "POSTROOM_KAFKA_CONFIG" in last, last
        for secret in (wrong, *secured.secrets()):
            assert secret not in said


def test_check_reports_authorization_per_topic_and_help_shows_no_secret(
        secured: Secured) -> None:
    env = {**secured.env, **role_env("recorder")}
    prefix = secured.roles["recorder"].topic_prefix
    as_relay, as_recorder, *helps = postroom(
        (env, ["check", "--role", "relay"]), (env, ["check", "--role", "recorder"]),
        (env, ["--help"]), (env, ["acls", "--help"]), (env, ["check", "-h"]))
    assert as_relay.returncode == 1
    lines = as_relay.stdout.splitlines()
    assert "FAIL  kafka: 3 of 3 topics not usable by the relay" in lines, as_relay.stdout
    for priority in ("high", "normal", "low"):
        assert (f"      {prefix}email.{priority}: not authorized (TOPIC_AUTHORIZATION_FAILED: "
                "this principal may not even describe it)") in lines
    assert any(line.startswith("ok    kafka: broker answers; the recorder role may use its one "
                               "topic; all ") and line.endswith("every replica in sync")
               for line in as_recorder.stdout.splitlines()), as_recorder.stdout
    assert all(h.returncode == 0 for h in helps)
    said = "".join(p.stdout + p.stderr for p in (as_relay, as_recorder, *helps))
    for secret in secured.secrets():
        assert secret not in said


def test_the_admin_creates_topics_and_reads_lag_and_the_recorder_may_not(
        secured: Secured) -> None:
    admin_env = {**secured.env, **role_env("admin")}
    created, lag, lag_as_recorder = postroom(
        (admin_env, ["topics", "create"]), (admin_env, ["lag", "--json"]),
        ({**secured.env, **role_env("recorder")}, ["lag"]))
    assert created.returncode == 0, created.stderr
    assert {line.split()[0] for line in created.stdout.splitlines()} == {"exists"}
    assert lag.returncode == 0, lag.stderr
    rows = [json.loads(line) for line in lag.stdout.splitlines()]
    groups = {row["group"] for row in rows if "group" in row}  # the last row is the outbox's
    assert groups == {secured.roles["admin"].sender_group, secured.roles["admin"].recorder_group}
    assert lag_as_recorder.returncode == 1
    sender_group = secured.roles["admin"].sender_group
    # Refused at the first thing it may not see: the sender group (describing it comes first).
    assert lag_as_recorder.stderr.strip() == (
        f"postroom lag: error: cannot describe group {sender_group}: Broker: Group authorization "
        "failed [GROUP_AUTHORIZATION_FAILED]")


def test_rotating_the_relays_password_loses_no_mail(
        secured: Secured, engine: sa.Engine, stack_settings: Settings,
        consume: Callable[..., list[Any]]) -> None:
    """The one-principal rotation of docs/operations.md, on a relay user of this test's own."""
    relay = secured.roles["relay"]
    principal_prefix = f"User:postroom-{uuid.uuid4().hex[:8]}-"
    user = principal_prefix.removeprefix("User:") + "relay"
    acls = [a for a in role_acls(relay.topic_prefix, sender_group=relay.sender_group,
                                 recorder_group=relay.recorder_group,
                                 principal_prefix=principal_prefix) if a.role is Role.RELAY]
    plain = make_admin(stack_settings)  # a super user on the PLAINTEXT listener
    scram = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192)

    def as_user(password: str) -> Settings:
        return dataclasses.replace(relay, kafka_config={
            **relay.kafka_config, "sasl.username": user, "sasl.password": password})

    def accepted(password: str) -> bool:
        try:
            check_reachable(as_user(password), timeout_s=5)
        except KafkaClientError as exc:
            if "check sasl.password" not in str(exc):
                raise
            return False
        return True

    def set_password(password: str) -> Settings:
        for future in plain.alter_user_scram_credentials([UserScramCredentialUpsertion(
                user, scram, password.encode())]).values():
            future.result()
        # The controller answers once the change is in its log; the broker that checks the
        # credentials applies it from the metadata log a moment later.
        wait_until(lambda: accepted(password), 30, "the broker to accept the new password")
        return as_user(password)

    def queue(batch: int) -> None:
        with engine.begin() as conn:
            enqueue(conn, key=f"rotation-{batch}", subject="S", body="b",
                    recipients=[f"r{n}@example.com" for n in range(5)])

    def published() -> int:
        with engine.connect() as conn:
            return int(conn.execute(sa.text(
                "SELECT count(*) FROM outbox WHERE status = 'published'")).scalar_one())

    old, new = uuid.uuid4().hex, uuid.uuid4().hex
    try:
        old_settings = set_password(old)
        apply_acls(secured.roles["admin"], acls)
        wait_until(lambda: apply_acls(secured.roles["admin"], acls) == [
            (a, "exists") for a in acls], 30, "the new user's ACLs")
        first = Relay(old_settings, engine)
        thread = threading.Thread(target=first.run, daemon=True)
        thread.start()
        queue(1)
        wait_until(lambda: published() == 5, 30, "the first batch published")
        new_settings = set_password(new)  # the broker knows only the new password now
        queue(2)  # while the relay still runs with the old one
        first.stop()
        thread.join(30)
        assert not thread.is_alive()
        assert not accepted(old)
        queue(3)
        second = Relay(new_settings, engine)
        thread = threading.Thread(target=second.run, daemon=True)
        thread.start()
        try:
            wait_until(lambda: published() == 15, 30, "every batch published")
        finally:
            second.stop()
            thread.join(30)
    finally:
        for future in plain.delete_acls([acl_binding(a, as_filter=True) for a in acls]).values():
            future.result()
        for future in plain.alter_user_scram_credentials([UserScramCredentialDeletion(
                user, ScramMechanism.SCRAM_SHA_512)]).values():
            future.result()
    records = consume(dataclasses.replace(stack_settings, topic_prefix=relay.topic_prefix),
                      [priority_topic(relay.topic_prefix, p) for p in Priority], expected=15)
    keys = [r.key for r in records]
    assert len(keys) == len(set(keys)) == 15  # each row once: none lost, none twice
