"""The ledger's connections: one autocommit PostgreSQL session that runs one statement at a time
and reopens when it breaks, and the batcher that lets concurrent requests share its round trips."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import psycopg
from psycopg import generators
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from postroom.errors import first_line
from postroom.sender.errors import LedgerUnavailableError

T = TypeVar("T")
R = TypeVar("R")

CONNECT_TIMEOUT_S = 10
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


class Batcher(Generic[T, R]):
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


class Session:
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
                if session_ended(results) or pgconn.status != psycopg.pq.ConnStatus.OK:
                    await conn.close()
                message = (result.error_message or b"").decode(errors="replace")
                raise LedgerUnavailableError(first_of(message, "the statement failed"))
            columns = range(result.nfields)
            return [tuple(result.get_value(row, column) for column in columns)
                    for row in range(result.ntuples)]

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None


def session_ended(results: list[psycopg.pq.abc.PGresult]) -> bool:
    """Whether one of ``results`` is an error that ends the session (FATAL, PANIC)."""
    severity = psycopg.pq.DiagnosticField.SEVERITY_NONLOCALIZED
    return any(r.error_field(severity) in (b"FATAL", b"PANIC") for r in results)


def first_of(message: str, otherwise: str) -> str:
    """The first line of a libpq message, or ``otherwise`` when it has none."""
    return message.strip().partition("\n")[0] or otherwise

