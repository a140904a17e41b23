"""The `postroom` command: parses arguments and calls the components. Holds no logic of its own."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy import exc as sa_errors

from postroom import __version__, logs
from postroom.acls import DEFAULT_PRINCIPAL_PREFIX, Acl, Role, parse_principal_prefix
from postroom.errors import ConfigError, PostroomError, first_line
from postroom.metrics import Metrics
from postroom.settings import FIELDS, Settings
from postroom.topics import Priority
from postroom.tracing import Tracing
from schemas.registry import COMPATIBILITY_LEVELS

log = logging.getLogger("postroom")

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports it


def configure_logging(level: str) -> None:
    # A command prints its result, no INFO line beside it; a role logs at `level` once it starts
    # (service_start).
    logs.configure_logging(logs.command_level(level))


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


def _iso_datetime(text: str) -> dt.datetime:
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time: {text!r}") from None
    if value.tzinfo is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} has no timezone; add one, e.g. {text}+00:00")
    try:
        value.astimezone(dt.UTC)
    except OverflowError:  # 0001-01-01T00:00+14:00 is in year 0 in UTC
        raise argparse.ArgumentTypeError(f"{text!r} is out of range in UTC") from None
    return value


STATUS_MAX_LIMIT = 1_000_000  # a table longer than this is for `--key K --json`


def _status_limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text[:40]!r}") from None
    if not 1 <= value <= STATUS_MAX_LIMIT:
        raise argparse.ArgumentTypeError(
            f"must be from 1 to {STATUS_MAX_LIMIT}, got {text[:40]!r}")
    return value


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


def cmd_db_upgrade(settings: Settings, args: argparse.Namespace) -> int:
    from relay.db import make_engine, upgrade

    engine = make_engine(settings)
    revision = upgrade(engine, settings.database_schema)
    print(f"outbox schema is at revision {revision}")
    return EXIT_OK


def cmd_topics_create(settings: Settings, args: argparse.Namespace) -> int:
    from postroom.kafka import create_topics

    print(f"creating topics with prefix {settings.topic_prefix!r} on "
          f"{settings.kafka_bootstrap_servers} ...", file=sys.stderr)
    for name, state in create_topics(settings).items():
        print(f"{state:8} {name}")
    return EXIT_OK


def _principal_prefix(text: str) -> str:
    try:
        return parse_principal_prefix(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _role_acls(settings: Settings, args: argparse.Namespace) -> list[Acl]:
    from postroom.acls import role_acls

    return role_acls(settings.topic_prefix, sender_group=settings.sender_group,
                     recorder_group=settings.recorder_group,
                     principal_prefix=args.principal_prefix,
                     idempotent_write=args.idempotent_write)


def cmd_acls(settings: Settings, args: argparse.Namespace) -> int:
    from postroom.acls import as_json_lines, as_kafka_acls, as_table

    acls = _role_acls(settings, args)
    if args.action == "apply":
        from postroom.kafka import apply_acls

        print(f"applying {len(acls)} ACLs for topic prefix {settings.topic_prefix!r} on "
              f"{settings.kafka_bootstrap_servers} ...", file=sys.stderr)
        for acl, state in apply_acls(settings, acls):
            print(f"{state:8} {acl.principal} {acl.operation.value} {acl.resource.value} "
                  f"{acl.pattern.value} {acl.name}")
        return EXIT_OK
    render = {"table": as_table, "kafka-acls": as_kafka_acls, "json": as_json_lines}
    print(render[args.format](acls))
    return EXIT_OK


def cmd_enqueue(settings: Settings, args: argparse.Namespace) -> int:
    from relay.db import check_schema, make_engine
    from relay.outbox import enqueue

    body = args.body if args.body is not None else _read_body(args.body_file)
    html = _read_body(args.html_file, "--html-file") if args.html_file is not None else None
    engine = make_engine(settings)
    check_schema(engine)
    with engine.begin() as conn:
        queued = enqueue(conn, key=args.key, recipients=args.to, subject=args.subject, body=body,
                         attachments=args.attach, priority=args.priority,
                         send_after=args.send_after, sender=args.sender,
                         limits=settings.size_limits(), html=html, inline=args.inline)
    if args.json:
        print(json.dumps({"queued": queued, "recipients": len(args.to),
                          "key": args.key if args.key is not None else args.subject}))
    else:
        print(f"queued {queued} new of {len(args.to)} recipient(s)")
    return EXIT_OK


def _read_body(path: Path, option: str = "--body-file") -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PostroomError(f"cannot read {option} {path}: {exc}") from exc


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
    from relay.publisher import Relay

    with _role_tracing(settings, "relay") as tracing:
        return _run_until_signalled(settings, lambda engine, metrics: Relay(
            settings, engine, metrics=metrics, tracing=tracing))


def cmd_sender(settings: Settings, args: argparse.Namespace) -> int:
    import asyncio

    from relay.db import libpq_conninfo
    from sender.claims import lease_s
    from sender.ledger import Ledger, sender_identity
    from sender.service import Sender, event_loop_factory

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
    from relay.recorder import Recorder

    with _role_tracing(settings, "recorder") as tracing:
        return _run_until_signalled(settings, lambda engine, metrics: Recorder(
            settings, engine, metrics=metrics, tracing=tracing))



def cmd_bounces(settings: Settings, args: argparse.Namespace) -> int:
    from bounces.service import BounceIntake, bounce_config

    bounce_config(settings)  # a missing address says so before the waits for the services
    return _run_until_signalled(
        settings, lambda engine, metrics: BounceIntake(settings, engine, metrics=metrics))


def cmd_check(settings: Settings, args: argparse.Namespace) -> int:
    """Each dependency in turn; the exit code is 0 only when every one is ready."""
    from postroom.kafka import KafkaDegraded, check_kafka
    from relay.db import check_database
    from schemas.registry import check_registry
    from sender.delivery import AttachmentsOffWarning, check_attachments
    from sender.smtp import check_smtp

    role = Role(args.role) if args.role else None

    def kafka(settings: Settings) -> str:
        return check_kafka(settings, role)

    failed = 0
    sender = (("attachments", check_attachments),) if role in (None, Role.SENDER) else ()
    for name, check in (("database", check_database), ("kafka", kafka),
                        ("registry", check_registry), ("smtp", check_smtp), *sender):
        try:
            print(f"ok    {name}: {check(settings)}")
        except (AttachmentsOffWarning, KafkaDegraded) as exc:  # said, and not a failure
            print(f"WARN  {name}: {exc}")
        except (PostroomError, sa_errors.OperationalError) as exc:
            failed += 1
            # Our own errors may list one problem per line (the kafka check, per topic).
            print(f"FAIL  {name}: {exc if isinstance(exc, PostroomError) else first_line(exc)}")
    return EXIT_FAILURE if failed else EXIT_OK


def cmd_schemas_register(settings: Settings, args: argparse.Namespace) -> int:
    from schemas.registry import register_contract

    print(f"registering the contract for prefix {settings.topic_prefix!r} at "
          f"{settings.require('schema_registry_url')} with compatibility {args.compatibility} ...",
          file=sys.stderr)
    for done in register_contract(settings, args.compatibility, schema_dir=args.schema_dir):
        print(f"{'new' if done.new else 'exists':8} {done.subject} {done.schema_name} "
              f"id={done.schema_id} version={done.version}")
    return EXIT_OK


def cmd_lag(settings: Settings, args: argparse.Namespace) -> int:
    import threading

    from postroom import lag

    groups = lag.postroom_groups(settings, args.group)
    engine = None
    outbox: Callable[[], lag.OutboxBacklog] | None = None
    if settings.database_url:
        from relay.db import check_schema, make_engine
        from relay.sql import outbox_backlog

        engine = make_engine(settings)
        check_schema(engine)

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
    try:
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
    finally:
        reader.close()
        if engine is not None:
            engine.dispose()


def _migrated_engine(settings: Settings) -> sa.Engine:
    from relay.db import check_schema, make_engine

    engine = make_engine(settings)
    check_schema(engine)
    return engine


def _dead_letters(settings: Settings, engine: sa.Engine) -> list[Any]:
    from relay import redrive

    print(f"reading {settings.topic_prefix}email.dead ...", file=sys.stderr)
    return redrive.read_dead_letters(settings, engine)


def cmd_dlq_list(settings: Settings, args: argparse.Namespace) -> int:
    from relay import redrive

    engine = _migrated_engine(settings)
    try:
        letters = _dead_letters(settings, engine)
    finally:
        engine.dispose()
    lines = ([json.dumps(letter.as_json()) for letter in letters] if args.json
             else redrive.render_dead_letters(letters))
    if lines:
        print("\n".join(lines))
    return EXIT_OK


def cmd_dlq_replay(settings: Settings, args: argparse.Namespace) -> int:
    from relay import redrive

    engine = _migrated_engine(settings)
    try:
        plan = redrive.plan_replay(_dead_letters(settings, engine), engine,
                                   None if args.all else args.key)
        return _redrive(engine, plan, "replay", args.dry_run)
    finally:
        engine.dispose()


def cmd_requeue(settings: Settings, args: argparse.Namespace) -> int:
    from relay import redrive

    engine = _migrated_engine(settings)
    try:
        return _redrive(engine, redrive.plan_requeue(engine, args.key, args.recipient),
                        "requeue", args.dry_run)
    finally:
        engine.dispose()


def _redrive(engine: sa.Engine, plan: Any, verb: str, dry_run: bool) -> int:
    from relay import redrive

    if plan.unknown is not None:
        raise PostroomError(f"unknown key {plan.unknown!r}: {dict(plan.skipped)[plan.unknown]}")
    print("\n".join(redrive.render_plan(plan, verb)))
    if dry_run:
        print("dry run: nothing changed")
        return EXIT_OK
    done = redrive.redrive(engine, plan)
    past = {"replay": "replayed", "requeue": "requeued"}[verb]
    print(f"{past} {len(done)} row(s): back on the relay's queue with a fresh retry budget"
          if done else f"{past} nothing")
    return EXIT_OK


def _since(text: str) -> dt.datetime:
    """An ISO date (midnight UTC) or an ISO time with a timezone."""
    if len(text) == 10:
        try:
            return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an ISO 8601 date: {text!r}") from None
    return _iso_datetime(text)


def cmd_report_failures(settings: Settings, args: argparse.Namespace) -> int:
    from relay import report

    since = args.since or dt.datetime.now(dt.UTC) - dt.timedelta(days=1)
    engine = _migrated_engine(settings)
    try:
        failures = report.failures_since(engine, since)
        if args.to is None:
            lines = (report.render_json(failures) if args.json
                     else report.render_lines(failures, since))
            if lines:
                print("\n".join(lines))
            return EXIT_OK
        if not failures:
            print(f"no email ended failed, dead, bounced or suppressed since "
                  f"{since.isoformat()}; nothing mailed")
            return EXIT_OK
        print(f"mailing {len(failures)} failure(s) to {args.to} through the outbox ...")
        with engine.begin() as conn:
            mailed = report.mail_report(conn, failures, since, args.to, settings.size_limits(),
                                        settings.attachments_root)
        key = mailed.key
        if args.json:
            print(json.dumps({"key": key, "queued": mailed.queued, "failures": len(failures),
                              "listed": mailed.listed, "in_csv": mailed.in_csv,
                              "attached": None if mailed.attached is None
                              else str(mailed.attached)}))
            return EXIT_OK
        if mailed.listed < len(failures):
            print(f"the body lists {mailed.listed} of them and counts the rest" + (
                "" if mailed.attached else "; set POSTROOM_ATTACHMENTS_ROOT to attach them all"))
        if mailed.attached is not None:
            print(f"attached {mailed.in_csv} as CSV: {mailed.attached}")
        print(f"queued the report as {key}" if mailed.queued else
              f"the report {key} with these rows was queued before; not queued again")
    finally:
        engine.dispose()
    return EXIT_OK


def cmd_purge(settings: Settings, args: argparse.Namespace) -> int:
    from postroom.kafka import topic_retention_s
    from postroom.topics import all_topics, dead_letter_topic, results_topic
    from relay import retention

    topics = [t for t in all_topics(settings.topic_prefix, len(settings.retry_delays_s))
              if t not in (dead_letter_topic(settings.topic_prefix),
                           results_topic(settings.topic_prefix))]
    kept_s = topic_retention_s(settings, topics)
    minimum_s, minimum_from = retention.minimum_age_s(kept_s)
    too_young = None
    if args.older_than < minimum_s and not args.force:
        too_young = (f"--older-than {args.older_than_text} is younger than {minimum_from}: "
                     "refused without --force (a cutoff this young is more often a typo than "
                     "meant)")
        if not args.dry_run:
            raise PostroomError(too_young)
    engine = _migrated_engine(settings)
    try:
        plan = retention.plan(engine, args.older_than, dt.datetime.now(dt.UTC), kept_s)
        print("\n".join(retention.render_plan(plan, args.older_than)), flush=True)
        if args.dry_run:
            print("dry run: nothing deleted" + (f"; {too_young}" if too_young else ""))
            return EXIT_OK
        outbox_rows, ledger_rows = retention.purge(
            engine, plan, progress=lambda text: print(text, file=sys.stderr, flush=True))
        print(f"deleted {outbox_rows} outbox row(s) and {ledger_rows} ledger row(s)")
    finally:
        engine.dispose()
    return EXIT_OK


class _AgeAction(argparse.Action):
    """--older-than: the age in seconds, and the text as written for messages."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        from relay.retention import parse_age_s

        try:
            seconds = parse_age_s(str(values))
        except ValueError as exc:
            parser.error(f"{option_string}: {exc}")
        setattr(namespace, self.dest, seconds)
        setattr(namespace, f"{self.dest}_text", str(values).strip())


