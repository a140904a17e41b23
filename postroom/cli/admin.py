"""Preparing the services: the outbox schema, the Kafka topics, the contract in the Schema
Registry and the ACLs each role needs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from postroom.acls import DEFAULT_PRINCIPAL_PREFIX, Acl, parse_principal_prefix
from postroom.cli.common import EXIT_OK, Commands
from postroom.schemas.registry import COMPATIBILITY_LEVELS
from postroom.settings import Settings, mask_url


def cmd_db_upgrade(settings: Settings, args: argparse.Namespace) -> int:
    from postroom.relay.db import make_engine, upgrade

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
    """Add `db upgrade`, `topics create`, `schemas register` and `acls`."""
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
