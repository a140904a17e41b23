"""Sending again: `dlq list` and `dlq replay` for the dead-letter topic, `requeue` for failed
or dead rows."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import sqlalchemy as sa

from postroom.cli.common import EXIT_OK, Commands, migrated_engine
from postroom.errors import PostroomError
from postroom.settings import Settings


def _dead_letters(settings: Settings, engine: sa.Engine) -> list[Any]:
    from postroom.relay import redrive

    print(f"reading {settings.topic_prefix}email.dead ...", file=sys.stderr)
    return redrive.read_dead_letters(settings, engine)


def cmd_dlq_list(settings: Settings, args: argparse.Namespace) -> int:
    from postroom.relay import redrive

    with migrated_engine(settings) as engine:
        letters = _dead_letters(settings, engine)
    lines = ([json.dumps(letter.as_json()) for letter in letters] if args.json
             else redrive.render_dead_letters(letters))
    if lines:
        print("\n".join(lines))
    return EXIT_OK


def cmd_dlq_replay(settings: Settings, args: argparse.Namespace) -> int:
    from postroom.relay import redrive

    with migrated_engine(settings) as engine:
        plan = redrive.plan_replay(_dead_letters(settings, engine), engine,
                                   None if args.all else args.key)
        return _redrive(engine, plan, "replay", args.dry_run)


def cmd_requeue(settings: Settings, args: argparse.Namespace) -> int:
    from postroom.relay import redrive

    with migrated_engine(settings) as engine:
        return _redrive(engine, redrive.plan_requeue(engine, args.key, args.recipient),
                        "requeue", args.dry_run)


def _redrive(engine: sa.Engine, plan: Any, verb: str, dry_run: bool) -> int:
    from postroom.relay import redrive

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


def add_commands(commands: Commands) -> None:
    """Add `dlq list`, `dlq replay` and `requeue`."""
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