def cmd_status(settings: Settings, args: argparse.Namespace) -> int:
    from relay.db import check_schema, make_engine
    from relay.sql import status_count_query, status_query

    engine = make_engine(settings)
    try:
        check_schema(engine)
        with engine.connect() as conn:
            limit = None if args.key else args.limit
            # One row past the limit says whether the list is cut, without counting the outbox.
            rows = conn.execute(status_query(args.key, None if limit is None else limit + 1)
                                ).mappings().all()
            total = (conn.execute(status_count_query()).scalar_one()
                     if limit is not None and len(rows) > limit else len(rows))
    finally:
        engine.dispose()
    rows = rows[:limit]
    if args.key and not rows:
        print(f"postroom status: no outbox rows for key {args.key!r} (a message key as "
              "enqueue was given it, or the subject when it was given none)", file=sys.stderr)
        return EXIT_FAILURE
    cut = f"showing the newest {len(rows)} of {total} rows (--limit N for more)" \
        if total > len(rows) else None
    if args.json:
        for row in rows:
            print(json.dumps({k: _jsonable(v) for k, v in row.items()}))
        if cut:
            print(cut, file=sys.stderr)
        return EXIT_OK
    if not rows:
        print("no outbox rows")
        return EXIT_OK
    if args.key:
        subjects = sorted({row["subject"] for row in rows})
        print(f"message {args.key}, subject {' / '.join(repr(s) for s in subjects)}: "
              f"{len(rows)} recipient(s)")
    print("\n".join(_status_table(rows, with_key=not args.key)))
    if cut:
        print(cut)
    return EXIT_OK


