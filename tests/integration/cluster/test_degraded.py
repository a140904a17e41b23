"""What operators see of a degraded three-broker cluster: `postroom check` WARNs on one broker
down and FAILs below min.insync.replicas, on an offline partition and on a replication factor
below min.insync.replicas; `postroom lag` answers while a broker is down, labelling what it could
not read; `topics create` refuses a replication factor the cluster cannot hold; the secured
listener with three bootstrap addresses."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

from postroom.acls import role_acls
from postroom.devkit.processes import postroom_command
from postroom.devkit.scratch import scratch, scratch_env
from postroom.devkit.wait import wait_until
from postroom.errors import KafkaClientError
from postroom.kafka import KafkaDegraded, acl_binding, apply_acls, check_kafka, create_topics, make_admin
from postroom.lag import LagReader, postroom_groups, read_report
from postroom.metrics import Metrics
from postroom.settings import Settings
from postroom.topics import all_topics, priority_topic
from support.cluster import BROKERS, Brokers, role_env

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(600)]

FINDING = re.compile(r"^      (WARN|FAIL) (\S+)\[(\d+)\]: .* \(replicas \[([\d,]+)\], ISR \[([\d,]*)\]\)$")
# What one-shot `postroom lag` may take with a broker just killed: one sample's 10 s, the
# broker wait at start and the process's own start.
LAG_ANSWERS_WITHIN_S = 25.0


def findings(text: str) -> list[tuple[str, str, int, list[int], list[int]]]:
    rows = []
    for line in text.splitlines()[1:]:
        match = FINDING.match(line)
        assert match, line
        word, topic, partition, replicas, isr = match.groups()
        rows.append((word, topic, int(partition), [int(n) for n in replicas.split(",")],
                     [int(n) for n in isr.split(",") if n]))
    return rows


def degraded(settings: Settings) -> str:
    try:
        said = check_kafka(settings)
    except KafkaDegraded as exc:
        return str(exc)
    raise AssertionError(f"not degraded: {said}")


def test_check_warns_with_a_broker_down_and_fails_with_two(topics: Settings,
                                                           brokers: Brokers) -> None:
    partitions = len(all_topics(topics.topic_prefix, 2)) * topics.topic_partitions
    assert wait_until(lambda: _ok_or_none(topics), 30, "every broker to know the topics").endswith(
        f"all {partitions} partitions have a leader and every replica in sync")

    brokers.stop(3)
    said = wait_until(lambda: _said_or_none(topics, partitions), 60, "check to see broker 3 gone")
    rows = findings(said)
    assert said.splitlines()[0].endswith(
        f"{len(rows)} of {partitions} partitions under-replicated, writes still taken")
    assert {word for word, *_ in rows} == {"WARN"}
    # broker 3 holds a replica of every partition (replication factor 3): each one says so
    assert len(rows) == partitions
    for _word, topic, _p, replicas, isr in rows:
        assert topic.startswith(topics.topic_prefix)
        assert sorted(replicas) == [1, 2, 3] and 3 not in isr and len(isr) == 2
    assert "min.insync.replicas=2 still met" in said

    brokers.stop(2)
    said = wait_until(lambda: _failing_or_none(topics), 60, "check to fail with two brokers down")
    rows = findings(said)
    assert {word for word, *_ in rows} == {"FAIL"}
    assert all(isr == [1] for *_, isr in rows), said
    assert "under-replicated below min.insync.replicas=2: writes are refused" in said

    brokers.restore()
    assert check_kafka(topics).endswith("every replica in sync")


def _said_or_none(settings: Settings, count: int) -> str | None:
    """check's WARN once ``count`` partitions are under-replicated."""
    try:
        check_kafka(settings)
    except KafkaDegraded as exc:
        return str(exc) if len(str(exc).splitlines()) - 1 >= count else None
    return None


def _failing_or_none(settings: Settings) -> str | None:
    try:
        check_kafka(settings)
    except KafkaDegraded:
        return None
    except KafkaClientError as exc:
        return str(exc)
    return None


