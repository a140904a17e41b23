"""The delivery ledger in PostgreSQL: the sender's guard against sending one idempotency key twice.

Right before talking to SMTP a sender claims the key; after the server's 250 it records the key as
sent. A claim is live while its owner's ledger session holds the owner's advisory lock, which
PostgreSQL drops when the process dies, so another sender may take a dead owner's claims at once;
the lease (longer than one send's deadline) is the fallback for an owner that is alive but stuck.
The ``sent`` marks go over a connection of their own (sender/marker.py). The statements are
sender/ledger_sql.py's, what a batch of claims answers sender/claims.py's.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from typing import Any

import psycopg

from postroom.sender.claims import ClaimResult, KeyState, decide_claims, first_attempts
from postroom.sender.ledger_session import Batcher, Session
from postroom.sender.ledger_sql import (
    CLAIM_NAME,
    LOCK_NAMESPACE,
    PREPARE_CLAIM,
    RELEASE,
    RENEW,
    STATES,
    TAKE_OWNER_LOCK,
    int_array,
    text_array,
)
from postroom.sender.marker import Marker

log = logging.getLogger(__name__)

OWNER_LOCK_RETRY_S = 0.5
OWNER_LOCK_LOG_EVERY_S = 10.0


def sender_identity() -> str:
    """Names this process in the ledger and in logs: host, pid and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Ledger:
    """Async access to ``sender_ledger``: claims, renewals and releases over one connection, which
    holds the owner's advisory lock, and ``sent`` marks over another; each reopened when it breaks.

    ``claim``, ``renew``, ``mark_sent`` and ``release`` each take one key; calls made at the same
    time are sent to the database as one statement.
    """

    def __init__(self, conninfo: str, owner: str, lease_s: float, schema: str | None = None) -> None:
        self.owner = owner
        self.lease_s = lease_s
        self._claiming = Session(conninfo, schema, on_open=self._open_claims)
        self._claim_params = [owner.encode(), repr(float(lease_s)).encode(), b"", b"",
                              LOCK_NAMESPACE.encode()]
        self._marker = Marker(conninfo, schema)
        self._claims = Batcher(self._claim_batch)
        self._released = Batcher(self._release_batch)
        self._renewed = Batcher(self._renew_batch)

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
        first = first_attempts(items)
        params = list(self._claim_params)
        params[2] = text_array(list(first))
        params[3] = int_array(list(first.values()))
        taken = {bytes(key or b"").decode(): None if taken_from is None else taken_from.decode()
                 for key, taken_from in await self._claiming.run_prepared(CLAIM_NAME, params)}
        # The session the keys were taken on, read before the next await: a statement between
        # (STATES, or a renewal or release sharing the connection) may reconnect, and a claim
        # stamped with the new session would skip the renewal that finds it taken over.
        session = self.session
        for key, taken_from in taken.items():
            if taken_from is not None:
                log.warning("key=%s taken over from %s: its owner's ledger session is gone or "
                            "its lease ran out; sending it (it may arrive twice)", key, taken_from)
        others = [key for key in first if key not in taken]
        rows = [KeyState(key, state, lease_until, attempt, message_id, done)
                for key, state, _owner, lease_until, attempt, message_id, done
                in (await self._run(STATES, {"keys": others}) if others else [])]
        return decide_claims(items, taken, rows, session)

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
