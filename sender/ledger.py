"""The delivery ledger in PostgreSQL: the sender's guard against sending one idempotency key twice.

Right before talking to SMTP a sender claims the key; after the server's 250 it records the key as
sent. A claim is live while its owner's ledger session holds the owner's advisory lock, which
PostgreSQL drops when the process dies, so another sender may take a dead owner's claims at once;
the lease (longer than one send's deadline) is the fallback for an owner that is alive but stuck.
The ``sent`` marks go over a connection and a thread of their own, so they never queue behind
claims or wait for the event loop; each says when its commit returned.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import enum
import logging
import os
import queue
import socket
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from postroom.errors import first_line
from sender.errors import LedgerUnavailableError

# Every sender holds this session-level advisory lock for its owner id on its claims connection.
# Taking the same lock for the length of the claim statement succeeds only when no session holds
# it: the owner's process or its connection is gone, and its claims are free.
LOCK_NAMESPACE = "postroom.sender_ledger"
TAKE_OWNER_LOCK = """
    SELECT pg_try_advisory_lock(hashtextextended(%(namespace)s || ':' || %(owner)s, 0))
"""
CLAIM = """
    INSERT INTO sender_ledger AS l (idempotency_key, state, owner, lease_until, attempt, updated_at)
    SELECT k, 'sending', %(owner)s, now() + make_interval(secs => %(lease_s)s), a, now()
    FROM unnest(%(keys)s::text[], %(attempts)s::int[]) AS t(k, a)
    ON CONFLICT (idempotency_key) DO UPDATE
        SET state = 'sending', owner = excluded.owner, lease_until = excluded.lease_until,
            attempt = excluded.attempt, updated_at = now(),
            taken_from = CASE WHEN l.state = 'sending' THEN l.owner END
        WHERE l.state = 'released'
           OR (l.state = 'sending' AND (
                l.lease_until < now()
                OR (l.owner <> excluded.owner AND pg_try_advisory_xact_lock(
                        hashtextextended(%(namespace)s || ':' || l.owner, 0)))))
    RETURNING idempotency_key, taken_from
"""
STATES = """
    SELECT idempotency_key, state, owner, lease_until, attempt, message_id
    FROM sender_ledger WHERE idempotency_key = ANY(%(keys)s)
"""
# Whoever holds the claim now: a server accepted the key, so no one may send it again.
# Prepared once per connection and run by libpq directly ($1 the keys, $2 their Message-IDs, as
# text arrays): psycopg's query conversion and parameter adaptation were most of a mark's CPU.
MARK_SENT = """
    UPDATE sender_ledger AS l
    SET state = 'sent', lease_until = NULL, message_id = t.message_id,
        updated_at = clock_timestamp()
    FROM unnest($1::text[], $2::text[]) AS t(k, message_id)
    WHERE l.idempotency_key = t.k
"""
MARK_SENT_NAME = b"postroom_mark_sent"
RELEASE = """
    UPDATE sender_ledger SET state = 'released', lease_until = NULL, updated_at = now()
    WHERE idempotency_key = ANY(%(keys)s) AND owner = %(owner)s AND state = 'sending'
