"""Looking at a running deployment: `check` (is every dependency ready) and `lag` (how far
the consumer groups and the outbox are behind)."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from postroom.acls import Role
from postroom.cli.common import EXIT_FAILURE, EXIT_OK, Commands, migrated_engine
from postroom.cli.services import ShutdownSignals, service_metrics
from postroom.errors import PostroomError, first_line
from postroom.settings import Settings

if TYPE_CHECKING:  # imported where a command uses the database, not at every start
    import sqlalchemy as sa


def cmd_check(settings: Settings, args: argparse.Namespace) -> int:
    """Each dependency in turn; the exit code is 0 only when every one is ready."""
    from sqlalchemy import exc as sa_errors

    from postroom.kafka import KafkaDegraded, check_groups, check_kafka
    from postroom.relay.db import check_database
    from postroom.schemas.registry import check_registry
    from postroom.sender.delivery import AttachmentsOffWarning, check_attachments
    from postroom.sender.smtp import check_smtp

    role = Role(args.role) if args.role else None

    def kafka(settings: Settings) -> str:
        return check_kafka(settings, role)

    def groups(settings: Settings) -> str:
        return check_groups(settings, role)

    failed = 0
    kafka_failed = False
    # The groups' protocol is asked of the brokers: not when they do not answer.
    joins = (("groups", groups),) if role in (None, Role.SENDER, Role.RECORDER) else ()
    # Only the sender talks to the SMTP server and reads attachments.
    sender = (("smtp", check_smtp), ("attachments", check_attachments)) \
        if role in (None, Role.SENDER) else ()
    for name, check in (("database", check_database), ("kafka", kafka), *joins,
                        ("registry", check_registry), *sender):
        if name == "groups" and kafka_failed:
            continue
        try:
            print(f"ok    {name}: {check(settings)}")
        except (AttachmentsOffWarning, KafkaDegraded) as exc:  # said, and not a failure
            print(f"WARN  {name}: {exc}")
        # Any database error, a grant missing as much as a server gone: said, and the rest run.
        except (PostroomError, sa_errors.DBAPIError) as exc:
            failed += 1
            kafka_failed = kafka_failed or name == "kafka"
            # Our own errors may list one problem per line (the kafka check, per topic).
            print(f"FAIL  {name}: {exc if isinstance(exc, PostroomError) else first_line(exc)}")
    return EXIT_FAILURE if failed else EXIT_OK


WATCH_MAX_S = 86_400.0


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text[:40]!r}") from None
    # nan passes every comparison but ==, and made `lag --watch nan` a busy loop.
    if not 0 < value <= WATCH_MAX_S:
        raise argparse.ArgumentTypeError(
            f"must be more than 0 and at most {WATCH_MAX_S:g} seconds, got {text[:40]!r}")
    return value


def cmd_lag(settings: Settings, args: argparse.Namespace) -> int:
    import threading

    from postroom import lag

    groups = lag.postroom_groups(settings, args.group)
    with contextlib.ExitStack() as cleanup:
        outbox: Callable[[], lag.OutboxBacklog] | None = None
        if settings.database_url:
            from postroom.relay.sql import outbox_backlog

            engine = cleanup.enter_context(migrated_engine(settings))

            def outbox(engine: sa.Engine = engine) -> lag.OutboxBacklog:
                with engine.connect() as conn:
                    return lag.OutboxBacklog(*outbox_backlog(conn))

        roles = {settings.sender_group: "sender", settings.recorder_group: "recorder"}

        def show(report: lag.LagReport) -> None:
            lines = lag.render_json(report) if args.json else lag.render_text(report, roles)
            if args.watch is not None and not args.json:
                # Each sample's table under the time it was taken, so a scrolled log reads back.
                now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
                lines = [f"-- {now} --", *lines]
            print("\n".join(lines), flush=True)

        reader = lag.LagReader(settings, groups)
        cleanup.callback(reader.close)  # closed before the engine is disposed
        if args.watch is None:
            show(lag.read_report(reader, outbox, samples=lag.ONE_SHOT_SAMPLES))
            return EXIT_OK
        with service_metrics(settings) as metrics:
            stop = threading.Event()
            ShutdownSignals().attach(stop.set)

            def on_report(report: lag.LagReport) -> None:
                lag.export(metrics, report, settings.kafka_cluster_name)
                show(report)
            print(f"sampling every {args.watch:g}s until stopped (Ctrl-C)", file=sys.stderr)
            lag.watch(reader, outbox, args.watch, stop, on_report)
        return EXIT_OK


def add_commands(commands: Commands) -> None:
    """Add `check` and `lag`."""
    check = commands.add_parser(
        "check", help="is everything ready? database schema, broker and topics (and their "
                      "partitions' replication: WARN under-replicated, FAIL offline or below "
                      "min.insync.replicas), the schema registry's subjects (when one is set), "
                      "SMTP server (exit code 0 when all are)")
    check.add_argument("--role", choices=[r.value for r in Role],
                       help="check what this role uses (the SMTP server and the attachments "
                            "root for the sender only) and that this client's principal may do "
                            "on each topic what the role needs (its ACLs, see `postroom acls`)")
    check.set_defaults(handler=cmd_check)
    lag = commands.add_parser(
        "lag", help="consumer-group lag of the sender and the recorder, in records and seconds, "
                    "with a Burrow-style verdict; the outbox backlog")
    lag.add_argument("--group", metavar="G", help="only this group (the sender's or the recorder's)")
    lag.add_argument("--json", action="store_true",
                     help="one JSON object per partition, then one for the outbox backlog")
    lag.add_argument("--watch", type=_positive_seconds, metavar="SECONDS",
                     help="sample every SECONDS (at most 86400) until stopped, each table "
                          "under its time, with a window of the last 10 samples for the "
                          "verdict; serves the lag metrics on POSTROOM_METRICS_PORT when set")
    lag.set_defaults(handler=cmd_lag)