def test_the_check_command_says_warn_and_exits_0_with_a_broker_down(
        topics: Settings, brokers: Brokers, db_settings: Settings, tmp_path: Path) -> None:
    from postroom.devkit.devsmtp import DevSmtpServer

    brokers.stop(1)
    wait_until(lambda: _said_or_none(topics, 1), 60, "check to see broker 1 gone")
    with DevSmtpServer(port=0) as server:
        env = {**_environ(), **scratch_env(topics),
               "POSTROOM_DATABASE_SCHEMA": db_settings.database_schema or "",
               "POSTROOM_RETRY_DELAYS": "1s,2s",  # the topics' two tiers
               "POSTROOM_SMTP_HOST": "127.0.0.1", "POSTROOM_SMTP_PORT": str(server.port),
               "POSTROOM_SMTP_TLS": "auto", "POSTROOM_ATTACHMENTS_ROOT": str(tmp_path)}
        done = subprocess.run(postroom_command("check"), env=env, capture_output=True,
                              text=True, timeout=120, check=False)
    kafka = [line for line in done.stdout.splitlines() if line.startswith("WARN  kafka: ")]
    assert done.returncode == 0, done.stdout + done.stderr
    assert kafka and "partitions under-replicated, writes still taken" in kafka[0], done.stdout
    assert "Traceback" not in done.stderr


def test_check_fails_on_an_offline_partition_and_on_a_factor_below_min_insync(
        cluster_settings: Settings, brokers: Brokers) -> None:
    single = dataclasses.replace(cluster_settings, topic_replication_factor=1,
                                 topic_config={"min.insync.replicas": "1"})
    with scratch(single, "c1", database=False) as settings:
        # every broker learns of new topics a moment after the controller made them
        said = wait_until(lambda: _ok_or_none(settings), 30, "every broker to know the topics")
        assert said.endswith("every replica in sync")
        high = priority_topic(settings.topic_prefix, "high")
        node = brokers.leader(high, 0)
        brokers.stop(node)
        said = wait_until(lambda: _failing_or_none(settings), 60, "an offline partition")
        rows = findings(said)
        offline = [(topic, p) for word, topic, p, replicas, _isr in rows if replicas == [node]]
        assert (high, 0) in offline
        assert all(word == "FAIL" for word, *_ in rows)
        assert f"{high}[0]: offline, no leader" in said

        # and lag: the offline partitions labelled, the rest answered
        started = time.monotonic()
        reader = LagReader(settings, postroom_groups(settings))
        try:
            report = read_report(reader, None, samples=3)
        finally:
            reader.close()
        assert time.monotonic() - started < LAG_ANSWERS_WITHIN_S
        labelled = {(p.topic, p.partition): p.unavailable for g in report.groups
                    for p in g.partitions if p.unavailable}
        assert labelled.get((high, 0)) == "offline: the partition has no leader"
        assert report.replication is not None and report.replication[high].offline >= 1
        brokers.restore()

    # a topic made by hand with one replica, under the cluster's min.insync.replicas=2
    with scratch(cluster_settings, "c2", database=False, create=False) as settings:
        admin = make_admin(settings)
        names = all_topics(settings.topic_prefix, 2)
        for future in admin.create_topics([NewTopic(n, 1, 1) for n in names]).values():
            future.result()
        # every broker learns of new topics a moment after the controller made them
        said = wait_until(lambda: (lambda text: text if text and "replication factor" in text
                                   else None)(_failing_or_none(settings)), 30,
                          "check to see the topics of one replica")
        assert (f"FAIL {names[0]}: replication factor 1 is below min.insync.replicas=2: every "
                "write is refused") in said


def test_topics_create_refuses_a_factor_the_cluster_cannot_hold(
        cluster_settings: Settings, brokers: Brokers) -> None:
    for factor, said in [
            (BROKERS + 1, "POSTROOM_TOPIC_REPLICATION_FACTOR=4 is more than the 3 broker(s) "
                          "that answer"),
            (1, "POSTROOM_TOPIC_REPLICATION_FACTOR=1 is below the cluster's "
                "min.insync.replicas=2")]:
        settings = dataclasses.replace(cluster_settings, topic_replication_factor=factor)
        with scratch(settings, "c3", database=False, create=False) as mine:
            with pytest.raises(KafkaClientError, match=re.escape(said)):
                create_topics(mine)
            assert not {t for t in make_admin(mine).list_topics(timeout=10).topics
                        if t.startswith(mine.topic_prefix)}
    brokers.stop(3)
    wait_until(lambda: len(make_admin(cluster_settings).list_topics(timeout=10).brokers) == 2,
               60, "broker 3 to leave the metadata")
    with scratch(cluster_settings, "c4", database=False, create=False) as mine:
        with pytest.raises(KafkaClientError, match=re.escape(
                "POSTROOM_TOPIC_REPLICATION_FACTOR=3 is more than the 2 broker(s) that answer")):
            create_topics(mine)


