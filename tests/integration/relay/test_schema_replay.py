"""The tests' schemas (tests/support/schema_replay.py: one real upgrade's statements sent again) are
the schemas `postroom db upgrade` makes: the same tables, columns, defaults, constraints, indexes,
triggers, functions, storage options and revision."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from postroom.devkit.scratch import drop_schema, scratch_settings
from postroom.relay.db import check_schema, make_engine, upgrade
from postroom.settings import Settings
from support.schema_replay import Recorded, replay

pytestmark = pytest.mark.integration

CATALOG = {
    "columns": """
        SELECT table_name, column_name, ordinal_position, data_type, udt_name, is_nullable,
               column_default, character_maximum_length, is_identity, identity_generation
        FROM information_schema.columns WHERE table_schema = :schema""",
    "constraints": """
        SELECT t.relname, c.conname, pg_get_constraintdef(c.oid)
        FROM pg_constraint c JOIN pg_class t ON t.oid = c.conrelid
        WHERE t.relnamespace = to_regnamespace(:schema)""",
    "indexes": "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = :schema",
    "triggers": """
        SELECT c.relname, t.tgname, pg_get_triggerdef(t.oid)
        FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
        WHERE c.relnamespace = to_regnamespace(:schema) AND NOT t.tgisinternal""",
    "functions": """
        SELECT proname, pg_get_function_identity_arguments(oid), prosrc
        FROM pg_proc WHERE pronamespace = to_regnamespace(:schema)""",
    "relations": """
        SELECT relname, relkind, reloptions::text FROM pg_class
        WHERE relnamespace = to_regnamespace(:schema)""",
}


def catalog(settings: Settings) -> dict[str, list[tuple[object, ...]]]:
    """Each CATALOG query's rows for the schema, its name written as <schema>, sorted; and the
    revision the schema is at."""
    schema = settings.database_schema or ""
    engine = make_engine(settings, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            found = {name: sorted(tuple(str(v).replace(schema, "<schema>") if v is not None
                                        else None for v in row)
                                  for row in conn.execute(sa.text(query), {"schema": schema}))
                     for name, query in CATALOG.items()}
            found["revision"] = [tuple(conn.execute(sa.text(
                "SELECT version_num FROM alembic_version")).scalars())]
        check_schema(engine)  # what every role asks before it starts
    finally:
        engine.dispose()
    return found


@pytest.fixture
def two_schemas(stack_settings: Settings) -> Iterator[tuple[Settings, Settings]]:
    upgraded, replayed = (scratch_settings(stack_settings, tag) for tag in ("up", "re"))
    try:
        yield upgraded, replayed
    finally:
        for settings in (upgraded, replayed):
            drop_schema(stack_settings, settings.database_schema or "")


def test_a_replayed_schema_is_the_upgraded_one(
        two_schemas: tuple[Settings, Settings], recorded_upgrade: Recorded) -> None:
    upgraded, replayed = two_schemas
    engine = make_engine(upgraded, poolclass=sa.pool.NullPool)
    try:
        upgrade(engine, upgraded.database_schema)
    finally:
        engine.dispose()
    replay(recorded_upgrade, replayed)
    made, copied = catalog(upgraded), catalog(replayed)
    assert all(made[name] for name in CATALOG), made  # the queries see what they compare
    assert copied == made
