"""The delivery ledger in PostgreSQL: the sender's guard against sending one idempotency key twice.

Before talking to SMTP, a sender claims the key with a lease; after the server's 250 it records the
key as sent. A redelivered event (rebalance, crash, a second sender) finds the key sent and is not
mailed again, or finds it leased by another sender and waits for that sender's answer. The window
that remains is between the server's 250 and the commit of ``mark_sent``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import enum
from collections.abc import Sequence
from typing import Any

import psycopg

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
MARK_SENT = """
    UPDATE sender_ledger AS l
    SET state = 'sent', lease_until = NULL, message_id = t.message_id, updated_at = now()
    FROM unnest(%(keys)s::text[], %(message_ids)s::text[]) AS t(k, message_id)
    WHERE l.idempotency_key = t.k AND l.owner = %(owner)s
"""
RELEASE = """
    UPDATE sender_ledger SET state = 'released', lease_until = NULL, updated_at = now()
    WHERE idempotency_key = ANY(%(keys)s) AND owner = %(owner)s AND state = 'sending'
"""


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


class Ledger:
    """Async access to ``sender_ledger`` over one connection, reopened when it breaks."""

    def __init__(self, conninfo: str, owner: str, lease_s: float, schema: str | None = None) -> None:
        self._conninfo = conninfo
        self._schema = schema
        self.owner = owner
        self.lease_s = lease_s
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._lock = asyncio.Lock()

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            options = f"-c search_path={self._schema}" if self._schema else ""
            self._conn = await psycopg.AsyncConnection.connect(
                self._conninfo, autocommit=True, connect_timeout=10, options=options)
        return self._conn

    async def _run(self, query: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        async with self._lock:
            conn = await self._connection()
            try:
                cursor = await conn.execute(query, params)
                return await cursor.fetchall() if cursor.description else []
            except psycopg.OperationalError:
                await conn.close()
                raise

    async def claim(self, keys: Sequence[str], attempts: Sequence[int]) -> dict[str, ClaimResult]:
        """Claim every key at once; each comes back MINE, SENT or BUSY."""
        if not keys:
            return {}
        mine = {row[0] for row in await self._run(CLAIM, {
            "owner": self.owner, "lease_s": self.lease_s, "keys": list(keys),
            "attempts": list(attempts)})}
        result = {key: ClaimResult(Claim.MINE) for key in mine}
        others = [key for key in keys if key not in mine]
        if others:
            for key, state, _owner, lease_until, attempt, message_id in await self._run(
                    STATES, {"keys": others}):
                claim = Claim.SENT if state == "sent" else Claim.BUSY
                result[key] = ClaimResult(claim, attempt, message_id, lease_until)
        return result

    async def mark_sent(self, keys: Sequence[str], message_ids: Sequence[str]) -> None:
        if keys:
            await self._run(MARK_SENT, {"keys": list(keys), "message_ids": list(message_ids),
                                        "owner": self.owner})

    async def release(self, keys: Sequence[str]) -> None:
        if keys:
            await self._run(RELEASE, {"keys": list(keys), "owner": self.owner})

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None