def test_lag_answers_with_the_busiest_leader_killed(topics: Settings, brokers: Brokers) -> None:
    high = priority_topic(topics.topic_prefix, "high")
    producer = Producer(topics.kafka_client_config())
    for n in range(30):
        producer.produce(high, key=f"k{n}", value=b"x", partition=n % topics.topic_partitions)
    assert producer.flush(30) == 0
    groups = postroom_groups(topics)
    node = brokers.leader(high, 0)
    brokers.kill(node)
    started = time.monotonic()
    reader = LagReader(topics, groups)
    metrics = Metrics()
    try:
        report = read_report(reader, None, samples=3)
        took = time.monotonic() - started
        assert took < LAG_ANSWERS_WITHIN_S, took
        sender = next(g for g in report.groups if g.group == topics.sender_group)
        for p in sender.partitions:
            if p.topic == high and p.unavailable is None:
                assert p.lag == 10  # nothing committed: every record is lag
        # the dead leader's partition is never read as 0: labelled UNAVAILABLE, with the report
        # saying PARTIAL, or (a later sample, once its leadership moved) read in full. Which one
        # depends on how soon the controller fences the broker and the leadership moves.
        from postroom import lag as lag_module

        (dead,) = [p for p in sender.partitions if (p.topic, p.partition) == (high, 0)]
        text = lag_module.render_text(report)
        (line,) = [t for t in text if t.startswith(f"{topics.sender_group}: ")]
        if dead.unavailable:
            assert sender.unavailable >= 1
            assert f"(PARTIAL: {sender.unavailable} of {len(sender.partitions)} partitions " in line
            assert any(t.startswith(f"  {high}[0] UNAVAILABLE") for t in text), text
        else:
            assert (dead.lag, dead.end) == (10, 10), dead
            assert "PARTIAL" not in line or sender.unavailable >= 1, line
        # the leadership moves within the broker's failover time: a whole answer again
        def whole() -> bool:
            again = read_report(reader, None, samples=1)
            return not any(g.unavailable for g in again.groups) and sum(
                p.lag for g in again.groups for p in g.partitions if p.topic == high) == 30
        wait_until(whole, 60, "lag to read every partition again")
        report = read_report(reader, None, samples=1)
        from postroom import lag

        lag.export(metrics, report, "c")
        assert report.replication is not None
        assert report.replication[high].under_replicated == topics.topic_partitions
        assert report.replication[high].below_min_isr == 0
        assert metrics.render().count("postroom_topic_partitions_under_replicated{") == len(
            all_topics(topics.topic_prefix, 2))
    finally:
        reader.close()


def test_the_secured_listener_with_three_addresses(topics: Settings, brokers: Brokers) -> None:
    own = Settings.from_env(role_env("admin"))
    assert len((own.kafka_bootstrap_servers or "").split(",")) == BROKERS
    admin = dataclasses.replace(topics, kafka_bootstrap_servers=own.kafka_bootstrap_servers,
                                kafka_config=own.kafka_config)
    acls = role_acls(topics.topic_prefix, sender_group=topics.sender_group,
                     recorder_group=topics.recorder_group)
    try:
        apply_acls(admin, acls)
        wait_until(lambda: _ok_or_none(admin), 30, "the admin's ACLs to take")
        brokers.stop(1)  # the first bootstrap address: the client goes on to the others
        said = wait_until(lambda: _said_or_none(admin, 1), 60,
                          "check over SASL_SSL to see broker 1 gone")
        assert "min.insync.replicas=2 still met" in said  # the admin reads the topics' configs
    finally:
        plain = make_admin(topics)  # the PLAINTEXT listener's principal is a super user
        for future in plain.delete_acls([acl_binding(a, as_filter=True) for a in acls]).values():
            future.result()


def _ok_or_none(settings: Settings) -> str | None:
    try:
        return check_kafka(settings)
    except KafkaClientError:
        return None


def _environ() -> dict[str, str]:
    import os

    return dict(os.environ)