# A row in these states is where its last error left it; in the others the error is history.
_ERROR_IS_CURRENT = frozenset({"failed", "dead", "retrying", "bounced", "suppressed"})
_STATUS_WIDTHS = {"KEY": 40, "RECIPIENT": 40}
_ERROR_WIDTH = 70


def _status_table(rows: Sequence[Any], *, with_key: bool) -> list[str]:
    """`postroom status` as a table: short columns, the last error apart from the state."""
    header = [*(["KEY"] if with_key else []), "RECIPIENT", "STATE", "TRIES", "CREATED (UTC)",
              "SENT (UTC)", "LAST ERROR"]
    table = []
    for row in rows:
        error = _clip(" ".join((row["last_error"] or "").split()), _ERROR_WIDTH)
        if error and row["status"] not in _ERROR_IS_CURRENT:
            error = f"(earlier attempt) {error}"
        # A row written by SQL (or a server's multi-line reply) may hold line breaks anywhere.
        table.append([*([_flat(row["message_key"])] if with_key else []), _flat(row["recipient"]),
                      _flat(row["status"]), str(row["attempts"]), _seconds(row["created_at"]),
                      _seconds(row["sent_at"]), error or "-"])
    widths = [min(max(len(line[n]) for line in [header, *table]), _STATUS_WIDTHS.get(name, 999))
              for n, name in enumerate(header)]
    return ["  ".join(_clip(cell, width).ljust(width) for cell, width in zip(
        line, widths, strict=True)).rstrip() for line in [header, *table]]


