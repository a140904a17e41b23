"""The delivery ledger in PostgreSQL: the sender's guard against sending one idempotency key twice.

Right before talking to SMTP a sender claims the key with a lease, which outlasts the deadline of
one send; after the server's 250 it records the key as sent. A redelivered event (rebalance,
crash, a second sender) finds the key sent and is not mailed again, or finds it leased by another
sender and waits for that sender's answer. The window that remains is between the server's 250
and the commit of ``mark_sent``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import enum
import os
import socket
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import psycopg
from psycopg.conninfo import make_conninfo

from postroom.errors import first_line
from sender.errors import LedgerUnavailableError

CLAIM = """
    INSERT INTO sender_ledger AS l (idempotency_key, state, owner, lease_until, attempt, updated_at)
    SELECT k, 'sending', %(owner)s, now() + make_interval(secs => %(lease_s)s), a, now()
    FROM unnest(%(keys)s::text[], %(attempts)s::int[]) AS t(k, a)
    ON CONFLICT (idempotency_key) DO UPDATE
        SET state = 'sending', owner = excluded.owner, lease_until = excluded.lease_until,
            attempt = excluded.attempt, updated_at = now()
        WHERE l.state = 'released' OR (l.state = 'sending' AND l.lease_until < now())
    RETURNING idempotency_key
"""
STATES = """
    SELECT idempotency_key, state, owner, lease_until, attempt, message_id
    FROM sender_ledger WHERE idempotency_key = ANY(%(keys)s)
"""
# Whoever holds the claim now: a server accepted the key, so no one may send it again.
MARK_SENT = """
    UPDATE sender_ledger AS l
    SET state = 'sent', lease_until = NULL, message_id = t.message_id, updated_at = now()
    FROM unnest(%(keys)s::text[], %(message_ids)s::text[]) AS t(k, message_id)
    WHERE l.idempotency_key = t.k
"""
RELEASE = """
    UPDATE sender_ledger SET state = 'released', lease_until = NULL, updated_at = now()
    WHERE idempotency_key = ANY(%(keys)s) AND owner = %(owner)s AND state = 'sending'
"""


T = TypeVar("T")
R = TypeVar("R")


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


class Ledger:
    """Async access to ``sender_ledger`` over one connection, reopened when it breaks.

    ``claim``, ``mark_sent`` and ``release`` each take one key; calls made at the same time are
    sent to the database as one statement.
    """

    def __init__(self, conninfo: str, owner: str, lease_s: float, schema: str | None = None) -> None:
        self._conninfo = conninfo
        self._schema = schema
        self.owner = owner
        self.lease_s = lease_s
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._lock = asyncio.Lock()
        self._claims = _Batcher(self._claim_batch)
        self._sent = _Batcher(self._mark_sent_batch)
        self._released = _Batcher(self._release_batch)

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            conninfo = self._conninfo
            if self._schema:
                conninfo = make_conninfo(conninfo, options=f"-c search_path={self._schema}")
            self._conn = await psycopg.AsyncConnection.connect(
                conninfo, autocommit=True, connect_timeout=10)
        return self._conn

    async def _run(self, query: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
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

    async def claim(self, key: str, attempt: int) -> ClaimResult:
        """MINE (send it now: the lease starts), SENT (never again) or BUSY (someone else is)."""
        return await self._claims.submit((key, attempt))

    async def mark_sent(self, key: str, message_id: str) -> None:
        """Record that a server accepted ``key``, whoever holds its claim now."""
        await self._sent.submit((key, message_id))

    async def release(self, key: str) -> None:
        """Give up our claim without a send (the attempt failed); a retry may claim it again."""
        await self._released.submit(key)

    async def _claim_batch(self, items: list[tuple[str, int]]) -> list[ClaimResult]:
        # The same key twice in one statement is an error in PostgreSQL; the later copies
        # wait (BUSY) for the first, as a second sender would.
        first: dict[str, int] = {}
        for key, attempt in items:
            first.setdefault(key, attempt)
        mine = {row[0] for row in await self._run(CLAIM, {
            "owner": self.owner, "lease_s": self.lease_s, "keys": list(first),
            "attempts": list(first.values())})}
        known: dict[str, ClaimResult] = {key: ClaimResult(Claim.MINE) for key in mine}
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

    async def _mark_sent_batch(self, items: list[tuple[str, str]]) -> list[None]:
        await self._run(MARK_SENT, {"keys": [k for k, _ in items],
                                    "message_ids": [m for _, m in items]})
        return [None] * len(items)

    async def _release_batch(self, keys: list[str]) -> list[None]:
        await self._run(RELEASE, {"keys": keys, "owner": self.owner})
        return [None] * len(keys)

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None
