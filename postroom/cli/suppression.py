"""`postroom suppression`: the addresses postroom does not mail, listed, added and removed."""

from __future__ import annotations

import argparse
import json

from postroom.cli.common import EXIT_OK, Commands, migrated_engine
from postroom.cli.text import ERROR_WIDTH, clip, flat, seconds
from postroom.settings import Settings


def cmd_suppression_list(settings: Settings, args: argparse.Namespace) -> int:
    from postroom.relay import suppression

    with migrated_engine(settings) as engine, engine.connect() as conn:
        entries = suppression.entries(conn)
    if args.json:
        for entry in entries:
            print(json.dumps(entry.as_json()))
        return EXIT_OK
    if not entries:
        print("no address is suppressed")
        return EXIT_OK
    header = ["ADDRESS", "SOURCE", "SINCE (UTC)", "UNTIL (UTC)", "REASON"]
    table = [[e.address, e.source.value, seconds(e.created_at), seconds(e.expires_at),
              clip(flat(e.reason), ERROR_WIDTH)] for e in entries]
    widths = [min(max(len(line[n]) for line in [header, *table]), 60) for n in range(len(header))]
    print("\n".join("  ".join(clip(cell, width).ljust(width) for cell, width in zip(
        line, widths, strict=True)).rstrip() for line in [header, *table]))
    return EXIT_OK


def cmd_suppression_add(settings: Settings, args: argparse.Namespace) -> int:
    from postroom.relay import suppression

    with migrated_engine(settings) as engine, engine.begin() as conn:
        entry = suppression.add(conn, args.address, args.reason,
                                args.expires or settings.suppression_expiry_s)
    print(f"suppressed {entry.address} until {seconds(entry.expires_at)} UTC: {entry.reason}")
    return EXIT_OK


def cmd_suppression_remove(settings: Settings, args: argparse.Namespace) -> int:
    from postroom.relay import suppression

    with migrated_engine(settings) as engine, engine.begin() as conn:
        address = suppression.remove(conn, args.address)
    print(f"removed {address} from the suppression list; emails queued for it from now on are "
          "sent")
    return EXIT_OK


def _expiry(text: str) -> float:
    # purge's --older-than syntax: a unit always (a bare 90 was 90 seconds), m is minutes.
    from postroom.relay.retention import parse_age_s

    try:
        return parse_age_s(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_commands(commands: Commands) -> None:
    """Add `suppression list`, `suppression add` and `suppression remove`."""
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
        description="Suppress ADDRESS (held in lower case, its domain as IDNA A-labels: any "
                    "spelling of the mailbox is one entry): the relay finishes every email to "
                    "it as 'suppressed' without sending it, until the entry expires. An entry "
                    "the address had is replaced.")
    adding.add_argument("address", metavar="ADDRESS", help="one bare address, local@domain")
    adding.add_argument("--reason", metavar="R", help="why (shown by list and on each row)")
    adding.add_argument("--expires", type=_expiry, metavar="D",
                        help="how long, with its unit: 90d or 90days, 12h, 30m (minutes), 2w; "
                             "a bare number and months are refused (default "
                             "POSTROOM_SUPPRESSION_EXPIRY, 30d)")
    adding.set_defaults(handler=cmd_suppression_add)
    removing = suppression_commands.add_parser(
        "remove", help="take an address off the list (exit 1 when it is not on it)")
    removing.add_argument("address", metavar="ADDRESS", help="one bare address, local@domain")
    removing.set_defaults(handler=cmd_suppression_remove)
