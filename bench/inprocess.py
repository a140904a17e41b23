"""The relay and a sender run in the benchmark's own process (threads), against a dev SMTP server
of the benchmark's: for parts that read the sender's own metrics afterwards."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import sqlalchemy as sa

from bench.report import BenchError
from postroom.devkit.devsmtp import DevSmtpServer
from postroom.relay.db import libpq_conninfo, make_engine
from postroom.relay.publisher import Relay
from postroom.sender.claims import lease_s
from postroom.sender.ledger import Ledger, sender_identity
from postroom.sender.service import Sender
from postroom.settings import Settings


def deliver_all(settings: Settings, emails: int, server: DevSmtpServer,
                enqueue: Callable[[sa.Connection], object], timeout_s: float) -> tuple[Sender, float]:
    """Start the relay and a sender, run ``enqueue(conn)`` in one transaction, and wait until
    ``server`` has accepted ``emails`` messages; return the stopped sender (its metrics) and the
    seconds from the enqueue's start to the last acceptance."""
    engine = make_engine(settings)
    relay = Relay(settings, engine)
    sender = Sender.from_settings(settings, ledger=Ledger(
        libpq_conninfo(engine), sender_identity(), lease_s(settings), settings.database_schema))
    loop = asyncio.new_event_loop()
    threads = [threading.Thread(target=relay.run, daemon=True),
               threading.Thread(target=lambda: loop.run_until_complete(sender.run()), daemon=True)]
    for thread in threads:
        thread.start()
    try:
        started = time.monotonic()
        with engine.begin() as conn:
            enqueue(conn)
        deadline = started + timeout_s
        while server.count() < emails:
            if time.monotonic() > deadline:
                raise BenchError(f"only {server.count()} of {emails} delivered in time")
            time.sleep(0.1)
        elapsed = time.monotonic() - started
    finally:
        relay.stop()
        loop.call_soon_threadsafe(sender.stop)
        for thread in threads:
            thread.join(60)
        loop.close()
        engine.dispose()
    return sender, elapsed
