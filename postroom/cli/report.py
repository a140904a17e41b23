"""`postroom report failures`: the rows that ended badly, printed or mailed through the outbox."""

from __future__ import annotations

import argparse
import datetime as dt
import json

from postroom.cli.common import EXIT_OK, Commands, iso_datetime, migrated_engine
from postroom.settings import Settings


def _since(text: str) -> dt.datetime:
    """An ISO date (midnight UTC) or an ISO time with a timezone."""
    if len(text) == 10:
        try:
            return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an ISO 8601 date: {text!r}") from None
    return iso_datetime(text)


def cmd_report_failures(settings: Settings, args: argparse.Namespace) -> int:
    from postroom.relay import report

    since = args.since or dt.datetime.now(dt.UTC) - dt.timedelta(days=1)
    with migrated_engine(settings) as engine:
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
    return EXIT_OK


def add_commands(commands: Commands) -> None:
    """Add `report failures`."""
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
