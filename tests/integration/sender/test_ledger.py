"""The delivery ledger against the real database: who may send a key, and when."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
import uuid
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.conninfo import conninfo_to_dict

from postroom.devkit.wait import wait_until
from postroom.errors import first_line
from postroom.relay.db import libpq_conninfo
from postroom.sender.claims import Claim, ClaimResult
from postroom.sender.errors import LedgerUnavailableError
from postroom.sender.ledger import Ledger
from postroom.sender.ledger_session import ledger_conninfo
from postroom.sender.ledger_sql import MARK_SENT, text_array
from postroom.sender.marker import MARK_IN_FLIGHT, refused
from postroom.settings import Settings
from support.fuzz import examples

# The owner lock is keyed by the owner's name across the database, and these tests name their
# ledgers "a", "b": on two pytest-xdist workers at once, one test's "a" waited for the other's
# (make test's --dist loadgroup keeps them on one worker).
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("ledger-owners")]


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


def ledger_state(engine: sa.Engine, key: str) -> str | None:
    with engine.connect() as conn:
        return conn.execute(sa.text("SELECT state FROM sender_ledger WHERE idempotency_key = :k"),
                            {"k": key}).scalar()


def test_a_started_mark_commits_while_the_event_loop_is_held(
        engine: sa.Engine, db_settings: Settings) -> None:
    """A mark is started from the read of a 250, inside a protocol callback: it reaches the
    database without the loop turning again (no thread to be scheduled, no task step)."""
    async def scenario() -> None:
        a = ledger(engine, db_settings, "a")
        try:
            await a.mark_sent("warm", "<warm@example.com>")  # the connection is open
            assert (await a.claim("k", 1)).claim is Claim.MINE
            mark = a.start_mark("k", "<k@example.com>")
            # Still inside this step, so the loop cannot run: waited for here, blocking it.
            wait_until(lambda: ledger_state(engine, "k") == "sent", 5, "the mark to commit",
                       poll_interval_s=0.01)
            assert not mark.done()  # its commit is read when the loop turns
            assert await asyncio.wait_for(mark, 5) <= time.monotonic()
        finally:
            await a.close()

    asyncio.run(scenario())


def test_marks_in_flight_do_not_wait_for_each_other(
        engine: sa.Engine, db_settings: Settings) -> None:
    """Each mark is written at once, up to MARK_IN_FLIGHT unanswered; the ones past that go
    together in one statement when an answer comes. All commit."""
    async def scenario() -> None:
        a = ledger(engine, db_settings, "a")
        try:
            await a.mark_sent("warm", "<warm@example.com>")
            keys = [f"k{i}" for i in range(MARK_IN_FLIGHT + 3)]
            claims = await asyncio.gather(*(a.claim(k, 1) for k in keys))
            assert {c.claim for c in claims} == {Claim.MINE}
            marks = [a.start_mark(k, f"<{k}@example.com>") for k in keys]
            assert [len(batch) for batch in a._marker._in_flight] == [1] * MARK_IN_FLIGHT
            assert [m.key for m in a._marker._waiting] == keys[MARK_IN_FLIGHT:]
            await asyncio.wait_for(asyncio.gather(*marks), 10)
            assert not a._marker._in_flight and not a._marker._waiting
        finally:
            await a.close()
        assert {k: ledger_state(engine, k) for k in keys} == dict.fromkeys(keys, "sent")

    asyncio.run(scenario())


def test_an_expired_lease_can_be_taken_over(engine: sa.Engine, db_settings: Settings) -> None:
    async def scenario() -> None:
        crashed = ledger(engine, db_settings, "crashed", lease_s=300)
        heir = ledger(engine, db_settings, "heir")
        try:
            assert (await crashed.claim("k", 1)).claim is Claim.MINE
            assert (await heir.claim("k", 1)).claim is Claim.BUSY
            # The lease runs out (by SQL: a 0.2 s lease and a 0.4 s sleep had run out before
            # the heir's first claim on a loaded machine).
            with engine.begin() as conn:
                conn.execute(sa.text("UPDATE sender_ledger SET lease_until = clock_timestamp() "
                                     "- interval '1 second' WHERE idempotency_key = 'k'"))
            assert (await heir.claim("k", 1)).claim is Claim.MINE
        finally:
            await crashed.close()
            await heir.close()

    asyncio.run(scenario())


def lease_of(engine: sa.Engine, key: str) -> tuple[str, str, dt.datetime | None]:
    with engine.connect() as conn:
        row = conn.execute(sa.text(
            "SELECT state, owner, lease_until FROM sender_ledger WHERE idempotency_key = :k"),
            {"k": key}).one()
    return row[0], row[1], row[2]


def test_a_renewal_starts_the_lease_again_only_for_a_claim_still_ours(
        engine: sa.Engine, db_settings: Settings) -> None:
    async def scenario() -> None:
        a = ledger(engine, db_settings, "a", lease_s=0.3)
        b = ledger(engine, db_settings, "b")
        try:
            assert (await a.claim("kept", 1)).claim is Claim.MINE
            _, _, first_lease = lease_of(engine, "kept")
            await asyncio.sleep(0.1)
            assert await a.renew("kept")
            state, owner, renewed_lease = lease_of(engine, "kept")
            assert (state, owner) == ("sending", "a")
            assert first_lease is not None and renewed_lease is not None
            assert renewed_lease > first_lease

            # Its lease ran out and b took it: a's renewal says so and changes nothing.
            assert (await a.claim("lost", 1)).claim is Claim.MINE
            await asyncio.sleep(0.5)
            assert (await b.claim("lost", 1)).claim is Claim.MINE
            _, _, b_lease = lease_of(engine, "lost")
            assert not await a.renew("lost")
            assert lease_of(engine, "lost") == ("sending", "b", b_lease)

            # A server accepted it (whoever sent it): not ours to send any more.
            assert (await a.claim("accepted", 1)).claim is Claim.MINE
            await b.mark_sent("accepted", "<accepted@example.com>")
            assert not await a.renew("accepted")
            assert lease_of(engine, "accepted")[0] == "sent"
        finally:
            await a.close()
            await b.close()

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


def test_an_attempt_whose_outcome_went_out_is_not_made_again(
        engine: sa.Engine, db_settings: Settings) -> None:
    async def scenario() -> None:
        a, b = ledger(engine, db_settings, "a"), ledger(engine, db_settings, "b")
        try:
            assert (await a.claim("k", 1)).claim is Claim.MINE
            await a.release("k", 1)  # attempt 1 failed; its result and retry are out
            # A copy of attempt 1's record, read again by anyone, is not attempted again.
            assert (await b.claim("k", 1)).claim is Claim.DONE
            assert (await a.claim("k", 1)).claim is Claim.DONE
            # The retry, attempt 2, is made; once done, copies of either attempt are not.
            assert (await b.claim("k", 2)).claim is Claim.MINE
            assert (await a.claim("k", 1)).claim is Claim.DONE  # an older copy, while 2 runs
            await b.release("k", 2)
            assert [(await a.claim("k", n)).claim for n in (1, 2)] == [Claim.DONE, Claim.DONE]
            # A copy of the done attempt 2 and the next attempt, 3, claimed in one statement:
            # the copy is done, attempt 3 is not (it waits and asks again, alone).
            copy, after = await asyncio.gather(b.claim("k", 2), b.claim("k", 3))
            assert (copy.claim, after.claim) == (Claim.DONE, Claim.BUSY)
            assert (await a.claim("k", 3)).claim is Claim.MINE

            # Given up without an attempt (a throttled send): the same attempt may go again.
            assert (await a.claim("t", 1)).claim is Claim.MINE
            await a.release("t")
            assert (await b.claim("t", 1)).claim is Claim.MINE
            # Two releases of one key in one statement keep the higher attempt.
            await asyncio.gather(b.release("t", 1), b.release("t"))
            assert (await a.claim("t", 1)).claim is Claim.DONE
        finally:
            await a.close()
            await b.close()

    asyncio.run(scenario())
    with engine.connect() as conn:
        done = dict(conn.execute(sa.text(
            "SELECT idempotency_key, done_attempt FROM sender_ledger")).all())
    assert (done["k"], done["t"]) == (2, 1)


def test_a_dead_owners_attempt_is_taken_over_but_not_an_older_done_one(
        engine: sa.Engine, db_settings: Settings) -> None:
    async def scenario() -> None:
        crashed = ledger(engine, db_settings, "crashed", lease_s=300)
        heir = ledger(engine, db_settings, "heir")
        try:
            assert (await crashed.claim("k", 1)).claim is Claim.MINE
            await crashed.release("k", 1)
            assert (await crashed.claim("k", 2)).claim is Claim.MINE
            await crashed.close()  # dies during attempt 2
            assert (await heir.claim("k", 1)).claim is Claim.DONE
            taken = await claim_until_mine(heir, "k", 2)
            assert taken.taken_from == "crashed"
        finally:
            await heir.close()

    asyncio.run(scenario())


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
            claims = await asyncio.gather(a.claim("k1", 1), a.claim("k2", 1))
            assert [(r.claim, r.session) for r in claims] == [(Claim.MINE, 1)] * 2
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
            assert a._claiming.opened == a.session == 2
            # ... so its claims are live again, and its release of k2 still works. A claim of
            # the old session is checked before its send: k2 is still a's, k1 is not.
            assert (await b.claim("k3", 1)).claim is Claim.BUSY
            assert await a.renew("k2")
            assert not await a.renew("k1")
            await a.release("k2")
            assert (await b.claim("k2", 2)).claim is Claim.MINE
        finally:
            await a.close()
            await b.close()

    asyncio.run(scenario())


def test_a_reopened_session_waits_for_an_older_session_holding_the_owner_lock(
        engine: sa.Engine, db_settings: Settings) -> None:

    from postroom.sender.ledger_sql import LOCK_NAMESPACE, TAKE_OWNER_LOCK

    async def scenario() -> None:
        conninfo = libpq_conninfo(engine)
        older = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
        # An owner of this test's own: the lock is the database's, and an earlier test's session
        # named "a" may not have ended yet on the server when this one starts.
        owner = f"a-{uuid.uuid4().hex[:8]}"
        a = ledger(engine, db_settings, owner)
        try:
            row = await (await older.execute(TAKE_OWNER_LOCK, {
                "namespace": LOCK_NAMESPACE, "owner": owner})).fetchone()
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


def test_close_waits_for_the_marks_started(engine: sa.Engine, db_settings: Settings) -> None:
    async def scenario() -> list[asyncio.Future[float]]:
        a = ledger(engine, db_settings, "a")
        await a.mark_sent("warm", "<warm@example.com>")
        claims = await asyncio.gather(*(a.claim(k, 1) for k in keys))
        assert {c.claim for c in claims} == {Claim.MINE}
        marks = [a.start_mark(k, f"<{k}@example.com>") for k in keys]
        await a.close()  # some wait for room: they go out as the first answers come
        return marks

    keys = [f"c{i}" for i in range(MARK_IN_FLIGHT + 5)]
    marks = asyncio.run(scenario())
    assert all(m.done() and m.exception() is None for m in marks)
    assert {k: ledger_state(engine, k) for k in keys} == dict.fromkeys(keys, "sent")


def test_a_mark_in_flight_when_its_session_is_terminated_fails_and_the_next_reconnects(
        engine: sa.Engine, db_settings: Settings) -> None:
    async def scenario() -> None:
        a = ledger(engine, db_settings, "a")
        blocker = await psycopg.AsyncConnection.connect(libpq_conninfo(engine))
        try:
            assert (await a.claim("k", 1)).claim is Claim.MINE
            await a.mark_sent("other", "<o@example.com>")
            marks_pid = a._marker._conn.info.backend_pid  # type: ignore[union-attr]
            await blocker.execute(f"SET search_path = {db_settings.database_schema}")
            await blocker.execute("SELECT 1 FROM sender_ledger WHERE idempotency_key = 'k' "
                                  "FOR UPDATE")  # the mark waits for this row
            stuck = a.start_mark("k", "<k@example.com>")
            await asyncio.sleep(0.3)
            assert not stuck.done()
            with engine.connect() as conn:
                assert conn.execute(sa.text("SELECT pg_terminate_backend(:p)"),
                                    {"p": marks_pid}).scalar_one()
            with pytest.raises(LedgerUnavailableError):
                await asyncio.wait_for(stuck, 5)  # the sender writes such a mark again
            await blocker.rollback()
            await a.mark_sent("k", "<k@example.com>")
            assert a._marker._conn.info.backend_pid != marks_pid  # type: ignore[union-attr]
            assert (await a.claim("k", 2)).claim is Claim.SENT
        finally:
            await blocker.close()
            await a.close()

    asyncio.run(scenario())


def test_an_idle_mark_session_that_was_terminated_is_reopened_for_the_next_mark(
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
            # The loop reads the server's goodbye and drops the connection.
            await asyncio.to_thread(wait_until, lambda: a._marker._conn is None, 5,
                                    "the marker to notice its session ended")
            await asyncio.wait_for(a.mark_sent("k", "<k@example.com>"), 10)
            assert (await a.claim("k", 2)).claim is Claim.SENT
        finally:
            await a.close()

    asyncio.run(scenario())


def test_marks_fail_while_the_database_cannot_be_reached(
        engine: sa.Engine, db_settings: Settings) -> None:
    async def scenario() -> None:
        bad = Ledger("host=127.0.0.1 port=1 dbname=none connect_timeout=2", "a", 30,
                     db_settings.database_schema)
        try:
            with pytest.raises(LedgerUnavailableError, match="cannot connect"):
                await asyncio.wait_for(bad.mark_sent("k", "<k@example.com>"), 10)
        finally:
            await bad.close()

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
            # A pipeline: nothing to SHOW on it.
            assert "-c enable_seqscan=off" in str(marks.info.options)
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


KEYS = ["plain", 'a "quoted" key', "back\\slash\\", "{braces},commas", " spaced ", "NULL",
        "", "ünïcødé ✉", "'single'"]


@settings(max_examples=examples(100), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(st.sampled_from(KEYS), st.text(st.characters(
    blacklist_categories=("Cs",), blacklist_characters="\x00"))), max_size=8))
def test_marks_pass_any_key_to_postgresql_as_it_is(engine: sa.Engine, keys: list[str]) -> None:
    """The hand-made array literal the marks are written with (libpq's text format) against
    psycopg's own adaptation of the list, as the reference: PostgreSQL reads the same keys."""
    with psycopg.connect(libpq_conninfo(engine), autocommit=True) as conn:
        got = conn.execute("SELECT %s::text[], %s::text[]",
                           [text_array(keys).decode(), keys]).fetchone()
    assert got == (keys, keys)



def test_a_sync_refused_on_a_lost_connection_gives_libpqs_reason(engine: sa.Engine) -> None:
    """The marker's pipeline as a PostgreSQL restart leaves it: the session ended, its goodbye
    read but not the connection's end, marks written since. The next mark's sync is refused,
    and psycopg says "connection not in pipeline mode"; the marker's reason is libpq's."""
    conn = psycopg.Connection.connect(libpq_conninfo(engine), autocommit=True)
    try:
        pgconn = conn.pgconn
        pgconn.nonblocking = 1
        pgconn.enter_pipeline_mode()
        with engine.connect() as other:
            assert other.execute(sa.text("SELECT pg_terminate_backend(:p)"),
                                 {"p": conn.info.backend_pid}).scalar_one()
        time.sleep(0.5)
        pgconn.consume_input()  # the server's goodbye
        for _ in range(5):
            pgconn.send_query_params(b"SELECT 1", None)
            try:
                pgconn.pipeline_sync()
            except psycopg.OperationalError as exc:
                refusal = exc
                break
            time.sleep(0.3)  # the writes after the goodbye go until the reset is read
        else:
            pytest.fail("libpq took every sync on a connection the server had closed")
        assert first_line(refusal) == "connection not in pipeline mode"  # psycopg's words
        assert refused(pgconn, refusal) == "server closed the connection unexpectedly"
    finally:
        conn.close()
