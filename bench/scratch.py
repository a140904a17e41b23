"""A schema, a topic prefix and consumer groups of the benchmark's own on the local stack, removed after.

Also checks up front that the stack answers, so a benchmark fails with a hint instead of a traceback.
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import Iterator

import sqlalchemy as sa
from confluent_kafka import KafkaException

from bench.report import BenchError, progress
from postroom.errors import PostroomError
from postroom.kafka import check_reachable, create_topics, make_admin
from postroom.settings import Settings
from postroom.topics import all_topics
from relay.db import make_engine, upgrade

ADMIN_TIMEOUT_S = 15.0


def check_stack(settings: Settings) -> None:
    """Raise BenchError unless PostgreSQL and Kafka of the local stack answer."""
    hint = "start the stack with `scripts/services.sh up` and source .dev/env"
    if not settings.database_url or not settings.kafka_bootstrap_servers:
        raise BenchError(f"POSTROOM_DATABASE_URL / POSTROOM_KAFKA_BOOTSTRAP_SERVERS are not set: {hint}")
    engine = make_engine(settings)
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except sa.exc.OperationalError as exc:
        raise BenchError(f"PostgreSQL does not answer ({str(exc.orig).splitlines()[0]}): {hint}") from exc
    finally:
        engine.dispose()
    try:
        check_reachable(settings, timeout_s=10)
    except PostroomError as exc:
        raise BenchError(f"{exc}: {hint}") from exc


@contextlib.contextmanager
def scratch(base: Settings, tag: str) -> Iterator[Settings]:
    """Settings with a fresh schema (migrated to head), topics and group names; all removed on exit."""
    name = f"bench_{tag}_{uuid.uuid4().hex[:8]}"
    settings = dataclasses.replace(base, database_schema=name, topic_prefix=f"{name}.",
                                   sender_group=f"{name}.sender", recorder_group=f"{name}.recorder")
    progress(f"creating schema {name} and topics {name}.*")
    engine = make_engine(settings)
    try:
        upgrade(engine, name)
    finally:
        engine.dispose()
    try:
        create_topics(settings)
        yield settings
    finally:
        progress(f"removing schema {name}, its topics and consumer groups")
        _drop_schema(base, name)
        _delete_kafka_state(settings)


def _drop_schema(base: Settings, name: str) -> None:
    admin = make_engine(base)
    try:
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{name}" CASCADE'))
    finally:
        admin.dispose()


def _delete_kafka_state(settings: Settings) -> None:
    admin = make_admin(settings)  # held until the futures resolve: a collected client cancels them
    topics = all_topics(settings.topic_prefix, len(settings.retry_delays_s))
    futures = {
        **admin.delete_topics(topics, operation_timeout=ADMIN_TIMEOUT_S),
        **admin.delete_consumer_groups([settings.sender_group, settings.recorder_group],
                                       request_timeout=ADMIN_TIMEOUT_S),
    }
    for name, future in futures.items():
        try:
            future.result()
        except KafkaException as exc:
            # A group that never formed (the relay benchmark has none) cannot be deleted: fine.
            if "GROUP_ID_NOT_FOUND" not in str(exc) and "does not exist" not in str(exc):
                progress(f"could not delete {name}: {exc}")
