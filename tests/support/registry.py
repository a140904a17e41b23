"""The local stack's Schema Registry for tests: its URL, and removing a test's subjects."""

from __future__ import annotations

import os

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient

from postroom.settings import Settings
from postroom.topics import topic_schemas, value_subject


def registry_url() -> str:
    """The registry `scripts/services.sh up` started; fails (never skips) when it is not set."""
    url = os.environ.get("POSTROOM_DEV_REGISTRY_URL")
    if not url:
        pytest.fail("POSTROOM_DEV_REGISTRY_URL is not set: run the tests with `make test` "
                    "(scripts/services.sh starts the registry and writes it into .dev/env)")
    return url


def delete_subjects(url: str, settings: Settings) -> None:
    """Delete the subjects of every topic of ``settings``' prefix that exist."""
    with SchemaRegistryClient({"url": url}) as client:
        existing = set(client.get_subjects())
        for topic in topic_schemas(settings.topic_prefix, len(settings.retry_delays_s)):
            if value_subject(topic) in existing:
                client.delete_subject(value_subject(topic))
