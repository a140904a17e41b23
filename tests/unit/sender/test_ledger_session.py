"""The ledger's claim batch over a fake claims connection: a claim carries the session its key
was taken on, even when the connection is opened again before the batch's answer is made."""

from __future__ import annotations

import asyncio
from typing import Any

from postroom.sender.claims import Claim, needs_renewal
from postroom.sender.ledger import Ledger


class ReconnectingSession:
    """The claim statement takes k1 on session 1; the connection then breaks and the STATES
    statement for k2 runs on session 2."""

    def __init__(self) -> None:
        self.opened = 1

    async def run_prepared(self, name: str, params: list[Any]) -> list[tuple[bytes, None]]:
        return [(b"k1", None)]

    async def run(self, query: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        self.opened = 2
        return [("k2", "sent", "other", None, 1, "<m@x>", None)]


def test_a_claim_keeps_the_session_it_was_taken_on_when_the_next_statement_reconnects() -> None:
    async def main() -> tuple[Any, Any, int]:
        ledger = Ledger("postgresql://unused", "me", 30.0)
        ledger._claiming = ReconnectingSession()  # type: ignore[assignment]
        mine, sent = await asyncio.gather(ledger.claim("k1", 1), ledger.claim("k2", 1))
        return mine, sent, ledger.session

    mine, sent, now = asyncio.run(main())
    assert (mine.claim, sent.claim) == (Claim.MINE, Claim.SENT)
    assert (mine.session, now) == (1, 2)
    # So the attempt renews it before its send, and finds it lost if another sender took it.
    assert needs_renewal(0.1, mine.session == now)
