"""The delivery ledger against the real database: who may send a key, and when."""

from __future__ import annotations

import asyncio
import datetime as dt
import sys
import time
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from psycopg.conninfo import conninfo_to_dict

from postroom.settings import Settings
from relay.db import libpq_conninfo
from sender.errors import LedgerUnavailableError
from sender.ledger import (
    MARK_SENT,
    MARK_SWITCH_INTERVAL_S,
    Claim,
    ClaimResult,
    Ledger,
    ledger_conninfo,
    text_array,
)

pytestmark = pytest.mark.integration


def ledger(engine: sa.Engine, settings: Settings, owner: str, lease_s: float = 30) -> Ledger:
    return Ledger(libpq_conninfo(engine), owner, lease_s, settings.database_schema)


def test_claims(engine: sa.Engine, db_settings: Settings) -> None:
    async def scenario() -> None:
        a, b = ledger(engine, db_settings, "a"), ledger(engine, db_settings, "b")
        try:
            # The same key twice at once (one batch): the first is ours, the copy waits.
            first, copy = await asyncio.gather(a.claim("k1", 1), a.claim("k1", 1))
            assert (first.claim, copy.claim) == (Claim.MINE, Claim.BUSY)
            busy = await b.claim("k1", 1)
            assert busy.claim is Claim.BUSY
            assert busy.lease_until is not None and busy.lease_until > dt.datetime.now(dt.UTC)
            await a.mark_sent("k1", "<id@example.com>")
            sent = await b.claim("k1", 2)
            assert (sent.claim, sent.message_id) == (Claim.SENT, "<id@example.com>")

            # A failed attempt releases the key; the retry may claim it again.
            assert (await a.claim("k2", 1)).claim is Claim.MINE
            await a.release("k2")
            assert (await b.claim("k2", 2)).claim is Claim.MINE
            await a.release("k2")  # not a's any more: nothing changes
            assert (await a.claim("k2", 2)).claim is Claim.BUSY
        finally:
            await a.close()
            await b.close()

    asyncio.run(scenario())


def test_a_mark_says_when_its_commit_returned(engine: sa.Engine, db_settings: Settings) -> None:
    async def scenario() -> None:
        a, b = ledger(engine, db_settings, "a"), ledger(engine, db_settings, "b")
        try:
            assert (await a.claim("k", 1)).claim is Claim.MINE
            before = time.monotonic()
            committed_at = await a.mark_sent("k", "<k@example.com>")
            assert before < committed_at <= time.monotonic()
            assert (await b.claim("k", 2)).claim is Claim.SENT
        finally:
            await a.close()
            await b.close()

    asyncio.run(scenario())


def test_the_marker_thread_gets_the_gil_within_its_switch_interval(
        engine: sa.Engine, db_settings: Settings) -> None:
    async def scenario() -> None:
        a = ledger(engine, db_settings, "a")
        try:
            await a.mark_sent("k", "<k@example.com>")
        finally:
            await a.close()

    default = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    try:
        asyncio.run(scenario())
        assert sys.getswitchinterval() == pytest.approx(MARK_SWITCH_INTERVAL_S)
    finally:
        sys.setswitchinterval(default)


def test_an_expired_lease_can_be_taken_over(engine: sa.Engine, db_settings: Settings) -> None:
    async def scenario() -> None:
        crashed = ledger(engine, db_settings, "crashed", lease_s=0.2)
        heir = ledger(engine, db_settings, "heir")
        try:
            assert (await crashed.claim("k", 1)).claim is Claim.MINE
            assert (await heir.claim("k", 1)).claim is Claim.BUSY
            await asyncio.sleep(0.4)
            assert (await heir.claim("k", 1)).claim is Claim.MINE
        finally:
            await crashed.close()
            await heir.close()

    asyncio.run(scenario())


class CountingLedger(Ledger):
    """A ledger that counts the statements it sends to the server: every one goes through
    ``_run``, one round trip each."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.statements = 0

    async def _run(self, query: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        self.statements += 1
        return await super()._run(query, params)


def test_many_concurrent_claims_share_round_trips(engine: sa.Engine, db_settings: Settings) -> None:
    async def scenario() -> tuple[list[Claim], int]:
        one = CountingLedger(libpq_conninfo(engine), "one", 30, db_settings.database_schema)
        try:
            results = await asyncio.gather(*(one.claim(f"k{i % 50}", 1) for i in range(200)))
        finally:
            await one.close()
        return [r.claim for r in results], one.statements

    claims, statements = asyncio.run(scenario())
    assert claims.count(Claim.MINE) == 50  # each key once; its copies wait
    assert claims.count(Claim.BUSY) == 150
    # Claimed one at a time, 200 claims take 200 statements and more (the state of a busy key
    # is a second one). Batched, the 200 that arrive together share a claim and a state query;
    # a second batch may form while the first is in flight.
    assert statements <= 4, statements


def backend_pids(engine: sa.Engine) -> set[int]:
    with engine.connect() as conn:
        return set(conn.execute(sa.text(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()")).scalars())


def taken_from(engine: sa.Engine, key: str) -> str | None:
    with engine.connect() as conn:
        return conn.execute(sa.text("SELECT taken_from FROM sender_ledger WHERE "
                                    "idempotency_key = :k"), {"k": key}).scalar_one()


async def claim_until_mine(owner: Ledger, key: str, attempt: int,
                           timeout_s: float = 10.0) -> ClaimResult:
    """Claim until MINE, as a sender asking again would; fail after ``timeout_s``."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        result = await owner.claim(key, attempt)
        if result.claim is Claim.MINE:
            return result
        assert asyncio.get_running_loop().time() < deadline, f"{key} stayed {result.claim}"
        await asyncio.sleep(0.1)