"""


T = TypeVar("T")
R = TypeVar("R")
log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 10
OWNER_LOCK_RETRY_S = 0.5
OWNER_LOCK_LOG_EVERY_S = 10.0
CLOSE_TIMEOUT_S = 10.0
# A thread that wants the GIL while the event loop's thread runs Python waits up to the switch
# interval (5 ms by default) before the loop is made to give it up. The marker thread wants it
# twice per mark, to start the statement and to read the commit: at full load that wait was a
# quarter of the duplicate window. The loop gives way to the marker within this instead.
MARK_SWITCH_INTERVAL_S = 0.0005
# Every ledger statement finds its rows by idempotency key, the primary key, so an index scan
# is the one good plan. Right after the table is created (a new install, a test, a benchmark),
# before autovacuum has analyzed it, the planner thinks it tiny and prefers a seq scan joined by
# hash: every mark then reads the whole ledger, 2 ms at 6,000 rows, more with each one it adds,
# and the duplicate window grows with it. Both ledger connections run with these settings.
PLAN_OPTIONS = "-c enable_seqscan=off -c enable_hashjoin=off -c enable_mergejoin=off"


def ledger_conninfo(conninfo: str, schema: str | None) -> str:
    """``conninfo`` with the ledger's plan settings and ``schema`` first on the search path, added
    to any ``options`` it already has."""
    options = [str(conninfo_to_dict(conninfo).get("options") or ""), PLAN_OPTIONS]
    if schema:
        options.append(f"-c search_path={schema}")
    return make_conninfo(conninfo, options=" ".join(o for o in options if o))


def sender_identity() -> str:
    """Names this process in the ledger and in logs: host, pid and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Claim(enum.StrEnum):
    MINE = "mine"          # go ahead and send
    SENT = "sent"          # a server accepted this key already: do not send again
    BUSY = "busy"          # another sender holds a live lease: wait for its answer


@dataclasses.dataclass(frozen=True)
class ClaimResult:
    claim: Claim
    attempt: int | None = None
    message_id: str | None = None
    lease_until: dt.datetime | None = None
    taken_from: str | None = None  # MINE by taking over the claim of this owner


class _Batcher(Generic[T, R]):
    """Runs requests that arrive while one batch is in flight together in the next batch,
    so concurrent senders share database round trips (group commit)."""

    def __init__(self, run: Callable[[list[T]], Awaitable[list[R]]]) -> None:
        self._run = run
        self._pending: list[tuple[T, asyncio.Future[R]]] = []
        self._draining = False

    async def submit(self, item: T) -> R:
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        if not self._draining:
            self._draining = True
            asyncio.get_running_loop().create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                try:
                    results = await self._run([item for item, _ in batch])
                except Exception as exc:  # noqa: BLE001 - handed to every waiter of the batch
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                else:
                    for (_, future), result in zip(batch, results, strict=True):
                        if not future.done():
                            future.set_result(result)
        finally:
            self._draining = False


