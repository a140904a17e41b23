"""Preparing the services: the outbox schema, the Kafka topics, the contract in the Schema
Registry and the ACLs each role needs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from postroom.acls import DEFAULT_PRINCIPAL_PREFIX, Acl, parse_principal_prefix
from postroom.cli.common import EXIT_OK, Commands
from postroom.schemas.compatibility import COMPATIBILITY_LEVELS
from postroom.settings import Settings, mask_url


def cmd_db_upgrade(settings: Settings, args: argparse.Namespace) -> int:
    from postroom.relay.db import make_engine, migrate

    def waiting(seconds: float) -> None:
        print(f"waiting for another migration of this schema to finish ({seconds:.0f}s so "
              "far; it holds the migration lock)", file=sys.stderr, flush=True)

    engine = make_engine(settings)
    try:
        done = migrate(engine, settings.database_schema, dry_run=args.dry_run or args.sql,
                       on_wait=waiting)
    finally:
        engine.dispose()
    dry = args.dry_run or args.sql
    if args.sql:
        for statement in done.statements:
            print(statement.strip().rstrip(";") + ";")
        return EXIT_OK
    verb = {"created": "would create" if dry else "created",
            "migrated": "would migrate" if dry else "migrated"}
    if done.before is None:
        print(f"{verb['created']} the outbox schema at revision {done.after} "
              f"({len(done.steps)} migrations)")
    elif done.before != done.after:
        print(f"{verb['migrated']} the outbox schema from revision {done.before} to "
              f"{done.after} ({len(done.steps)} migrations)")
    else:
        print(f"outbox schema is at revision {done.after}, the newest: nothing to do")
    for step in done.steps:
        print(f"  {step}")
    if dry:
        print(f"dry run: {len(done.statements)} SQL statements rolled back, nothing changed "
              "(--sql prints them)")
    return EXIT_OK


def cmd_db_current(settings: Settings, args: argparse.Namespace) -> int:
    from postroom.relay.db import history, make_engine

    engine = make_engine(settings)
    try:
        current, revisions = history(engine)
    finally:
        engine.dispose()
    newest = revisions[-1].split()[0]
    if current is None:
        print(f"no outbox schema yet: `postroom db upgrade` creates it at revision {newest}")
    elif current == newest:
        print(f"outbox schema is at revision {current}, the newest")
    else:
        behind = len(revisions) - 1 - [r.split()[0] for r in revisions].index(current)
        print(f"outbox schema is at revision {current}; the newest is {newest}: "
              f"`postroom db upgrade` runs {behind} migrations")
    return EXIT_OK


def cmd_db_history(settings: Settings, args: argparse.Namespace) -> int:
    from postroom.relay.db import history, make_engine

    engine = make_engine(settings)
    try:
        current, revisions = history(engine)
    finally:
        engine.dispose()
    applied = True if current is not None else False
    for revision in revisions:
        mark = "applied" if applied else "pending"
        if revision.split()[0] == current:
            mark, applied = "applied, current", False
        print(f"{revision:40} {mark}")
    return EXIT_OK


def cmd_topics_create(settings: Settings, args: argparse.Namespace) -> int:
    from postroom.kafka import create_topics

    print(f"creating topics with prefix {settings.topic_prefix!r} on "
          f"{settings.kafka_bootstrap_servers} ...", file=sys.stderr)
    for name, state in create_topics(settings).items():
        print(f"{state:8} {name}")
    return EXIT_OK


def cmd_schemas_register(settings: Settings, args: argparse.Namespace) -> int:
    from postroom.schemas.registry import register_contract

    print(f"registering the contract for prefix {settings.topic_prefix!r} at "
          f"{mask_url(settings.require('schema_registry_url'))} with compatibility {args.compatibility} ...",
          file=sys.stderr)
    for done in register_contract(settings, args.compatibility, schema_dir=args.schema_dir):
        print(f"{'new' if done.new else 'exists':8} {done.subject} {done.schema_name} "
              f"id={done.schema_id} version={done.version}")
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


def add_commands(commands: Commands) -> None:
    """Add `db upgrade`, `db current`, `db history`, `topics create`, `schemas register` and `acls`."""
    db = commands.add_parser("db", help="manage the outbox schema")
    db_commands = db.add_subparsers(dest="db_command", required=True, metavar="SUBCOMMAND")
    db_upgrade = db_commands.add_parser(
        "upgrade", help="create or migrate the outbox schema (idempotent): says whether it "
                        "created it, migrated it from one revision to another (listing the "
                        "migrations) or found nothing to do; waits its turn behind another "
                        "migration of the schema, saying so every 10 s")
    db_upgrade.add_argument("--dry-run", action="store_true",
                            help="run the migrations in a transaction rolled back: what would "
                                 "be done, and nothing changed")
    db_upgrade.add_argument("--sql", action="store_true",
                            help="a dry run that prints the SQL the migrations run")
    db_upgrade.set_defaults(handler=cmd_db_upgrade)
    db_commands.add_parser(
        "current", help="the revision the outbox schema is at, and whether it is the newest"
    ).set_defaults(handler=cmd_db_current)
    db_commands.add_parser(
        "history", help="every migration of this release, oldest first: applied or pending"
    ).set_defaults(handler=cmd_db_history)

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
