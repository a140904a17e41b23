"""The delivery ledger in PostgreSQL: the sender's guard against sending one idempotency key twice.

Right before talking to SMTP a sender claims the key; after the server's 250 it records the key as
sent. A claim is live while its owner's ledger session holds the owner's advisory lock, which
PostgreSQL drops when the process dies, so another sender may take a dead owner's claims at once;
the lease (longer than one send's deadline) is the fallback for an owner that is alive but stuck.
The ``sent`` marks go over a connection of their own, written the moment the 250 is read and
without waiting for each other (libpq's pipeline mode); each says when its commit was read.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import datetime as dt
import enum
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import psycopg
from psycopg import generators
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
# Prepared once per connection and run by libpq directly, as the mark is: $1 the owner, $2 the
# lease in seconds, $3 the keys and $4 their attempts (as array literals), $5 LOCK_NAMESPACE.
CLAIM = """
    INSERT INTO sender_ledger AS l (idempotency_key, state, owner, lease_until, attempt, updated_at)
    SELECT k, 'sending', $1, now() + make_interval(secs => $2), a, now()
    FROM unnest($3::text[], $4::int[]) AS t(k, a)
    ON CONFLICT (idempotency_key) DO UPDATE
        SET state = 'sending', owner = excluded.owner, lease_until = excluded.lease_until,
            attempt = excluded.attempt, updated_at = now(),
            taken_from = CASE WHEN l.state = 'sending' THEN l.owner END
        WHERE (l.state = 'released'
               OR (l.state = 'sending' AND (
                    l.lease_until < now()
                    OR (l.owner <> excluded.owner AND pg_try_advisory_xact_lock(
                            hashtextextended($5 || ':' || l.owner, 0))))))
          -- An attempt whose outcome went out whole is not made again (a copy of its record).
          AND (l.done_attempt IS NULL OR l.done_attempt < excluded.attempt)
    RETURNING idempotency_key, taken_from
"""
CLAIM_NAME = b"postroom_claim"
PREPARE_CLAIM = f"PREPARE {CLAIM_NAME.decode()} (text, float8, text[], int[], text) AS {CLAIM}"
STATES = """
    SELECT idempotency_key, state, owner, lease_until, attempt, message_id, done_attempt
    FROM sender_ledger WHERE idempotency_key = ANY(%(keys)s)
"""
# Whoever holds the claim now: a server accepted the key, so no one may send it again.
# Prepared once per connection and written by libpq directly ($1 the keys, $2 their Message-IDs,
# as text arrays): psycopg's query conversion and parameter adaptation were most of a mark's CPU.
MARK_SENT = """
    UPDATE sender_ledger AS l
    SET state = 'sent', lease_until = NULL, message_id = t.message_id,
        updated_at = clock_timestamp()
    FROM unnest($1::text[], $2::text[]) AS t(k, message_id)
    WHERE l.idempotency_key = t.k
"""
MARK_SENT_NAME = b"postroom_mark_sent"
# Our claims that waited for their turn long enough to need a fresh lease before their send; a
# key not returned is no longer ours (its lease ran out or our session ended, and another sender
# took it, or a server accepted it meanwhile).
RENEW = """
    UPDATE sender_ledger
    SET lease_until = now() + make_interval(secs => %(lease_s)s), updated_at = now()
    WHERE idempotency_key = ANY(%(keys)s) AND owner = %(owner)s AND state = 'sending'
    RETURNING idempotency_key
"""
# Our claims given up: after an attempt whose outcome is published (its attempt becomes the
# key's done_attempt), or without an attempt (a throttled send, deferred: done NULL). A key given
# twice in one statement is updated once, with its highest attempt (max and GREATEST skip NULLs).
RELEASE = """
    UPDATE sender_ledger AS l
    SET state = 'released', lease_until = NULL, updated_at = now(),
        done_attempt = GREATEST(l.done_attempt, t.done)
    FROM (SELECT k, max(done) AS done
          FROM unnest(%(keys)s::text[], %(dones)s::int[]) AS u(k, done) GROUP BY k) AS t
    WHERE l.idempotency_key = t.k AND l.owner = %(owner)s AND l.state = 'sending'
