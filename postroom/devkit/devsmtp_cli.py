"""``postroom devsmtp``: the dev SMTP server's command line (its flags, each with a
``POSTROOM_DEVSMTP_*`` variable) and the process that serves until SIGINT or SIGTERM.

The server itself is postroom.devkit.devsmtp; this module only turns flags into its arguments.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from postroom.devkit.devsmtp import DEFAULT_HOST, DEFAULT_PORT, DevSmtpServer
from postroom.devkit.devsmtp_handler import (
    DEFAULT_MAX_KEPT,
    DEFER_REPLY,
    REJECT_REPLY,
    THROTTLE_REPLY,
    open_maildir,
)
from postroom.logs import configure_logging

ENV_PREFIX = "POSTROOM_DEVSMTP_"
MAX_PORT = 65_535


def parse_defer(text: str) -> tuple[str, int]:
    """``"ops@example.com:2"`` -> ``("ops@example.com", 2)``."""
    address, sep, count = text.strip().rpartition(":")
    if not sep or not address or not count.isdigit() or int(count) < 1:
        raise argparse.ArgumentTypeError(
            f"expected ADDRESS:COUNT with COUNT at least 1, e.g. ops@example.com:2; got {text!r}")
    return address, int(count)


def _split(text: str | None) -> list[str]:
    return [p.strip() for p in (text or "").split(",") if p.strip()]


def build_parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    """The ``postroom devsmtp`` parser; each flag defaults to its ``POSTROOM_DEVSMTP_*`` variable."""

    def var(name: str) -> str:
        return ENV_PREFIX + name

    parser = argparse.ArgumentParser(
        prog="postroom devsmtp",
        description="Run a local SMTP server that rejects, defers, delays or drops chosen "
                    "recipients. List variables take comma-separated values.",
    )
    parser.add_argument("--host", default=env.get(var("HOST"), DEFAULT_HOST),
                        help=f"address to listen on (env {var('HOST')}; default %(default)s)")
    parser.add_argument("--port", type=int, default=env.get(var("PORT"), DEFAULT_PORT),
                        help=f"port to listen on (env {var('PORT')}; default %(default)s)")
    parser.add_argument("--reject", action="append", metavar="ADDR",
                        help=f"answer RCPT TO with {REJECT_REPLY!r}; repeatable "
                             f"(env {var('REJECT')})")
    parser.add_argument("--defer", action="append", type=parse_defer, metavar="ADDR:N",
                        help=f"answer RCPT TO with {DEFER_REPLY!r} the first N times; "
                             f"repeatable (env {var('DEFER')})")
    parser.add_argument("--latency", type=int, metavar="MS",
                        default=env.get(var("LATENCY"), 0),
                        help=f"wait MS milliseconds before accepting a message "
                             f"(env {var('LATENCY')}; default %(default)s)")
    parser.add_argument("--throttle-every", type=int, metavar="N",
                        default=env.get(var("THROTTLE_EVERY"), 0),
                        help=f"answer every Nth RCPT TO with {THROTTLE_REPLY!r}, whatever its "
                             f"address (env {var('THROTTLE_EVERY')}; default %(default)s: none)")
    parser.add_argument("--drop", action="append", metavar="ADDR",
                        help=f"close the connection after the message content, without a "
                             f"reply; repeatable (env {var('DROP')})")
    parser.add_argument("--maildir", type=Path, metavar="DIR",
                        default=env.get(var("MAILDIR")),
                        help=f"also store accepted messages in this Maildir "
                             f"(env {var('MAILDIR')})")
    parser.add_argument("--max-kept", type=int, metavar="N",
                        default=env.get(var("MAX_KEPT"), DEFAULT_MAX_KEPT),
                        help=f"keep at most the newest N messages in memory "
                             f"(env {var('MAX_KEPT')}; default %(default)s)")
    return parser


def parse_args(argv: Sequence[str] | None, env: Mapping[str, str]) -> argparse.Namespace:
    """Parse flags; a list flag given on the command line replaces its environment variable."""
    parser = build_parser(env)
    args = parser.parse_args(argv)
    if args.reject is None:
        args.reject = _split(env.get(ENV_PREFIX + "REJECT"))
    if args.drop is None:
        args.drop = _split(env.get(ENV_PREFIX + "DROP"))
    if args.defer is None:
        try:
            args.defer = [parse_defer(p) for p in _split(env.get(ENV_PREFIX + "DEFER"))]
        except argparse.ArgumentTypeError as exc:
            parser.error(f"{ENV_PREFIX}DEFER: {exc}")
    if not 0 <= args.port <= MAX_PORT:
        parser.error(f"--port must be from 0 (any free port) to {MAX_PORT}, got {args.port}")
    if args.latency < 0:
        parser.error("--latency must not be negative")
    if int(args.throttle_every) < 0:
        parser.error("--throttle-every must not be negative")
    if int(args.max_kept) < 1:
        parser.error("--max-kept must be at least 1")
    return args


def bind_warning(host: str) -> str | None:
    """What to say before listening on ``host``: None for a loopback address."""
    if host == "localhost":
        return None
    try:
        if ipaddress.ip_address(host).is_loopback:
            return None
    except ValueError:
        pass  # a host name: it may resolve to anything
    return (f"WARNING: devsmtp listens on {host}, not on a loopback address: anyone who can "
            "reach it can hand it mail, which it accepts and keeps. It is a test server.")


def main(argv: list[str] | None = None) -> int:
    """``postroom devsmtp``: serve until SIGINT or SIGTERM."""
    args = parse_args(argv, os.environ)
    configure_logging(logging.INFO, "%(asctime)s %(message)s")
    logging.getLogger("mail.log").setLevel(logging.WARNING)  # aiosmtpd's per-command chatter
    warning = bind_warning(args.host)
    if warning is not None:
        print(warning, file=sys.stderr, flush=True)
    if args.maildir is not None:
        try:
            open_maildir(args.maildir)
        except OSError as exc:
            print(f"devsmtp: cannot use --maildir {args.maildir}: {exc}", file=sys.stderr)
            return 1
    server = DevSmtpServer(args.host, args.port, reject=args.reject, defer=dict(args.defer),
                           latency_ms=args.latency, maildir=args.maildir, drop=args.drop,
                           max_kept=int(args.max_kept), throttle_every=int(args.throttle_every))
    stopping = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        stopping.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            server.start()
        except OSError as exc:
            print(f"devsmtp: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
            return 1
        print(f"devsmtp listening on {server.host}:{server.port}", flush=True)
        stopping.wait()
        server.stop()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return 0



if __name__ == "__main__":
    raise SystemExit(main())
