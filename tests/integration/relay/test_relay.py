"""The relay against the real database and broker: routing, keys, headers, ordering hazards."""

from __future__ import annotations

import dataclasses
import datetime as dt
import io
import json
import logging
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fastavro
import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from postroom import enqueue
from postroom.devkit.processes import PostroomProcesses
from postroom.devkit.scratch import scratch_env
from postroom.devkit.wait import wait_until
from postroom.errors import KafkaClientError, KafkaFatalError
from postroom.headers import ROW_ID_HEADER
from postroom.kafka import KafkaError, fatal, make_producer
from postroom.relay import sql
from postroom.relay.connections import Connections, Listener
from postroom.relay.db import make_engine
from postroom.relay.publisher import Relay
from postroom.schemas.codec import EmailRequested, load_schema
from postroom.schemas.decoding import decode
from postroom.schemas.framing import SCHEMA_HEADER
from postroom.settings import Settings
from postroom.topics import Priority, priority_topic
from support.commands import start_postroom
from support.foreign import force_fatal
from support.fuzz import examples
from support.metrics import counter
from support.rounds import publish_round

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
ALL_PRIORITIES = [p.value for p in Priority]


def topics(settings: Settings) -> list[str]:
    return [priority_topic(settings.topic_prefix, p) for p in Priority]


def unpublished(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text(
            "SELECT count(*) FROM outbox WHERE published_at IS NULL")).scalar_one())


def test_rows_go_to_their_priority_topic_keyed_with_avro_and_headers(
        settings: Settings, engine: sa.Engine, consume: Callable[..., Any]) -> None:
    with engine.begin() as conn:
        for priority in ALL_PRIORITIES:
            enqueue(conn, key=f"m-{priority}", recipients=["a@example.com", "b@example.com"],
                    subject=f"{priority} mail", body="hello", priority=priority)
    assert publish_round(Relay(settings, engine)) == 6

    records = consume(settings, topics(settings), expected=6)
    assert len(records) == 6
    with engine.connect() as conn:
        rows = {r.idempotency_key: r for r in conn.execute(sa.text(
            "SELECT id, idempotency_key, priority, status, published_at FROM outbox"))}
    # Decode with the .avsc file itself, not through our codec, to check the contract.
    with (ROOT / "schemas" / "email_requested.avsc").open() as f:
        contract = fastavro.parse_schema(json.load(f))
    for record in records:
        key = record.key.decode()
        row = rows[key]
        assert record.topic == priority_topic(settings.topic_prefix, row.priority)
        headers = dict(record.headers)
        assert headers[ROW_ID_HEADER] == str(row.id).encode()
        assert headers[SCHEMA_HEADER] == load_schema("email_requested").fingerprint.encode()
        plain = fastavro.schemaless_reader(io.BytesIO(record.value), contract)
        assert plain["idempotency_key"] == key
        assert plain["outbox_id"] == row.id
        assert plain["priority"] == row.priority
        assert plain["attempt"] == 1
        event = decode(EmailRequested, record.value, record.headers)
        assert event.subject == f"{row.priority} mail"
        assert row.status == "published"
        assert row.published_at is not None


@pytest.mark.parametrize("created_at", [
    "2026-09-30 23:59:59.999999+00", "2026-10-01 00:00:00+00", "2026-10-01 00:00:00.000999+02",
    "1969-12-31 23:59:59.999500+00", "2106-02-07 06:28:16.001+00",
])
def test_the_claim_writes_created_at_as_the_codec_writes_the_timestamp(
        settings: Settings, engine: sa.Engine, consume: Callable[..., Any], created_at: str) -> None:
    # The claim hands created_at over as milliseconds computed by the database; the event must
    # carry what encoding the row's datetime would (rounded down, before the epoch too).
    with engine.begin() as conn:
        enqueue(conn, key="m", recipients=["a@example.com"], subject="s", body="b")
        conn.execute(sa.text("UPDATE outbox SET created_at = CAST(:t AS timestamptz)"),
                     {"t": created_at})
        stored = conn.execute(sa.text("SELECT created_at FROM outbox")).scalar_one()
    assert publish_round(Relay(settings, engine)) == 1
    [record] = consume(settings, topics(settings), expected=1)
    event = decode(EmailRequested, record.value, record.headers)
    floored = stored - dt.timedelta(microseconds=stored.microsecond % 1000)
    assert event.created_at == floored


