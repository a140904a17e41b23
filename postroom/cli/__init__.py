"""The `postroom` command: parses arguments and calls the components. Holds no logic of its own;
each command group's handlers and arguments live in a module of this package."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from postroom import logs
from postroom.cli import (
    admin,
    enqueue,
    monitor,
    purge,
    redrive,
    report,
    roles,
    status,
    suppression,
)
from postroom.cli.common import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_USAGE
from postroom.errors import ConfigError, PostroomError, first_line
from postroom.settings import FIELDS, Settings
from postroom.settings_declare import declarations


def configure_logging(level: str) -> None:
    # A command prints its result, no INFO line beside it; a role logs at `level` once it starts
    # (service_start).
    logs.configure_logging(logs.command_level(level))


class _Version(argparse.Action):
    """argparse's version action, the version read from the package's metadata only when asked
    (importlib.metadata is a tenth of a start of the command)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        from postroom import __version__

        print(f"postroom {__version__}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    files = [declared.file.env for _, declared in declarations(Settings) if declared.file]
    env_help = "\n".join(f"  {name}" for name in [*FIELDS, *files])
    parser = argparse.ArgumentParser(
        prog="postroom",
        description="Durable email delivery: PostgreSQL outbox -> Kafka -> SMTP.",
        epilog=f"Settings are read from these environment variables (see README.md):\n{env_help}",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action=_Version, nargs=0,
                        help="show program's version number and exit")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # In the order `postroom --help` lists them.
    for group in (admin, enqueue, roles, monitor, redrive, report, purge):
        group.add_commands(commands)
    commands.add_parser(
        "devsmtp", add_help=False,
        help="a local SMTP server that rejects, defers, delays or drops chosen recipients "
             "(see postroom devsmtp --help)")
    status.add_commands(commands)
    suppression.add_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        code = _main(argv)
        sys.stdout.flush()  # a closed pipe shows here, while it can still be caught
    except BrokenPipeError:
        # The reader went away (`postroom status --json | head -2`): stop quietly. Python's
        # recipe: point stdout at /dev/null so the flush at exit does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILURE
    return code


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["devsmtp"]:
        # The dev server has its own parser (and runs without the POSTROOM_* settings).
        try:
            from postroom.devkit import devsmtp_cli
        except ModuleNotFoundError as exc:
            if (exc.name or "").partition(".")[0] != "aiosmtpd":
                raise
            print("postroom devsmtp: error: the test server needs aiosmtpd: "
                  "pip install 'postroom[devsmtp]'", file=sys.stderr)
            return EXIT_FAILURE
        return devsmtp_cli.main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = Settings.from_env()
        configure_logging(settings.log_level)
        return int(args.handler(settings, args))
    except ConfigError as exc:
        print(f"postroom {args.command}: configuration error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except PostroomError as exc:
        print(f"postroom {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        # Ctrl-C while a one-shot command waits (on a broker, say): stop, no traceback.
        print(f"postroom {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        if not _database_error(exc):
            raise
        # unreachable, read-only, a grant missing, ...
        print(f"postroom {args.command}: error: cannot use the database "
              f"(POSTROOM_DATABASE_URL): {first_line(exc)}", file=sys.stderr)
        return EXIT_FAILURE


def _database_error(exc: Exception) -> bool:
    """Whether ``exc`` is SQLAlchemy's DBAPIError. SQLAlchemy is imported by the commands that
    use the database (one that does not, `lag` or an argument refused, starts without it), so an
    error raised before it was imported cannot be one."""
    errors = sys.modules.get("sqlalchemy.exc")
    return errors is not None and isinstance(exc, errors.DBAPIError)
