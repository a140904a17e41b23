"""Sending again: `dlq list` and `dlq replay` for the dead-letter topic, `requeue` for failed
or dead rows."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from postroom.cli.common import EXIT_OK, Commands, migrated_engine
from postroom.errors import PostroomError
from postroom.settings import Settings

if TYPE_CHECKING:  # imported where a command uses the database, not at every start
    import sqlalchemy as sa


@contextlib.contextmanager
def _pages(settings: Settings, engine: sa.Engine, args: argparse.Namespace) -> Iterator[Any]:
    """The dead-letter topic's pages as the arguments ask, progress said on stderr."""
    from postroom.relay import dlq

    topic = f"{settings.topic_prefix}email.dead"
    print(f"reading {topic}" + (f" from {args.after}" if args.after else "") + " ...",
          file=sys.stderr)

    def progress(done: Any) -> None:
        share = f" ({100 * done.read // done.total}%)" if done.total else ""
        print(f"read {done.read} of {done.total} record(s){share}, at {done.at}", file=sys.stderr)

    pages = dlq.dead_letter_pages(settings, engine, after=args.after, limit=args.limit or None,
                                  progress=progress)
    with contextlib.closing(pages):
        yield pages


def _more(args: argparse.Namespace, read: int, following: Any) -> None:
    """Where the next page starts, when ``--limit`` stopped the read before the end."""
    if args.limit and read >= args.limit and following is not None:
        print(f"more: {args.command_line} --after {following}", file=sys.stderr)


def cmd_dlq_list(settings: Settings, args: argparse.Namespace) -> int:
    from postroom.relay import redrive

    letters = keys = replayable = pages_read = 0
    following = None
    with migrated_engine(settings) as engine, _pages(settings, engine, args) as pages:
        for page in pages:
            lines, page_keys, page_replayable = redrive.render_page(page.letters)
            if args.json:
                lines = [json.dumps(letter.as_json()) for letter in page.letters]
            print("\n".join(lines), flush=True)
            letters += len(page.letters)
            keys += page_keys
            replayable += page_replayable
            following = page.next
            pages_read += 1
    if not args.json:
        print(redrive.render_count(letters, keys, replayable, pages_read) if letters
              else "the dead-letter topic is empty" if not args.after
              else f"no dead letters after {args.after}")
    _more(args, letters, following)
    return EXIT_OK


def cmd_dlq_replay(settings: Settings, args: argparse.Namespace) -> int:
    from postroom.relay import redrive

    key = None if args.all else args.key
    found = read = replayed = blocks = 0
    planned: set[int] = set()  # a dry run's rows so far: its pages change no row
    following = None
    with migrated_engine(settings) as engine, _pages(settings, engine, args) as pages:
        for page in pages:
            read += len(page.letters)
            following = page.next
            plan = redrive.plan_replay(page.letters, engine, key)
            if plan.unknown is not None:
                continue  # none of this page's letters has the key
            found += 1
            if args.dry_run:
                again = tuple((r.idempotency_key, "planned in an earlier page of this dry run")
                              for r in plan.rows if r.id in planned)
                plan = redrive.RedrivePlan(tuple(r for r in plan.rows if r.id not in planned),
                                           plan.skipped + again)
                planned.update(row.id for row in plan.rows)
            replayed += _redrive(engine, plan, "replay", args.dry_run)
            blocks += 1
        if key is not None and not found:
            raise PostroomError(f"unknown key {key!r}: not on the dead-letter topic")
        if not blocks:
            _redrive(engine, redrive.RedrivePlan(()), "replay", args.dry_run)
    if blocks > 1:
        print(f"in all: {'would replay' if args.dry_run else 'replayed'} {replayed} row(s) of "
              f"{read} dead letter(s) read, in {blocks} pages")
    _more(args, read, following)
    return EXIT_OK


def cmd_requeue(settings: Settings, args: argparse.Namespace) -> int:
    from postroom.relay import redrive

    with migrated_engine(settings) as engine:
        _redrive(engine, redrive.plan_requeue(engine, args.key, args.recipient), "requeue",
                 args.dry_run)
    return EXIT_OK


def _redrive(engine: sa.Engine, plan: Any, verb: str, dry_run: bool) -> int:
    """Say the plan, carry it out unless ``dry_run``; the rows it moved (or would move)."""
    from postroom.relay import redrive

    if plan.unknown is not None:
        raise PostroomError(f"unknown key {plan.unknown!r}: {dict(plan.skipped)[plan.unknown]}")
    print("\n".join(redrive.render_plan(plan, verb)))
    if dry_run:
        print("dry run: nothing changed", flush=True)
        return len(plan.rows)
    done = redrive.redrive(engine, plan)
    past = {"replay": "replayed", "requeue": "requeued"}[verb]
    print(f"{past} {len(done)} row(s): back on the relay's queue with a fresh retry budget"
          if done else f"{past} nothing", flush=True)
    return len(done)


def add_commands(commands: Commands) -> None:
    """Add `dlq list`, `dlq replay` and `requeue`."""
    dlq = commands.add_parser("dlq", help="list or replay the dead-letter topic")
    dlq_commands = dlq.add_subparsers(dest="dlq_command", required=True, metavar="SUBCOMMAND")
    dlq_list = dlq_commands.add_parser(
        "list", help="the dead letters, oldest first, one line per key (its latest): why, "
                     "attempts, and whether its row can be replayed")
    dlq_list.add_argument("--json", action="store_true",
                          help="one JSON object per dead letter (all of them, oldest first "
                               "within each page)")
    _paging(dlq_list, "list")
    dlq_list.set_defaults(handler=cmd_dlq_list)
    replay = dlq_commands.add_parser(
        "replay", help="send dead-lettered emails again with a fresh retry budget (idempotent: "
                       "a replayed row is not replayed twice)")
    which = replay.add_mutually_exclusive_group(required=True)
    which.add_argument("--key", help="an idempotency key (as `dlq list` shows) or a message "
                                      "key (exit 1 when no dead letter has it)")
    which.add_argument("--all", action="store_true", help="every replayable dead letter")
    replay.add_argument("--dry-run", action="store_true", help="say what would be replayed only")
    _paging(replay, "replay")
    replay.set_defaults(handler=cmd_dlq_replay)

    requeue = commands.add_parser(
        "requeue", help="send failed or dead rows of a message again (e.g. after an address was "
                        "fixed); idempotent")
    requeue.add_argument("--key", required=True,
                         help="the message key (exit 1 when no row has it)")
    requeue.add_argument("--recipient", metavar="ADDR", help="only this recipient's row")
    requeue.add_argument("--dry-run", action="store_true", help="say what would be requeued only")
    requeue.set_defaults(handler=cmd_requeue)


def _position(text: str) -> Any:
    from postroom.relay.dlq import Position

    try:
        return Position.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number such as 1000, got {text!r}")
    return int(text)


def _paging(parser: argparse.ArgumentParser, verb: str) -> None:
    """--after and --limit: the topic is read in its order (partition, then offset), in pages of
    1000 letters, each oldest first; the last page's position goes on with --after."""
    parser.add_argument(
        "--after", type=_position, metavar="PARTITION:OFFSET",
        help="start at this position of the topic (its order: partition, then offset), as the "
             "`more:` line of a limited run names it; default: the beginning")
    parser.add_argument(
        "--limit", type=_count, default=0, metavar="N",
        help=f"{verb} at most N dead letters, then name where the next ones start; default 0: "
             "all of them, read in pages of 1000")
    parser.set_defaults(command_line=f"postroom dlq {verb}")
