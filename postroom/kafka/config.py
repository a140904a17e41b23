"""The librdkafka configuration of every client postroom makes: its settings, its error and log
handling (librdkafka's repeating lines summarised), producer and consumer tuning."""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import KafkaError

from postroom.settings import PRODUCER_MESSAGE_TIMEOUT_MS, Settings

log = logging.getLogger(__name__)

CONSUMER_FETCH_WAIT_MS = 50
# librdkafka's 45 s default kept a killed sender's partitions, and the emails in them, idle for
# 45 s. Heartbeats come from librdkafka's own thread, not the event loop, so only a dead, stopped
# or cut-off process misses them: 10 s (five heartbeats) rides out a long GC pause and moves a
# dead member's partitions within about 10-15 s. A broker SIGKILLed on three brokers pauses
# deliveries for its fencing (9 s) with it; when that broker coordinated the group, the session
# may run out before the new coordinator answers and the group rejoins (once, 19.2 s), which
# KIP-848's protocol avoids (a group joins with it where the platform allows a session this short:
# group_protocol.py) and 12-15 s sessions narrow at the takeover's cost (docs/operations.md,
# "Consumer group protocol and session timeouts"). The broker's group.min.session.timeout.ms is 6 s
# by default.
CONSUMER_SESSION_TIMEOUT_MS = 10_000
CONSUMER_HEARTBEAT_INTERVAL_MS = 2_000
# The classic protocol's session timing, which librdkafka refuses with group.protocol=consumer.
CLASSIC_TIMING = {"session.timeout.ms": CONSUMER_SESSION_TIMEOUT_MS,
                  "heartbeat.interval.ms": CONSUMER_HEARTBEAT_INTERVAL_MS}
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


def member_client_id(group_id: str) -> str:
    """``postroom-<group>-<host>-<pid>``: which process a group member is, where the broker
    shows only an address (alike for every sender on one host)."""
    host = re.sub(r"[^A-Za-z0-9.-]", "-", socket.gethostname())[:63] or "host"
    return f"postroom-{group_id}-{host}-{os.getpid()}"


def client_config(settings: Settings) -> dict[str, Any]:
    """The settings' librdkafka config with postroom's error and log handling; every client
    postroom makes starts from it."""
    return {**settings.kafka_client_config(), "error_cb": _log_error, "logger": _client_log}


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


_PLAIN_NUMBER = re.compile(r"[0-9]{1,18}")


def plain_number(value: object) -> int | None:
    """A config value the broker or the settings give, as a whole number when it is a plain
    ASCII one; None otherwise (not ``str.isdigit()``, which takes '²' that ``int()`` refuses)."""
    text = str(value) if value is not None else ""
    return int(text) if _PLAIN_NUMBER.fullmatch(text) else None


def named_protocol(*configs: Mapping[str, Any]) -> str | None:
    """``group.protocol`` as the settings or the caller give it (the last config wins), if any."""
    named = None
    for config in configs:
        if "group.protocol" in config:
            named = str(config["group.protocol"]).strip().lower()
    return named


def consumer_config(settings: Settings, group_id: str, **overrides: Any) -> dict[str, Any]:
    """A consumer that commits only what the caller stores as done, rebalancing cooperatively
    unless the caller overrides the assignment (the sender divides each topic: range).

    POSTROOM_KAFKA_CONSUMER_CONFIG may change the tuning (session.timeout.ms,
    auto.commit.interval.ms, fetch sizes, ...) but not how offsets are stored and committed.
    With its ``group.protocol=consumer`` (KIP-848) the broker times the session and assigns:
    postroom's session and heartbeat defaults are left out, and its assignment strategy is
    asked of the broker (``group.remote.assignor``), as librdkafka refuses them otherwise.
    """
    kip848 = named_protocol(settings.kafka_consumer_config, overrides) == "consumer"
    timing = {} if kip848 else CLASSIC_TIMING
    config: dict[str, Any] = {
        # A paused retry tier resumes with a fresh fetch; the broker's default wait (500 ms)
        # made retries fire late. POSTROOM_KAFKA_CONSUMER_CONFIG may change it.
        "fetch.wait.max.ms": CONSUMER_FETCH_WAIT_MS,
        **timing,
        # Names the member in `postroom lag` and the broker's tools, this host and process
        # apart from the group's other members; the settings may rename it.
        "client.id": member_client_id(group_id),
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


def reader_config(settings: Settings, group_id: str, **overrides: Any) -> dict[str, Any]:
    """A consumer that only reads (assigned partitions, no offsets stored or committed): the
    settings' consumer tuning with postroom's error and log handling; overrides win."""
    return {**client_config(settings), **settings.kafka_consumer_config, "group.id": group_id,
            "enable.auto.commit": False, "enable.partition.eof": False, **overrides}
