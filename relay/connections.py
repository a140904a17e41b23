"""The relay's database connections: the claims and marks connections kept across rounds, and the
LISTEN connection that wakes the relay when rows are inserted."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import psycopg
import sqlalchemy as sa

from postroom.errors import first_line
from postroom.relay import sql
from postroom.relay.db import libpq_conninfo

log = logging.getLogger(__name__)


class Connections:
    """The relay's database connections: one for claims, one for marks, each used by one thread
    at a time. They are kept across rounds and run in autocommit, so a claim or a mark is one
    statement and one round trip; per round, pool check-outs with their pings, BEGIN, COMMIT and
    the claim's plan settings cost more than the statements did under load.

    The claims connection's session holds the advisory lock of :attr:`owner`, the key its claims
    carry: when the session ends (the relay killed, the connection cut or closed after a failure),
    any relay's next claim takes the rows it held (relay/sql/publish.py).
    """

    def __init__(self, engine: sa.Engine) -> None:
        self._engine = engine
        self._claims: tuple[sa.Connection, int] | None = None  # and its owner key
        self._marks: sa.Connection | None = None

    def _claims_and_owner(self) -> tuple[sa.Connection, int]:
        if self._claims is None:
            conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            try:
                sql.pin_claim_plan(conn, session=True)
                owner = sql.take_claims_owner(conn)
            except BaseException:
                # Its session may hold the settings or the lock: never back to the pool.
                conn.invalidate()
                conn.close()
                raise
            self._claims = (conn, owner)
        return self._claims

    def claims(self) -> sa.Connection:
        return self._claims_and_owner()[0]

    @property
    def owner(self) -> int:
        """The key the claims connection's claims carry (opening that connection first)."""
        return self._claims_and_owner()[1]

    def marks(self) -> sa.Connection:
        if self._marks is None:
            self._marks = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        return self._marks

    def close(self) -> None:
        """Close both; the next use connects again (after a failure: to a restarted server)."""
        held, marks, self._claims, self._marks = self._claims, self._marks, None, None
        if held is not None:
            claims = held[0]
            # Its session settings and owner lock must not reach the pool's other users; closed,
            # its session ends and its claims are free to every relay.
            claims.invalidate()
            claims.close()
        if marks is not None:
            try:
                marks.close()
            except sa.exc.DBAPIError:
                log.debug("closing the marks connection failed", exc_info=True)


class Listener:
    """The LISTEN connection on the outbox's insert channel; without it the relay polls."""

    def __init__(self, engine: sa.Engine, stop: threading.Event) -> None:
        self._engine = engine
        # The relay's stop event: a wait returns as soon as it is set.
        self._stop = stop
        self._listener: psycopg.Connection[Any] | None = None
        self._schema: str | None = None

    def ensure(self) -> None:
        if self._listener is not None and not self._listener.closed:
            return
        self._listener = psycopg.connect(libpq_conninfo(self._engine), autocommit=True,
                                         connect_timeout=10)
        self._listener.execute(f"LISTEN {sql.NOTIFY_CHANNEL}")
        # Every schema's inserts notify the one channel, naming their schema: a relay wakes for
        # its own (it woke for every schema's in the database). The engine's connections have
        # its search path (the LISTEN connection's conninfo does not); None: it wakes for any.
        with self._engine.connect() as conn:
            self._schema = conn.execute(sa.text("SELECT current_schema()")).scalar()

    def _ours(self, notify: psycopg.Notify) -> bool:
        return self._schema is None or notify.payload == self._schema

    def close(self) -> None:
        if self._listener is not None:
            try:
                self._listener.close()
            except psycopg.Error:
                log.debug("closing the LISTEN connection failed", exc_info=True)
            self._listener = None

    def wait_for_rows(self, timeout_s: float) -> None:
        """Return on the first notification of an insert into this relay's schema, after
        ``timeout_s``, or on stop()."""
        listener = self._listener
        if listener is None:
            self._stop.wait(timeout_s)
            return
        deadline = time.monotonic() + timeout_s
        try:
            # Short slices so stop() is honoured promptly.
            while not self._stop.is_set() and time.monotonic() < deadline:
                slice_s = min(0.25, max(0.0, deadline - time.monotonic()))
                if any(self._ours(n) for n in listener.notifies(timeout=slice_s, stop_after=1)):
                    for _ in listener.notifies(timeout=0):  # drain what piled up meanwhile
                        pass
                    return
        except psycopg.Error as exc:
            log.warning("LISTEN connection lost (%s); polling until it is back", one_line(exc))
            self.close()


def one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {first_line(exc)}"