def test_a_row_committed_after_a_higher_id_is_still_published(
        settings: Settings, engine: sa.Engine, consume: Callable[..., Any]) -> None:
    relay = Relay(settings, engine)
    slow = engine.connect()
    slow_tx = slow.begin()
    enqueue(slow, key="slow", recipients=["slow@example.com"], subject="S", body="b")
    slow_id = slow.execute(sa.text("SELECT max(id) FROM outbox")).scalar_one()
    with engine.begin() as conn:
        enqueue(conn, key="fast", recipients=["fast@example.com"], subject="S", body="b")
        fast_id = conn.execute(sa.text("SELECT max(id) FROM outbox")).scalar_one()
    assert slow_id < fast_id
    assert publish_round(relay) == 1  # only the committed, higher id
    slow_tx.commit()
    slow.close()
    assert publish_round(relay) == 1  # the lower id, committed late, is not skipped
    keys = sorted(r.key for r in consume(settings, topics(settings), expected=2))
    assert keys == [b"fast|fast@example.com", b"slow|slow@example.com"]
    assert unpublished(engine) == 0


def test_a_rolled_back_insert_publishes_nothing(
        settings: Settings, engine: sa.Engine) -> None:
    with engine.connect() as conn:
        tx = conn.begin()
        enqueue(conn, key="k", recipients=["a@example.com"], subject="S", body="b")
        tx.rollback()
    assert publish_round(Relay(settings, engine)) == 0


def test_rows_due_later_wait_for_their_time(settings: Settings, engine: sa.Engine) -> None:
    import datetime as dt

    soon = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=2)
    with engine.begin() as conn:
        enqueue(conn, key="k", recipients=["a@example.com"], subject="S", body="b",
                send_after=soon)
    relay = Relay(settings, engine)
    assert publish_round(relay) == 0
    time.sleep(2.2)
    assert publish_round(relay) == 1


def test_the_claim_reads_the_queue_not_the_history(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text("""
            INSERT INTO outbox (idempotency_key, message_key, recipient, subject, body, priority,
                                status, published_at)
            SELECT 'old|' || g, 'old', 'a@example.com', 'S', 'b', 'normal', 'sent', now()
            FROM generate_series(1, 20000) AS g"""))
        enqueue(conn, key="new", recipients=["a@example.com"], subject="S", body="b")
        conn.execute(sa.text("ANALYZE outbox"))
        conn.execute(sa.text("ANALYZE outbox_queue"))
        # Rows inserted as published never enter the queue.
        assert conn.execute(sa.text("SELECT count(*) FROM outbox_queue")).scalar_one() == 1
        sql.pin_claim_plan(conn)
        plan = "\n".join(conn.execute(sa.text(
            "EXPLAIN " + sql.CLAIM_DUE.text),
            {"limit": 1000, "ttl_s": 60, "owner": 12345}).scalars())
    assert "Index Scan using outbox_queue_due" in plan, plan
    assert "Seq Scan" not in plan, plan


ROWS_FETCHED = sa.text("""
    SELECT sum(idx_tup_fetch + seq_tup_read) FROM pg_stat_xact_user_tables
    WHERE relid IN ('outbox'::regclass, 'outbox_queue'::regclass)""")


def _rows_read_by_claim(engine: sa.Engine, claim: Callable[[sa.Connection], object]) -> int:
    """Rows a claim reads (outbox and its queue), by PostgreSQL's count of row fetches.

    A difference: the counts may still hold fetches of earlier transactions of the session.
    """
    with engine.connect() as conn, conn.begin() as tx:
        before = conn.execute(ROWS_FETCHED).scalar_one()
        claim(conn)
        read = conn.execute(ROWS_FETCHED).scalar_one() - before
        tx.rollback()
    return int(read)


