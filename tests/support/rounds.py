"""One relay round as ``run()`` makes it, for tests that count what each round publishes."""

from __future__ import annotations

from postroom.relay.publisher import Relay


def publish_round(relay: Relay) -> int:
    """One :meth:`Rounds.step <relay.publisher.Rounds.step>` of ``relay``, its marks done and any
    rows claimed ahead handed back before it returns: the rows it published."""
    with relay.rounds() as rounds:
        return rounds.step()
