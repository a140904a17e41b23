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
from relay import sql
from relay.db import libpq_conninfo

log = logging.getLogger(__name__)


class Connections:
    """The relay's database connections: one for claims, one for marks, each used by one thread
    at a time. They are kept across rounds and run in autocommit, so a claim or a mark is one
    statement and one round trip; per round, pool check-outs with their pings, BEGIN, COMMIT and
    the claim's plan settings cost more than the statements did under load.
    """

    def __init__(self, engine: sa.Engine) -> None:
        self._engine = engine
        self._claims: sa.Connection | None = None
        self._marks: sa.Connection | None = None

    def claims(self) -> sa.Connection:
        if self._claims is None:
            conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            sql.pin_claim_plan(conn, session=True)
            self._claims = conn
        return self._claims

    def marks(self) -> sa.Connection:
        if self._marks is None:
            self._marks = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        return self._marks

    def close(self) -> None:
        """Close both; the next use connects again (after a failure: to a restarted server)."""
        claims, marks, self._claims, self._marks = self._claims, self._marks, None, None
        if claims is not None:
            # Its session settings must not reach the pool's other users.
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

    def ensure(self) -> None:
        if self._listener is not None and not self._listener.closed:
            return
        self._listener = psycopg.connect(libpq_conninfo(self._engine), autocommit=True,
                                         connect_timeout=10)
        self._listener.execute(f"LISTEN {sql.NOTIFY_CHANNEL}")

    def close(self) -> None:
        if self._listener is not None:
            try:
                self._listener.close()
            except psycopg.Error:
                log.debug("closing the LISTEN connection failed", exc_info=True)
            self._listener = None

    def wait_for_rows(self, timeout_s: float) -> None:
        """Return on the first insert notification, after ``timeout_s``, or on stop()."""
        listener = self._listener
        if listener is None:
            self._stop.wait(timeout_s)
            return
        deadline = time.monotonic() + timeout_s
        try:
            # Short slices so stop() is honoured promptly.
            while not self._stop.is_set() and time.monotonic() < deadline:
                slice_s = min(0.25, max(0.0, deadline - time.monotonic()))
                if any(True for _ in listener.notifies(timeout=slice_s, stop_after=1)):
                    for _ in listener.notifies(timeout=0):  # drain what piled up meanwhile
                        pass
                    return
        except psycopg.Error as exc:
            log.warning("LISTEN connection lost (%s); polling until it is back", one_line(exc))
            self.close()


def one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {first_line(exc)}"
