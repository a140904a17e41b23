"""`postroom enqueue`: one email per recipient into the outbox."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from postroom.cli.common import EXIT_OK, Commands, iso_datetime, migrated_engine
from postroom.errors import PostroomError
from postroom.settings import Settings
from postroom.topics import Priority


def cmd_enqueue(settings: Settings, args: argparse.Namespace) -> int:
    from postroom.relay.outbox import Email, content_key, enqueue
    from postroom.relay.sql import status_query

    body = args.body if args.body is not None else _read_body(args.body_file)
    html = _read_body(args.html_file, "--html-file") if args.html_file is not None else None
    email = Email(recipients=args.to, subject=args.subject, body=body, key=args.key,
                  attachments=args.attach, priority=args.priority, send_after=args.send_after,
                  sender=args.sender, html=html, inline=args.inline)
    # Without --key the content names the message: a rerun of the same email queues nothing,
    # a different one (tomorrow's report under today's subject) is a new message.
    key = args.key if args.key is not None else content_key(email)
    with migrated_engine(settings) as engine, engine.begin() as conn:
        earlier = conn.execute(status_query(key, None)).mappings().all()
        queued = enqueue(conn, key=key, recipients=args.to, subject=args.subject, body=body,
                         attachments=args.attach, priority=args.priority,
                         send_after=args.send_after, sender=args.sender,
                         limits=settings.size_limits(), html=html, inline=args.inline)
    given = {address.strip().lower() for address in args.to}
    before = [row for row in earlier if row["recipient"].lower() in given]
    first = min((row["created_at"] for row in before), default=None)
    if args.json:
        print(json.dumps({"queued": queued, "recipients": len(args.to), "key": key,
                          "queued_before": first.isoformat() if first else None}))
        return EXIT_OK
    print(f"queued {queued} new of {len(args.to)} recipient(s)"
          + ("" if args.key is not None else f" as message {key}"))
    if before and first is not None:
        states = Counter(row["status"] for row in before)
        same = ("the same subject, bodies and files" if args.key is None
                else f"message key {key!r}")
        print(f"not queued again: {len(before)} recipient(s) already had {same}, queued "
              f"{first.strftime('%Y-%m-%d %H:%M:%S')} UTC ("
              + ", ".join(f"{state} {count}" for state, count in sorted(states.items()))
              + ("); a different email needs another --key" if args.key is not None
                 else "); --key K queues it again under a key of its own"))
    return EXIT_OK


def _read_body(path: Path, option: str = "--body-file") -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PostroomError(f"cannot read {option} {path}: {exc}") from exc


def add_commands(commands: Commands) -> None:
    """Add `enqueue`."""
    enqueue = commands.add_parser("enqueue", help="queue one email per recipient")
    enqueue.add_argument(
        "--key", help="message key, e.g. sales-report-2026-09; with the recipient it makes the "
                      "idempotency key, so a rerun queues nothing twice (default: the subject "
                      "and a digest of the content, e.g. 'Nightly report #3f2a9c1b04de': the "
                      "same email once, a different one anew)")
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
    enqueue.add_argument("--send-after", type=iso_datetime, metavar="ISO8601",
                         help="not before this time, e.g. 2026-10-02T07:00:00+00:00")
    enqueue.add_argument("--from", dest="sender", metavar="ADDR",
                         help="From address (default: POSTROOM_MAIL_FROM at delivery)")
    enqueue.add_argument("--json", action="store_true", help="print the result as JSON")
    enqueue.set_defaults(handler=cmd_enqueue)