def test_a_dead_owners_claims_are_taken_at_once(engine: sa.Engine, db_settings: Settings) -> None:
    async def scenario() -> None:
        crashed = ledger(engine, db_settings, "crashed", lease_s=300)
        heir = ledger(engine, db_settings, "heir")
        try:
            assert (await crashed.claim("k", 1)).claim is Claim.MINE
            assert (await heir.claim("k", 1)).claim is Claim.BUSY  # alive: its lock is held
            await crashed.close()  # as a killed process's sessions end
            # The server releases the lock once the closed session's backend has exited, a
            # moment after the close; a sender asks again every second (claims.BUSY_WAIT_MAX_S).
            taken = await claim_until_mine(heir, "k", 1)
            assert taken.taken_from == "crashed"
        finally:
            await heir.close()

    asyncio.run(scenario())
    assert taken_from(engine, "k") == "crashed"


def test_an_owner_whose_session_was_terminated_takes_its_lock_again(
        engine: sa.Engine, db_settings: Settings) -> None:
    async def scenario() -> None:
        a = ledger(engine, db_settings, "a", lease_s=300)
        b = ledger(engine, db_settings, "b")
        try:
            before = backend_pids(engine)
            assert [r.claim for r in await asyncio.gather(
                a.claim("k1", 1), a.claim("k2", 1))] == [Claim.MINE, Claim.MINE]
            await a.mark_sent("k0", "<k0@example.com>")  # opens a's marking session
            claims_pid = a._claiming._conn.info.backend_pid  # type: ignore[union-attr]
            assert claims_pid in backend_pids(engine) - before
            with engine.connect() as conn:
                assert conn.execute(sa.text("SELECT pg_terminate_backend(:p)"),
                                    {"p": claims_pid}).scalar_one()
            # While a's session is gone, its claims are free: b takes k1 at once.
            taken = await claim_until_mine(b, "k1", 1)
            assert taken.taken_from == "a"
            # a's 250 for k1 is still recorded: the server accepted it, whoever holds the claim.
            await a.mark_sent("k1", "<k1@example.com>")
            assert (await b.claim("k1", 2)).claim is Claim.SENT
            # a's next claim reopens its session and takes its lock first ...
            with pytest.raises(LedgerUnavailableError):
                await a.claim("k3", 1)  # the statement that finds the session gone fails
            assert (await a.claim("k3", 1)).claim is Claim.MINE
            assert a._claiming.opened == 2
            # ... so its claims are live again, and its release of k2 still works.
            assert (await b.claim("k3", 1)).claim is Claim.BUSY
            await a.release("k2")
            assert (await b.claim("k2", 2)).claim is Claim.MINE
        finally:
            await a.close()
            await b.close()

    asyncio.run(scenario())


def test_a_reopened_session_waits_for_an_older_session_holding_the_owner_lock(
        engine: sa.Engine, db_settings: Settings) -> None:

    from sender.ledger import LOCK_NAMESPACE, TAKE_OWNER_LOCK

    async def scenario() -> None:
        conninfo = libpq_conninfo(engine)
        older = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
        a = ledger(engine, db_settings, "a")
        try:
            row = await (await older.execute(TAKE_OWNER_LOCK, {
                "namespace": LOCK_NAMESPACE, "owner": "a"})).fetchone()
            assert row == (True,)
            claim = asyncio.ensure_future(a.claim("k", 1))
            await asyncio.sleep(1.5)
            assert not claim.done()  # no claim before the lock is ours
            await older.close()
            assert (await asyncio.wait_for(claim, 10)).claim is Claim.MINE
        finally:
            await a.close()
            await older.close()

    asyncio.run(scenario())


def test_a_mark_does_not_wait_behind_a_claim(engine: sa.Engine, db_settings: Settings) -> None:

    async def scenario() -> None:
        a = ledger(engine, db_settings, "a")
        b = ledger(engine, db_settings, "b")
        blocker = await psycopg.AsyncConnection.connect(libpq_conninfo(engine))
        try:
            assert (await b.claim("held", 1)).claim is Claim.MINE
            await b.release("held")
            assert (await a.claim("other", 1)).claim is Claim.MINE
            await blocker.execute(f"SET search_path = {db_settings.database_schema}")
            await blocker.execute("SELECT 1 FROM sender_ledger WHERE idempotency_key = 'held' "
                                  "FOR UPDATE")  # an open transaction holds the row
            stuck = asyncio.ensure_future(a.claim("held", 2))
            await asyncio.sleep(0.5)
            assert not stuck.done()
            await asyncio.wait_for(a.mark_sent("other", "<o@example.com>"), 5)
            assert not stuck.done()
            assert (await b.claim("other", 2)).claim is Claim.SENT
            await blocker.rollback()
            assert (await asyncio.wait_for(stuck, 10)).claim is Claim.MINE
        finally:
            await blocker.close()
            await a.close()
            await b.close()

    asyncio.run(scenario())


