"""The `postroom bounces` role: an SMTP listener (aiosmtpd) on POSTROOM_BOUNCE_LISTEN that the
platform's mail server routes the bounce domain to, answering as bounces.intake decides."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import threading
from typing import Any

import sqlalchemy as sa
from aiosmtpd.smtp import SMTP, Envelope, Session

from postroom import kafka
from postroom.bounces.adapters import DatabaseRows, KafkaResults
from postroom.bounces.errors import Refusal
from postroom.bounces.intake import (
    HELD_REPLY,
    MAX_REPORT_BYTES,
    Accepted,
    BounceConfig,
    Intake,
    Results,
    Rows,
)
from postroom.errors import ConfigError, PostroomError
from postroom.metrics import BOUNCE_REFUSED_TOTAL, Metrics
from postroom.schemas.registry import framing_for
from postroom.settings import Settings, env_name

log = logging.getLogger(__name__)

# Fixed, so aiosmtpd does no reverse lookup, and never the relay's own name (Postfix refuses a
# next hop that greets with its myhostname as a mail loop).
SERVER_HOSTNAME = "postroom-bounces.invalid"
FATAL_CHECK_EVERY_S = 1.0
SESSION_TIMEOUT_S = 300.0  # RFC 5321 4.5.3.2.7: the server's timeout is at least 5 minutes
_ACCEPTED = "postroom_accepted"  # the Envelope attribute holding a session's Accepted recipients


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
    """aiosmtpd's hooks; the intake's decisions that read the database or wait for Kafka run on
    a worker thread, so one slow report does not hold the other sessions."""

    def __init__(self, intake: Intake) -> None:
        self.intake = intake

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
        return await asyncio.to_thread(self.intake.message, accepted,
                                       envelope.original_content or b"")

    async def handle_exception(self, error: Exception) -> str:
        # A fault of ours, never the report's: the MTA keeps it and tries again.
        log.error("bounce session failed: %s: %s", type(error).__name__, error)
        return HELD_REPLY


class _Session(SMTP):
    """aiosmtpd's session, counting what it refuses by itself: a report over the size limit."""

    def __init__(self, handler: _Handler, metrics: Metrics) -> None:
        # SMTPUTF8: the DSN of an email to a UTF-8 address needs it, or the MTA cannot send it.
        super().__init__(handler, data_size_limit=MAX_REPORT_BYTES, hostname=SERVER_HOSTNAME,
                         ident="postroom bounces", timeout=SESSION_TIMEOUT_S,
                         enable_SMTPUTF8=True)
        self._metrics = metrics

    async def push(self, status: Any) -> None:
        if (status.encode() if isinstance(status, str) else bytes(status)).startswith(b"552"):
            self._metrics.inc(BOUNCE_REFUSED_TOTAL, reason=Refusal.TOO_LARGE.value)
            log.warning("bounce refused (%s): over %d bytes", Refusal.TOO_LARGE.value,
                        MAX_REPORT_BYTES)
        await super().push(status)


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
            results = kafka_results = KafkaResults(self._settings, framing_for(self._settings))
        handler = _Handler(Intake(self._config, self._rows, results, self.metrics))
        host, port = self._settings.bounce_listen
        try:
            server = await self._loop.create_server(lambda: _Session(handler, self.metrics),
                                                    host, port)
        except OSError as exc:
            raise PostroomError(f"cannot listen on {host}:{port} "
                                f"({env_name('bounce_listen')}): {exc.strerror or exc}") from exc
        self.port = int(server.sockets[0].getsockname()[1])
        log.info("bounce intake listening on %s:%d for %s", host, self.port, self._config.address)
        self.listening.set()
        try:
            await until_stopped(self._stopping)
        finally:
            server.close()
            await server.wait_closed()
            if kafka_results is not None:
                kafka_results.close()
            log.info("bounce intake stopped")
