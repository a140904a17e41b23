"""`postroom status`: who received what, one line per recipient row."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Sequence
from typing import Any

from postroom.cli.common import EXIT_FAILURE, EXIT_OK, Commands, migrated_engine
from postroom.cli.text import ERROR_WIDTH, clip, flat, seconds
from postroom.settings import Settings

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


def cmd_status(settings: Settings, args: argparse.Namespace) -> int:
    from postroom.relay.sql import status_count_query, status_query

    with migrated_engine(settings) as engine, engine.connect() as conn:
        limit = None if args.key else args.limit
        # One row past the limit says whether the list is cut, without counting the outbox.
        rows = conn.execute(status_query(args.key, None if limit is None else limit + 1)
                            ).mappings().all()
        total = (conn.execute(status_count_query()).scalar_one()
                 if limit is not None and len(rows) > limit else len(rows))
    rows = rows[:limit]
    if args.key and not rows:
        print(f"postroom status: no outbox rows for key {args.key!r} (a message key as "
              "enqueue was given it: `postroom enqueue` prints it)", file=sys.stderr)
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


def _status_table(rows: Sequence[Any], *, with_key: bool) -> list[str]:
    """`postroom status` as a table: short columns, the last error apart from the state."""
    header = [*(["KEY"] if with_key else []), "RECIPIENT", "STATE", "TRIES", "CREATED (UTC)",
              "SENT (UTC)", "LAST ERROR"]
    table = []
    for row in rows:
        error = clip(" ".join((row["last_error"] or "").split()), ERROR_WIDTH)
        if error and row["status"] not in _ERROR_IS_CURRENT:
            error = f"(earlier attempt) {error}"
        # A row written by SQL (or a server's multi-line reply) may hold line breaks anywhere.
        table.append([*([flat(row["message_key"])] if with_key else []), flat(row["recipient"]),
                      flat(row["status"]), str(row["attempts"]), seconds(row["created_at"]),
                      seconds(row["sent_at"]), error or "-"])
    widths = [min(max(len(line[n]) for line in [header, *table]), _STATUS_WIDTHS.get(name, 999))
              for n, name in enumerate(header)]
    return ["  ".join(clip(cell, width).ljust(width) for cell, width in zip(
        line, widths, strict=True)).rstrip() for line in [header, *table]]


def _jsonable(value: Any) -> Any:
    return value.isoformat() if isinstance(value, dt.datetime) else value


def add_commands(commands: Commands) -> None:
    """Add `status`."""
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
