"""A schema, a topic prefix and consumer groups of the benchmark's own on the local stack, removed after
(postroom.devkit.scratch, migrated).

Also checks up front that the stack answers, so a benchmark fails with a hint instead of a traceback.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import sqlalchemy as sa

from bench.report import BenchError, progress
from postroom.devkit.scratch import scratch as devkit_scratch
from postroom.errors import PostroomError, first_line
from postroom.kafka import check_reachable
from postroom.relay.db import make_engine, upgrade
from postroom.settings import Settings


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
        raise BenchError(f"PostgreSQL does not answer ({first_line(exc)}): {hint}") from exc
    finally:
        engine.dispose()
    try:
        check_reachable(settings, timeout_s=10)
    except PostroomError as exc:
        raise BenchError(f"{exc}: {hint}") from exc


@contextlib.contextmanager
def scratch(base: Settings, tag: str) -> Iterator[Settings]:
    """postroom.devkit.scratch (schema, topics and groups of the benchmark's own, removed on exit),
    its schema migrated to head; each step reported on stderr."""
    with devkit_scratch(base, f"bench_{tag}", say=progress) as settings:
        progress(f"creating schema {settings.database_schema}")
        engine = make_engine(settings)
        try:
            upgrade(engine, settings.database_schema)
        finally:
            engine.dispose()
        yield settings
