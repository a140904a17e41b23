"""Names of every Kafka topic postroom uses, derived from the topic prefix. Pure.

``Priority`` lives here, in the base, because its values are part of the topic names and both
roles use it: enqueue validates it, the relay picks the topic, the sender orders its reads.
"""

from __future__ import annotations

import enum
import functools
import re

# The topics one process names: its priorities, tiers, dead letters and results, a few prefixes.
TOPIC_NAMES_CACHED = 256


class Priority(enum.StrEnum):
    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"

    @classmethod
    def parse(cls, value: str) -> Priority:
        try:
            return cls(value.strip().lower())
        except ValueError:
            allowed = ", ".join(p.value for p in cls)
            raise ValueError(f"unknown priority {value!r} (expected one of: {allowed})") from None


def priority_topic(prefix: str, priority: Priority | str) -> str:
    """Topic that carries fresh email events of one priority."""
    return f"{prefix}email.{Priority(priority).value}"


def retry_topic(prefix: str, tier: int) -> str:
    """Topic of retry tier ``tier`` (1-based: tier 1 holds the first retry)."""
    if tier < 1:
        raise ValueError(f"retry tier starts at 1, got {tier}")
    return f"{prefix}email.retry.{tier}"


def dead_letter_topic(prefix: str) -> str:
    return f"{prefix}email.dead"


def results_topic(prefix: str) -> str:
    return f"{prefix}email.results"


@functools.lru_cache(maxsize=TOPIC_NAMES_CACHED)
def tier_of_retry_topic(prefix: str, topic: str) -> int | None:
    """Inverse of :func:`retry_topic`; None for a topic that is not a retry tier. Cached: the
    sender asks it of every record it reads."""
    head = f"{prefix}email.retry."
    if not topic.startswith(head):
        return None
    tail = topic[len(head):]
    # Only the spelling retry_topic() produces: not "0", "01", or a non-ASCII digit such as "²".
    return int(tail) if re.fullmatch(r"[1-9][0-9]*", tail) else None


@functools.lru_cache(maxsize=TOPIC_NAMES_CACHED)
def priority_of_topic(prefix: str, topic: str) -> Priority | None:
    """Inverse of :func:`priority_topic`; None for any other topic. Cached: the sender asks it of
    every partition it holds ten times a second."""
    for priority in Priority:
        if topic == priority_topic(prefix, priority):
            return priority
    return None


def sender_topics(prefix: str, retry_tiers: int) -> list[str]:
    """What the sender group reads: every priority topic and every retry tier."""
    return [
        *(priority_topic(prefix, p) for p in Priority),
        *(retry_topic(prefix, n) for n in range(1, retry_tiers + 1)),
    ]


def all_topics(prefix: str, retry_tiers: int) -> list[str]:
    """Every topic postroom needs, in a stable order."""
    return [*sender_topics(prefix, retry_tiers), dead_letter_topic(prefix), results_topic(prefix)]


def topic_schemas(prefix: str, retry_tiers: int) -> dict[str, str]:
    """Each topic postroom writes Avro to, and the contract schema (``schemas/<name>.avsc``) of
    its values: email_requested on the priority, retry and dead-letter topics, email_result on
    the results topic. The registry subject of a topic is ``<topic>-value``."""
    return {topic: ("email_result" if topic == results_topic(prefix) else "email_requested")
            for topic in all_topics(prefix, retry_tiers)}


def value_subject(topic: str) -> str:
    """The registry subject of a topic's values under the topic name strategy."""
    return f"{topic}-value"