def test_a_claim_reads_one_batch_of_a_backlog_the_statistics_do_not_know(
        engine: sa.Engine) -> None:
    # The tables were analyzed while the queue was all but empty, as it is between runs; then a
    # report job queues a large run, and autovacuum (kept off here) has not analyzed it yet.
    backlog, batch = 5000, 100
    with engine.begin() as conn:
        for table in ("outbox", "outbox_queue"):
            conn.execute(sa.text(f"ALTER TABLE {table} SET (autovacuum_enabled = false)"))
        enqueue(conn, key="early", recipients=["early@example.com"], subject="S", body="b")
    with engine.begin() as conn:
        conn.execute(sa.text("ANALYZE outbox, outbox_queue"))
        enqueue(conn, key="run", recipients=[f"r{n}@example.com" for n in range(backlog)],
                subject="S", body="b")

    read = _rows_read_by_claim(engine, lambda conn: sql.claim_due(conn, batch, 60))
    # The queue's index walk, then each claimed row by primary key in the queue and the outbox;
    # never the backlog.
    assert batch <= read <= 4 * batch, read
    # Proof that the statement alone, planned on those statistics, would read it all.
    unpinned = _rows_read_by_claim(engine, lambda conn: conn.execute(
        sql.CLAIM_DUE, {"limit": batch, "ttl_s": 60, "owner": None}).all())
    assert unpinned >= backlog, unpinned


UPDATES = sa.text("""
    SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables
    WHERE relid = 'outbox'::regclass""")


def test_marking_published_rewrites_outbox_rows_in_place(engine: sa.Engine) -> None:
    # No index may cover published_at or status: else each mark (and each recorded result)
    # writes a new entry into every index of the outbox instead of a HOT update.
    with engine.begin() as conn:
        enqueue(conn, key="k", recipients=[f"r{n}@example.com" for n in range(20)],
                subject="S", body="b")
    with engine.connect() as conn:
        with conn.begin():
            ids = [row.outbox_id for row in sql.claim_due(conn, 100, 60)]
        with conn.begin():
            before = conn.execute(UPDATES).one()
            conn.execute(sql.MARK_PUBLISHED, {"ids": ids, "owner": None})
            after = conn.execute(UPDATES).one()
    updated, in_place = after[0] - before[0], after[1] - before[1]
    assert (updated, in_place) == (20, 20)
    assert unpublished(engine) == 0


EXPIRE_CLAIMS = sa.text("UPDATE outbox_queue SET claimed_until = now() - interval '1 second'")


def _claimed_twice(engine: sa.Engine, attempts_meanwhile: int) -> tuple[int, int]:
    """The attempt of the queued row's claim, and of its claim again once the first ran out,
    its first event having gone on meanwhile until the row was recorded dead after
    ``attempts_meanwhile`` attempts."""
    with engine.begin() as conn:
        [first] = sql.claim_due(conn, 10, 60)
        conn.execute(sa.text("UPDATE outbox SET status = 'dead', attempts = :n"),
                     {"n": attempts_meanwhile})
        conn.execute(EXPIRE_CLAIMS)
    with engine.begin() as conn:
        [again] = sql.claim_due(conn, 10, 60)
        conn.execute(sql.MARK_PUBLISHED, {"ids": [again.outbox_id], "owner": None})
    return first.attempt, again.attempt


def test_a_row_claimed_again_goes_out_as_the_attempt_it_was_queued_as(engine: sa.Engine) -> None:
    # A relay killed between Kafka's acknowledgement and its mark leaves its rows queued, and once
    # the claim runs out another relay publishes them again. The first event may have gone its
    # whole way meanwhile (recorded dead after 5 attempts): the second must be the same attempt,
    # which the senders' ledger sends once, not attempt 6 and a second chain of retries.
    with engine.begin() as conn:
        enqueue(conn, key="k", recipients=["a@example.com"], subject="S", body="b")
    assert _claimed_twice(engine, attempts_meanwhile=5) == (1, 1)

    # A redriven row is queued as its next attempt, the same at every claim.
    with engine.begin() as conn:
        ids = conn.execute(sa.text("SELECT id FROM outbox")).scalars().all()
        assert [r.attempts for r in conn.execute(sql.REDRIVE, {"ids": ids})] == [5]
    assert _claimed_twice(engine, attempts_meanwhile=10) == (6, 6)

    # A queue row of a release before the queue held attempts goes on from the row's.
    with engine.begin() as conn:
        assert [r.attempts for r in conn.execute(sql.REDRIVE, {"ids": ids})] == [10]
        conn.execute(sa.text("UPDATE outbox_queue SET attempt = NULL"))
        conn.execute(sa.text("UPDATE outbox SET attempts = 12"))
        assert [r.attempt for r in sql.claim_due(conn, 10, 60)] == [13]


