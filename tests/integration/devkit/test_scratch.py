"""A scratch leaves nothing behind on the stack: its schema, its topics (whatever tiers they were
created with) and both consumer groups are gone after it."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from confluent_kafka import Consumer, TopicPartition

from postroom.devkit.scratch import scratch, wait_for_topics
from postroom.devkit.wait import wait_until
from postroom.kafka import create_topics, make_admin
from postroom.relay.db import make_engine, upgrade
from postroom.settings import Settings
from postroom.topics import all_topics, priority_topic

pytestmark = pytest.mark.integration


def schemas(settings: Settings) -> set[str]:
    engine = make_engine(settings)
    try:
        with engine.connect() as conn:
            return set(conn.execute(sa.text("SELECT nspname FROM pg_namespace")).scalars())
    finally:
        engine.dispose()


def test_a_scratch_removes_its_schema_topics_and_groups(stack_settings: Settings) -> None:
    messages: list[str] = []
    with scratch(stack_settings, "devkit", say=messages.append) as settings:
        assert settings.database_schema and settings.database_schema.startswith("devkit_")
        assert settings.topic_prefix == settings.database_schema + "."
        engine = make_engine(settings)
        upgrade(engine, settings.database_schema)
        engine.dispose()
        # More tiers than the settings have; waited for, so that the broker's metadata, which
        # the deletion lists the prefix's topics from, has them all (else a topic listed late
        # outlives the scratch, and the check below can pass before it shows).
        wait_for_topics(settings, list(create_topics(settings, all_topics(settings.topic_prefix, 6))))
        topic = priority_topic(settings.topic_prefix, "high")
        for group in (settings.sender_group, settings.recorder_group):
            member = Consumer({**settings.kafka_client_config(), "group.id": group})
            try:
                member.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
            finally:
                member.close()
        admin = make_admin(settings)
        groups = {g.group_id for g in admin.list_consumer_groups().result().valid}
        assert {settings.sender_group, settings.recorder_group} <= groups
        assert settings.database_schema in schemas(stack_settings)

    assert settings.database_schema not in schemas(stack_settings)
    # A deletion the controller accepted reaches the broker's metadata a moment later.
    wait_until(lambda: not [t for t in admin.list_topics(timeout=10).topics
                            if t.startswith(settings.topic_prefix)], 30, "the topics to be gone")
    groups = {g.group_id for g in admin.list_consumer_groups().result().valid}
    assert not {settings.sender_group, settings.recorder_group} & groups
    assert messages == [f"creating topics {settings.topic_prefix}*",
                        f"removing schema {settings.database_schema}",
                        f"removing topics {settings.topic_prefix}* and groups "
                        f"{settings.sender_group}, {settings.recorder_group}"]
