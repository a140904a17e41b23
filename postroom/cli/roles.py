"""The long-running roles: relay, sender, recorder and the bounce intake, each run until
SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol

from postroom import logs
from postroom.cli.common import EXIT_OK, Commands
from postroom.cli.services import ShutdownSignals, service_start
from postroom.settings import Settings
from postroom.tracing import Tracing

if TYPE_CHECKING:  # imported where a command uses them, not at every start
    import sqlalchemy as sa

    from postroom.metrics import Metrics


class _Service(Protocol):
    def run(self) -> None: ...
    def stop(self) -> None: ...


def _run_until_signalled(settings: Settings,
                         make: Callable[[sa.Engine, Metrics], _Service]) -> int:
    """Start a blocking service (relay, recorder) and run it until SIGTERM or SIGINT."""
    signals = ShutdownSignals()
    with service_start(settings) as (engine, metrics):
        service = make(engine, metrics)
        signals.attach(service.stop)
        service.run()
    return EXIT_OK


@contextlib.contextmanager
def _role_tracing(settings: Settings, role: str) -> Iterator[Tracing]:
    """The role's tracing from the OTEL_* variables (off without them; a ConfigError before the
    role waits for anything), its spans exported before the role exits."""
    from postroom import tracing

    logs.set_level(settings.log_level)  # the role's level: it says where its spans go
    made = tracing.setup(role)
    try:
        yield made
    finally:
        made.shutdown()


def cmd_relay(settings: Settings, args: argparse.Namespace) -> int:
    from postroom.relay.publisher import Relay

    with _role_tracing(settings, "relay") as tracing:
        return _run_until_signalled(settings, lambda engine, metrics: Relay(
            settings, engine, metrics=metrics, tracing=tracing))


def cmd_sender(settings: Settings, args: argparse.Namespace) -> int:
    import asyncio

    from postroom.relay.db import libpq_conninfo
    from postroom.sender.claims import lease_s
    from postroom.sender.ledger import Ledger, sender_identity
    from postroom.sender.service import Sender, event_loop_factory

    async def run(ledger: Ledger, metrics: Metrics) -> None:
        sender = Sender.from_settings(settings, ledger=ledger, metrics=metrics,
                                      tracing=tracing)
        loop = asyncio.get_running_loop()

        def stop() -> None:
            loop.call_soon_threadsafe(sender.stop)

        signals.attach(stop)
        await sender.run()

    settings.check_attachments_root()
    signals = ShutdownSignals()
    with _role_tracing(settings, "sender") as tracing, service_start(settings, smtp=True) as (
            engine, metrics):
        ledger = Ledger(libpq_conninfo(engine), sender_identity(), lease_s(settings),
                        settings.database_schema)
        with asyncio.Runner(loop_factory=event_loop_factory(settings.event_loop)) as runner:
            runner.run(run(ledger, metrics))
    return EXIT_OK


def cmd_recorder(settings: Settings, args: argparse.Namespace) -> int:
    from postroom.relay.recorder import Recorder

    with _role_tracing(settings, "recorder") as tracing:
        return _run_until_signalled(settings, lambda engine, metrics: Recorder(
            settings, engine, metrics=metrics, tracing=tracing))


def cmd_bounces(settings: Settings, args: argparse.Namespace) -> int:
    from postroom.bounces.service import BounceIntake, bounce_config

    bounce_config(settings)  # a missing address says so before the waits for the services
    return _run_until_signalled(
        settings, lambda engine, metrics: BounceIntake(settings, engine, metrics=metrics))


def cmd_web(settings: Settings, args: argparse.Namespace) -> int:
    from postroom.errors import PostroomError
    from postroom.web.serve import serve

    try:
        serve(settings)
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] not in _WEB_EXTRA:
            raise
        raise PostroomError(f"the console needs its extra ({exc.name} is missing): "
                            "pip install 'postroom[web]'") from exc
    return EXIT_OK


# What the `web` extra installs (the console imports them when it starts).
_WEB_EXTRA = frozenset({"starlette", "jinja2", "uvicorn", "multipart", "python_multipart",
                        "itsdangerous"})


def add_commands(commands: Commands) -> None:
    """Add `relay`, `sender`, `recorder`, `bounces` and `web`."""
    running = ("Runs until SIGTERM or SIGINT, then stops cleanly. It checks the database schema "
               "and the broker at start and exits with one line if either is not ready "
               "(`postroom check` says which). With POSTROOM_METRICS_PORT set it serves "
               "/metrics, /healthz and /readyz on 127.0.0.1.")
    commands.add_parser(
        "relay", help="publish committed outbox rows to Kafka until stopped",
        description="Publish committed outbox rows to <prefix>email.<priority>, woken by the "
                    "outbox's NOTIFY and polling every POSTROOM_RELAY_POLL_INTERVAL; rows are "
                    "claimed for POSTROOM_RELAY_CLAIM_TTL, so several relays may run. " + running
    ).set_defaults(handler=cmd_relay)
    commands.add_parser(
        "sender", help="deliver email events over SMTP as a member of the sender group",
        description="Consume the priority and retry topics as a member of POSTROOM_SENDER_GROUP, "
                    "deliver each email over SMTP (POSTROOM_SMTP_*), send temporary failures "
                    "through the retry tiers (POSTROOM_RETRY_DELAYS), dead-letter what cannot "
                    "be sent and publish every outcome to the results topic. Run several to "
                    "scale, up to the partition count. " + running
    ).set_defaults(handler=cmd_sender)
    commands.add_parser(
        "recorder", help="write delivery results back into the outbox rows",
        description="Consume the results topic as POSTROOM_RECORDER_GROUP and write each "
                    "outcome (sent, retrying, failed, dead, with the attempt and the last "
                    "error) into its outbox row; results only move a row forward, so reading "
                    "them again changes nothing. " + running
    ).set_defaults(handler=cmd_recorder)
    commands.add_parser(
        "bounces", help="take bounces and complaints (RFC 3464 DSNs, RFC 5965 reports) by SMTP",
        description="Listen on POSTROOM_BOUNCE_LISTEN for the mail the platform's relay routes "
                    "to the bounce domain of POSTROOM_BOUNCE_ADDRESS; each delivery status "
                    "notification or feedback report whose signed return path names an outbox "
                    "row becomes a bounced, delayed or complained result for the recorder. "
                    "Forged, expired or unknown tokens, auto-replies and malformed or huge "
                    "reports are refused and counted; while Kafka or the database is down the "
                    "relay is answered 451 and keeps the report. Sessions past "
                    "POSTROOM_BOUNCE_MAX_SESSIONS, or POSTROOM_BOUNCE_MAX_SESSIONS_PER_CLIENT "
                    "from one address, are answered 421. " + running
    ).set_defaults(handler=cmd_bounces)
    commands.add_parser(
        "web", help="the console for support and operators: search, timelines, reports, "
                    "suppression, dead letters, lag (a browser on POSTROOM_WEB_LISTEN)",
        description="Serve the console on POSTROOM_WEB_LISTEN (127.0.0.1:8480 by default) until "
                    "SIGTERM or SIGINT. It refuses to start without a way to sign in: "
                    "POSTROOM_WEB_OPERATOR_TOKEN_FILE, POSTROOM_WEB_READER_TOKEN_FILE or "
                    "POSTROOM_WEB_TRUSTED_PROXIES (a single-sign-on proxy's X-Forwarded-Email). "
                    "Readers search and read; operators also suppress, replay and requeue, each "
                    "action written to the audit table. Needs the `web` extra."
    ).set_defaults(handler=cmd_web)
