"""postroom's topics on the broker: created, described (exists, authorized), their replication
and retention read."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from postroom.acls import TopicAccess, admin_topics_prefix
from postroom.errors import KafkaClientError
from postroom.kafka.clients import make_admin
from postroom.kafka.config import BROKER_WAIT_S, plain_number
from postroom.kafka.errors import is_moving, translate
from postroom.kafka.probe import check_reachable
from postroom.replication import PartitionReplicas, replication_refusal
from postroom.settings import Settings
from postroom.topics import all_topics

log = logging.getLogger(__name__)

# How often a role starting asks again for its topics while a broker is down (each ask waits
# up to BROKER_WAIT_S): a cluster's failover takes about 10 s, its controller's fencing 9 s.
START_TOPIC_TRIES = 6


def require_topics(settings: Settings, timeout_s: float = BROKER_WAIT_S,
                   tries: int = START_TOPIC_TRIES, pause_s: float = 1.0) -> None:
    """KafkaClientError, in one line naming ``postroom topics create``, when a topic postroom
    uses does not exist: a role started before them would wait on them for ever. A topic this
    principal may not describe is not called missing (``postroom check --role`` tells that).

    A role started while a broker of the cluster is down may find the description timing out
    (the metadata's controller was the broker lost): it asks again, ``tries`` times in all, with
    a warning each time, before it gives up."""
    topics = all_topics(settings.topic_prefix, len(settings.retry_delays_s))
    for attempt in range(1, tries + 1):
        try:
            access = topic_access(settings, topics, timeout_s)
            break
        except KafkaClientError as exc:
            if attempt == tries or not is_moving(exc):
                raise
            log.warning("%s; asking again in %.0fs (%d of %d)", exc, pause_s, attempt, tries)
            time.sleep(pause_s)
    missing = [a.topic for a in access if a.exists is False]
    if missing:
        raise KafkaClientError(
            f"{len(missing)} of {len(topics)} topics missing on "
            f"{settings.kafka_bootstrap_servers}: {', '.join(missing)}; run `postroom topics "
            f"create` (with the same POSTROOM_TOPIC_PREFIX={settings.topic_prefix!r})")


def topic_replicas(settings: Settings, topics: Sequence[str], timeout_s: float = 10.0,
                   admin: AdminClient | None = None,
                   ) -> tuple[list[PartitionReplicas], int]:
    """Leader, replicas and ISR of every partition of ``topics`` the cluster's metadata shows
    (a topic missing or not visible has none), and how many brokers answer."""
    admin = admin or make_admin(settings)
    try:
        metadata = admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise translate(exc, "cannot read the cluster's metadata") from exc
    found = [PartitionReplicas(topic, p.id, p.leader, tuple(p.replicas), tuple(p.isrs))
             for topic in topics if topic in metadata.topics
             for p in metadata.topics[topic].partitions.values()]
    return found, len(metadata.brokers)


def min_insync_replicas(settings: Settings, topics: Sequence[str], timeout_s: float = 10.0,
                        admin: AdminClient | None = None) -> dict[str, int | None]:
    """Each topic's effective ``min.insync.replicas`` (its own or the broker's); None where the
    broker would not say (a principal without DESCRIBE_CONFIGS, a topic missing)."""
    from confluent_kafka.admin import ConfigResource, ResourceType  # type: ignore[attr-defined]

    if not topics:
        return {}
    admin = admin or make_admin(settings)
    resources = [ConfigResource(ResourceType.TOPIC, name) for name in topics]
    found: dict[str, int | None] = dict.fromkeys(topics)
    futures = admin.describe_configs(resources, request_timeout=timeout_s)
    for resource, future in futures.items():
        try:
            entry = future.result().get("min.insync.replicas")
        except KafkaException:
            continue  # not authorized, or gone: judged without it
        if entry is not None and (number := plain_number(entry.value)) is not None:
            found[resource.name] = number
    return found


def broker_settings(admin: AdminClient, broker: int, names: Sequence[str],
                    timeout_s: float = 10.0) -> dict[str, int | None]:
    """Whole-number configs of one broker (``min.insync.replicas``, ``default.replication.
    factor``); None for each when this principal may not read them (DESCRIBE_CONFIGS on the
    cluster)."""
    from confluent_kafka.admin import ConfigResource, ResourceType  # type: ignore[attr-defined]

    found: dict[str, int | None] = dict.fromkeys(names)
    resource = ConfigResource(ResourceType.BROKER, str(broker))
    try:
        entries = admin.describe_configs([resource], request_timeout=timeout_s)[resource].result()
    except KafkaException:
        return found
    for name in names:
        entry = entries.get(name)
        if entry is not None and (number := plain_number(entry.value)) is not None:
            found[name] = number
    return found


def planned_replication(settings: Settings, admin: AdminClient, metadata: Any,
                        timeout_s: float = 10.0) -> tuple[int, int, int | None, str]:
    """(replication factor, brokers answering, min.insync.replicas or None, the setting that
    gave the factor) for topics created now: POSTROOM_TOPIC_REPLICATION_FACTOR, or with -1 the
    broker's default.replication.factor (-1 again when this principal may not read it).

    min.insync.replicas is POSTROOM_TOPIC_CONFIG's, else the broker's; the broker's config needs
    DescribeConfigs on the cluster, which the admin role does not have, so then the lowest of the
    existing postroom topics' effective values (DescribeConfigs on them, which it has) stands
    in; with none of them, a warning says the factor could not be checked."""
    configs = broker_settings(admin, min(metadata.brokers), (
        "default.replication.factor", "min.insync.replicas"), timeout_s) if metadata.brokers else {}
    own = plain_number(settings.topic_config.get("min.insync.replicas"))
    min_insync = own if own is not None else configs.get("min.insync.replicas")
    if min_insync is None:
        ours = sorted(name for name in metadata.topics
                      if name.startswith(admin_topics_prefix(settings.topic_prefix)))
        found = [n for n in min_insync_replicas(settings, ours, timeout_s, admin).values()
                 if n is not None]
        # The lowest: a factor below it is refused on every one of them, whatever its origin.
        min_insync = min(found, default=None)
        if min_insync is None:
            log.warning("could not check the replication factor against min.insync.replicas: "
                        "this principal may not read the broker's config (DescribeConfigs on "
                        "the cluster) and no postroom topic exists to read it from; a factor "
                        "below it would refuse every write (NOT_ENOUGH_REPLICAS)")
    factor, source = settings.topic_replication_factor, "POSTROOM_TOPIC_REPLICATION_FACTOR"
    if factor < 0:
        factor = configs.get("default.replication.factor") or -1
        source = "the broker's default.replication.factor"
    return factor, len(metadata.brokers), min_insync, source


def create_topics(
    settings: Settings,
    names: Iterable[str] | None = None,
    *,
    timeout_s: float = 30.0,
) -> dict[str, str]:
    """Create each topic that does not exist yet; return ``{topic: "created" | "exists"}``."""
    wanted = list(names) if names is not None else all_topics(
        settings.topic_prefix, len(settings.retry_delays_s))
    check_reachable(settings)
    admin = make_admin(settings)
    try:
        metadata = admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise translate(exc, "cannot list topics") from exc
    existing = set(metadata.topics)
    result = {name: "exists" for name in wanted if name in existing}
    if any(name not in existing for name in wanted):
        # Refused here in one line, not by the broker once per topic.
        refusal = replication_refusal(*planned_replication(settings, admin, metadata, timeout_s))
        if refusal:
            raise KafkaClientError(f"cannot create topics on {settings.kafka_bootstrap_servers}: "
                                   f"{refusal}")
    missing = [
        NewTopic(name, num_partitions=settings.topic_partitions,
                 replication_factor=settings.topic_replication_factor,
                 config=dict(settings.topic_config))
        for name in wanted if name not in existing
    ]
    if missing:
        futures = admin.create_topics(missing, request_timeout=timeout_s)
        for name, future in futures.items():
            try:
                future.result()
                result[name] = "created"
            except KafkaException as exc:
                err = exc.args[0]
                # Another process may have created it between our listing and our request.
                if isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    result[name] = "exists"
                else:
                    raise translate(exc, f"cannot create topic {name}") from exc
    return {name: result[name] for name in wanted}


# Kafka's defaults for a topic that does not set them: a segment is rolled after seven days.
DEFAULT_SEGMENT_MS = 7 * 24 * 3600 * 1000
# How often a broker looks for segments past their retention (log.retention.check.interval.ms,
# five minutes by default): a record may outlive its segment's deadline by this much.
RETENTION_CHECK_MARGIN_S = 300.0


@dataclasses.dataclass(frozen=True)
class TopicRetention:
    """How long the topics keep records: the longest ``retention.ms``, and the longest a record
    can stay (``record_life_s``)."""

    retention_s: float
    record_life_s: float


def topic_retention(settings: Settings, topics: Iterable[str],
                    timeout_s: float = 30.0) -> TopicRetention | None:
    """The longest ``retention.ms`` of ``topics`` and the longest a record can stay on one of
    them, in seconds; None when one keeps records forever (``retention.ms=-1``).

    Kafka deletes a whole segment once its newest record is older than ``retention.ms``, and a
    segment takes records for up to ``segment.ms``: a record can stay ``retention.ms`` +
    ``segment.ms`` (and the broker's next retention check) after it was written, a week past
    ``retention.ms`` at Kafka's defaults."""
    from confluent_kafka.admin import ConfigResource, ResourceType  # type: ignore[attr-defined]

    check_reachable(settings)
    admin = make_admin(settings)
    resources = [ConfigResource(ResourceType.TOPIC, name) for name in topics]
    retention_s = record_life_s = 0.0
    try:
        for future in admin.describe_configs(resources, request_timeout=timeout_s).values():
            configs = future.result()
            retention_ms = _config_ms(configs, "retention.ms", -1)
            if retention_ms < 0:
                return None
            segment_ms = max(0, _config_ms(configs, "segment.ms", DEFAULT_SEGMENT_MS))
            retention_s = max(retention_s, retention_ms / 1000)
            record_life_s = max(record_life_s, (retention_ms + segment_ms) / 1000
                                + RETENTION_CHECK_MARGIN_S)
    except KafkaException as exc:
        raise translate(exc, "cannot read the topics' retention.ms and segment.ms") from exc
    return TopicRetention(retention_s, record_life_s)


def _config_ms(configs: dict[str, Any], name: str, default: int) -> int:
    entry = configs.get(name)
    return int(entry.value) if entry is not None and entry.value is not None else default


def topic_access(settings: Settings, topics: Sequence[str],
                 timeout_s: float = 10.0) -> list[TopicAccess]:
    """Per topic: does it exist, and which operations (``READ``, ``WRITE``...) are authorized."""
    from confluent_kafka import TopicCollection

    admin = make_admin(settings)
    futures = admin.describe_topics(TopicCollection(list(topics)),
                                    include_authorized_operations=True,
                                    request_timeout=timeout_s)
    found = []
    for topic in topics:
        try:
            description = futures[topic].result()
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            code = err.code() if isinstance(err, KafkaError) else None
            if code == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                found.append(TopicAccess(topic, None, None))
            elif code == KafkaError.UNKNOWN_TOPIC_OR_PART:
                found.append(TopicAccess(topic, False, frozenset()))
            else:
                raise translate(exc, f"cannot describe topic {topic}") from exc
            continue
        operations = frozenset(op.name for op in description.authorized_operations or ())
        found.append(TopicAccess(topic, True, operations))
    admin.poll(0)  # served now, so the client is not destroyed with events queued
    return found
