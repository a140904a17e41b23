"""The `postroom bounces` role: an SMTP listener (aiosmtpd sessions, bounces.session) on
POSTROOM_BOUNCE_LISTEN that the platform's mail server routes the bounce domain to, answering as
bounces.intake decides."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import threading
from concurrent.futures import Executor, ThreadPoolExecutor

import sqlalchemy as sa
from aiosmtpd.smtp import SMTP, Envelope, Session

from postroom import kafka
from postroom.bounces.adapters import DatabaseRows, KafkaResults
from postroom.bounces.intake import (
    HELD_REPLY,
    Accepted,
    BounceConfig,
    Intake,
    Results,
    Rows,
)
from postroom.bounces.limits import SessionLimits, report_max_bytes
from postroom.bounces.session import BounceSession
from postroom.errors import ConfigError, PostroomError
from postroom.metrics import Metrics
from postroom.schemas.registry import framing_for
from postroom.settings import Settings, env_name

log = logging.getLogger(__name__)

FATAL_CHECK_EVERY_S = 1.0  # how often an idle intake looks for a fatal results producer
_ACCEPTED = "postroom_accepted"  # the Envelope attribute holding a session's Accepted recipients
# The intake's own workers (never asyncio's shared default executor): reports to a signed return
# path on theirs, mail to the bare address (anyone's; the heuristics' CPU) on its own, so a
# flood at the bare address does not queue ahead of a report about our mail, and takes one CPU
# at most. Each queue is bounded by the sessions: one message per session at a time.
TOKENED_WORKERS = 4
BARE_WORKERS = 1


async def until_stopped(stopping: asyncio.Event) -> None:
    """Until ``stopping`` is set; KafkaFatalError once the results producer is in librdkafka's
    fatal state (it never works again: the intake exits, its supervisor starts it afresh)."""
    while not stopping.is_set():
        kafka.raise_if_fatal()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(FATAL_CHECK_EVERY_S):
                await stopping.wait()


def bounce_config(settings: Settings) -> BounceConfig:
    """The intake's settings; ConfigError when POSTROOM_BOUNCE_ADDRESS is not set."""
    if settings.bounce_address is None:
        raise ConfigError(env_name("bounce_address"), "postroom bounces needs the bounce address "
                          "(bounces@<the bounce domain>) and POSTROOM_BOUNCE_SECRET")
    return BounceConfig(settings.bounce_address, settings.bounce_secrets,
                        dt.timedelta(seconds=settings.bounce_token_max_age_s))


class _Handler:
    """aiosmtpd's hooks; the intake's decisions (the parse, the row's read, the wait for Kafka)
    run on the intake's workers, so one slow report does not hold the other sessions."""

    def __init__(self, intake: Intake, tokened: Executor, bare: Executor) -> None:
        self.intake = intake
        self._tokened = tokened
        self._bare = bare

    async def handle_RCPT(self, server: SMTP, session: Session, envelope: Envelope, address: str,
                          rcpt_options: list[str]) -> str:
        verdict = self.intake.recipient(address)
        if isinstance(verdict, str):
            return verdict
        envelope.rcpt_tos.append(address)
        accepted: list[Accepted] | None = getattr(envelope, _ACCEPTED, None)
        if accepted is None:
            accepted = []
            setattr(envelope, _ACCEPTED, accepted)
        accepted.append(verdict)
        return "250 2.1.5 Ok"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        accepted: list[Accepted] = getattr(envelope, _ACCEPTED, [])
        workers = (self._tokened if any(a.outbox_id is not None for a in accepted)
                   else self._bare)
        return await asyncio.get_running_loop().run_in_executor(
            workers, self.intake.message, accepted, envelope.original_content or b"")

    async def handle_exception(self, error: Exception) -> str:
        # A fault of ours, never the report's: the MTA keeps it and tries again.
        log.error("bounce session failed: %s: %s", type(error).__name__, error)
        return HELD_REPLY


class BounceIntake:
    """Serves POSTROOM_BOUNCE_LISTEN until stop(); run() blocks (on its own event loop)."""

    def __init__(self, settings: Settings, engine: sa.Engine, *, metrics: Metrics | None = None,
                 rows: Rows | None = None, results: Results | None = None) -> None:
        self._settings = settings
        self._config = bounce_config(settings)
        self.metrics = metrics or Metrics()
        self._rows = rows or DatabaseRows(engine)
        self._results = results
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._stop_requested = threading.Event()
        self.listening = threading.Event()  # set once the port is bound (tests wait for it)
        self.port: int | None = None

    def stop(self) -> None:
        """Stop serving; callable from any thread or a signal handler."""
        self._stop_requested.set()
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(stopping.set)
            except RuntimeError:
                pass  # the loop closed meanwhile: it has stopped

    def run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        if self._stop_requested.is_set():
            return
        results = self._results
        kafka_results = None
        if results is None:
            # Built now: a producer setting librdkafka refuses stops the role with one line,
            # rather than failing every report with a 451.
            results = kafka_results = KafkaResults(self._settings, framing_for(self._settings))
            kafka_results.start()
        limits = SessionLimits(self._settings.bounce_max_sessions,
                               self._settings.bounce_max_sessions_per_client)
        size_limit = report_max_bytes(self._settings.size_limits())
        with ThreadPoolExecutor(TOKENED_WORKERS, "bounces-tokened") as tokened, \
                ThreadPoolExecutor(BARE_WORKERS, "bounces-bare") as bare:
            handler = _Handler(Intake(self._config, self._rows, results, self.metrics),
                               tokened, bare)
            try:
                await self._listen(handler, limits, size_limit, self._stopping)
            finally:
                if kafka_results is not None:
                    kafka_results.close()

    async def _listen(self, handler: _Handler, limits: SessionLimits, size_limit: int,
                      stopping: asyncio.Event) -> None:
        host, port = self._settings.bounce_listen
        try:
            server = await asyncio.get_running_loop().create_server(
                lambda: BounceSession(handler, self.metrics, limits, size_limit), host, port)
        except OSError as exc:
            raise PostroomError(f"cannot listen on {host}:{port} "
                                f"({env_name('bounce_listen')}): {exc.strerror or exc}") from exc
        self.port = int(server.sockets[0].getsockname()[1])
        log.info("bounce intake listening on %s:%d for %s (at most %d sessions, %d per client; "
                 "reports up to %d bytes)", host, self.port, self._config.address,
                 limits.max_sessions, limits.max_per_client, size_limit)
        self.listening.set()
        try:
            await until_stopped(stopping)
        finally:
            server.close()
            await server.wait_closed()
            log.info("bounce intake stopped")