def cmd_suppression_list(settings: Settings, args: argparse.Namespace) -> int:
    from relay import suppression

    engine = _migrated_engine(settings)
    try:
        with engine.connect() as conn:
            entries = suppression.entries(conn)
    finally:
        engine.dispose()
    if args.json:
        for entry in entries:
            print(json.dumps(entry.as_json()))
        return EXIT_OK
    if not entries:
        print("no address is suppressed")
        return EXIT_OK
    header = ["ADDRESS", "SOURCE", "SINCE (UTC)", "UNTIL (UTC)", "REASON"]
    table = [[e.address, e.source.value, _seconds(e.created_at), _seconds(e.expires_at),
              _clip(_flat(e.reason), _ERROR_WIDTH)] for e in entries]
    widths = [min(max(len(line[n]) for line in [header, *table]), 60) for n in range(len(header))]
    print("\n".join("  ".join(_clip(cell, width).ljust(width) for cell, width in zip(
        line, widths, strict=True)).rstrip() for line in [header, *table]))
    return EXIT_OK


def cmd_suppression_add(settings: Settings, args: argparse.Namespace) -> int:
    from relay import suppression

    engine = _migrated_engine(settings)
    try:
        with engine.begin() as conn:
            entry = suppression.add(conn, args.address, args.reason,
                                    args.expires or settings.suppression_expiry_s)
    finally:
        engine.dispose()
    print(f"suppressed {entry.address} until {_seconds(entry.expires_at)} UTC: {entry.reason}")
    return EXIT_OK


