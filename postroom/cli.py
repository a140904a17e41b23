"""The `postroom` command: parses arguments and calls the components. Holds no logic of its own."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy import exc as sa_errors

from postroom import __version__
from postroom.errors import ConfigError, PostroomError, first_line
from postroom.metrics import Metrics
from postroom.settings import FIELDS, Settings
from postroom.topics import Priority
from schemas.registry import COMPATIBILITY_LEVELS

log = logging.getLogger("postroom")

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # librdkafka's own debug lines are noise at INFO.
    logging.getLogger("alembic").setLevel(max(logging.WARNING, logging.getLevelName(level)))


def on_shutdown_signals(callback: Callable[[], None]) -> None:
    """Call ``callback`` on SIGTERM or SIGINT (once; a second signal interrupts hard)."""
    def handler(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s, stopping cleanly", signal.Signals(signum).name)
        signal.signal(signum, signal.SIG_DFL)
        callback()
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def _iso_datetime(text: str) -> dt.datetime:
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time: {text!r}") from None
    if value.tzinfo is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} has no timezone; add one, e.g. {text}+00:00")
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
                         attachment_max_bytes=settings.attachment_max_bytes, html=html,
                         inline=args.inline)
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
def service_start(settings: Settings) -> Iterator[tuple[sa.Engine, Metrics]]:
    """What every long-running command needs first: a migrated database, a reachable broker,
    and metrics (served when POSTROOM_METRICS_PORT is set)."""
    from postroom.kafka import check_reachable
    from postroom.metrics import serve
    from relay.db import check_schema, make_engine

    engine = make_engine(settings)
    check_schema(engine)
    check_reachable(settings)
    metrics = Metrics()
    server = serve(metrics, settings.metrics_port) if settings.metrics_port else None
    try:
        yield engine, metrics
    finally:
        if server is not None:
            server.shutdown()
        engine.dispose()


class _Service(Protocol):
    def run(self) -> None: ...
    def stop(self) -> None: ...


def _run_until_signalled(settings: Settings,
                         make: Callable[[sa.Engine, Metrics], _Service]) -> int:
    """Start a blocking service (relay, recorder) and run it until SIGTERM or SIGINT."""
    with service_start(settings) as (engine, metrics):
        service = make(engine, metrics)
        on_shutdown_signals(service.stop)
        service.run()
    return EXIT_OK


def cmd_relay(settings: Settings, args: argparse.Namespace) -> int:
    from relay.publisher import Relay

    return _run_until_signalled(
        settings, lambda engine, metrics: Relay(settings, engine, metrics=metrics))


def cmd_sender(settings: Settings, args: argparse.Namespace) -> int:
    import asyncio

    from relay.db import libpq_conninfo
    from sender.claims import lease_s
    from sender.ledger import Ledger, sender_identity
    from sender.service import Sender

    async def run(ledger: Ledger, metrics: Metrics) -> None:
        sender = Sender(settings, ledger=ledger, metrics=metrics)
        loop = asyncio.get_running_loop()

        def stop() -> None:
            loop.call_soon_threadsafe(sender.stop)

        on_shutdown_signals(stop)
        await sender.run()

    settings.check_attachments_root()
    with service_start(settings) as (engine, metrics):
        ledger = Ledger(libpq_conninfo(engine), sender_identity(), lease_s(settings),
                        settings.database_schema)
        asyncio.run(run(ledger, metrics))
    return EXIT_OK


def cmd_recorder(settings: Settings, args: argparse.Namespace) -> int:
    from relay.recorder import Recorder

    return _run_until_signalled(
        settings, lambda engine, metrics: Recorder(settings, engine, metrics=metrics))


def cmd_check(settings: Settings, args: argparse.Namespace) -> int:
    """Each dependency in turn; the exit code is 0 only when every one is ready."""
    from postroom.kafka import check_topics
    from relay.db import check_database
    from schemas.registry import check_registry
    from sender.smtp import check_smtp

    failed = 0
    for name, check in (("database", check_database), ("kafka", check_topics),
                        ("registry", check_registry), ("smtp", check_smtp)):
        try:
            print(f"ok    {name}: {check(settings)}")
        except (PostroomError, sa_errors.OperationalError) as exc:
            failed += 1
            print(f"FAIL  {name}: {first_line(exc)}")
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
    from postroom.kafka import postroom_group_lag

    lag = postroom_group_lag(settings)
    if args.json:
        for group, rows in lag.items():
            for row in rows:
                print(json.dumps({"group": group, "topic": row.topic, "partition": row.partition,
                                  "committed": row.committed,
                                  "high_watermark": row.high_watermark, "lag": row.lag}))
        return EXIT_OK
    for group, rows in lag.items():
        print(f"{group}: total lag {sum(r.lag for r in rows)}")
        for row in rows:
            committed = "-" if row.committed is None else str(row.committed)
            print(f"  {row.topic}[{row.partition}] committed={committed} "
                  f"end={row.high_watermark} lag={row.lag}")
    return EXIT_OK


def cmd_status(settings: Settings, args: argparse.Namespace) -> int:
    from relay.db import check_schema, make_engine
    from relay.sql import status_query

    engine = make_engine(settings)
    check_schema(engine)
    with engine.connect() as conn:
        rows = conn.execute(status_query(args.key, None if args.key else args.limit)).mappings().all()
    if args.json:
        for row in rows:
            print(json.dumps({k: _jsonable(v) for k, v in row.items()}))
        return EXIT_OK
    if not rows:
        print("no outbox rows" + (f" for key {args.key!r}" if args.key else ""))
        return EXIT_OK
    for row in rows:
        print(" | ".join([
            row["message_key"], row["recipient"], row["subject"], row["priority"],
            row["status"], f"attempts={row['attempts']}", row["last_error"] or "-",
            f"created={_short(row['created_at'])}", f"published={_short(row['published_at'])}",
            f"sent={_short(row['sent_at'])}",
        ]))
    return EXIT_OK


def _jsonable(value: Any) -> Any:
    return value.isoformat() if isinstance(value, dt.datetime) else value


def _short(value: dt.datetime | None) -> str:
    return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z" if value else "-"


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

    commands.add_parser("relay", help="publish committed outbox rows to Kafka until stopped"
                        ).set_defaults(handler=cmd_relay)

    commands.add_parser(
        "sender", help="deliver email events over SMTP as a member of the sender group"
    ).set_defaults(handler=cmd_sender)
    commands.add_parser(
        "recorder", help="write delivery results back into the outbox rows"
    ).set_defaults(handler=cmd_recorder)
    commands.add_parser(
        "check", help="is everything ready? database schema, broker and topics, the schema "
                      "registry's subjects (when one is set), SMTP server (exit code 0 when all "
                      "are)").set_defaults(handler=cmd_check)
    lag = commands.add_parser("lag", help="consumer-group lag of the sender and the recorder")
    lag.add_argument("--json", action="store_true", help="one JSON object per partition")
    lag.set_defaults(handler=cmd_lag)
    commands.add_parser(
        "devsmtp", add_help=False,
        help="a local SMTP server that rejects, defers, delays or drops chosen recipients "
             "(see postroom devsmtp --help)")

    status = commands.add_parser("status", help="who received what: one line per recipient row")
    status.add_argument("--key", help="only this message key")
    status.add_argument("--limit", type=int, default=50,
                        help="without --key, the newest N rows (default 50)")
    status.add_argument("--json", action="store_true", help="one JSON object per line")
    status.set_defaults(handler=cmd_status)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["devsmtp"]:
        # The dev server has its own parser (and runs without the POSTROOM_* settings).
        try:
            from sender import devsmtp
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
    except sa_errors.OperationalError as exc:
        print(f"postroom {args.command}: error: cannot use the database "
              f"(POSTROOM_DATABASE_URL): {first_line(exc)}", file=sys.stderr)
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
