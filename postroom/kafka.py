"""Thin wrappers around confluent-kafka: client configs, topic creation, errors translated to ours."""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from postroom.acls import (
    Acl,
    Operation,
    Pattern,
    Resource,
    Role,
    TopicAccess,
    admin_topics_prefix,
    needed_on_topics,
    role_acls,
    topic_problems,
    topic_warnings,
)
from postroom.errors import KafkaClientError
from postroom.headers import UNREADABLE_HEADERS
from postroom.replication import (
    PartitionReplicas,
    Severity,
    replication_findings,
    replication_refusal,
    summary,
)
from postroom.settings import PRODUCER_MESSAGE_TIMEOUT_MS, Settings, mask_kafka_config
from postroom.topics import all_topics

log = logging.getLogger(__name__)

Headers = list[tuple[str, str | bytes | None]]

CONSUMER_FETCH_WAIT_MS = 50
# librdkafka's 45 s default kept a killed sender's partitions, and the emails in them, idle for
# 45 s. Heartbeats come from librdkafka's own thread, not the event loop, so only a dead, stopped
# or cut-off process misses them: 10 s (five heartbeats) rides out a long GC pause and moves a
# dead member's partitions within about 12 s. A broker SIGKILLed on three brokers paused
# deliveries 8.4 s (median) with it, as with 30 s or KIP-848's protocol (docs/operations.md,
# "Consumer group protocol and session timeouts"); 30 s slowed a dead sender's takeover to 29 s.
# The broker's group.min.session.timeout.ms is 6 s by default.
CONSUMER_SESSION_TIMEOUT_MS = 10_000
CONSUMER_HEARTBEAT_INTERVAL_MS = 2_000
# The broker's assignor (KIP-848) for each client-side strategy postroom asks for.
REMOTE_ASSIGNOR = {"range": "range", "cooperative-sticky": "uniform"}


# A client's errors and librdkafka's own log lines repeat while a broker is down (about 20 a
# second for a closed port): the first of each kind is logged, the rest counted and said in one
# line when that kind comes back REPEAT_SUMMARY_S later.
REPEAT_SUMMARY_S = 60.0
REPEAT_KINDS_KEPT = 256  # kinds remembered at once; beyond, the oldest are forgotten
# How long a command or a role waits at start for a broker to answer before it gives up.
BROKER_WAIT_S = 10.0
_DIGITS = re.compile(r"\d+")
_librdkafka_log = logging.getLogger("postroom.librdkafka")