def test_a_mark_whose_session_was_terminated_fails_and_the_next_reconnects(
        engine: sa.Engine, db_settings: Settings) -> None:
    async def scenario() -> None:
        a = ledger(engine, db_settings, "a")
        try:
            assert (await a.claim("k", 1)).claim is Claim.MINE
            await a.mark_sent("other", "<o@example.com>")
            marks_pid = a._marker._conn.info.backend_pid  # type: ignore[union-attr]
            with engine.connect() as conn:
                assert conn.execute(sa.text("SELECT pg_terminate_backend(:p)"),
                                    {"p": marks_pid}).scalar_one()
            with pytest.raises(LedgerUnavailableError):
                await a.mark_sent("k", "<k@example.com>")  # the sender retries such a mark
            await a.mark_sent("k", "<k@example.com>")
            assert (await a.claim("k", 2)).claim is Claim.SENT
        finally:
            await a.close()

    asyncio.run(scenario())


def _plan_nodes(plan: dict[str, Any]) -> list[str]:
    return [plan["Node Type"], *(n for child in plan.get("Plans", []) for n in _plan_nodes(child))]


def test_marks_read_the_ledger_by_its_key_before_it_is_analyzed(
        engine: sa.Engine, db_settings: Settings) -> None:
    """A mark is a prepared statement, planned once for all its keys. Planned on a new ledger,
    which has no statistics and few rows, the plan joins the keys to a seq scan of the whole
    table, and it is kept as the ledger grows: each mark then reads all of it. The ledger's
    connections plan it on the primary key."""
    schema = db_settings.database_schema

    def prepare(conninfo: str) -> psycopg.Connection[Any]:
        conn = psycopg.connect(conninfo, autocommit=True)
        conn.execute(f"SET search_path = {schema}")
        conn.execute("SET plan_cache_mode = force_generic_plan")  # as after five executions
        conn.execute(f"PREPARE mark (text[], text[]) AS {MARK_SENT}")
        return conn

    def plan_of(conn: psycopg.Connection[Any]) -> list[str]:
        row = conn.execute("EXPLAIN (FORMAT JSON) EXECUTE mark "
                           "('{k1,k2,k3}', '{<1@x>,<2@x>,<3@x>}')").fetchone()
        assert row is not None
        return _plan_nodes(row[0][0]["Plan"])

    with prepare(libpq_conninfo(engine)) as plain, \
            prepare(ledger_conninfo(libpq_conninfo(engine), schema)) as pinned:
        plain.execute("ALTER TABLE sender_ledger SET (autovacuum_enabled = false)")
        plain.execute("""
            INSERT INTO sender_ledger (idempotency_key, state, owner, lease_until, attempt)
            SELECT 'k' || i, 'sending', 'a', now() + interval '1 minute', 1
            FROM generate_series(1, 3000) AS i""")
        assert "Seq Scan" in plan_of(plain)  # the hazard is there without the settings
        nodes = plan_of(pinned)
    assert "Seq Scan" not in nodes and "Index Scan" in nodes, nodes

    async def scenario() -> None:
        a = ledger(engine, db_settings, "a")
        try:
            assert (await a.claim("fresh", 1)).claim is Claim.MINE
            await a.mark_sent("fresh", "<fresh@x>")
            claims = a._claiming._conn
            marks = a._marker._conn
            assert claims is not None and marks is not None
            row = await (await claims.execute("SHOW enable_seqscan")).fetchone()
            assert row == ("off",)
            assert marks.execute("SHOW enable_seqscan").fetchone() == ("off",)
        finally:
            await a.close()

    asyncio.run(scenario())


def test_the_ledger_keeps_the_options_its_url_brings() -> None:
    conninfo = ledger_conninfo("host=db dbname=postroom options='-c statement_timeout=5000'",
                               "tenant_a")
    options = conninfo_to_dict(conninfo)["options"]
    assert "-c statement_timeout=5000" in options
    assert "-c enable_seqscan=off" in options
    assert "-c search_path=tenant_a" in options
    assert conninfo_to_dict(conninfo)["host"] == "db"


def test_marks_pass_any_key_to_postgresql_as_it_is(engine: sa.Engine) -> None:
    keys = ["plain", 'a "quoted" key', "back\\slash\\", "{braces},commas", " spaced ", "NULL",
            "", "ünïcødé ✉", "'single'"]
    with psycopg.connect(libpq_conninfo(engine), autocommit=True) as conn:
        got = conn.execute("SELECT %s::text[]", [text_array(keys).decode()]).fetchone()
    assert got == (keys,)
