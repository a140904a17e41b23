"""`python -m bench.queue_triggers`: what the outbox's queue trigger costs an enqueue statement.

Four scratch schemas, migrated to head, then changed: the trigger of migration 0004 (dynamic SQL,
a separate wake-up trigger, the queue's foreign key), the same with static SQL and one trigger
function, that without the foreign key (the head revision's: 0011's, which since 0012 also
writes the queue row's attempt; 0004's trigger does not), and no trigger at all. Each
round times, per schema, 1,000 one-row INSERT_ROW statements (prepared, through psycopg alone,
nothing checked in Python) and five 10,000-row INSERT_ROWS statements, interleaved; prints the
medians of 5 rounds with their spread. Not part of `python -m bench`: it measures the schema, not
postroom.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any

import psycopg

from bench.workload import BODY
from postroom.devkit.scratch import scratch
from postroom.relay import pgdriver, sql
from postroom.relay.db import libpq_conninfo, make_engine, upgrade
from postroom.settings import Settings

ROUNDS, CALLS, CHUNK, CHUNKS = 5, 1_000, 10_000, 5
VARIANTS = ("0004: dynamic SQL, two triggers, foreign key",
            "static SQL, one trigger, foreign key", "head: static SQL, no foreign key",
            "no trigger")

# The statements enqueue's fast path sends (INSERT_ROW, INSERT_ROWS with its lists in binary).
ROW = pgdriver.driver_sql(sql.insert_row(None), frozenset())
ROWS = pgdriver.driver_sql(sql.insert_rows(None), frozenset({"keys", "recipients"}))
SHARED: dict[str, Any] = {"message_key": "m", "sender": None, "subject": "S", "body": BODY,
                          "attachments": [], "html": None, "inline": [], "priority": "normal",
                          "available_at": None}


def _as_0004(conn: psycopg.Connection[Any], schema: str) -> None:
    """Migration 0011 undone by hand: 0004's trigger, 0001's wake-up, the foreign key."""
    conn.execute(f"""CREATE OR REPLACE FUNCTION "{schema}".postroom_outbox_queue() RETURNS trigger
        LANGUAGE plpgsql AS $$ BEGIN
            EXECUTE format('INSERT INTO %I.outbox_queue (id, available_at) '
                           'SELECT id, available_at FROM new_rows WHERE published_at IS NULL',
                           TG_TABLE_SCHEMA);
            RETURN NULL; END $$""")
    conn.execute(f"""CREATE FUNCTION "{schema}".postroom_outbox_notify() RETURNS trigger
        LANGUAGE plpgsql AS $$ BEGIN
            PERFORM pg_notify('postroom_outbox', TG_TABLE_SCHEMA); RETURN NULL; END $$""")
    conn.execute(f"""CREATE TRIGGER outbox_notify AFTER INSERT ON "{schema}".outbox
        FOR EACH STATEMENT EXECUTE FUNCTION "{schema}".postroom_outbox_notify()""")


def _with_foreign_key(conn: psycopg.Connection[Any], schema: str) -> None:
    conn.execute(f"""ALTER TABLE "{schema}".outbox_queue ADD FOREIGN KEY (id)
                     REFERENCES "{schema}".outbox (id) ON DELETE CASCADE""")


def _without_trigger(conn: psycopg.Connection[Any], schema: str) -> None:
    conn.execute(f'DROP TRIGGER outbox_queue ON "{schema}".outbox')


def _one_rows(conninfo: str, schema: str, tag: str) -> float:
    """µs per one-row statement."""
    with psycopg.connect(conninfo, prepare_threshold=0) as conn:
        conn.execute(f'SET search_path = "{schema}"')
        with conn.cursor() as cursor:
            started = time.perf_counter()
            for n in range(CALLS):
                cursor.execute(ROW, {**SHARED, "idempotency_key": f"{tag}-{n}",
                                     "recipient": f"c{n}@example.com"})
                cursor.fetchone()
            return (time.perf_counter() - started) / CALLS * 1e6


def _chunks(conninfo: str, schema: str, tag: str) -> float:
    """Rows a second of CHUNKS statements of CHUNK rows each."""
    with psycopg.connect(conninfo) as conn:
        conn.execute(f'SET search_path = "{schema}"')
        started = time.perf_counter()
        for start in range(0, CHUNK * CHUNKS, CHUNK):
            numbers = range(start, start + CHUNK)
            conn.execute(ROWS, {**SHARED, "keys": [f"{tag}-{n}" for n in numbers],
                                "recipients": [f"r{n}@example.com" for n in numbers]}).fetchone()
        return CHUNK * CHUNKS / (time.perf_counter() - started)


def main() -> int:
    base = Settings.from_env()
    with scratch(base, "bench_triggers", kafka=False) as first:
        engine = make_engine(first)
        conninfo = libpq_conninfo(engine)
        engine.dispose()
        schemas = [f"{first.database_schema}_{n}" for n in range(len(VARIANTS))]
        for schema in schemas:
            migrated = make_engine(dataclasses.replace(first, database_schema=schema))
            upgrade(migrated, schema)
            migrated.dispose()
        try:
            with psycopg.connect(conninfo, autocommit=True) as conn:
                _as_0004(conn, schemas[0])
                _with_foreign_key(conn, schemas[0])
                _with_foreign_key(conn, schemas[1])
                _without_trigger(conn, schemas[3])
            one: dict[str, list[float]] = {v: [] for v in VARIANTS}
            many: dict[str, list[float]] = {v: [] for v in VARIANTS}
            for round_no in range(ROUNDS):
                print(f"round {round_no + 1} of {ROUNDS}", flush=True)
                for variant, schema in zip(VARIANTS, schemas, strict=True):
                    one[variant].append(_one_rows(conninfo, schema, f"p{round_no}"))
                    many[variant].append(_chunks(conninfo, schema, f"b{round_no}"))
        finally:
            with psycopg.connect(conninfo, autocommit=True) as conn:
                for schema in schemas:
                    conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    print(f"{'queue trigger':<48} {'one-row µs (min..max)':>24} {'10k-row rows/s (min..max)':>30}")
    for variant in VARIANTS:
        a, b = one[variant], many[variant]
        print(f"{variant:<48} {statistics.median(a):>8.0f} ({min(a):.0f}..{max(a):.0f})"
              f"{statistics.median(b):>16,.0f} ({min(b):,.0f}..{max(b):,.0f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
