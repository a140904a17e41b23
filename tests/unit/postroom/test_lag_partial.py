"""`postroom lag` with part of the cluster gone: partitions whose offsets no broker gave are
labelled unavailable (not a lag of 0), counted in no total or verdict, their lag series removed;
a leader that does not answer holds up only its own partitions; the replication gauges."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime as dt
import json
import time
from collections.abc import Mapping
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from postroom import lag
from postroom.errors import KafkaClientError
from postroom.lag import GroupReport, LagReader, LagReport, PartitionReport
from postroom.lagrules import Verdict
from postroom.metrics import Metrics
from postroom.replication import TopicHealth
from postroom.settings import Settings

T = "postroom.email.high"


def report(*partitions: PartitionReport,
           replication: Mapping[str, TopicHealth] | None = None) -> LagReport:
    group = GroupReport("g", "stable", (), partitions,
                        max((p.verdict for p in partitions if p.unavailable is None),
                            default=Verdict.OK))
    return LagReport(dt.datetime(2026, 12, 2, tzinfo=dt.UTC), (group,), None,
                     {} if replication is None else replication)


READ = PartitionReport("g", T, 0, 5, 12, 7, 3.5, Verdict.WARN)
GONE = PartitionReport("g", T, 1, None, -1, 0, 0.0, Verdict.OK,
                       unavailable="offline: the partition has no leader")


def test_an_unavailable_partition_is_labelled_and_left_out_of_the_totals() -> None:
    said = report(READ, GONE, dataclasses.replace(GONE, partition=2))
    group = said.groups[0]
    assert (group.sum_lag, group.max_lag, group.max_lag_seconds, group.unavailable) == (
        7, 7, 3.5, 2)
    text = lag.render_text(said)
    assert text[0].endswith("(PARTIAL: 2 of 3 partitions unavailable, not counted)")
    assert text[2:] == [f"  {T}[1] UNAVAILABLE: offline: the partition has no leader",
                        f"  {T}[2] UNAVAILABLE (as above)"]
    rows = [json.loads(line) for line in lag.render_json(said)]
    assert rows[1] == {"group": "g", "topic": T, "partition": 1, "committed": None, "end": None,
                       "lag": None, "lag_seconds": None, "verdict": "UNKNOWN",
                       "unavailable": "offline: the partition has no leader",
                       "group_state": "stable", "group_members": 0, "group_idle_members": 0,
                       "group_verdict": "WARN"}


def test_a_whole_report_adds_no_line() -> None:
    assert lag.render_text(report(READ)) == [
        "g: WARN, state stable, members none (no consumer of this group is running); total lag "
        "7, max 3.5s behind", f"  {T}[0] committed=5 end=12 lag=7 behind=3.5s WARN"]
    assert len(lag.render_json(report(READ))) == 1


def test_replication_problems_are_a_line_per_topic() -> None:
    said = report(READ, replication={T: TopicHealth(3, 1, 2, 1),
                                     "postroom.email.low": TopicHealth(3)})
    assert lag.render_text(said)[-1] == (
        f"replication: {T}: 1 offline, 2 under-replicated, 1 below min.insync.replicas (of 3 "
        "partitions; `postroom check` names them)")
    assert json.loads(lag.render_json(said)[-1]) == {
        "replication": T, "partitions": 3, "offline": 1, "under_replicated": 2,
        "below_min_insync_replicas": 1}
    unread = dataclasses.replace(said, replication=None)
    assert lag.render_text(unread)[-1].startswith("replication: UNKNOWN")


def test_export_drops_the_series_of_an_unavailable_partition_and_sets_the_gauges() -> None:
    metrics = Metrics()
    lag.export(metrics, report(READ, dataclasses.replace(GONE, unavailable=None, lag=4)), "c")
    lag.export(metrics, report(READ, GONE, replication={T: TopicHealth(3, 1, 2, 1)}), "c")
    text = metrics.render()
    assert f'partition="0",topic="{T}"}} 7.0' in text
    assert f'partition="1",topic="{T}"' not in text
    assert 'postroom_lag_partitions_unavailable{group="g"} 1.0' in text
    assert f'postroom_topic_partitions_offline{{cluster_name="c",topic="{T}"}} 1.0' in text
    assert f'postroom_topic_partitions_under_replicated{{cluster_name="c",topic="{T}"}} 2.0' in text
    assert (f'postroom_topic_partitions_below_min_insync_replicas{{cluster_name="c",topic="{T}"}}'
            ' 1.0') in text


def done(value: Any = None, error: KafkaError | None = None) -> concurrent.futures.Future[Any]:
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()
    if error is not None:
        future.set_exception(KafkaException(error))
    else:
        future.set_result(value)
    return future


@dataclasses.dataclass
class Offset:
    offset: int


class FakeAdmin:
    """list_offsets as librdkafka answers it with broker 2 gone: its partitions time out."""

    def __init__(self, dead: int, leaders: Mapping[tuple[str, int], int]) -> None:
        self.dead, self.leaders, self.requests = dead, leaders, 0

    def list_offsets(self, wanted: Mapping[TopicPartition, Any], request_timeout: float,
                     ) -> dict[TopicPartition, concurrent.futures.Future[Any]]:
        self.requests += 1
        answers = {}
        for tp, spec in wanted.items():
            if self.leaders[(tp.topic, tp.partition)] == self.dead:
                answers[tp] = done(error=KafkaError(KafkaError._TIMED_OUT, "Local: Timed out"))
            else:
                latest = "latest" in repr(spec).lower() or str(spec).endswith("-1")
                answers[tp] = done(Offset(10 * tp.partition + (5 if latest else 0)))
        return answers


@pytest.fixture
def reader(monkeypatch: pytest.MonkeyPatch) -> LagReader:
    monkeypatch.setattr(lag.reader, "OFFSETS_RETRY_S", 0.5)
    return LagReader(Settings(kafka_bootstrap_servers="k1:9092,k2:9092,k3:9092"), {})


def test_a_leader_that_does_not_answer_holds_up_only_its_partitions(reader: LagReader) -> None:
    leaders = {(T, 0): 1, (T, 1): 2, (T, 2): 3, (T, 3): -1}
    reader._admin = FakeAdmin(dead=2, leaders=leaders)
    started = time.monotonic()
    reader._deadline = started + 1.2  # as sample() sets it
    marks = reader._watermarks([TopicPartition(T, p) for p in range(4)], leaders)
    assert time.monotonic() - started < 1.2 + 0.5  # the deadline, and one retry's pause at most
    assert marks[(T, 0)] == (0, 5)
    assert marks[(T, 2)] == (20, 25)
    assert isinstance(marks[(T, 1)], str) and "Timed out" in marks[(T, 1)]
    assert marks[(T, 3)] == "offline: the partition has no leader"
    # one request per leader and offset kind, then only the dead leader's asked again
    assert reader._admin.requests >= 3 * 2 + 1 * 2
    assert (reader._admin.requests - 6) % 2 == 0


R1 = "postroom.email.retry.1"


def test_export_drops_the_retry_series_of_an_unavailable_tier_partition() -> None:
    metrics = Metrics()
    waiting = PartitionReport("g", R1, 0, 0, 4, 4, 2.0, Verdict.OK, 1, 2, 2.0)
    lag.export(metrics, report(READ, waiting), "c")
    assert f'postroom_retry_waiting{{partition="0",topic="{R1}"}} 4.0' in metrics.render()
    lag.export(metrics, report(READ, dataclasses.replace(
        waiting, unavailable="offline: the partition has no leader")), "c")
    text = metrics.render()
    for name in ("postroom_retry_waiting", "postroom_retry_overdue",
                 "postroom_retry_overdue_seconds"):
        assert f'{name}{{partition="0",topic="{R1}"}}' not in text, name


def test_a_group_nothing_was_read_of_keeps_its_last_totals_and_status() -> None:
    # 0 lag and status OK (or no series) would resolve the group's alerts while nothing is known.
    metrics = Metrics()
    lag.export(metrics, report(READ), "c")
    lag.export(metrics, report(GONE, dataclasses.replace(GONE, partition=2)), "c")
    text = metrics.render()
    assert 'postroom_consumergroup_status{group="g"} 1.0' in text
    assert 'kafka_consumergroup_group_sum_lag{cluster_name="c",group="g"} 7.0' in text
    assert 'kafka_consumergroup_group_max_lag_seconds{cluster_name="c",group="g"} 3.5' in text
    assert 'postroom_lag_partitions_unavailable{group="g"} 2.0' in text
    said = lag.render_text(report(GONE))
    assert said[0].startswith("g: UNKNOWN, ")
    assert json.loads(lag.render_json(report(GONE))[0])["group_verdict"] == "UNKNOWN"


def test_a_group_that_could_not_be_described_has_members_unknown() -> None:
    group = GroupReport("g", "unknown (coordinator moving)", (), (READ,), Verdict.WARN,
                        members_known=False)
    said = LagReport(dt.datetime(2026, 12, 2, tzinfo=dt.UTC), (group,), None, {})
    assert "members unknown;" in lag.render_text(said)[0]
    assert "no consumer" not in lag.render_text(said)[0]
    assert json.loads(lag.render_json(said)[0])["group_members"] is None
    metrics = Metrics()
    lag.export(metrics, dataclasses.replace(report(READ), groups=(dataclasses.replace(
        group, members=(lag.Member("s1", "h", 6),), members_known=True),)), "c")
    lag.export(metrics, said, "c")
    assert 'postroom_consumergroup_members{group="g"} 1.0' in metrics.render()  # not 0


def test_a_describe_that_gets_no_answer_leaves_the_members_unknown(
        reader: LagReader, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_answer(group: str) -> None:
        raise KafkaClientError("cannot describe group g", code="_TIMED_OUT")

    monkeypatch.setattr(reader, "_describe", no_answer)
    monkeypatch.setattr(reader, "_offsets", lambda group, topics: (
        [], [(TopicPartition(T, 0), "offsets unreadable")]))
    group = reader._sample_group("g", [T])
    assert not group.members_known
    assert group.state.startswith("unknown (")


def test_a_first_record_not_read_in_time_is_unknown_not_zero(
        reader: LagReader, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reader, "_describe", lambda group: ("stable", ()))
    monkeypatch.setattr(reader, "_offsets", lambda group, topics: (
        [(TopicPartition(T, 0), 5, 5, 12), (TopicPartition(R1, 0), 0, 0, 4)], []))
    monkeypatch.setattr(reader, "_first_records", lambda wanted: {})  # the sample's time ran out
    group = reader._sample_group("g", [T, R1])
    high, tier = group.partitions
    assert (high.lag, high.lag_seconds) == (7, None)
    assert (tier.lag, tier.overdue, tier.overdue_seconds, tier.lag_seconds) == (4, None, None, None)
    assert group.max_lag_seconds == 0.0  # of what is known: nothing
    said = LagReport(dt.datetime(2026, 12, 2, tzinfo=dt.UTC), (group,), None, {})
    text = lag.render_text(said)
    assert text[1] == f"  {T}[0] committed=5 end=12 lag=7 behind=unknown OK"
    assert text[2] == f"  {R1}[0] committed=0 end=4 lag=4 waiting=4 overdue=unknown OK"
    rows = [json.loads(line) for line in lag.render_json(said)]
    assert (rows[0]["lag_seconds"], rows[1]["overdue"], rows[1]["overdue_seconds"]) == (
        None, None, None)
    metrics = Metrics()
    lag.export(metrics, report(dataclasses.replace(high, lag_seconds=3.0)), "c")
    lag.export(metrics, said, "c")
    out = metrics.render()
    where = f'{{cluster_name="c",group="g",partition="0",topic="{T}"}}'
    assert f"kafka_consumergroup_group_lag{where} 7.0" in out
    assert f"kafka_consumergroup_group_lag_seconds{where}" not in out
    assert f'postroom_retry_waiting{{partition="0",topic="{R1}"}} 4.0' in out
    assert f'postroom_retry_overdue{{partition="0",topic="{R1}"}}' not in out


class NoMetadata:
    def list_topics(self, timeout: float) -> None:
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "Local: Timed out"))


def test_metadata_that_does_not_come_labels_the_group_unavailable(
        reader: LagReader, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reader, "_records", NoMetadata)
    reader._deadline = time.monotonic() + 1
    rows, unreadable = reader._offsets("g", [T])
    assert rows == []
    assert [(tp.topic, tp.partition) for tp, _why in unreadable] == [
        (T, p) for p in range(reader._settings.topic_partitions)]
    assert all("Timed out" in why for _tp, why in unreadable)


def test_a_refused_metadata_request_still_ends_the_report(
        reader: LagReader, monkeypatch: pytest.MonkeyPatch) -> None:
    class Refused:
        def list_topics(self, timeout: float) -> None:
            raise KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "refused"))

    monkeypatch.setattr(reader, "_records", Refused)
    reader._deadline = time.monotonic() + 1
    with pytest.raises(KafkaClientError, match="TOPIC_AUTHORIZATION_FAILED"):
        reader._offsets("g", [T])


def test_each_group_of_a_sample_has_its_own_time(reader: LagReader,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lag.reader, "READ_TIMEOUT_S", 1.0)
    reader._groups = {"a": [T], "b": [T]}
    reader._reached = True
    monkeypatch.setattr(reader, "_replication", lambda: None)
    left = []

    def slow(group: str) -> tuple[str, tuple[lag.Member, ...]]:
        time.sleep(0.6)
        left.append(reader._deadline - time.monotonic())
        return "stable", ()

    monkeypatch.setattr(reader, "_describe", slow)
    monkeypatch.setattr(reader, "_offsets", lambda group, topics: (
        [], [(TopicPartition(T, 0), "offsets unreadable")]))
    reader.sample()
    assert len(left) == 2 and min(left) > 0.2, left  # b is not left what a did not use


def test_a_registry_that_could_not_answer_is_not_asked_again_for_a_while() -> None:
    """`lag` with a registry that hangs: one ask per schema id a minute, not one per record."""
    from postroom.lag.due import REGISTRY_QUIET_S, QuietLookup
    from postroom.schemas.codec import load_schema
    from postroom.schemas.errors import SchemaUnavailableError

    asked: list[int] = []
    answers: dict[int, bool] = {7: False}
    now = [0.0]

    def registry(schema_id: int) -> Any:
        asked.append(schema_id)
        if not answers.get(schema_id, True):
            raise SchemaUnavailableError("timed out")
        return load_schema("email_requested")

    lookup = QuietLookup(registry, clock=lambda: now[0])
    for _ in range(50):
        with pytest.raises(SchemaUnavailableError):
            lookup(7)
    assert asked == [7]
    assert lookup(8).name  # another id is asked
    now[0] += REGISTRY_QUIET_S
    answers[7] = True
    assert lookup(7).name
    assert asked == [7, 8, 7]
