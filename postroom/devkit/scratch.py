"""A database schema, a topic prefix and consumer groups of one run's own on a shared local stack,
removed afterwards: each test, each benchmark and each demo run gets one."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import uuid
from collections.abc import Callable, Iterator

import sqlalchemy as sa

from postroom.devkit.wait import wait_until
from postroom.kafka import (
    KafkaError,
    KafkaException,
    OffsetSpec,
    TopicPartition,
    create_topics,
    make_admin,
)
from postroom.settings import ENV_PREFIX, Settings

ADMIN_TIMEOUT_S = 15.0
TOPIC_METADATA_TIMEOUT_S = 60.0
# Deleting what a run never created is no problem: the run may not have come that far.
_ABSENT = {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.GROUP_ID_NOT_FOUND}

log = logging.getLogger(__name__)


def unique_name(tag: str) -> str:
    """``tag``, an underscore and ten random hex digits: a schema name and a topic prefix."""
    return f"{tag}_{uuid.uuid4().hex[:10]}"


def scratch_settings(base: Settings, tag: str) -> Settings:
    """``base`` with a schema, a topic prefix and sender and recorder groups no one else uses."""
    name = unique_name(tag)
    return dataclasses.replace(base, database_schema=name, topic_prefix=f"{name}.",
                               sender_group=f"{name}.sender", recorder_group=f"{name}.recorder")


def scratch_env(settings: Settings) -> dict[str, str]:
    """The variables that give a `postroom` process the schema, prefix and groups of ``settings``."""
    return {ENV_PREFIX + "DATABASE_SCHEMA": settings.database_schema or "",
            ENV_PREFIX + "TOPIC_PREFIX": settings.topic_prefix,
            ENV_PREFIX + "SENDER_GROUP": settings.sender_group,
            ENV_PREFIX + "RECORDER_GROUP": settings.recorder_group}


@contextlib.contextmanager
def scratch(base: Settings, tag: str, *, database: bool = True, kafka: bool = True,
            create: bool = True, say: Callable[[str], None] = log.info) -> Iterator[Settings]:
    """Settings of scratch_settings(); on exit its schema is dropped (``database``) and its
    prefix's topics and its groups deleted (``kafka``).

    The schema is the caller's to create (`postroom db upgrade` or relay.db.upgrade); the topics
    are created on entry when ``kafka`` and ``create``. ``say`` reports each step.
    """
    settings = scratch_settings(base, tag)
    try:
        if kafka and create:
            say(f"creating topics {settings.topic_prefix}*")
            wait_for_topics(settings, list(create_topics(settings)))
        yield settings
    finally:
        if database:
            say(f"removing schema {settings.database_schema}")
            drop_schema(base, settings.database_schema or "")
        if kafka:
            say(f"removing topics {settings.topic_prefix}* and groups {settings.sender_group}, "
                f"{settings.recorder_group}")
            for problem in delete_kafka_state(settings):
                say(problem)


def wait_for_topics(settings: Settings, names: list[str],
                    timeout_s: float = TOPIC_METADATA_TIMEOUT_S) -> None:
    """Return once the broker's metadata has each of ``names`` with a leader for every partition:
    the controller accepts a creation before the broker serves the topic, and a DescribeConfigs
    or a produce meanwhile is refused with UNKNOWN_TOPIC_OR_PART, and a leader named in the
    metadata refuses with NOT_LEADER_FOR_PARTITION until it has taken the partition over."""
    admin = make_admin(settings)

    def ready() -> bool:
        # All topics, never the named ones: a metadata request naming a topic may create it.
        topics = admin.list_topics(timeout=ADMIN_TIMEOUT_S).topics
        if not all(name in topics and topics[name].error is None and topics[name].partitions
                   and all(p.leader >= 0 for p in topics[name].partitions.values())
                   for name in names):
            return False
        # A leader in the metadata may not serve its partition yet (NOT_LEADER_FOR_PARTITION):
        # each partition's end offset is asked of its leader, in one request per broker.
        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        futures = admin.list_offsets({TopicPartition(name, number): latest for name in names
                                      for number in topics[name].partitions},
                                     request_timeout=ADMIN_TIMEOUT_S)
        try:
            for future in futures.values():
                future.result()
        except KafkaException:
            return False
        return True

    wait_until(ready, timeout_s, f"the broker to serve {len(names)} new topics")


def drop_schema(base: Settings, schema: str) -> None:
    """Drop ``schema`` and everything in it, if it exists."""
    engine = sa.create_engine(base.require("database_url"), poolclass=sa.pool.NullPool,
                              connect_args={"connect_timeout": 10})
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
    finally:
        engine.dispose()


def delete_kafka_state(settings: Settings) -> list[str]:
    """Delete every topic of the prefix (whatever tiers it was created with) and both groups;
    return what could not be deleted, one line each."""
    admin = make_admin(settings)  # held until the futures resolve: a collected client cancels them
    try:
        topics = [name for name in admin.list_topics(timeout=ADMIN_TIMEOUT_S).topics
                  if name.startswith(settings.topic_prefix)]
    except KafkaException as exc:
        return [f"could not list the topics of {settings.topic_prefix}*: {exc}"]
    futures = {
        **(admin.delete_topics(topics, operation_timeout=ADMIN_TIMEOUT_S) if topics else {}),
        **admin.delete_consumer_groups([settings.sender_group, settings.recorder_group],
                                       request_timeout=ADMIN_TIMEOUT_S),
    }
    problems = []
    for name, future in futures.items():
        try:
            future.result()
        except KafkaException as exc:
            error = exc.args[0]
            if not (isinstance(error, KafkaError) and error.code() in _ABSENT):
                problems.append(f"could not delete {name}: {exc}")
    return problems