# A claim that would outlive every wait of these tests: rows taken before it runs out were taken
# because their owner's session had ended.
LONG_TTL_S = 3600.0
BACKEND_PID = sa.text("SELECT pg_backend_pid()")
# With a timeout, the server answers once the backend is gone (true) or the time has passed
# (false). Polling pg_stat_activity instead read one snapshot per transaction: a backend still
# there at the first read stayed there until the wait gave up.
TERMINATE_AND_WAIT = sa.text("SELECT pg_terminate_backend(:pid, :timeout_ms)")
BACKEND_EXIT_TIMEOUT_MS = 60_000
CLAIM_OWNERS = sa.text("SELECT DISTINCT claimed_by FROM outbox_queue")


def _claim(db: Connections, limit: int = 10) -> list[int]:
    """The ids ``db`` claims, as the relay claims (with its owner key)."""
    return sorted(row.outbox_id for row in sql.claim_due(db.claims(), limit, LONG_TTL_S,
                                                         owner=db.owner, pinned=True))


def _end_session(engine: sa.Engine, conn: sa.Connection) -> None:
    """End ``conn``'s session from the server's side, as a killed relay's ends, and wait until
    its backend is gone (with it, its locks)."""
    pid = conn.execute(BACKEND_PID).scalar_one()
    with engine.connect() as admin:
        assert admin.execute(TERMINATE_AND_WAIT,
                             {"pid": pid, "timeout_ms": BACKEND_EXIT_TIMEOUT_MS}).scalar_one(), \
            f"backend {pid} still there after {BACKEND_EXIT_TIMEOUT_MS} ms"


def test_rows_claimed_by_a_session_that_ended_are_claimed_again_at_once(
        settings: Settings, engine: sa.Engine, consume: Callable[..., Any]) -> None:
    # A relay killed, or whose connection was cut, between its claim and its publish: its rows
    # wait for no claim to run out.
    with engine.begin() as conn:
        enqueue(conn, key="k", recipients=[f"r{n}@example.com" for n in range(5)], subject="S",
                body="b")
    gone, live = Connections(engine), Connections(engine)
    try:
        claimed = _claim(gone)
        assert len(claimed) == 5
        # While its session lives, neither another relay's claim nor its own next one takes them.
        assert _claim(live) == []
        assert _claim(gone) == []
        _end_session(engine, gone.claims())
        assert _claim(live) == claimed
        with engine.connect() as conn:
            assert conn.execute(CLAIM_OWNERS).scalars().all() == [live.owner]
    finally:
        gone.close()
        live.close()
    # The new owner's connection closed (as after a failed round): a relay's round takes them.
    assert publish_round(Relay(settings, engine)) == 5
    assert len(consume(settings, topics(settings), expected=5)) == 5


def test_claims_without_an_owner_wait_until_they_run_out(engine: sa.Engine) -> None:
    # Taken by a relay of a release before migration 0013, a claim names no owner.
    with engine.begin() as conn:
        enqueue(conn, key="k", recipients=["a@example.com"], subject="S", body="b")
        [row] = sql.claim_due(conn, 10, LONG_TTL_S)
    live = Connections(engine)
    try:
        assert _claim(live) == []
        with engine.begin() as conn:
            conn.execute(EXPIRE_CLAIMS)
        assert _claim(live) == [row.outbox_id]
    finally:
        live.close()


