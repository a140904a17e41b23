"""`postroom purge`: finished rows and their ledger entries deleted in short batches, never
younger than the topics keep their records."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from typing import Any

from postroom.cli.common import EXIT_OK, Commands, migrated_engine
from postroom.errors import PostroomError
from postroom.settings import Settings


def cmd_purge(settings: Settings, args: argparse.Namespace) -> int:
    from postroom.kafka import topic_retention
    from postroom.relay import retention
    from postroom.topics import all_topics, dead_letter_topic, results_topic

    topics = [t for t in all_topics(settings.topic_prefix, len(settings.retry_delays_s))
              if t not in (dead_letter_topic(settings.topic_prefix),
                           results_topic(settings.topic_prefix))]
    kept = topic_retention(settings, topics)
    # The youngest cutoff taken without --force is the topics' retention, as it was; the ledger
    # keeps its rows for as long as a record can stay, which is longer.
    minimum_s, minimum_from = retention.minimum_age_s(kept.retention_s if kept else None)
    too_young = None
    if args.older_than < minimum_s and not args.force:
        too_young = (f"--older-than {args.older_than_text} is younger than {minimum_from}: "
                     "refused without --force (a cutoff this young is more often a typo than "
                     "meant)")
        if not args.dry_run:
            raise PostroomError(too_young)
    with migrated_engine(settings) as engine:
        plan = retention.plan(engine, args.older_than, dt.datetime.now(dt.UTC),
                              kept.record_life_s if kept else None)
        print("\n".join(retention.render_plan(plan, args.older_than)), flush=True)
        if args.dry_run:
            print("dry run: nothing deleted" + (f"; {too_young}" if too_young else ""))
            return EXIT_OK
        outbox_rows, ledger_rows = retention.purge(
            engine, plan, progress=lambda text: print(text, file=sys.stderr, flush=True))
        print(f"deleted {outbox_rows} outbox row(s) and {ledger_rows} ledger row(s)")
    return EXIT_OK


class _AgeAction(argparse.Action):
    """--older-than: the age in seconds, and the text as written for messages."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        from postroom.relay.retention import parse_age_s

        try:
            seconds = parse_age_s(str(values))
        except ValueError as exc:
            parser.error(f"{option_string}: {exc}")
        setattr(namespace, self.dest, seconds)
        setattr(namespace, f"{self.dest}_text", str(values).strip())


def add_commands(commands: Commands) -> None:
    """Add `purge`."""
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
