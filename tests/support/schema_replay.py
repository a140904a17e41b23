"""A migrated schema per test without Alembic each time: the statements one real
``postroom.relay.db.upgrade`` sent to PostgreSQL, recorded once per pytest worker, are sent again,
in one transaction, for each new schema.

The migrations run in one transaction on one connection and decide nothing from data an empty
schema lacks, so the same statements, with the recorded schema's name replaced by the new one,
make the same schema (tests/integration/relay/test_schema_replay.py compares the catalogs). A
real upgrade cost about 0.1 CPU-s in the test's process (Alembic loading its scripts) on top of
PostgreSQL's, for each of some 470 tests.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import sqlalchemy as sa

from postroom.devkit.scratch import drop_schema, scratch_settings
from postroom.relay.db import make_engine, upgrade
from postroom.settings import Settings


@dataclasses.dataclass(frozen=True)
class Recorded:
    """What one upgrade of ``schema`` sent: (statement, parameters, executemany) in order."""

    schema: str
    statements: tuple[tuple[str, Any, bool], ...]


def record(base: Settings) -> Recorded:
    """Upgrade a schema of its own from nothing, keeping every statement sent; drop it."""
    settings = scratch_settings(base, "tpl")
    schema = settings.database_schema or ""
    engine = make_engine(settings, poolclass=sa.pool.NullPool)
    sent: list[tuple[str, Any, bool]] = []

    def keep(_conn: object, _cursor: object, statement: str, parameters: Any,
             _context: object, executemany: bool) -> None:
        sent.append((statement, parameters, executemany))

    sa.event.listen(engine, "before_cursor_execute", keep)
    try:
        upgrade(engine, schema)
    finally:
        engine.dispose()
        drop_schema(base, schema)
    return Recorded(schema, tuple(sent))


def replay(recorded: Recorded, settings: Settings) -> None:
    """Make ``settings``' schema as the recorded upgrade made its own."""
    schema = settings.database_schema or ""
    engine = make_engine(settings, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            for statement, parameters, _many in recorded.statements:
                conn.exec_driver_sql(statement.replace(recorded.schema, schema),
                                     _renamed(parameters, recorded.schema, schema))
    finally:
        engine.dispose()


def _renamed(value: Any, old: str, new: str) -> Any:
    if isinstance(value, str):
        return value.replace(old, new)
    if isinstance(value, dict):
        return {key: _renamed(item, old, new) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_renamed(item, old, new) for item in value)
    return value
