"""Which consumer group protocol a role's group joins with when its settings name none.

KIP-848's protocol (``group.protocol=consumer``) has no client-side session to lose when the
group's coordinator dies, so a broker kill pauses deliveries only for the broker's fencing; the
classic protocol may lose that race and rejoin (docs/operations.md, "Consumer group protocol
and session timeouts"). But under KIP-848 the broker times the session: Kafka's own default and
floor are 45 s, and a dead sender's mail would wait that long where postroom's classic session
is 10 s. So a group joins with KIP-848 only where the platform has made its session as short as
postroom's: the group's ``consumer.session.timeout.ms`` (its own config, or the brokers'
``group.consumer.session.timeout.ms``) at most :data:`CONSUMER_SESSION_TIMEOUT_MS`, a broker
that has the protocol on, and a librdkafka that runs it in production. Otherwise classic, with
the reason said once at start. ``group.protocol`` in POSTROOM_KAFKA_CONSUMER_CONFIG decides
without asking.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaException, libversion
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    ResourceType,
)

from postroom.kafka.config import (
    CLASSIC_TIMING,
    CONSUMER_SESSION_TIMEOUT_MS,
    named_protocol,
    plain_number,
)
from postroom.settings import Settings

log = logging.getLogger(__name__)

CLASSIC = "classic"
CONSUMER = "consumer"
# librdkafka made KIP-848's protocol generally available in 2.12.0 (its CHANGELOG).
KIP848_LIBRDKAFKA = (2, 12)
GROUP_SESSION = "consumer.session.timeout.ms"
BROKER_PROTOCOLS = "group.coordinator.rebalance.protocols"
ASK_TIMEOUT_S = 5.0


@dataclasses.dataclass(frozen=True)
class ProtocolChoice:
    protocol: str  # CLASSIC or CONSUMER
    reason: str


def librdkafka_version(packed: int) -> tuple[int, int]:
    """(major, minor) of librdkafka's packed version number (0xMMmmrrxx)."""
    return packed >> 24 & 0xFF, packed >> 16 & 0xFF


def decide(group: str, *, librdkafka: tuple[int, int], session_ms: int | None,
           broker_protocols: str | None) -> ProtocolChoice:
    """The protocol for ``group`` from what the cluster said. Pure.

    ``session_ms`` is the group's effective KIP-848 session timeout (None: not readable, which
    needs DescribeConfigs on the group); ``broker_protocols`` the brokers'
    ``group.coordinator.rebalance.protocols`` (None: not readable, which needs DescribeConfigs on
    the cluster; a session set as short as postroom's then stands for the platform's consent).
    """
    if librdkafka < KIP848_LIBRDKAFKA:
        return ProtocolChoice(CLASSIC, f"librdkafka {librdkafka[0]}.{librdkafka[1]} predates "
                                       "KIP-848's protocol in production (2.12)")
    if broker_protocols is not None and CONSUMER not in {
            p.strip() for p in broker_protocols.split(",")}:
        return ProtocolChoice(CLASSIC, f"the brokers' {BROKER_PROTOCOLS} is {broker_protocols!r}")
    if session_ms is None:
        return ProtocolChoice(CLASSIC, f"the group's {GROUP_SESSION} could not be read "
                                       "(DescribeConfigs on the group)")
    if session_ms > CONSUMER_SESSION_TIMEOUT_MS:
        return ProtocolChoice(CLASSIC, (
            f"under KIP-848 the group's session would be {session_ms / 1000:g} s "
            f"({GROUP_SESSION}), longer than the classic {CONSUMER_SESSION_TIMEOUT_MS / 1000:g} s "
            f"a dead member's partitions wait; set it to at most "
            f"{CONSUMER_SESSION_TIMEOUT_MS} on group {group} to use KIP-848"))
    return ProtocolChoice(CONSUMER, f"KIP-848: the group's session is {session_ms / 1000:g} s "
                                    f"({GROUP_SESSION})")


def _config_value(admin: AdminClient, resource: ConfigResource, name: str,
                  timeout_s: float) -> str | None:
    try:
        entries = admin.describe_configs([resource], request_timeout=timeout_s)[resource].result()
    except KafkaException as exc:
        log.debug("describe %s: %s", resource, exc)
        return None
    entry = entries.get(name)
    return None if entry is None or entry.value is None else str(entry.value)


def ask_cluster(admin: AdminClient, group: str,
                timeout_s: float = ASK_TIMEOUT_S) -> ProtocolChoice:
    """:func:`decide` on what the cluster says of ``group`` and of one broker. The brokers are
    asked only when the group's session would allow KIP-848, so an untuned cluster costs one
    request and a broker that does not answer one ``timeout_s``."""
    session = _config_value(admin, ConfigResource(ResourceType.GROUP, group), GROUP_SESSION,
                            timeout_s)
    session_ms = plain_number(session)
    protocols = None
    if session_ms is not None and session_ms <= CONSUMER_SESSION_TIMEOUT_MS:
        try:
            brokers = admin.list_topics(timeout=timeout_s).brokers
        except KafkaException as exc:
            log.debug("list brokers: %s", exc)
            brokers = {}
        if brokers:
            protocols = _config_value(admin, ConfigResource(ResourceType.BROKER,
                                                            str(min(brokers))),
                                      BROKER_PROTOCOLS, timeout_s)
    return decide(group, librdkafka=librdkafka_version(libversion()[1]), session_ms=session_ms,
                  broker_protocols=protocols)


def group_protocol(settings: Settings, group: str, admin: AdminClient,
                   overrides: Mapping[str, Any] | None = None) -> ProtocolChoice:
    """The protocol ``group`` joins with: as named in POSTROOM_KAFKA_CONSUMER_CONFIG (or by the
    caller's ``overrides``), else as the cluster allows (:func:`ask_cluster`)."""
    named = named_protocol(settings.kafka_consumer_config, overrides or {})
    if named is not None:
        return ProtocolChoice(named, "group.protocol as configured")
    timing = sorted(CLASSIC_TIMING.keys() & set(settings.kafka_consumer_config))
    if timing:
        # librdkafka refuses these with KIP-848's protocol: the operator chose classic timing.
        return ProtocolChoice(CLASSIC, f"POSTROOM_KAFKA_CONSUMER_CONFIG sets {', '.join(timing)}, "
                                       "which only the classic protocol takes")
    return ask_cluster(admin, group)
