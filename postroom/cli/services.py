"""What a long-running command needs first: signals caught from the start, the database, broker
and topics waited for, and metrics with /healthz and /readyz."""

from __future__ import annotations

import contextlib
import logging
import signal
from collections.abc import Callable, Iterator
from types import FrameType

import sqlalchemy as sa

from postroom import logs
from postroom.metrics import Metrics
from postroom.settings import Settings

log = logging.getLogger("postroom")


class ShutdownSignals:
    """SIGTERM and SIGINT, caught from the start of a long-running command: a signal before the
    service exists (while it connects) stops it as soon as it is attached, instead of killing
    the process half set up. A second signal interrupts hard."""

    def __init__(self) -> None:
        self._callback: Callable[[], None] | None = None
        self.received: str | None = None
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self.received = signal.Signals(signum).name
        log.info("received %s, stopping cleanly", self.received)
        signal.signal(signum, signal.SIG_DFL)
        if self._callback is not None:
            self._callback()

    def attach(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` on the next signal, or now if one came already."""
        self._callback = callback
        if self.received is not None:
            callback()


@contextlib.contextmanager
def service_start(settings: Settings, *, smtp: bool = False) -> Iterator[tuple[sa.Engine, Metrics]]:
    """What every long-running command needs first: a migrated database, a reachable broker,
    and metrics with /healthz and /readyz (served when POSTROOM_METRICS_PORT is set)."""
    from postroom.kafka import check_reachable, require_topics
    from relay.db import check_schema_at_start, make_engine

    logs.set_level(settings.log_level)
    engine = make_engine(settings)
    # Ctrl-C while the role waits for its database, broker and topics stops it at once (main
    # says "interrupted"); ShutdownSignals takes it back for the clean stop once they answer.
    waiting = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        check_schema_at_start(engine)
        check_reachable(settings)
        require_topics(settings)
    finally:
        signal.signal(signal.SIGINT, waiting)
    try:
        with service_metrics(settings, smtp=smtp) as metrics:
            yield engine, metrics
    finally:
        engine.dispose()


@contextlib.contextmanager
def service_metrics(settings: Settings, *, smtp: bool = False) -> Iterator[Metrics]:
    """A role's metrics, served with /healthz and /readyz when POSTROOM_METRICS_PORT is set.
    Ready means: the database at the newest revision (when configured), the broker with every
    topic, and for the sender (``smtp``) the SMTP server."""
    from postroom.health import Check, Readiness, serve
    from postroom.kafka import check_topics

    metrics = Metrics(process=True)
    if not settings.metrics_port:
        yield metrics
        return
    checks: list[Check] = [("kafka", lambda: check_topics(settings))]
    if settings.database_url:
        from relay.db import check_database

        checks.insert(0, ("database", lambda: check_database(settings)))
    if smtp:
        from sender.smtp import check_smtp

        checks.append(("smtp", lambda: check_smtp(settings)))
    server = serve(metrics, settings.metrics_port, readiness=Readiness(checks, metrics))
    try:
        yield metrics
    finally:
        server.shutdown()
