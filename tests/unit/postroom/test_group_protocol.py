"""The consumer config under either group protocol: KIP-848's (group.protocol=consumer) leaves the
session timing and the assignment to the broker, and librdkafka refuses a consumer given the
classic protocol's keys with it. The configs are dicts; the consumers made of them are only
created, never connected."""

from __future__ import annotations

import types
from concurrent.futures import Future

import pytest
from confluent_kafka import Consumer, KafkaException
from confluent_kafka.admin import ConfigEntry, ConfigResource, ResourceType  # type: ignore[attr-defined]
from hypothesis import given, settings
from hypothesis import strategies as st

from postroom.kafka import (
    CONSUMER_HEARTBEAT_INTERVAL_MS,
    CONSUMER_SESSION_TIMEOUT_MS,
    clients,
    consumer_config,
)
from postroom.kafka.config import named_protocol
from postroom.kafka.group_protocol import (
    ProtocolChoice,
    ask_cluster,
    decide,
    group_protocol,
    librdkafka_version,
)
from postroom.settings import Settings
from support.fuzz import examples

CLASSIC_ONLY = ("session.timeout.ms", "heartbeat.interval.ms", "partition.assignment.strategy")


def settings_of(consumer: str = "") -> Settings:
    env = {"POSTROOM_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9"}
    if consumer:
        env["POSTROOM_KAFKA_CONSUMER_CONFIG"] = consumer
    return Settings.from_env(env)


def created(config: dict[str, object]) -> None:
    """librdkafka accepts the config (a Consumer connects only when it is used)."""
    Consumer({**config, "log_level": 0}).close()


@pytest.mark.parametrize(("overrides", "assignor"), [
    ({}, "uniform"),                                           # relay's and recorder's groups
    ({"partition.assignment.strategy": "range"}, "range"),    # the sender's (sender/consumer.py)
])
def test_kip848_leaves_timing_and_assignment_to_the_broker(
        overrides: dict[str, str], assignor: str) -> None:
    config = consumer_config(settings_of("group.protocol=consumer"), "g", **overrides)
    assert not set(CLASSIC_ONLY) & set(config), config
    assert config["group.remote.assignor"] == assignor
    created(config)


def test_kip848_may_be_asked_for_by_the_caller_too() -> None:
    config = consumer_config(settings_of(), "g", **{"group.protocol": "consumer"})
    assert not set(CLASSIC_ONLY) & set(config), config
    created(config)


def test_an_assignor_of_the_settings_wins() -> None:
    config = consumer_config(settings_of("group.protocol=consumer;group.remote.assignor=uniform"),
                             "g", **{"partition.assignment.strategy": "range"})
    assert config["group.remote.assignor"] == "uniform"


@pytest.mark.parametrize("consumer", ["", "group.protocol=classic", "group.protocol=CLASSIC"])
def test_the_classic_protocol_keeps_postroom_timing(consumer: str) -> None:
    config = consumer_config(settings_of(consumer), "g")
    assert (config["session.timeout.ms"], config["heartbeat.interval.ms"],
            config["partition.assignment.strategy"]) == (
        CONSUMER_SESSION_TIMEOUT_MS, CONSUMER_HEARTBEAT_INTERVAL_MS, "cooperative-sticky")
    assert "group.remote.assignor" not in config
    created(config)


def test_a_classic_key_set_by_the_operator_with_kip848_is_refused_by_librdkafka() -> None:
    """Not dropped in silence: the operator asked for a timing the broker would not apply."""
    config = consumer_config(settings_of("group.protocol=consumer;session.timeout.ms=30000"), "g")
    assert config["session.timeout.ms"] == "30000"
    with pytest.raises(KafkaException, match=r"session\.timeout\.ms"):
        created(config)


# ---- which protocol a group joins with when the settings name none (postroom.kafka.group_protocol)

NEW = (2, 16)


@pytest.mark.parametrize(("librdkafka", "session_ms", "protocols", "protocol", "said"), [
    (NEW, 10_000, "classic,consumer,streams", "consumer", "KIP-848: the group's session is 10 s"),
    (NEW, 6_000, None, "consumer", "6 s"),       # the brokers' config unreadable: the session says
    (NEW, 45_000, "classic,consumer", "classic", "would be 45 s"),      # Kafka's default
    (NEW, 10_001, "classic,consumer", "classic", "at most 10000 on group g"),
    (NEW, None, "classic,consumer", "classic", "could not be read"),
    (NEW, 10_000, "classic", "classic", "rebalance.protocols is 'classic'"),
    (NEW, 10_000, "classic, consumer", "consumer", "10 s"),
    ((2, 11), 10_000, "classic,consumer", "classic", "librdkafka 2.11 predates"),
    ((1, 99), 10_000, None, "classic", "predates"),
])
def test_kip848_only_where_the_platform_made_its_session_as_short_as_postroom_s(
        librdkafka: tuple[int, int], session_ms: int | None, protocols: str | None,
        protocol: str, said: str) -> None:
    choice = decide("g", librdkafka=librdkafka, session_ms=session_ms,
                    broker_protocols=protocols)
    assert choice.protocol == protocol
    assert said in choice.reason