@hypothesis_settings(max_examples=examples(40), deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)), min_size=1, max_size=6))
def test_claims_written_by_sql_with_any_owner_never_stop_a_claim(
        engine: sa.Engine, owners: list[int | None]) -> None:
    # claimed_by is a plain column: SQL may write any bigint there, or NULL. A claim that has not
    # run out and names an owner no session holds (any of these: none of them is taken here) is
    # free; one without an owner waits for its TTL. Nothing written there makes the claim fail.
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM outbox"))
        enqueue(conn, key="k", recipients=[f"r{n}@example.com" for n in range(len(owners))],
                subject="S", body="b")
        ids = conn.execute(sa.text("SELECT id FROM outbox ORDER BY id")).scalars().all()
        for row_id, owner in zip(ids, owners, strict=True):
            conn.execute(sa.text(
                "UPDATE outbox_queue SET claimed_until = now() + interval '1 hour', "
                "claimed_by = :owner WHERE id = :id"), {"owner": owner, "id": row_id})
    live = Connections(engine)
    try:
        assert _claim(live) == sorted(row_id for row_id, owner in zip(ids, owners, strict=True)
                                      if owner is not None)
    finally:
        live.close()


class _RoundFailsOnce(Relay):
    """A relay whose first round fails after its claim, before anything is produced (as when the
    broker or the database goes away mid-round)."""

    failed = False

    def _send(self, rows: Any) -> Any:
        if not self.failed:
            self.failed = True
            raise KafkaClientError("the broker went away mid-round", retriable=True)
        return super()._send(rows)


def test_a_relay_publishes_the_rows_of_its_failed_round_without_waiting_for_their_claim(
        settings: Settings, engine: sa.Engine, consume: Callable[..., Any]) -> None:
    with engine.begin() as conn:
        enqueue(conn, key="k", recipients=["a@example.com", "b@example.com"], subject="S",
                body="b")
    relay = _RoundFailsOnce(dataclasses.replace(settings, relay_claim_ttl_s=LONG_TTL_S), engine)
    thread = threading.Thread(target=relay.run)
    thread.start()
    try:
        # The failed round's connections are closed and its claims with them; the next round,
        # after the relay's first back-off, claims the rows again.
        records = consume(settings, topics(settings), expected=2, timeout_s=30)
    finally:
        relay.stop()
        thread.join(timeout=10)
    assert relay.failed and relay.stats.errors == 1
    assert len(records) == 2
    assert unpublished(engine) == 0


@pytest.mark.parametrize("only_errors", [True, False], ids=["failures-reported", "all-reported"])
def test_broker_outage_loses_nothing_and_releases_the_claims(
        settings: Settings, engine: sa.Engine, consume: Callable[..., Any],
        only_errors: bool) -> None:
    # The relay's own producer reports failures only; one that reports every record must do too.
    with engine.begin() as conn:
        enqueue(conn, key="k", recipients=["a@example.com", "b@example.com"], subject="S",
                body="b")
    unreachable = dataclasses.replace(settings, kafka_bootstrap_servers="127.0.0.1:1")
    down = Relay(unreachable, engine, producer_factory=lambda: make_producer(
        unreachable, **{"message.timeout.ms": 1500, "delivery.report.only.error": only_errors}))
    with pytest.raises(KafkaClientError, match="2 of 2 rows were not acknowledged"):
        publish_round(down)
    with engine.connect() as conn:
        claimed = conn.execute(sa.text(
            "SELECT count(*) FROM outbox_queue WHERE claimed_until IS NOT NULL "
            "OR claimed_by IS NOT NULL")).scalar_one()
    assert (unpublished(engine), claimed) == (2, 0)
    assert publish_round(Relay(settings, engine)) == 2
    assert len(consume(settings, topics(settings), expected=2)) == 2


# Long enough to tell a wait that ran out from one a notification ended, on any machine.
WAKE_TIMEOUT_S = 30.0


def notify(engine: sa.Engine, payload: str) -> None:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("SELECT pg_notify(:channel, :payload)"),
                     {"channel": sql.NOTIFY_CHANNEL, "payload": payload})