class _Session:
    """One autocommit connection used by one statement at a time, reopened when it breaks;
    ``on_open`` runs on every new connection before any statement."""

    def __init__(self, conninfo: str, schema: str | None,
                 on_open: Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]] | None = None,
                 ) -> None:
        self._conninfo = ledger_conninfo(conninfo, schema)
        self._on_open = on_open
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._lock = asyncio.Lock()
        self.opened = 0

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            conn = await psycopg.AsyncConnection.connect(
                self._conninfo, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
            try:
                if self._on_open is not None:
                    await self._on_open(conn)
            except BaseException:
                await conn.close()
                raise
            self._conn = conn
            self.opened += 1
        return self._conn

    async def run(self, query: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        async with self._lock:
            try:
                conn = await self._connection()
            except psycopg.Error as exc:
                raise LedgerUnavailableError(f"cannot connect: {first_line(exc)}") from exc
            try:
                cursor = await conn.execute(query, params)
                return await cursor.fetchall() if cursor.description else []
            except psycopg.Error as exc:
                if isinstance(exc, psycopg.OperationalError):
                    await conn.close()
                raise LedgerUnavailableError(first_line(exc)) from exc

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None


class _Marker:
    """Writes ``sent`` marks from a thread of its own over a connection of its own.

    A mark is the one write whose delay can send an email twice (a crash between the 250 and its
    commit), so it must not wait for the event loop's next turn, let alone behind claims: the
    statement leaves as soon as the GIL lets this thread run, which its start makes within
    MARK_SWITCH_INTERVAL_S (for the whole process). Marks that arrive while one is in flight go
    together in the next statement. A mark's future holds the ``time.monotonic()`` at which its
    commit returned.
    """

    def __init__(self, conninfo: str, schema: str | None) -> None:
        self._conninfo = ledger_conninfo(conninfo, schema)
        self._queue: queue.SimpleQueue[_Mark | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._conn: psycopg.Connection[Any] | None = None
        self._prepared_on: psycopg.Connection[Any] | None = None

    def submit(self, key: str, message_id: str) -> asyncio.Future[float]:
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        if self._thread is None:
            sys.setswitchinterval(min(sys.getswitchinterval(), MARK_SWITCH_INTERVAL_S))
            self._thread = threading.Thread(target=self._run, name="ledger-marks", daemon=True)
            self._thread.start()
        self._queue.put(_Mark(key, message_id, future))
        return future

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                break
            batch = [first]
            stop = False
            while True:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                    break
                batch.append(more)
            try:
                self._write(batch)
            except Exception as exc:  # noqa: BLE001 - handed to every waiter; they retry
                _settle(batch, 0.0, exc)
            else:
                _settle(batch, time.monotonic(), None)
            if stop:
                break
        if self._conn is not None:
            self._conn.close()

    def _write(self, batch: list[_Mark]) -> None:
        if self._conn is None or self._conn.closed or self._conn.broken:
            try:
                self._conn = psycopg.Connection.connect(self._conninfo, autocommit=True,
                                                        connect_timeout=CONNECT_TIMEOUT_S)
            except psycopg.Error as exc:
                raise LedgerUnavailableError(f"cannot connect: {first_line(exc)}") from exc
        conn = self._conn
        try:
            if self._prepared_on is not conn:
                self._check(conn, conn.pgconn.prepare(MARK_SENT_NAME, MARK_SENT.encode()))
                self._prepared_on = conn
            # libpq lets go of the GIL while it waits for the commit.
            self._check(conn, conn.pgconn.exec_prepared(MARK_SENT_NAME, [
                text_array([m.key for m in batch]), text_array([m.message_id for m in batch])]))
        except psycopg.Error as exc:  # libpq gave no result at all
            conn.close()
            raise LedgerUnavailableError(first_line(exc)) from exc

    @staticmethod
    def _check(conn: psycopg.Connection[Any], result: psycopg.pq.abc.PGresult) -> None:
        """Raise LedgerUnavailableError unless ``result`` is a success; a broken connection is
        closed, to be opened again by the next mark."""
        if result.status in (psycopg.pq.ExecStatus.COMMAND_OK, psycopg.pq.ExecStatus.TUPLES_OK):
            return
        message = (result.error_message or conn.pgconn.error_message).decode(errors="replace")
        if conn.pgconn.status != psycopg.pq.ConnStatus.OK:
            conn.close()
        raise LedgerUnavailableError(message.strip().partition("\n")[0] or "the mark failed")

    async def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            await asyncio.to_thread(self._thread.join, CLOSE_TIMEOUT_S)
            self._thread = None


@dataclasses.dataclass(frozen=True)
class _Mark:
    key: str
    message_id: str
    future: asyncio.Future[float]


def text_array(values: list[str]) -> bytes:
    """``values`` as a PostgreSQL text array literal, every element quoted (so "NULL" is text)."""
    quoted = ('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values)
    return ("{" + ",".join(quoted) + "}").encode()


def _settle(batch: list[_Mark], result: float, exc: BaseException | None) -> None:
    """Settle every mark of ``batch`` on its loop, in one hop to it (all share the one loop)."""
    def settle() -> None:
        for mark in batch:
            if mark.future.done():
                continue
            if exc is None:
                mark.future.set_result(result)
            else:
                mark.future.set_exception(exc)
    try:
        batch[0].future.get_loop().call_soon_threadsafe(settle)
    except RuntimeError:
        pass  # the loop is closed: nobody waits for this mark any more


class Ledger:
    """Async access to ``sender_ledger``: claims and releases over one connection, which holds the
    owner's advisory lock, and ``sent`` marks over another; each reopened when it breaks.

    ``claim``, ``mark_sent`` and ``release`` each take one key; calls made at the same time are
    sent to the database as one statement.
    """

    def __init__(self, conninfo: str, owner: str, lease_s: float, schema: str | None = None) -> None:
        self.owner = owner
        self.lease_s = lease_s
        self._claiming = _Session(conninfo, schema, on_open=self._take_owner_lock)
        self._marker = _Marker(conninfo, schema)
        self._claims = _Batcher(self._claim_batch)
        self._released = _Batcher(self._release_batch)

    async def _take_owner_lock(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Hold the owner's lock before this connection claims anything: while it is free,
        other senders may take our claims. A session of ours that the server has not yet noticed
        is gone may still hold it; wait for the server to end that session."""
        params = {"namespace": LOCK_NAMESPACE, "owner": self.owner}
        waited_s = 0.0
        while True:
            row = await (await conn.execute(TAKE_OWNER_LOCK, params)).fetchone()
            if row is not None and row[0]:
                break
            if waited_s % OWNER_LOCK_LOG_EVERY_S == 0:
                log.warning("ledger: owner lock of %s is still held by an older session; waiting "
                            "(%.0fs so far)", self.owner, waited_s)
            await asyncio.sleep(OWNER_LOCK_RETRY_S)
            waited_s += OWNER_LOCK_RETRY_S
        if self._claiming.opened:
            log.warning("ledger: connection reopened and owner lock of %s taken again; claims "
                        "another sender took meanwhile stay its own", self.owner)
        else:
            log.info("ledger: owner lock of %s taken", self.owner)

    async def _run(self, query: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        """One statement on the claims connection (the owner lock held)."""
        return await self._claiming.run(query, params)

    async def claim(self, key: str, attempt: int) -> ClaimResult:
        """MINE (send it now: the lease starts), SENT (never again) or BUSY (someone else is)."""
        return await self._claims.submit((key, attempt))

    async def mark_sent(self, key: str, message_id: str) -> float:
        """Record that a server accepted ``key``, whoever holds its claim now; the
        ``time.monotonic()`` at which the mark's commit returned."""
        return await self._marker.submit(key, message_id)

    async def release(self, key: str) -> None:
        """Give up our claim without a send (the attempt failed); a retry may claim it again."""
        await self._released.submit(key)

    async def _claim_batch(self, items: list[tuple[str, int]]) -> list[ClaimResult]:
        # The same key twice in one statement is an error in PostgreSQL; the later copies
        # wait (BUSY) for the first, as a second sender would.
        first: dict[str, int] = {}
        for key, attempt in items:
            first.setdefault(key, attempt)
        rows = await self._run(CLAIM, {
            "owner": self.owner, "lease_s": self.lease_s, "keys": list(first),
            "attempts": list(first.values()), "namespace": LOCK_NAMESPACE})
        mine = {key for key, _ in rows}
        for key, taken_from in rows:
            if taken_from is not None:
                log.warning("key=%s taken over from %s: its owner's ledger session is gone or "
                            "its lease ran out; sending it (it may arrive twice)", key, taken_from)
        known: dict[str, ClaimResult] = {key: ClaimResult(Claim.MINE, taken_from=taken_from)
                                         for key, taken_from in rows}
        others = [key for key in first if key not in mine]
        if others:
            for key, state, _owner, lease_until, attempt, message_id in await self._run(
                    STATES, {"keys": others}):
                claim = Claim.SENT if state == "sent" else Claim.BUSY
                known[key] = ClaimResult(claim, attempt, message_id, lease_until)
        results: list[ClaimResult] = []
        handed: set[str] = set()
        for key, _ in items:
            result = known.get(key, ClaimResult(Claim.BUSY))
            if result.claim is Claim.MINE and key in handed:
                result = ClaimResult(Claim.BUSY)
            handed.add(key)
            results.append(result)
        return results

    async def _release_batch(self, keys: list[str]) -> list[None]:
        await self._run(RELEASE, {"keys": keys, "owner": self.owner})
        return [None] * len(keys)

    async def close(self) -> None:
        await self._claiming.close()
        await self._marker.close()