def test_librdkafka_packed_versions() -> None:
    assert librdkafka_version(0x021000FF) == (2, 16)
    assert librdkafka_version(0x020C0100) == (2, 12)
    assert librdkafka_version(0x010900FF) == (1, 9)


@pytest.mark.parametrize(("configs", "named"), [
    (({}, {}), None),
    (({"group.protocol": "CONSUMER"}, {}), "consumer"),
    (({"group.protocol": "consumer"}, {"group.protocol": "classic"}), "classic"),  # caller wins
    (({}, {"group.protocol": " classic "}), "classic"),
])
def test_a_named_protocol_decides_without_asking(
        configs: tuple[dict[str, str], dict[str, str]], named: str | None) -> None:
    assert named_protocol(*configs) == named


def test_the_cluster_is_asked_only_when_no_protocol_is_named(
        monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []

    def ask(admin: object, group: str) -> ProtocolChoice:
        asked.append(group)
        return ProtocolChoice("consumer", "as the test says")

    made: list[dict[str, object]] = []
    monkeypatch.setattr(clients, "group_protocol",
                        lambda settings, group, admin: ask(admin, group))
    monkeypatch.setattr(clients, "WatchedConsumer", lambda config: made.append(config))
    clients.make_consumer(settings_of(), "g1")
    clients.make_consumer(settings_of("group.protocol=classic"), "g2")
    clients.make_consumer(settings_of(), "g3", **{"group.protocol": "classic"})
    assert asked == ["g1"]
    assert [c["group.protocol"] for c in made] == ["consumer", "classic", "classic"]
    assert "session.timeout.ms" not in made[0] and made[1]["session.timeout.ms"] == 10_000


@pytest.mark.parametrize("timing", ["session.timeout.ms=30000", "heartbeat.interval.ms=1000"])
def test_classic_timing_in_the_settings_keeps_the_group_classic_without_asking(
        timing: str) -> None:
    """librdkafka refuses these with KIP-848: a platform's 10 s session must not make the role
    fail at its next start."""
    class NoAdmin:
        def __getattr__(self, name: str) -> object:
            raise AssertionError(f"the cluster was asked ({name})")

    choice = group_protocol(settings_of(timing), "g", NoAdmin())  # type: ignore[arg-type]
    assert choice.protocol == "classic"
    assert timing.split("=")[0] in choice.reason
    created(consumer_config(settings_of(timing), "g", **{"group.protocol": choice.protocol}))


class Answers:
    """An admin client's describe_configs and list_topics, as the cluster would answer them."""

    def __init__(self, session: str | None) -> None:
        self.session = session
        self.protocols = "classic,consumer"
        self.asked: list[str] = []

    def describe_configs(self, resources: list[ConfigResource],
                         request_timeout: float) -> dict[ConfigResource, Future[object]]:
        resource = resources[0]
        self.asked.append(f"describe {resource.restype.name}")
        future: Future[object] = Future()
        if resource.restype is ResourceType.GROUP and self.session is not None:
            future.set_result({"consumer.session.timeout.ms": ConfigEntry(
                "consumer.session.timeout.ms", self.session)})
        elif resource.restype is ResourceType.BROKER:
            future.set_result({"group.coordinator.rebalance.protocols": ConfigEntry(
                "group.coordinator.rebalance.protocols", self.protocols)})
        else:
            future.set_exception(KafkaException("timed out"))
        return {resource: future}

    def list_topics(self, timeout: float) -> object:
        self.asked.append("metadata")
        return types.SimpleNamespace(brokers={2: None, 1: None})


@pytest.mark.parametrize(("session", "protocol", "asked"), [
    ("45000", "classic", ["describe GROUP"]),                       # untuned: one request
    (None, "classic", ["describe GROUP"]),                          # no answer: one timeout
    ("10000", "consumer", ["describe GROUP", "metadata", "describe BROKER"]),
])
def test_the_brokers_are_asked_only_when_the_group_s_session_allows_kip848(
        session: str | None, protocol: str, asked: list[str]) -> None:
    admin = Answers(session)
    assert ask_cluster(admin, "g").protocol == protocol  # type: ignore[arg-type]
    assert admin.asked == asked


@settings(max_examples=examples(200), deadline=None)
@given(st.one_of(st.none(), st.text(), st.from_regex(r"[0-9]{1,25}", fullmatch=True),
                 st.sampled_from(["²", "٣", "10000 ", "1e4", "-1", "0x10", "+6000", "6_000"])),
       st.text())
def test_whatever_the_cluster_answers_the_choice_is_made_without_raising(
        session: str | None, protocols: str) -> None:
    """A broker's answers are data: a session that is not a plain number of at most 10 s, or
    brokers without the protocol, give classic; a role never fails on them at its start."""
    admin = Answers(session)
    admin.protocols = protocols
    choice = ask_cluster(admin, "g")  # type: ignore[arg-type]
    plain = session is not None and session.isascii() and session.isdigit() and len(session) <= 18
    allowed = plain and int(session) <= 10_000 and "consumer" in {  # type: ignore[arg-type]
        p.strip() for p in protocols.split(",")}
    assert choice.protocol == ("consumer" if allowed else "classic")
    assert "\n" not in choice.reason