"""


T = TypeVar("T")
R = TypeVar("R")
log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 10
OWNER_LOCK_RETRY_S = 0.5
OWNER_LOCK_LOG_EVERY_S = 10.0
CLOSE_TIMEOUT_S = 10.0
# Marks written and not yet answered, past which new ones wait to go together in one statement.
# Each mark in flight is a transaction of its own, and the database commits one connection's
# transactions one after another: this many single marks cost at most this many commits of
# waiting, where a slow disk would otherwise queue a whole burst of them one commit at a time.
MARK_IN_FLIGHT = 8
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
    DONE = "done"          # this attempt was made and its outcome published: not again


@dataclasses.dataclass(frozen=True)
class ClaimResult:
    claim: Claim
    attempt: int | None = None
    message_id: str | None = None
    lease_until: dt.datetime | None = None
    taken_from: str | None = None  # MINE by taking over the claim of this owner
    session: int = 0  # the claims session it was taken on (Ledger.session)


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

    async def run_prepared(self, name: bytes, params: list[bytes]) -> list[tuple[bytes | None, ...]]:
        """Statement ``name``, prepared by ``on_open``, with text ``params``; its rows as they
        come (bytes, None for NULL). For the statement run with every claim: psycopg's query
        conversion, parameter adaptation and cursor were most of its CPU."""
        async with self._lock:
            try:
                conn = await self._connection()
            except psycopg.Error as exc:
                raise LedgerUnavailableError(f"cannot connect: {first_line(exc)}") from exc
            pgconn = conn.pgconn
            try:
                pgconn.send_query_prepared(name, params)
                results = await conn.wait(generators.execute(pgconn))
            except psycopg.Error as exc:
                await conn.close()  # the connection failed under the statement
                raise LedgerUnavailableError(first_line(exc)) from exc
            result = results[-1]
            if result.status != psycopg.pq.ExecStatus.TUPLES_OK:
                if _session_ended(results) or pgconn.status != psycopg.pq.ConnStatus.OK:
                    await conn.close()
                message = (result.error_message or b"").decode(errors="replace")
                raise LedgerUnavailableError(_first(message, "the statement failed"))
            columns = range(result.nfields)
            return [tuple(result.get_value(row, column) for column in columns)
                    for row in range(result.ntuples)]

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None


class _Marker:
    """Writes ``sent`` marks over a connection of its own, from the event loop's thread, the moment
    each is started (sender/service.py starts it from the read of the server's 250).

    A mark is the one write whose delay can send an email twice (a crash between the 250 and its
    commit), so it waits for nothing it need not: in libpq's pipeline mode it is written to the
    database while earlier marks are still in flight, each in its own transaction, and never
    queues behind claims, a thread being scheduled, or the loop's next turn. Only past
    MARK_IN_FLIGHT statements in flight do marks wait, to go together in one statement when one
    returns: a database slow to commit (a slow disk) then commits many marks at once rather
    than queueing them one by one. A mark's future holds the ``time.monotonic()`` at which its
    commit was read.
    """

    def __init__(self, conninfo: str, schema: str | None) -> None:
        self._conninfo = ledger_conninfo(conninfo, schema)
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._connecting: asyncio.Task[None] | None = None
        self._waiting: list[_Mark] = []  # not written yet: no connection, or MARK_IN_FLIGHT are
        self._in_flight: collections.deque[list[_Mark]] = collections.deque()  # a statement each
        self._results: list[psycopg.pq.abc.PGresult] = []  # of the oldest statement in flight
        self._flushing = False  # libpq holds output the socket did not take; a writer waits
        self._socket = -1  # the connection's, kept: libpq forgets it when the connection breaks

    def start(self, key: str, message_id: str) -> asyncio.Future[float]:
        """Write the mark now, or as soon as the connection is open."""
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        # Its awaiter may be gone (a shutdown) before a failure comes: not an unretrieved error.
        future.add_done_callback(_retrieve)
        self._waiting.append(_Mark(key, message_id, future))
        self._write()
        return future

    def _write(self) -> None:
        conn = self._conn
        if conn is None:
            if self._connecting is None:
                self._connecting = asyncio.get_running_loop().create_task(self._connect())
            return
        if not self._waiting or len(self._in_flight) >= MARK_IN_FLIGHT:
            return
        batch, self._waiting = self._waiting, []
        self._in_flight.append(batch)
        pgconn = conn.pgconn
        try:
            pgconn.send_query_prepared(MARK_SENT_NAME, [
                text_array([m.key for m in batch]), text_array([m.message_id for m in batch])])
            pgconn.pipeline_sync()
            self._flush(pgconn)
        except psycopg.Error as exc:
            self._broken(first_line(exc))

    def _flush(self, pgconn: psycopg.pq.abc.PGconn) -> None:
        pending = pgconn.flush() == 1
        if pending != self._flushing:
            loop = asyncio.get_running_loop()
            if pending:
                loop.add_writer(self._socket, self._on_writable)
            else:
                loop.remove_writer(self._socket)
            self._flushing = pending

    def _on_writable(self) -> None:
        if self._conn is None:
            return
        try:
            self._flush(self._conn.pgconn)
        except psycopg.Error as exc:
            self._broken(first_line(exc))

    def _on_readable(self) -> None:
        if self._conn is None:
            return
        pgconn = self._conn.pgconn
        try:
            pgconn.consume_input()
            # A statement's results, then None, then its sync's result (as psycopg's own
            # pipeline reads them).
            while not pgconn.is_busy():
                result = pgconn.get_result()
                if result is None:
                    if not self._results:
                        break  # nothing more has arrived
                    results, self._results = self._results, []
                    self._settle(self._in_flight.popleft(), results)
                    if _session_ended(results):  # e.g. pg_terminate_backend: nothing else comes
                        self._broken(_first(pgconn.error_message.decode(errors="replace"),
                                            "the session ended"))
                        return
                elif result.status != psycopg.pq.ExecStatus.PIPELINE_SYNC:
                    self._results.append(result)
        except psycopg.Error as exc:
            self._broken(first_line(exc))
            return
        if pgconn.status != psycopg.pq.ConnStatus.OK:
            self._broken(pgconn.error_message.decode(errors="replace"))
            return
        self._write()  # the marks that waited for room

    @staticmethod
    def _settle(batch: list[_Mark], results: list[psycopg.pq.abc.PGresult]) -> None:
        failed = next((r for r in results if r.status != psycopg.pq.ExecStatus.COMMAND_OK), None)
        if failed is not None:
            message = (failed.error_message or b"").decode(errors="replace")
            _fail(batch, LedgerUnavailableError(_first(message, "the mark failed")))
            return
        committed_at = time.monotonic()
        for mark in batch:
            if not mark.future.done():
                mark.future.set_result(committed_at)

    def _broken(self, why: str) -> None:
        """The connection is gone: the marks in flight fail (the sender writes them again, they
        are idempotent); those not yet written go over the next connection."""
        self._close_connection()
        error = LedgerUnavailableError(_first(why, "the connection broke"))
        while self._in_flight:
            _fail(self._in_flight.popleft(), error)
        self._results = []
        if self._waiting:
            self._write()

    def _close_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        loop = asyncio.get_running_loop()
        loop.remove_reader(self._socket)
        if self._flushing:
            loop.remove_writer(self._socket)
            self._flushing = False
        conn.pgconn.finish()

    async def _connect(self) -> None:
        try:
            conn = await psycopg.AsyncConnection.connect(
                self._conninfo, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
            try:
                await conn.execute(f"PREPARE {MARK_SENT_NAME.decode()} (text[], text[]) "
                                   f"AS {MARK_SENT}")
                conn.pgconn.nonblocking = 1
                conn.pgconn.enter_pipeline_mode()
                self._socket = conn.pgconn.socket
            except BaseException:
                await conn.close()
                raise
        except psycopg.Error as exc:
            waiting, self._waiting = self._waiting, []
            _fail(waiting, LedgerUnavailableError(f"cannot connect: {first_line(exc)}"))
            return
        finally:
            self._connecting = None
        asyncio.get_running_loop().add_reader(self._socket, self._on_readable)
        self._conn = conn
        self._write()

    async def close(self) -> None:
        """Wait (up to CLOSE_TIMEOUT_S) for the marks started, then close; any still unanswered
        fail."""
        if self._connecting is not None:
            self._connecting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._connecting
        if self._conn is not None:
            pending = [m.future for batch in self._in_flight for m in batch]
            pending += [m.future for m in self._waiting]  # written as answers come
            if pending:
                await asyncio.wait(pending, timeout=CLOSE_TIMEOUT_S)
        self._close_connection()
        error = LedgerUnavailableError("the ledger closed before the mark was answered")
        while self._in_flight:
            _fail(self._in_flight.popleft(), error)
        _fail(self._waiting, error)
        self._waiting = []


@dataclasses.dataclass(frozen=True)
class _Mark:
    key: str
    message_id: str
    future: asyncio.Future[float]


def text_array(values: list[str]) -> bytes:
    """``values`` as a PostgreSQL text array literal, every element quoted (so "NULL" is text)."""
    quoted = ('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values)
    return ("{" + ",".join(quoted) + "}").encode()


def _fail(marks: list[_Mark], error: LedgerUnavailableError) -> None:
    """``error`` for every mark of ``marks`` not yet settled."""
    for mark in marks:
        if not mark.future.done():
            mark.future.set_exception(error)


def _session_ended(results: list[psycopg.pq.abc.PGresult]) -> bool:
    """Whether one of ``results`` is an error that ends the session (FATAL, PANIC)."""
    severity = psycopg.pq.DiagnosticField.SEVERITY_NONLOCALIZED
    return any(r.error_field(severity) in (b"FATAL", b"PANIC") for r in results)


def _retrieve(future: asyncio.Future[float]) -> None:
    if not future.cancelled():
        future.exception()


def _first(message: str, otherwise: str) -> str:
    """The first line of a libpq message, or ``otherwise`` when it has none."""
    return message.strip().partition("\n")[0] or otherwise


class Ledger:
    """Async access to ``sender_ledger``: claims, renewals and releases over one connection, which
    holds the owner's advisory lock, and ``sent`` marks over another; each reopened when it breaks.

    ``claim``, ``renew``, ``mark_sent`` and ``release`` each take one key; calls made at the same
    time are sent to the database as one statement.
    """

    def __init__(self, conninfo: str, owner: str, lease_s: float, schema: str | None = None) -> None:
        self.owner = owner
        self.lease_s = lease_s
        self._claiming = _Session(conninfo, schema, on_open=self._open_claims)
        self._claim_params = [owner.encode(), repr(float(lease_s)).encode(), b"", b"",
                              LOCK_NAMESPACE.encode()]
        self._marker = _Marker(conninfo, schema)
        self._claims = _Batcher(self._claim_batch)
        self._released = _Batcher(self._release_batch)
        self._renewed = _Batcher(self._renew_batch)

    async def _open_claims(self, conn: psycopg.AsyncConnection[Any]) -> None:
        await self._take_owner_lock(conn)
        await conn.execute(PREPARE_CLAIM)

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
        """MINE (send it now: the lease starts), SENT (never again), DONE (this attempt was made
        and its outcome published: a copy of its record) or BUSY (someone else is sending)."""
        return await self._claims.submit((key, attempt))

    def start_mark(self, key: str, message_id: str) -> asyncio.Future[float]:
        """Start recording that a server accepted ``key``, whoever holds its claim now, without
        waiting (from a protocol's callback); the future holds the ``time.monotonic()`` at which
        the commit was read, or LedgerUnavailableError."""
        return self._marker.start(key, message_id)

    async def mark_sent(self, key: str, message_id: str) -> float:
        """:meth:`start_mark`, awaited."""
        return await self._marker.start(key, message_id)

    @property
    def session(self) -> int:
        """Which claims session is open (1 for the first): a claim taken on an earlier one may
        have been taken over while that session was gone."""
        return self._claiming.opened

    async def renew(self, key: str) -> bool:
        """Start our claim's lease again from now; False when the key is no longer ours."""
        return await self._renewed.submit(key)

    async def release(self, key: str, done_attempt: int | None = None) -> None:
        """Give up our claim: after ``done_attempt`` failed and its outcome was published (a
        copy of that attempt is then never made again; a later attempt may claim the key), or,
        with None, without an attempt (a deferred send may claim it again)."""
        await self._released.submit((key, done_attempt))

    async def _claim_batch(self, items: list[tuple[str, int]]) -> list[ClaimResult]:
        # The same key twice in one statement is an error in PostgreSQL; the later copies
        # wait (BUSY) for the first, as a second sender would.
        first: dict[str, int] = {}
        for key, attempt in items:
            first.setdefault(key, attempt)
        params = list(self._claim_params)
        params[2] = text_array(list(first))
        params[3] = ("{" + ",".join(map(str, first.values())) + "}").encode()
        rows = [(bytes(key or b"").decode(), None if taken_from is None else taken_from.decode())
                for key, taken_from in await self._claiming.run_prepared(CLAIM_NAME, params)]
        mine = {key for key, _ in rows}
        for key, taken_from in rows:
            if taken_from is not None:
                log.warning("key=%s taken over from %s: its owner's ledger session is gone or "
                            "its lease ran out; sending it (it may arrive twice)", key, taken_from)
        session = self.session
        known: dict[str, ClaimResult] = {
            key: ClaimResult(Claim.MINE, taken_from=taken_from, session=session)
            for key, taken_from in rows}
        others = [key for key in first if key not in mine]
        dones: dict[str, int] = {}
        if others:
            for key, state, _owner, lease_until, attempt, message_id, done in await self._run(
                    STATES, {"keys": others}):
                claim = (Claim.SENT if state == "sent" else
                         Claim.DONE if done is not None and done >= first[key] else Claim.BUSY)
                known[key] = ClaimResult(claim, attempt, message_id, lease_until)
                if done is not None:
                    dones[key] = done
        results: list[ClaimResult] = []
        handed: set[str] = set()
        for key, attempt in items:
            result = known.get(key, ClaimResult(Claim.BUSY))
            if result.claim is Claim.MINE and key in handed:
                result = ClaimResult(Claim.BUSY)
            elif result.claim is Claim.DONE and dones[key] < attempt:
                # DONE was found for the key's first attempt of this batch; a later attempt of
                # it (its next tier's record, read with a copy of the last) is not done: it asks
                # again, alone.
                result = ClaimResult(Claim.BUSY)
            handed.add(key)
            results.append(result)
        return results

    async def _renew_batch(self, keys: list[str]) -> list[bool]:
        rows = await self._run(RENEW, {"keys": keys, "owner": self.owner,
                                       "lease_s": self.lease_s})
        ours = {key for (key,) in rows}
        return [key in ours for key in keys]

    async def _release_batch(self, items: list[tuple[str, int | None]]) -> list[None]:
        await self._run(RELEASE, {"keys": [key for key, _ in items],
                                  "dones": [done for _, done in items], "owner": self.owner})
        return [None] * len(items)

    async def close(self) -> None:
        await self._claiming.close()
        await self._marker.close()
