"""Waiting at start for a broker to answer, and saying in one line what each address tried."""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from postroom.errors import KafkaClientError
from postroom.kafka import config
from postroom.kafka.config import BROKER_WAIT_S
from postroom.kafka.errors import creation_error, explain_refusal
from postroom.settings import Settings

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
            config._client_log.log(level, msg, *args)


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
    try:
        admin = AdminClient(probe)
    except KafkaException as exc:
        raise creation_error(exc, settings, "admin", "cannot create Kafka admin client") from exc
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