def test_a_relay_wakes_for_inserts_into_its_own_schema_only(
        db_settings: Settings, engine: sa.Engine) -> None:
    # Every schema's inserts notify the one channel: a relay woke (and claimed) for each insert
    # of any schema in the database, another deployment's or another test's.
    listener = Listener(engine, threading.Event())
    listener.ensure()
    try:
        notify(engine, "someone_elses_schema")
        started = time.monotonic()
        listener.wait_for_rows(1.0)
        assert time.monotonic() - started >= 1.0  # waited its time out
        notify(engine, db_settings.database_schema or "")
        started = time.monotonic()
        listener.wait_for_rows(WAKE_TIMEOUT_S)
        assert time.monotonic() - started < WAKE_TIMEOUT_S  # woken
    finally:
        listener.close()


def test_run_wakes_on_notify_and_stops_on_request(
        settings: Settings, engine: sa.Engine, consume: Callable[..., Any]) -> None:
    # Polling once an hour, the relay can publish a row enqueued after its first (empty) claim
    # within this test's time only if the row's NOTIFY woke it.
    slow_poll = dataclasses.replace(settings, relay_poll_interval_s=3600.0)
    relay_engine = make_engine(slow_poll)
    claims: list[float] = []

    @sa.event.listens_for(relay_engine, "after_cursor_execute")
    def count_claims(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any,
                     executemany: bool) -> None:
        if getattr(context.compiled, "statement", None) is sql.CLAIM_DUE:
            claims.append(time.monotonic())

    relay = Relay(slow_poll, relay_engine)
    thread = threading.Thread(target=relay.run)
    thread.start()
    try:
        wait_until(lambda: claims, 30, "the relay's first claim")
        assert relay.stats.rounds == 0  # it found nothing and is waiting
        started = time.monotonic()
        with engine.begin() as conn:
            enqueue(conn, key="k", recipients=["a@example.com"], subject="S", body="b")
        records = consume(settings, topics(settings), expected=1, timeout_s=30)
        woke_after = time.monotonic() - started
        claims_after_wake = len(claims)
    finally:
        relay.stop()
        thread.join(timeout=10)
        relay_engine.dispose()
    assert not thread.is_alive()
    assert len(records) == 1
    assert claims_after_wake == 2, "one claim before the row, one after its NOTIFY"
    assert woke_after < 30


@pytest.mark.slow
def test_two_relay_processes_publish_every_row_exactly_once(
        settings: Settings, engine: sa.Engine, consume: Callable[..., Any], tmp_path: Path) -> None:
    total = 10_000
    env = {**os.environ, **scratch_env(settings), "POSTROOM_RELAY_BATCH_SIZE": "500",
           "POSTROOM_LOG_LEVEL": "INFO"}
    relays = PostroomProcesses(env, tmp_path, starter=start_postroom)
    try:
        relays.start("relay0", "relay")
        relays.start("relay1", "relay")
        # Both share the backlog only if both run before it is there.
        relays.wait_logged("relay started", timeout_s=60)
        for batch in range(20):  # 20 transactions of 500, enqueued while both relays run
            with engine.begin() as conn:
                enqueue(conn, key=f"bulk-{batch}", subject="S", body="b",
                        recipients=[f"user{i}@example.com" for i in range(500)],
                        priority=ALL_PRIORITIES[batch % 3])
        records = consume(settings, topics(settings), expected=total, timeout_s=90)
    finally:
        codes = relays.stop_all(timeout_s=30)
    assert codes == {"relay0": 0, "relay1": 0}, {name: relays.log(name) for name in codes}
    counts = Counter(r.key for r in records)
    assert len(counts) == total
    assert max(counts.values()) == 1, counts.most_common(3)
    for record in records:
        batch = int(record.key.decode().split("|")[0].split("-")[1])
        assert record.topic == priority_topic(settings.topic_prefix, ALL_PRIORITIES[batch % 3])
    assert unpublished(engine) == 0


