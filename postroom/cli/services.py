"""What a long-running command needs first: signals caught from the start, the database, broker
and topics waited for, and metrics with /healthz and /readyz."""

from __future__ import annotations

import contextlib
import errno
import gc
import logging
import signal
from collections.abc import Callable, Iterator
from types import FrameType
from typing import TYPE_CHECKING

from postroom import logs
from postroom.errors import ConfigError
from postroom.settings import Settings

if TYPE_CHECKING:  # imported where a command uses them, not at every start
    import sqlalchemy as sa

    from postroom.metrics import Metrics

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
    from postroom.relay.db import check_schema_at_start, make_engine

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
    log.debug("startup objects left out of the collector's passes: %d", tune_collector())
    try:
        with service_metrics(settings, smtp=smtp) as metrics:
            yield engine, metrics
    finally:
        engine.dispose()


# A young pass of the cyclic collector once this many more containers (dicts, lists, objects)
# live than at the last pass, not CPython's 700. With CPython's defaults the sender ran about 85
# young and 8 middle passes per 1,000 emails on smtp-sink and 8 full ones a run, 450-500 ms of
# passes in a 10,000-email run; with tune_collector 125-180 ms, most of it before the role froze its start.
# The sender's RSS stayed at 93 MiB; its CPU per email moved less than the machine's noise.
# (bench.delivery.run_postroom, 10,000 emails, four runs each, gc.callbacks timing every pass,
# 6 December.)
YOUNG_PASS_EVERY = 10_000


def tune_collector() -> int:
    """Collect once, then leave every object the role has made so far (its modules, classes,
    settings, engine: about 84,000 in the sender) out of the cyclic collector's later passes,
    and run young passes every YOUNG_PASS_EVERY containers; return how many objects are left
    out. A full pass walked them all with the event loop stopped: 50-220 ms every 20-40 s in
    the sender under `python -m bench latency`, 38 ms at most once frozen (6 December).
    What the running role makes is collected as before."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_PASS_EVERY, older, oldest)
    return gc.get_freeze_count()


@contextlib.contextmanager
def service_metrics(settings: Settings, *, smtp: bool = False) -> Iterator[Metrics]:
    """A role's metrics, served with /healthz and /readyz when POSTROOM_METRICS_PORT is set.
    Ready means: no Kafka client of the role in its fatal state (checked at every probe), the
    database at the newest revision (when configured), the broker with every topic, and for
    the sender (``smtp``) the SMTP server."""
    from postroom.health import Check, Readiness, serve
    from postroom.kafka import check_topics, fatal_check
    from postroom.metrics import Metrics  # prometheus_client: the roles', not every command's

    metrics = Metrics(process=True)
    if settings.metrics_port is None:
        yield metrics
        return
    checks: list[Check] = [("kafka", lambda: check_topics(settings))]
    if settings.database_url:
        from postroom.relay.db import check_database

        checks.insert(0, ("database", lambda: check_database(settings)))
    if smtp:
        from postroom.sender.smtp import check_smtp

        checks.append(("smtp", lambda: check_smtp(settings)))
    try:
        server = serve(metrics, settings.metrics_port, readiness=Readiness(
            checks, metrics, live=[("kafka clients", fatal_check)]))
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise ConfigError("POSTROOM_METRICS_PORT",
                              f"cannot listen on 127.0.0.1:{settings.metrics_port}: "
                              f"{exc.strerror}") from exc
        raise ConfigError("POSTROOM_METRICS_PORT",
                          f"127.0.0.1:{settings.metrics_port} is taken (another postroom process "
                          "on this host?): give each process a port of its own, or 0 for any "
                          "free one") from exc
    try:
        yield metrics
    finally:
        server.shutdown()
