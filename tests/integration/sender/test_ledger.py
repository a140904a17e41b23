"""The delivery ledger against the real database: who may send a key, and when."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest
import sqlalchemy as sa

from postroom.settings import Settings
from relay.db import libpq_conninfo
from sender.ledger import Claim, Ledger

pytestmark = pytest.mark.integration


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


def test_an_expired_lease_can_be_taken_over(engine: sa.Engine, db_settings: Settings) -> None:
    async def scenario() -> None:
        crashed = ledger(engine, db_settings, "crashed", lease_s=0.2)
        heir = ledger(engine, db_settings, "heir")
        try:
            assert (await crashed.claim("k", 1)).claim is Claim.MINE
            assert (await heir.claim("k", 1)).claim is Claim.BUSY
            await asyncio.sleep(0.4)
            assert (await heir.claim("k", 1)).claim is Claim.MINE
        finally:
            await crashed.close()
            await heir.close()

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