def cmd_suppression_remove(settings: Settings, args: argparse.Namespace) -> int:
    from relay import suppression

    engine = _migrated_engine(settings)
    try:
        with engine.begin() as conn:
            address = suppression.remove(conn, args.address)
    finally:
        engine.dispose()
    print(f"removed {address} from the suppression list; emails queued for it from now on are "
          "sent")
    return EXIT_OK


def _expiry(text: str) -> float:
    from postroom.settings import parse_period_s

    try:
        return parse_period_s(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _flat(text: str) -> str:
    return " ".join(text.split()) or "-"


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def _seconds(value: dt.datetime | None) -> str:
    return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S") if value else "-"


def _jsonable(value: Any) -> Any:
    return value.isoformat() if isinstance(value, dt.datetime) else value


def build_parser() -> argparse.ArgumentParser:
    env_help = "\n".join(f"  {name}" for name in FIELDS)
    parser = argparse.ArgumentParser(
        prog="postroom",
        description="Durable email delivery: PostgreSQL outbox -> Kafka -> SMTP.",
        epilog=f"Settings are read from these environment variables (see README.md):\n{env_help}\n"
               "  POSTROOM_SMTP_PASSWORD_FILE\n  POSTROOM_KAFKA_CONFIG_FILE",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"postroom {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    db = commands.add_parser("db", help="manage the outbox schema")
    db_commands = db.add_subparsers(dest="db_command", required=True, metavar="SUBCOMMAND")
    db_commands.add_parser("upgrade", help="create or migrate the outbox schema (idempotent)"
                           ).set_defaults(handler=cmd_db_upgrade)

    topics = commands.add_parser("topics", help="manage Kafka topics")
    topic_commands = topics.add_subparsers(dest="topics_command", required=True,
                                           metavar="SUBCOMMAND")
    topic_commands.add_parser(
        "create", help="create every topic postroom uses (idempotent; partitions, replication "
                       "and configs from POSTROOM_TOPIC_*)").set_defaults(handler=cmd_topics_create)

    schemas = commands.add_parser("schemas", help="manage the contract in the Schema Registry")
    schema_commands = schemas.add_subparsers(dest="schemas_command", required=True,
                                             metavar="SUBCOMMAND")
    register = schema_commands.add_parser(
        "register", help="register schemas/*.avsc under each topic's subject <topic>-value at "
                         "POSTROOM_SCHEMA_REGISTRY_URL and set its compatibility (idempotent; "
                         "a schema the rule rejects is refused with the registry's message)")
    register.add_argument("--compatibility", default="BACKWARD", choices=COMPATIBILITY_LEVELS,
                          help="compatibility level of every subject (default BACKWARD)")
    register.add_argument("--schema-dir", type=Path, metavar="DIR",
                          help="register the .avsc files in DIR instead of this version's "
                               "(e.g. a contract prepared for the next release)")
    register.set_defaults(handler=cmd_schemas_register)

    acls = commands.add_parser(
        "acls", help="the Kafka ACLs each role needs (relay, sender, recorder, bounces, admin); "
                     "`acls apply` creates them (idempotent)")
    acls.add_argument("action", nargs="?", choices=["apply"],
                      help="create the ACLs through the Admin API (needs ALTER and DESCRIBE on "
                           "the cluster); without it, print them")
    acls.add_argument("--principal-prefix", default=DEFAULT_PRINCIPAL_PREFIX, metavar="PREFIX",
                      type=_principal_prefix,
                      help="principal of a role is PREFIX + role (default User:postroom-)")
    acls.add_argument("--format", default="table", choices=["table", "kafka-acls", "json"],
                      help="table (default), kafka-acls.sh commands, or one JSON object a line")
    acls.add_argument("--idempotent-write", action="store_true",
                      help="also IDEMPOTENT_WRITE on the cluster for relay and sender (brokers "
                           "before Kafka 3.0 need it for an idempotent producer)")
    acls.set_defaults(handler=cmd_acls)

    enqueue = commands.add_parser("enqueue", help="queue one email per recipient")
    enqueue.add_argument("--key", help="message key, e.g. sales-report-2026-09 (default: subject)")
    enqueue.add_argument("--to", action="append", required=True, metavar="ADDR",
                         help="recipient; repeat for several")
    enqueue.add_argument("--subject", required=True)
    body = enqueue.add_mutually_exclusive_group(required=True)
    body.add_argument("--body", help="plain text body")
    body.add_argument("--body-file", type=Path, metavar="FILE", help="read the body from FILE")
    enqueue.add_argument("--attach", action="append", default=[], metavar="PATH",
                         help="file to attach (stored as a path); repeat for several")
    enqueue.add_argument("--html-file", type=Path, metavar="FILE",
                         help="an HTML body (UTF-8) sent beside the text body")
    enqueue.add_argument("--inline", action="append", default=[], metavar="PATH",
                         help="an image the HTML shows as cid:<file name> (stored as a path); "
                              "repeat for several")
    enqueue.add_argument("--priority", default="normal", choices=[p.value for p in Priority])
    enqueue.add_argument("--send-after", type=_iso_datetime, metavar="ISO8601",
                         help="not before this time, e.g. 2026-10-02T07:00:00+00:00")
    enqueue.add_argument("--from", dest="sender", metavar="ADDR",
                         help="From address (default: POSTROOM_MAIL_FROM at delivery)")
    enqueue.add_argument("--json", action="store_true", help="print the result as JSON")
    enqueue.set_defaults(handler=cmd_enqueue)

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
                    "relay is answered 451 and keeps the report. " + running
    ).set_defaults(handler=cmd_bounces)
    check = commands.add_parser(
        "check", help="is everything ready? database schema, broker and topics (and their "
                      "partitions' replication: WARN under-replicated, FAIL offline or below "
                      "min.insync.replicas), the schema registry's subjects (when one is set), "
                      "SMTP server (exit code 0 when all are)")
    check.add_argument("--role", choices=[r.value for r in Role],
                       help="also check that this client's principal may do on each topic what "
                            "this role needs (its ACLs, see `postroom acls`)")
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
    dlq = commands.add_parser("dlq", help="list or replay the dead-letter topic")
    dlq_commands = dlq.add_subparsers(dest="dlq_command", required=True, metavar="SUBCOMMAND")
    dlq_list = dlq_commands.add_parser(
        "list", help="the dead letters, oldest first, one line per key (its latest): why, "
                     "attempts, and whether its row can be replayed")
    dlq_list.add_argument("--json", action="store_true",
                          help="one JSON object per dead letter (all of them, oldest first)")
    dlq_list.set_defaults(handler=cmd_dlq_list)
    replay = dlq_commands.add_parser(
        "replay", help="send dead-lettered emails again with a fresh retry budget (idempotent: "
                       "a replayed row is not replayed twice)")
    which = replay.add_mutually_exclusive_group(required=True)
    which.add_argument("--key", help="an idempotency key (as `dlq list` shows) or a message "
                                      "key (exit 1 when no dead letter has it)")
    which.add_argument("--all", action="store_true", help="every replayable dead letter")
    replay.add_argument("--dry-run", action="store_true", help="say what would be replayed only")
    replay.set_defaults(handler=cmd_dlq_replay)

    requeue = commands.add_parser(
        "requeue", help="send failed or dead rows of a message again (e.g. after an address was "
                        "fixed); idempotent")
    requeue.add_argument("--key", required=True,
                         help="the message key (exit 1 when no row has it)")
    requeue.add_argument("--recipient", metavar="ADDR", help="only this recipient's row")
    requeue.add_argument("--dry-run", action="store_true", help="say what would be requeued only")
    requeue.set_defaults(handler=cmd_requeue)

    report = commands.add_parser("report", help="reports from the outbox")
    report_commands = report.add_subparsers(dest="report_command", required=True,
                                            metavar="SUBCOMMAND")
    failures = report_commands.add_parser(
        "failures", help="rows that ended failed, dead, bounced or suppressed: printed, or "
                         "mailed through postroom")
    failures.add_argument("--since", type=_since, metavar="DATE",
                          help="ISO date (UTC) or time with timezone (default: 24 hours ago)")
    failures.add_argument("--to", metavar="ADDR",
                          help="mail the report to ADDR (queued in the outbox; the same rows "
                               "are mailed once)")
    failures.add_argument("--json", action="store_true", help="one JSON object per row")
    failures.set_defaults(handler=cmd_report_failures)

    purge = commands.add_parser(
        "purge", help="delete finished rows and their ledger entries in short batches",
        description="Delete outbox rows that ended sent, bounced, failed, dead or suppressed "
                    "before a cutoff (and "
                    "are not queued again), then the ledger rows no row and no topic needs, in "
                    "short batches. It prints the cutoff (UTC) and the rows by state first. A "
                    "cutoff younger than the topics' retention (7 days when they keep records "
                    "forever) is refused without --force.")
    purge.add_argument("--older-than", action=_AgeAction, required=True, metavar="AGE",
                       help="rows that ended longer ago than AGE, with a unit: 30d or 30days or "
                            "'30 days', 12h, 90m, 2w; a bare number is refused")
    purge.add_argument("--dry-run", action="store_true",
                       help="print what would be deleted, delete nothing")
    purge.add_argument("--force", action="store_true",
                       help="allow a cutoff younger than the topics' retention (or 7 days)")
    purge.set_defaults(handler=cmd_purge)

    commands.add_parser(
        "devsmtp", add_help=False,
        help="a local SMTP server that rejects, defers, delays or drops chosen recipients "
             "(see postroom devsmtp --help)")

    status = commands.add_parser(
        "status", help="who received what: one line per recipient row",
        description="A table of outbox rows, one per recipient: its state, the attempts, when "
                    "it was created and sent (UTC), and the last error; an error that an "
                    "attempt after it overcame (the row went on to be sent, or is queued again) "
                    "is marked '(earlier attempt)'.")
    status.add_argument("--key", help="only this message key (exit 1 when no row has it)")
    status.add_argument("--limit", type=_status_limit, default=50, metavar="N",
                        help="without --key, the newest N rows (default 50; it says 'showing "
                             "the newest N of M rows' when there are more)")
    status.add_argument("--json", action="store_true",
                        help="one JSON object per row, every column, for machines")
    status.set_defaults(handler=cmd_status)

    suppressed = commands.add_parser(
        "suppression", help="the addresses postroom does not mail (bounced, complained, or "
                            "added): list, add, remove")
    suppression_commands = suppressed.add_subparsers(dest="suppression_command", required=True,
                                                     metavar="SUBCOMMAND")
    listing = suppression_commands.add_parser(
        "list", help="every address suppressed now: source, since, until, reason")
    listing.add_argument("--json", action="store_true", help="one JSON object per address")
    listing.set_defaults(handler=cmd_suppression_list)
    adding = suppression_commands.add_parser(
        "add", help="suppress an address: emails to it end suppressed, not sent",
        description="Suppress ADDRESS (held in lower case): the relay finishes every email to "
                    "it as 'suppressed' without sending it, until the entry expires. An entry "
                    "the address had is replaced.")
    adding.add_argument("address", metavar="ADDRESS", help="one bare address, local@domain")
    adding.add_argument("--reason", metavar="R", help="why (shown by list and on each row)")
    adding.add_argument("--expires", type=_expiry, metavar="D",
                        help="how long, e.g. 90d or 12h (default POSTROOM_SUPPRESSION_EXPIRY, 30d)")
    adding.set_defaults(handler=cmd_suppression_add)
    removing = suppression_commands.add_parser(
        "remove", help="take an address off the list (exit 1 when it is not on it)")
    removing.add_argument("address", metavar="ADDRESS", help="one bare address, local@domain")
    removing.set_defaults(handler=cmd_suppression_remove)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        code = _main(argv)
        sys.stdout.flush()  # a closed pipe shows here, while it can still be caught
    except BrokenPipeError:
        # The reader went away (`postroom status --json | head -2`): stop quietly. Python's
        # recipe: point stdout at /dev/null so the flush at exit does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILURE
    return code


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["devsmtp"]:
        # The dev server has its own parser (and runs without the POSTROOM_* settings).
        try:
            from postroom.devkit import devsmtp
        except ModuleNotFoundError as exc:
            if (exc.name or "").partition(".")[0] != "aiosmtpd":
                raise
            print("postroom devsmtp: error: the test server needs aiosmtpd: "
                  "pip install 'postroom[devsmtp]'", file=sys.stderr)
            return EXIT_FAILURE
        return devsmtp.main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = Settings.from_env()
        configure_logging(settings.log_level)
        return int(args.handler(settings, args))
    except ConfigError as exc:
        print(f"postroom {args.command}: configuration error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except PostroomError as exc:
        print(f"postroom {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except sa_errors.DBAPIError as exc:  # unreachable, read-only, a grant missing, ...
        print(f"postroom {args.command}: error: cannot use the database "
              f"(POSTROOM_DATABASE_URL): {first_line(exc)}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        # Ctrl-C while a one-shot command waits (on a broker, say): stop, no traceback.
        print(f"postroom {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