class RepeatedLines:
    """Which of many alike lines to log: the first of a kind, then, once ``interval_s`` has
    passed, the next one with the count of those left out. Lines differing only in their
    numbers (a client's serial, milliseconds, a port) are of one kind. Pure: the clock is given."""

    def __init__(self, interval_s: float = REPEAT_SUMMARY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._kinds: dict[str, list[float]] = {}  # kind -> [logged at, left out since]

    def admit(self, text: str) -> str | None:
        """The line to log for ``text`` now, or None when it is only counted."""
        kind = _DIGITS.sub("#", text)
        now = self._clock()
        with self._lock:
            seen = self._kinds.get(kind)
            if seen is not None and now - seen[0] < self._interval_s:
                seen[1] += 1
                return None
            if len(self._kinds) >= REPEAT_KINDS_KEPT:
                del self._kinds[next(iter(self._kinds))]
            self._kinds[kind] = [now, 0]
        if seen is not None and seen[1]:
            return f"{text} (and {seen[1]:.0f} more like it in the last {now - seen[0]:.0f}s)"
        return text


_repeats = RepeatedLines()


class ClientLog:
    """Where librdkafka's own log lines go (confluent-kafka's ``logger``): Python logging, under
    ``postroom.librdkafka``, repeats summarised, instead of ``%3|...|FAIL|`` lines on stderr.
    Its informational lines (below WARNING) describe its internals: DEBUG."""

    def __init__(self, repeats: RepeatedLines = _repeats) -> None:
        self._repeats = repeats

    def log(self, level: int, msg: str, *args: object) -> None:
        try:
            text = msg % args if args else msg
        except (TypeError, ValueError):  # a '%' of librdkafka's own in the format
            text = " ".join(str(part) for part in (msg, *args))
        line = self._repeats.admit(text)
        if line is not None:
            _librdkafka_log.log(level if level >= logging.WARNING else logging.DEBUG, "%s", line)


_client_log = ClientLog()


def _log_error(err: KafkaError) -> None:
    # librdkafka reports broker outages here and keeps retrying by itself; say it, don't stop.
    line = _repeats.admit(f"kafka client error code={err.name()}: {err.str()}")
    if line is not None:
        log.warning("%s", line)


def client_config(settings: Settings) -> dict[str, Any]:
    """The settings' librdkafka config with postroom's error and log handling; every client
    postroom makes starts from it."""
    return {**settings.kafka_client_config(), "error_cb": _log_error, "logger": _client_log}


def is_too_large(err: object) -> bool:
    """Whether ``err`` (a KafkaError, or a KafkaException carrying one) says a record is too large
    for the producer or the broker ever to take: retrying it cannot help."""
    if isinstance(err, KafkaException) and err.args:
        err = err.args[0]
    return isinstance(err, KafkaError) and err.code() in (
        KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE)


def translate(exc: KafkaException | KafkaError, message: str) -> KafkaClientError:
    """Our error for a librdkafka one, keeping its code."""
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else exc
    if isinstance(err, KafkaError):
        return KafkaClientError(f"{message}: {err.str()}", code=err.name(),
                                retriable=err.retriable())
    return KafkaClientError(f"{message}: {exc}")


def producer_config(settings: Settings, **overrides: Any) -> dict[str, Any]:
    """An idempotent, acks=all producer config; overrides win.

    POSTROOM_KAFKA_PRODUCER_CONFIG may change the tuning (linger.ms, compression.type, ...) but
    not what delivery relies on: idempotence, acks=all and the message timeout, which the relay's
    claim TTL is sized against.
    """
    return {
        **client_config(settings),
        "linger.ms": 5,
        "compression.type": "lz4",
        **settings.kafka_producer_config,
        "enable.idempotence": True,
        "acks": "all",
        "message.timeout.ms": PRODUCER_MESSAGE_TIMEOUT_MS,
        **overrides,
    }


def consumer_config(settings: Settings, group_id: str, **overrides: Any) -> dict[str, Any]:
    """A consumer that commits only what the caller stores as done, rebalancing cooperatively
    unless the caller overrides the assignment (the sender divides each topic: range).

    POSTROOM_KAFKA_CONSUMER_CONFIG may change the tuning (session.timeout.ms,
    auto.commit.interval.ms, fetch sizes, ...) but not how offsets are stored and committed.
    With its ``group.protocol=consumer`` (KIP-848) the broker times the session and assigns:
    postroom's session and heartbeat defaults are left out, and its assignment strategy is
    asked of the broker (``group.remote.assignor``), as librdkafka refuses them otherwise.
    """
    kip848 = str({**settings.kafka_consumer_config, **overrides}.get(
        "group.protocol", "classic")).lower() == "consumer"
    timing = {} if kip848 else {"session.timeout.ms": CONSUMER_SESSION_TIMEOUT_MS,
                                "heartbeat.interval.ms": CONSUMER_HEARTBEAT_INTERVAL_MS}
    config: dict[str, Any] = {
        # A paused retry tier resumes with a fresh fetch; the broker's default wait (500 ms)
        # made retries fire late. POSTROOM_KAFKA_CONSUMER_CONFIG may change it.
        "fetch.wait.max.ms": CONSUMER_FETCH_WAIT_MS,
        **timing,
        # Names the member in `postroom lag` and the broker's tools; the settings may rename it.
        "client.id": f"postroom-{group_id}",
        **client_config(settings),
        **settings.kafka_consumer_config,
        "group.id": group_id,
        "enable.auto.commit": True,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "partition.assignment.strategy": "cooperative-sticky",
        **overrides,
    }
    if kip848:
        strategy = config.pop("partition.assignment.strategy")
        config.setdefault("group.remote.assignor", REMOTE_ASSIGNOR.get(strategy, "uniform"))
    return config


def make_producer(settings: Settings, **overrides: Any) -> Producer:
    config = producer_config(settings, **overrides)
    log.debug("producer config %s", mask_kafka_config(config))
    try:
        return Producer(config)
    except KafkaException as exc:
        raise translate(exc, "cannot create Kafka producer") from exc


def make_consumer(settings: Settings, group_id: str, **overrides: Any) -> Consumer:
    config = consumer_config(settings, group_id, **overrides)
    log.debug("consumer config %s", mask_kafka_config(config))
    try:
        return Consumer(config)
    except KafkaException as exc:
        raise translate(exc, "cannot create Kafka consumer") from exc


def make_admin(settings: Settings) -> AdminClient:
    try:
        return AdminClient(client_config(settings))
    except KafkaException as exc:
        raise translate(exc, "cannot create Kafka admin client") from exc


# Where a client's security settings come from, for messages that name them.
_CONFIG_VARS = "POSTROOM_KAFKA_CONFIG / POSTROOM_KAFKA_CONFIG_FILE"


def explain_refusal(err: KafkaError, config: Mapping[str, Any]) -> str | None:
    """What to fix when the broker refused our credentials or TLS failed; None for other errors.

    Names the setting, never its value (the librdkafka text holds no secret either).
    """
    if err.code() == KafkaError._AUTHENTICATION:
        user = config.get("sasl.username", "(no sasl.username)")
        return (f"the broker refused the credentials of sasl.username={user} "
                f"(sasl.mechanism={config.get('sasl.mechanism', '?')}): check sasl.password in "
                f"{_CONFIG_VARS}. {err.str()}")
    if err.code() == KafkaError._SSL:
        return (f"TLS with the broker failed: check ssl.ca.location (the CA that signed the "
                f"broker's certificate) in {_CONFIG_VARS}. {err.str()}")
    return None


_BROKER_FAILURE = re.compile(
    r"^(?P<broker>(?:\w+://)?[^\s/]+)/[^\s:]+: (?:Connect to \S+ failed: )?(?P<why>.*?)"
    r"(?: \(after \d+ms in state \w+(?:, \d+ identical error\(s\) suppressed)?\))?$")


def describe_attempts(errors: Iterable[str], bootstrap: Sequence[str] = ()) -> str:
    """What the client's errors say of each broker tried, in one line, in the order of the
    ``bootstrap`` addresses: ``127.0.0.1:1 (Connection refused), kafka:9092 (Failed to resolve
    ...)``; the first error as it is when none names a broker."""
    errors = list(errors)
    tried: dict[str, str] = {}
    for text in errors:
        match = _BROKER_FAILURE.match(text)
        if match:
            tried[match["broker"]] = match["why"]
    if tried:
        order = {address.strip(): n for n, address in enumerate(bootstrap)}
        brokers = sorted(tried, key=lambda broker: (order.get(broker, len(order)), broker))
        return ", ".join(f"{broker} ({tried[broker]})" for broker in brokers)
    return errors[0] if errors else "no answer"


class _ProbeLog:
    """librdkafka's lines while waiting for a broker: its FAIL lines (one per connection try)
    are the errors the wait reports once; the rest go where every client's go."""

    def log(self, level: int, msg: str, *args: object) -> None:
        if not msg.startswith("FAIL") and not (args and str(args[0]) == "FAIL"):
            _client_log.log(level, msg, *args)


def check_reachable(settings: Settings, timeout_s: float = BROKER_WAIT_S) -> None:
    """Raise KafkaClientError unless a broker answers a metadata request within ``timeout_s``:
    one line naming POSTROOM_KAFKA_BOOTSTRAP_SERVERS and what each address tried answered
    (the client's errors while it waits are in it, not logged one by one).

    Refused credentials and failed TLS handshakes stop the check at once, with what to fix.
    """
    refusals: list[str] = []
    errors: list[str] = []
    config = settings.kafka_client_config()

    def on_error(err: KafkaError) -> None:
        errors.append(err.str())
        explained = explain_refusal(err, config)
        if explained:
            refusals.append(explained)

    probe: dict[str, Any] = {**config, "error_cb": on_error, "logger": _ProbeLog()}
    admin = AdminClient(probe)
    servers = f"{settings.kafka_bootstrap_servers} (POSTROOM_KAFKA_BOOTSTRAP_SERVERS)"
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            admin.list_topics(timeout=max(0.1, min(1.0, deadline - time.monotonic())))
        except KafkaException as exc:
            admin.poll(0)  # serves error_cb
            if refusals:
                raise KafkaClientError(
                    f"cannot use the Kafka broker at {servers}: {refusals[0]}") from exc
            if time.monotonic() >= deadline:
                raise KafkaClientError(
                    f"no Kafka broker answered at {servers} within {timeout_s:g}s; tried "
                    f"{describe_attempts(errors, config['bootstrap.servers'].split(','))}"
                ) from exc
        else:
            admin.poll(0)  # served now, so the client is not destroyed with events queued
            return


# Errors a broker loss brings while leaderships, coordinators and the metadata's controller
# move: a request made again a moment later is answered. Others (a refusal) are final.
MOVING_CODES = frozenset({"_TIMED_OUT", "_TRANSPORT", "_ALL_BROKERS_DOWN", "_WAIT_COORD",
                          "COORDINATOR_NOT_AVAILABLE", "NOT_COORDINATOR",
                          "COORDINATOR_LOAD_IN_PROGRESS", "LEADER_NOT_AVAILABLE",
                          "NOT_LEADER_FOR_PARTITION", "REQUEST_TIMED_OUT"})
# How often a role starting asks again for its topics while a broker is down (each ask waits
# up to BROKER_WAIT_S): a cluster's failover takes about 10 s, its controller's fencing 9 s.
START_TOPIC_TRIES = 6


def is_moving(exc: KafkaClientError) -> bool:
    """Whether ``exc`` is a broker loss's passing error, not a refusal."""
    return exc.retriable or exc.code in MOVING_CODES


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
        return (f"broker answers; the {role.value} may use all {len(topics)} of its topics",
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
        if entry is not None and entry.value is not None and entry.value.isdigit():
            found[resource.name] = int(entry.value)
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
        if entry is not None and str(entry.value).isdigit():
            found[name] = int(entry.value)
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
    own = settings.topic_config.get("min.insync.replicas", "")
    min_insync = int(own) if own.isdigit() else configs.get("min.insync.replicas")
    if min_insync is None and not own.isdigit():
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


@dataclasses.dataclass(frozen=True)
class Record:
    """What the sender needs of one consumed Kafka message."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers

    @property
    def tp(self) -> tuple[str, int]:
        return (self.topic, self.partition)

    @classmethod
    def from_message(cls, msg: Message) -> Record:
        headers = message_headers(msg)
        key = msg.key()
        value = msg.value()
        return cls(msg.topic() or "", msg.partition() or 0, msg.offset() or 0,
                   key.encode() if isinstance(key, str) else key,
                   value.encode() if isinstance(value, str) else value, headers)


# CPython's tuple layout: its item pointers follow the object's fixed part.
_TUPLE_ITEMS_AT = tuple.__basicsize__


def message_headers(msg: Message) -> Headers:
    """``msg.headers()`` as a list; ``[(UNREADABLE_HEADERS, None)]`` when confluent-kafka could
    not decode a header name (not UTF-8, as a Go or C producer may write). It then returns a list
    whose pair holds NULL for the name and leaves the decode error pending: raised as SystemError
    by an unspecialised call, silently kept by a specialised one (or dropped by a garbage
    collection), and any later touch of that name crashes the process. So each name is checked
    to be there, by its pointer, before the list is used, and a pending error is cleared."""
    try:
        raw = msg.headers()
        if not raw:
            return []
        pairs = list(raw.items()) if isinstance(raw, dict) else list(raw)
        for pair in pairs:
            if type(pair) is not tuple or ctypes.c_void_p.from_address(
                    id(pair) + _TUPLE_ITEMS_AT).value is None:
                ctypes.pythonapi.PyErr_Clear()
                return [(UNREADABLE_HEADERS, None)]
    except (SystemError, UnicodeDecodeError):  # the pending error, raised (itself or wrapped)
        # by the first call that checks for one
        return [(UNREADABLE_HEADERS, None)]
    return pairs


def readable_records(messages: Iterable[Message]) -> Iterator[Record]:
    """The records among consumed messages; consumer errors are logged (partition EOF silently)."""
    for msg in messages:
        err = msg.error()
        if err is None:
            yield Record.from_message(msg)
        elif err.code() != KafkaError._PARTITION_EOF:
            log.warning("consumer error: %s", err.str())


def topic_retention_s(settings: Settings, topics: Iterable[str],
                      timeout_s: float = 30.0) -> float | None:
    """The longest ``retention.ms`` of ``topics``, in seconds; None when one keeps records forever."""
    from confluent_kafka.admin import ConfigResource, ResourceType  # type: ignore[attr-defined]

    check_reachable(settings)
    admin = make_admin(settings)
    resources = [ConfigResource(ResourceType.TOPIC, name) for name in topics]
    longest = 0.0
    try:
        for future in admin.describe_configs(resources, request_timeout=timeout_s).values():
            entry = future.result().get("retention.ms")
            value = int(entry.value) if entry is not None and entry.value is not None else -1
            if value < 0:
                return None
            longest = max(longest, value / 1000)
    except KafkaException as exc:
        raise translate(exc, "cannot read the topics' retention.ms") from exc
    return longest


def _binding(acl: Acl) -> Any:
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    kinds = {Resource.TOPIC: ResourceType.TOPIC, Resource.GROUP: ResourceType.GROUP,
             Resource.CLUSTER: ResourceType.BROKER}
    patterns = {Pattern.LITERAL: ResourcePatternType.LITERAL,
                Pattern.PREFIXED: ResourcePatternType.PREFIXED}
    return AclBinding(kinds[acl.resource], acl.name, patterns[acl.pattern], acl.principal, "*",
                      AclOperation[acl.operation.name], AclPermissionType.ALLOW)


def _binding_key(binding: Any) -> tuple[str, ...]:
    return tuple(str(getattr(binding, field)) for field in (
        "restype", "name", "resource_pattern_type", "principal", "host", "operation",
        "permission_type"))


def apply_acls(settings: Settings, acls: Sequence[Acl],
               timeout_s: float = 30.0) -> list[tuple[Acl, str]]:
    """Create each ACL the broker does not hold yet; return ``(acl, "created" | "exists")``.

    The principal needs ALTER and DESCRIBE on the cluster.
    """
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    check_reachable(settings)
    admin = make_admin(settings)
    # None matches any name, principal and host (the stubs say str).
    everything = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY,  # type: ignore[arg-type]
                                  None, None, AclOperation.ANY, AclPermissionType.ALLOW)  # type: ignore[arg-type]
    try:
        held = {_binding_key(b) for b in admin.describe_acls(
            everything, request_timeout=timeout_s).result()}
    except KafkaException as exc:
        raise translate(exc, "cannot read the broker's ACLs (needs DESCRIBE on the cluster)") from exc
    bindings = {acl: _binding(acl) for acl in acls}
    missing = [b for b in bindings.values() if _binding_key(b) not in held]
    if missing:
        for binding, future in admin.create_acls(missing, request_timeout=timeout_s).items():
            try:
                future.result()
            except KafkaException as exc:
                raise translate(exc, f"cannot create ACL {binding} "
                                     "(needs ALTER on the cluster)") from exc
    created = {_binding_key(b) for b in missing}
    return [(acl, "created" if _binding_key(b) in created else "exists")
            for acl, b in bindings.items()]


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