def test_the_relay_survives_a_database_restart(
        settings: Settings, engine: sa.Engine, consume: Callable[..., Any]) -> None:
    """Every connection of the relay is killed, as a restart would; it reconnects and goes on."""
    name = f"relay-test-{uuid.uuid4().hex[:8]}"
    relay_engine = make_engine(settings, application_name=name)
    relay = Relay(settings, relay_engine)
    thread = threading.Thread(target=relay.run)
    thread.start()
    try:
        with engine.begin() as conn:
            enqueue(conn, key="before", recipients=["a@example.com"], subject="S", body="b")
        consume(settings, topics(settings), expected=1, timeout_s=15)
        with engine.begin() as conn:
            killed = conn.execute(sa.text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = :name"), {"name": name}).scalar_one()
        assert killed >= 2  # its pooled connection and its LISTEN connection
        with engine.begin() as conn:
            enqueue(conn, key="after", recipients=["b@example.com"], subject="S", body="b")
        records = consume(settings, topics(settings), expected=2, timeout_s=30)
    finally:
        relay.stop()
        thread.join(timeout=15)
        relay_engine.dispose()
    assert not thread.is_alive()
    assert sorted(r.key for r in records) == [b"after|b@example.com", b"before|a@example.com"]
    assert unpublished(engine) == 0


def test_a_read_only_database_is_waited_out_not_an_exit(
        settings: Settings, engine: sa.Engine, consume: Callable[..., Any],
        caplog: pytest.LogCaptureFixture) -> None:
    """A standby after a failover refuses the claim (SQLSTATE 25006, psycopg's InternalError,
    not an OperationalError): that is the database's fault, not a row's. The relay used to end
    with a traceback; it now tries the round again, and publishes once it can write."""
    caplog.set_level(logging.WARNING, logger="postroom.relay.publisher")
    with engine.begin() as conn:
        enqueue(conn, key="standby", recipients=["a@example.com"], subject="S", body="b")
    read_only = sa.create_engine(engine.url, connect_args={
        "options": f"-c search_path={settings.database_schema} "
                   "-c default_transaction_read_only=on"})
    relay = Relay(settings, read_only)
    thread = threading.Thread(target=relay.run)
    thread.start()
    try:
        wait_until(lambda: sum("relay round failed" in r.getMessage()
                               for r in caplog.records) >= 2 or not thread.is_alive(),
                   30, "the relay to try its round twice")
        assert thread.is_alive(), "the relay ended on a read-only database"
        assert unpublished(engine) == 1
    finally:
        relay.stop()
        thread.join(timeout=15)
        read_only.dispose()
    assert not thread.is_alive()
    publish_round(Relay(settings, engine))
    [record] = consume(settings, topics(settings), expected=1, timeout_s=15)
    assert record.key == b"standby|a@example.com"


INSERT_BY_HAND = sa.text("""
    INSERT INTO outbox (idempotency_key, message_key, recipient, subject, body, priority)
    VALUES (:key, :key, 'a@example.com', 'S', :body, 'normal')""")


@pytest.mark.parametrize(("event_max_bytes", "body_bytes", "refused_by"), [
    (4096, 10_000, "the relay's cap"),
    # The relay's cap set above what the producer takes (1 MB message.max.bytes): produce()
    # itself refuses, which used to escape the round and end `postroom relay`.
    (8 * 1024 * 1024, 2 * 1024 * 1024, "the producer"),
])
def test_a_row_too_large_to_publish_is_failed_and_the_rest_published(
        settings: Settings, engine: sa.Engine, consume: Callable[..., Any],
        event_max_bytes: int, body_bytes: int, refused_by: str) -> None:
    """Issue 10: a row written past enqueue's cap (before it existed, or by hand) ends as a
    recorded permanent failure in one round; it neither stops the relay nor comes back."""
    with engine.begin() as conn:
        conn.execute(INSERT_BY_HAND, {"key": "huge", "body": "x" * body_bytes})
        enqueue(conn, key="fine", recipients=["b@example.com"], subject="S", body="b")
    relay = Relay(dataclasses.replace(settings, event_max_bytes=event_max_bytes), engine)
    assert publish_round(relay) == 1, refused_by
    assert publish_round(relay) == 0
    with engine.connect() as conn:
        rows = dict(conn.execute(sa.text(
            "SELECT message_key, status || ': ' || coalesce(last_error, '') FROM outbox")).all())
        queued = conn.execute(sa.text("SELECT count(*) FROM outbox_queue")).scalar_one()
    assert rows["huge"].startswith("failed: the event is too large to publish")
    assert rows["fine"] == "published: "
    assert queued == 0
    assert counter(relay.metrics, "relay_too_large_total") == 1
    records = consume(settings, topics(settings), expected=1, timeout_s=15)
    assert [r.key for r in records] == [b"fine|b@example.com"]


def test_a_late_mark_leaves_a_row_another_relay_or_a_requeue_queued_since(
        engine: sa.Engine) -> None:
    """A relay whose claim ran out while its broker was slow marks its batch after another
    relay claimed, published and marked the row, and after a requeue queued its next attempt:
    the late mark must leave that attempt queued and the row as the requeue left it."""
    from postroom.relay import redrive

    with engine.begin() as conn:
        enqueue(conn, key="late", recipients=["a@example.com"], subject="S", body="b")
    late, other = Connections(engine), Connections(engine)
    try:
        [row_id] = _claim(late)
        with engine.begin() as conn:
            conn.execute(EXPIRE_CLAIMS)
        assert _claim(other) == [row_id]
        with engine.begin() as conn:  # the other relay's publish, its mark; the send failed
            conn.execute(sql.MARK_PUBLISHED, {"ids": [row_id], "owner": other.owner})
            conn.execute(sa.text("UPDATE outbox SET status = 'failed', attempts = 1 "
                                 "WHERE id = :id"), {"id": row_id})
        assert [r.id for r in redrive.redrive(engine, redrive.plan_requeue(engine, "late", None))
                ] == [row_id]
        with engine.begin() as conn:  # the late relay's marks of its acknowledged batch
            conn.execute(sql.MARK_PUBLISHED, {"ids": [row_id], "owner": late.owner})
            conn.execute(sql.RELEASE_CLAIMS, {"ids": [row_id], "owner": late.owner})
        with engine.connect() as conn:
            queued = conn.execute(sa.text("SELECT claimed_by FROM outbox_queue WHERE id = :id"),
                                  {"id": row_id}).all()
            status = conn.execute(sa.text("SELECT status FROM outbox WHERE id = :id"),
                                  {"id": row_id}).scalar_one()
        assert queued == [(None,)]  # the requeue's attempt waits for the next claim
        assert status == "pending"
        assert _claim(other) == [row_id]
    finally:
        late.close()
        other.close()


def test_a_relay_whose_producer_is_in_its_fatal_state_exits_instead_of_retrying(
        settings: Settings, engine: sa.Engine, consume: Callable[..., Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """librdkafka's fatal state (forced here by its test hook; a fenced idempotent producer in
    production) is never retried: run() raises KafkaFatalError, which the command prints as its
    one line before exiting 1. Before, each round failed and was tried again for ever."""
    monkeypatch.setattr(fatal, "FATAL", fatal.FatalState())  # this test's process state
    made: list[Any] = []

    def producer() -> Any:
        made.append(make_producer(settings, **{"delivery.report.only.error": True}))
        return made[-1]

    with engine.begin() as conn:
        enqueue(conn, key="before", recipients=["a@example.com"], subject="S", body="b")
    relay = Relay(settings, engine, producer_factory=producer)
    raised: list[BaseException] = []

    def run() -> None:
        try:
            relay.run()
        except BaseException as exc:  # noqa: BLE001 - the test reads what ended the relay
            raised.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        consume(settings, topics(settings), expected=1, timeout_s=30)
        force_fatal(made[0], KafkaError.INVALID_PRODUCER_EPOCH)
        with engine.begin() as conn:
            enqueue(conn, key="after", recipients=["a@example.com"], subject="S", body="b")
        thread.join(timeout=30)
        assert not thread.is_alive(), "the relay lives on with a producer that cannot work"
    finally:
        relay.stop()
        thread.join(timeout=10)
    [error] = raised
    assert isinstance(error, KafkaFatalError), error
    assert error.code == "INVALID_PRODUCER_EPOCH"
    assert unpublished(engine) == 1  # the row waits for the relay started afresh
