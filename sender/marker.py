"""The ledger's ``sent`` marks, written over a PostgreSQL connection of their own in libpq's
pipeline mode the moment a server's 250 is read, each in its own transaction."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import time
from typing import Any

import psycopg

from postroom.errors import first_line
from postroom.sender.errors import LedgerUnavailableError
from postroom.sender.ledger_session import CONNECT_TIMEOUT_S, first_of, ledger_conninfo, session_ended
from postroom.sender.ledger_sql import MARK_SENT_NAME, PREPARE_MARK_SENT, text_array

CLOSE_TIMEOUT_S = 10.0
# Marks written and not yet answered, past which new ones wait to go together in one statement.
# Each mark in flight is a transaction of its own, and the database commits one connection's
# transactions one after another: this many single marks cost at most this many commits of
# waiting, where a slow disk would otherwise queue a whole burst of them one commit at a time.
MARK_IN_FLIGHT = 8


class Marker:
    """Writes ``sent`` marks over a connection of its own, from the event loop's thread, the moment
    each is started (sender/attempt.py starts it from the read of the server's 250).

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
        self._waiting: list[Mark] = []  # not written yet: no connection, or MARK_IN_FLIGHT are
        self._in_flight: collections.deque[list[Mark]] = collections.deque()  # a statement each
        self._results: list[psycopg.pq.abc.PGresult] = []  # of the oldest statement in flight
        self._flushing = False  # libpq holds output the socket did not take; a writer waits
        self._socket = -1  # the connection's, kept: libpq forgets it when the connection breaks

    def start(self, key: str, message_id: str) -> asyncio.Future[float]:
        """Write the mark now, or as soon as the connection is open."""
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        # Its awaiter may be gone (a shutdown) before a failure comes: not an unretrieved error.
        future.add_done_callback(_retrieve)
        self._waiting.append(Mark(key, message_id, future))
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
            self._broken(refused(pgconn, exc))

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
        pgconn = self._conn.pgconn
        try:
            self._flush(pgconn)
        except psycopg.Error as exc:
            self._broken(refused(pgconn, exc))

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
                    if session_ended(results):  # e.g. pg_terminate_backend: nothing else comes
                        self._broken(first_of(pgconn.error_message.decode(errors="replace"),
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
    def _settle(batch: list[Mark], results: list[psycopg.pq.abc.PGresult]) -> None:
        failed = next((r for r in results if r.status != psycopg.pq.ExecStatus.COMMAND_OK), None)
        if failed is not None:
            message = (failed.error_message or b"").decode(errors="replace")
            _fail(batch, LedgerUnavailableError(first_of(message, "the mark failed")))
            return
        committed_at = time.monotonic()
        for mark in batch:
            if not mark.future.done():
                mark.future.set_result(committed_at)

    def _broken(self, why: str) -> None:
        """The connection is gone: the marks in flight fail (the sender writes them again, they
        are idempotent); those not yet written go over the next connection."""
        self._close_connection()
        error = LedgerUnavailableError(first_of(why, "the connection broke"))
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
                await conn.execute(PREPARE_MARK_SENT)
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
class Mark:
    key: str
    message_id: str
    future: asyncio.Future[float]


def _fail(marks: list[Mark], error: LedgerUnavailableError) -> None:
    """``error`` for every mark of ``marks`` not yet settled."""
    for mark in marks:
        if not mark.future.done():
            mark.future.set_exception(error)


def refused(pgconn: psycopg.pq.abc.PGconn, exc: psycopg.Error) -> str:
    """Why libpq refused to send: its connection's own message when it has one. psycopg words a
    refused pipeline sync "connection not in pipeline mode" whatever libpq's reason (a connection
    lost under a PostgreSQL restart, say)."""
    return first_of(pgconn.error_message.decode(errors="replace"), first_line(exc))


def _retrieve(future: asyncio.Future[float]) -> None:
    if not future.cancelled():
        future.exception()

