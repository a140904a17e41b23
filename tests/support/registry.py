"""The local stack's Schema Registry for tests: its URL, and removing a test's subjects."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient

from postroom.settings import REGISTRY_TIMEOUT_S, Settings
from postroom.topics import topic_schemas, value_subject
from support.stack import dev_dir


def registry_url() -> str:
    """The registry `scripts/services.sh up` started; fails (never skips) when it is not set."""
    url = os.environ.get("POSTROOM_DEV_REGISTRY_URL")
    if not url:
        pytest.fail("POSTROOM_DEV_REGISTRY_URL is not set: run the tests with `make test` "
                    "(scripts/services.sh starts the registry and writes it into .dev/env)")
    return url


def client(url: str) -> SchemaRegistryClient:
    """confluent-kafka's own client, as a foreign consumer would make it, with a request timeout:
    its default waits for ever, and a registry that stalls should fail the test, not hang it."""
    return SchemaRegistryClient({"url": url, "timeout": REGISTRY_TIMEOUT_S})


def delete_subjects(url: str, settings: Settings) -> None:
    """Delete the subjects of every topic of ``settings``' prefix that exist."""
    with client(url) as registry:
        existing = set(registry.get_subjects())
        for topic in topic_schemas(settings.topic_prefix, len(settings.retry_delays_s)):
            if value_subject(topic) in existing:
                registry.delete_subject(value_subject(topic))


def diagnosis() -> str:
    """What the local registry process is doing, for the report of a test that failed on it:
    alive or not, its CPU time and memory (busy in GC, or idle and stuck?), its last log lines."""
    registry_dir = dev_dir() / "registry"
    lines = []
    try:
        pid = int((registry_dir / "registry.pid").read_text())
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        rss = Path(f"/proc/{pid}/status").read_text().split("VmRSS:")[1].split("\n")[0].strip()
        lines.append(f"pid {pid}, state {stat[0]}, CPU {(int(stat[11]) + int(stat[12])) / ticks:.1f} s"
                     f" user+system, {int(stat[17])} threads, RSS {rss}")
    except (OSError, ValueError, IndexError) as exc:
        lines.append(f"no registry process to look at: {exc}")
    try:
        tail = (registry_dir / "registry.out").read_text(errors="replace").splitlines()[-25:]
    except OSError as exc:
        tail = [f"no registry log: {exc}"]
    return "\n".join([*lines, "last lines of its log:", *tail])
